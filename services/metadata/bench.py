"""Benchmark of the metadata service through NATS, as the gateway calls it.

    python -m services.metadata.bench [ops] [--seconds 5] [--concurrency 1,32]
    python -m services.metadata.bench list [--ledgers 100000] [--page-size 100,1000]
        both: [--instances 1] [--nats-url URL --database-url URL] [--json FILE]

Without URLs it starts its own nats-server and PostgreSQL in a temporary directory. It
runs the metadata service as separate processes (`python -m services.metadata`), then:

- `ops` (the default) measures ledger creates per second and compare-and-set updates per
  second (each worker CASes its own ledger, version after version) with p50/p99
  latencies, at each concurrency (requests in flight), and the CPU each phase cost per
  operation (`cpu_us_per_op`, from /proc) in the service, PostgreSQL (its backends
  included), nats-server and this client (a servers' part only when this bench started
  them);
- `list` adds `--ledgers` ledger rows in one INSERT, then lists every ledger with
  `ledger.list`, a page at a time, one request in flight, at each page size: pages/s, and
  page latency p50/p99 in the first, middle and last tenth of the pages (keyset paging: a
  steady rate means the three agree).
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
from psycopg.types.json import Jsonb

from quire.bench.procstat import Process, cpu_seconds
from quire.infra import start_nats, start_postgres
from services.metadata import core
from services.metadata.postgres import connect, conninfo_from_url
from services.metadata.sql import LEDGER_FIELDS
from shared.config import nats_servers
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


class CpuMeter:
    """CPU seconds of the processes a phase runs on, by kind: this client (its own process
    only: the servers are its children) and each of `processes` with its descendants."""

    def __init__(self, processes: list[Process]) -> None:
        self._processes = processes
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        used = {"client": time.process_time()}
        for process, seconds in cpu_seconds(self._processes).items():
            kind = next(p.kind for p in self._processes if p.name == process)
            used[kind] = used.get(kind, 0.0) + seconds
        return used

    def start(self) -> None:
        self._start = self._now()

    def per_op_us(self, ops: int) -> dict[str, float]:
        used = {k: v - self._start[k] for k, v in self._now().items()}
        per_op = {k: round(v / max(1, ops) * 1e6, 1) for k, v in used.items()}
        per_op["total"] = round(sum(used.values()) / max(1, ops) * 1e6, 1)
        return per_op


def summary(latencies_ms: list[float], seconds: float, cpu: CpuMeter) -> dict:
    return {
        "ops": len(latencies_ms),
        "ops_per_s": round(len(latencies_ms) / seconds, 1),
        "p50_ms": round(percentile(latencies_ms, 0.50), 3),
        "p99_ms": round(percentile(latencies_ms, 0.99), 3),
        "cpu_us_per_op": cpu.per_op_us(len(latencies_ms)),
    }


async def run_creates(
    client: MetadataClient, concurrency: int, seconds: float, cpu: CpuMeter
) -> dict:
    latencies: list[float] = []
    cpu.start()
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await client.create_ledger(create_request())
            latencies.append((time.perf_counter() - started) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summary(latencies, time.perf_counter() - began, cpu)


async def run_cas(client: MetadataClient, concurrency: int, seconds: float, cpu: CpuMeter) -> dict:
    ledgers = [await client.create_ledger(create_request()) for _ in range(concurrency)]
    latencies: list[float] = []
    cpu.start()
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
    return summary(latencies, time.perf_counter() - began, cpu)


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


async def run_ops(args: argparse.Namespace, client: MetadataClient, cpu: CpuMeter) -> dict:
    await run_creates(client, 8, 1.0, cpu)  # warm-up: connections, prepared statements
    results = {}
    for concurrency in args.concurrency:
        results[f"creates_c{concurrency}"] = await run_creates(
            client, concurrency, args.seconds, cpu
        )
        results[f"cas_c{concurrency}"] = await run_cas(client, concurrency, args.seconds, cpu)
        print(concurrency, results[f"creates_c{concurrency}"], results[f"cas_c{concurrency}"])
    return results


# -- list -----------------------------------------------------------------------------------

# The columns a fill writes besides the id, each the same for every row.
_FILL_COLUMNS = [(f, c) for f, c in LEDGER_FIELDS.items() if f != "ledger_id"]
SQL_FILL_LEDGERS = f"""
INSERT INTO ledgers (ledger_id, {", ".join(c for _, c in _FILL_COLUMNS)})
SELECT %(first)s::bigint + i, {", ".join(f"%({c})s" for _, c in _FILL_COLUMNS)}
FROM generate_series(0, %(count)s::bigint - 1) i"""
# Past every id taken, whether the sequence gave it out or a creator chose it.
SQL_FILL_FIRST_ID = """
SELECT GREATEST(nextval('ledger_id_seq'), COALESCE(max(ledger_id) + 1, 0)) AS first
FROM ledgers"""
SQL_FILL_SEQUENCE = "SELECT setval('ledger_id_seq', %(last)s)"


async def fill_ledgers(database_url: str, count: int) -> None:
    """`count` rows of what `ledger.create` stores (an OPEN E3/Qw3/Qa2 ledger), in one
    statement, with the sequence moved past them. No outbox rows: a fill has no events,
    so the publisher has nothing to do while the list is measured."""
    meta = core.new_ledger(create_request(), 0, int(time.time() * 1000))
    row = meta.model_dump(mode="json")
    params = {
        c: Jsonb(row[f]) if isinstance(row[f], dict | list) else row[f] for f, c in _FILL_COLUMNS
    }
    conn = await connect(conninfo_from_url(database_url), 30.0)
    try:
        first = (await (await conn.execute(SQL_FILL_FIRST_ID)).fetchone())["first"]
        await conn.execute(SQL_FILL_LEDGERS, {**params, "first": first, "count": count})
        await conn.execute(SQL_FILL_SEQUENCE, {"last": first + count - 1})
        await conn.execute("ANALYZE ledgers")
    finally:
        await conn.close()


def tenths(latencies_ms: list[float]) -> dict[str, dict[str, float]]:
    """p50/p99 of the first, middle and last tenth of the pages, in listing order."""
    n = len(latencies_ms)
    size = max(1, n // 10)
    middle = max(0, n // 2 - size // 2)
    parts = {
        "first": latencies_ms[:size],
        "middle": latencies_ms[middle : middle + size],
        "last": latencies_ms[-size:],
    }
    return {
        name: {
            "pages": len(part),
            "p50_ms": round(percentile(part, 0.50), 3),
            "p99_ms": round(percentile(part, 0.99), 3),
        }
        for name, part in parts.items()
    }


async def list_all(client: MetadataClient, page_size: int) -> dict:
    latencies: list[float] = []
    listed = 0
    after = None
    began = time.perf_counter()
    while True:
        started = time.perf_counter()
        page = await client.list_ledgers(after, page_size)
        latencies.append((time.perf_counter() - started) * 1000)
        listed += len(page.ledgers)
        if page.next_after is None:
            break
        after = page.next_after
    seconds = time.perf_counter() - began
    return {
        "page_size": page_size,
        "ledgers": listed,
        "pages": len(latencies),
        "seconds": round(seconds, 2),
        "pages_per_s": round(len(latencies) / seconds, 1),
        "ledgers_per_s": round(listed / seconds),
        "tenths": tenths(latencies),
    }


async def run_list(args: argparse.Namespace, client: MetadataClient, database_url: str) -> dict:
    began = time.perf_counter()
    await fill_ledgers(database_url, args.ledgers)
    print(f"filled {args.ledgers} ledgers in {time.perf_counter() - began:.1f} s")
    for _ in range(10):  # warm-up: connections, prepared statements
        await client.list_ledgers(None, max(args.page_size))
    results = {}
    for page_size in args.page_size:
        results[f"list_p{page_size}"] = result = await list_all(client, page_size)
        print(json.dumps(result))
    return results


async def bench(
    args: argparse.Namespace, nats_url: str, database_url: str, servers: list[Process]
) -> dict:
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
    nc = await nats.connect(servers=nats_servers(nats_url))
    try:
        client = MetadataClient(nc, Subjects(prefix), timeout_s=10.0)
        await wait_ready(client)
        if args.mode == "list":
            return await run_list(args, client, database_url)
        processes = servers + [
            Process(f"metadata-{i}", "metadata", proc.pid) for i, proc in enumerate(procs)
        ]
        return await run_ops(args, client, CpuMeter(processes))
    finally:
        await nc.drain()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("mode", nargs="?", choices=["ops", "list"], default="ops")
    parser.add_argument("--seconds", type=float, default=5.0, help="ops: per phase")
    parser.add_argument("--concurrency", type=int_list, default=[1, 32], help="ops")
    parser.add_argument("--ledgers", type=int, default=100_000, help="list: rows to add")
    parser.add_argument("--page-size", type=int_list, default=[100, 1000], help="list")
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
            processes = [Process(s.name, s.kind, s.pid) for s in servers]
            results = asyncio.run(bench(args, nats_url, database_url, processes))
        finally:
            for server in reversed(servers):
                server.stop()
    settings: dict = {"mode": args.mode, "instances": args.instances}
    if args.mode == "list":
        settings.update(ledgers=args.ledgers, page_size=args.page_size)
    else:
        settings.update(seconds=args.seconds, concurrency=args.concurrency)
    report = {
        "settings": settings,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": results,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
