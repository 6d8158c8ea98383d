"""The journal alone (no NATS, no ledgerstore): `python -m services.journal.bench`.

Measures, on this machine's disk:
- the raw rate of 4 KiB append + fdatasync (the ceiling for one-at-a-time durability);
- journal adds/s at 1 KiB with group commit, and the fsync batch sizes it reached.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from services.journal.journal import Journal
from shared import bench_report, wire
from shared.bookie.journal_format import EntryRecord
from shared.config import JournalSettings
from shared.digest import DigestManager

KEY = b"k" * 20


def raw_fsync_rate(directory: Path, seconds: float) -> dict:
    path = directory / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block = os.urandom(4096)
    count, latencies = 0, []
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - started) * 1000)
            count += 1
    finally:
        os.close(fd)
        path.unlink()
    return {
        "fdatasync_per_s": round(count / seconds),
        "p50_ms": round(statistics.median(latencies), 3),
    }


async def journal_adds(directory: Path, seconds: float, writers: int, size: int) -> dict:
    journal = Journal(directory, JournalSettings(max_backups=0))
    await journal.open()
    task = asyncio.create_task(journal.run_writer())
    digest = DigestManager("crc32c")
    payload = os.urandom(size)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def writer(ledger_id: int) -> None:
        entry_id = 0
        while time.perf_counter() < deadline:
            frame = digest.sign(ledger_id, entry_id, entry_id - 1, size, payload)
            started = time.perf_counter()
            record = EntryRecord.of(KEY, frame, wire.DIGEST_CODES[digest.digest_type])
            await journal.submit([record], now_ms=started * 1000)
            latencies.append((time.perf_counter() - started) * 1000)
            entry_id += 1

    started = time.perf_counter()
    cpu_started = time.process_time()
    await asyncio.gather(*(writer(ledger) for ledger in range(1, writers + 1)))
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await journal.close()
    stats = journal.stats
    latencies.sort()
    return {
        "entry_size_bytes": size,
        "writers": writers,
        # Every thread of this process (the writer thread too), user and system.
        "cpu_us_per_add": round(cpu_s / max(len(latencies), 1) * 1e6, 1),
        "adds_per_s": round(len(latencies) / elapsed),
        "fsyncs_per_s": round(stats.journal_sync / elapsed),
        "batch_entries_mean": round(stats.journal_flush_batch_records_sum / stats.journal_sync, 1),
        "batch_entries_max": stats.journal_flush_batch_records_max,
        "add_p50_ms": round(latencies[len(latencies) // 2], 3),
        "add_p99_ms": round(latencies[int(len(latencies) * 0.99)], 3),
        "entries": len(latencies),
    }


async def run(args: argparse.Namespace) -> dict:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="quire-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    return {
        "machine": {"cpus": os.cpu_count(), "dir": str(base)},
        "raw_fsync_4k": raw_fsync_rate(base, args.seconds),
        "journal": await journal_adds(
            base / "bookie" / "journal", args.seconds, args.writers, args.entry_size
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.journal.bench")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--writers", type=int, default=64, help="concurrent adders")
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--dir", help="where to write (default: a new temp dir)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    import uvloop

    uvloop.install()  # the event loop the bookie runs on
    bench_report.emit(asyncio.run(run(args)), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
