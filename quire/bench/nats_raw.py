"""What one nats-server carries for Quire's kind of traffic, through the Python client that
every Quire process uses (docs/scaling.md): `python -m quire.bench.nats_raw`.

- `publish`: one process publishes `--count` messages of `--size` bytes on one subject as
  fast as it can, another subscribes and counts them: messages/s and MB/s received;
- `request`: a responder process answers each request with a small reply (as a bookie
  answers an add), the bench keeps `--in-flight` requests outstanding: requests/s.

Without `--nats-url` it starts its own nats-server in a temporary directory, and then also
reports the server's CPU per 1,000 messages (a request and its reply are two).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats

from quire.bench.procstat import Process, cpu_seconds

SUBJECT = "bench.nats.publish"
SERVICE = "bench.nats.request"


def _subscriber(url: str, count: int, ready: Any, result: Any) -> None:
    async def run() -> None:
        nc = await nats.connect(url)
        done = asyncio.Event()
        seen = {"n": 0, "first": 0.0}

        async def handle(_msg: Any) -> None:
            if seen["n"] == 0:
                seen["first"] = time.perf_counter()
            seen["n"] += 1
            if seen["n"] == count:
                done.set()

        await nc.subscribe(SUBJECT, cb=handle, pending_msgs_limit=-1, pending_bytes_limit=-1)
        await nc.flush()
        ready.set()
        await done.wait()
        result.put(time.perf_counter() - seen["first"])
        await nc.close()

    asyncio.run(run())


def _responder(url: str, ready: Any, stop: Any) -> None:
    async def run() -> None:
        nc = await nats.connect(url)

        async def handle(msg: Any) -> None:
            await msg.respond(b"ok")

        await nc.subscribe(SERVICE, cb=handle, pending_msgs_limit=-1, pending_bytes_limit=-1)
        await nc.flush()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await nc.close()

    asyncio.run(run())


async def publish(url: str, count: int, size: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    ready, result = ctx.Event(), ctx.Queue()
    sub = ctx.Process(target=_subscriber, args=(url, count, ready, result))
    sub.start()
    try:
        ready.wait(30)
        nc = await nats.connect(url, flush_timeout=30)
        payload = os.urandom(size)
        started = time.perf_counter()
        for i in range(count):
            await nc.publish(SUBJECT, payload)
            if i % 1000 == 999:
                await nc.flush()  # keep the client's buffer bounded, as a real sender does
        await nc.flush()
        sent_s = time.perf_counter() - started
        received_s = result.get(timeout=120)
        await nc.close()
    finally:
        sub.join(30)
    return {
        "messages": count,
        "size_bytes": size,
        "published_per_s": round(count / sent_s),
        "received_per_s": round(count / received_s),
        "received_mb_per_s": round(count * size / received_s / 1e6, 1),
    }


async def request(url: str, count: int, size: int, in_flight: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    responder = ctx.Process(target=_responder, args=(url, ready, stop))
    responder.start()
    try:
        ready.wait(30)
        nc = await nats.connect(url)
        payload = os.urandom(size)
        latencies: list[float] = []
        remaining = [count]

        async def worker() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                sent = time.perf_counter()
                await nc.request(SERVICE, payload, timeout=10)
                latencies.append(time.perf_counter() - sent)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
        await nc.close()
    finally:
        stop.set()
        responder.join(30)
    latencies.sort()
    return {
        "requests": count,
        "size_bytes": size,
        "in_flight": in_flight,
        "requests_per_s": round(count / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
    }


async def run(
    args: argparse.Namespace, url: str, server_cpu: Callable[[], float] | None = None
) -> dict[str, Any]:
    phases = {
        "publish": (lambda: publish(url, args.count, args.size), args.count),
        "request": (
            lambda: request(url, args.requests, args.size, args.in_flight),
            2 * args.requests,
        ),
    }
    results = {}
    for name, (phase, messages) in phases.items():
        before = server_cpu() if server_cpu else 0.0
        results[name] = await phase()
        if server_cpu:
            used = server_cpu() - before
            results[name]["server_cpu_ms_per_1000_messages"] = round(used / messages * 1e6, 1)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200_000, help="messages published")
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=1024, help="bytes a message")
    parser.add_argument("--in-flight", type=int, default=64, help="requests outstanding")
    parser.add_argument("--nats-url")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.nats_url:
        results = asyncio.run(run(args, args.nats_url))
    else:
        from quire.infra import start_nats

        with tempfile.TemporaryDirectory(prefix="quire-nats-bench-") as tmp:
            server = start_nats(Path(tmp))
            process = Process("nats-server", "nats", server.pid)

            def cpu() -> float:
                return cpu_seconds([process])["nats-server"]

            try:
                results = asyncio.run(run(args, server.url, cpu))
            finally:
                server.stop()
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return results


if __name__ == "__main__":
    main()
