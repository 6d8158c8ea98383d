"""Benchmark of the metadata service through NATS, as the gateway calls it.

    python -m services.metadata.bench [--seconds 5] [--concurrency 1,32] [--instances 1]
                                      [--nats-url URL --database-url URL] [--json FILE]

Without URLs it starts its own nats-server and PostgreSQL in a temporary directory. It
runs the metadata service as separate processes (`python -m services.metadata`), then
measures ledger creates per second and compare-and-set updates per second (each worker
CASes its own ledger, version after version) with p50/p99 latencies, at each concurrency
(requests in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats

from quire.infra import start_nats, start_postgres
from shared.metaclient import MetadataClient, MetadataError
from shared.models import CreateLedgerRequest, UpdateLedgerRequest
from shared.subjects import Subjects

ENSEMBLE = ["bookie-1", "bookie-2", "bookie-3"]


def create_request() -> CreateLedgerRequest:
    return CreateLedgerRequest(
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        digest="crc32c",
        ensemble=ENSEMBLE,
        password_salt="00" * 16,
        password_hash="11" * 32,
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summary(latencies_ms: list[float], seconds: float) -> dict[str, float]:
    return {
        "ops": len(latencies_ms),
        "ops_per_s": round(len(latencies_ms) / seconds, 1),
        "p50_ms": round(percentile(latencies_ms, 0.50), 3),
        "p99_ms": round(percentile(latencies_ms, 0.99), 3),
    }


async def run_creates(client: MetadataClient, concurrency: int, seconds: float) -> dict:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await client.create_ledger(create_request())
            latencies.append((time.perf_counter() - started) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summary(latencies, time.perf_counter() - began)


async def run_cas(client: MetadataClient, concurrency: int, seconds: float) -> dict:
    ledgers = [await client.create_ledger(create_request()) for _ in range(concurrency)]
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(ledger_id: int) -> None:
        version = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            updated = await client.update_ledger(
                UpdateLedgerRequest(
                    ledger_id=ledger_id, expected_version=version, length=version + 1
                )
            )
            latencies.append((time.perf_counter() - started) * 1000)
            version = updated.version

    began = time.perf_counter()
    await asyncio.gather(*(worker(m.ledger_id) for m in ledgers))
    return summary(latencies, time.perf_counter() - began)


async def wait_ready(client: MetadataClient, timeout_s: float = 60.0) -> None:
    give_up_at = time.monotonic() + timeout_s
    while True:
        try:
            await client.instance_id()
            return
        except MetadataError:
            if time.monotonic() > give_up_at:
                raise
            await asyncio.sleep(0.2)


async def bench(args: argparse.Namespace, nats_url: str, database_url: str) -> dict:
    prefix = f"bench{os.getpid()}"
    env = {
        **os.environ,
        "QUIRE_NATS_URL": nats_url,
        "QUIRE_DATABASE_URL": database_url,
        "QUIRE_SUBJECT_PREFIX": prefix,
        "QUIRE_LOG_LEVEL": "WARNING",
    }
    procs = [
        subprocess.Popen([sys.executable, "-m", "services.metadata"], env=env)
        for _ in range(args.instances)
    ]
    nc = await nats.connect(nats_url)
    try:
        client = MetadataClient(nc, Subjects(prefix), timeout_s=10.0)
        await wait_ready(client)
        await run_creates(client, 8, 1.0)  # warm-up: connections, prepared statements
        results = {}
        for concurrency in args.concurrency:
            results[f"creates_c{concurrency}"] = await run_creates(
                client, concurrency, args.seconds
            )
            results[f"cas_c{concurrency}"] = await run_cas(client, concurrency, args.seconds)
            print(concurrency, results[f"creates_c{concurrency}"], results[f"cas_c{concurrency}"])
        return results
    finally:
        await nc.drain()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32]
    )
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--nats-url")
    parser.add_argument("--database-url")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quire-bench-") as tmp:
        servers = []
        try:
            nats_url, database_url = args.nats_url, args.database_url
            if nats_url is None:
                servers.append(start_nats(Path(tmp) / "nats"))
                nats_url = servers[-1].url
            if database_url is None:
                os.chmod(tmp, 0o755)  # as root, PostgreSQL runs as 'nobody'
                servers.append(start_postgres(Path(tmp) / "postgres"))
                database_url = servers[-1].url
            results = asyncio.run(bench(args, nats_url, database_url))
        finally:
            for server in reversed(servers):
                server.stop()
    report = {
        "settings": {"seconds": args.seconds, "instances": args.instances},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": results,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
