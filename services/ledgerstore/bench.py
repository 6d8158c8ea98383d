"""One bookie's storage alone (journal + ledgerstore, no NATS): `python -m
services.ledgerstore.bench` (or `quire bench-storage`).

Measures, on this machine's disk:
- the raw rate of 4 KiB append + fdatasync (the ceiling for one-at-a-time durability);
- journal adds/s at 1 KiB with group commit, and the fsync batch sizes it reached;
- ledgerstore index lookups/s, cold reads/s (read cache empty, random order) and warm
  reads/s (from the read cache);
- the index candidates: SQLite (WAL) against LMDB (if the `lmdb` package is installed),
  inserts/s in checkpoint-sized transactions and point lookups/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import struct
import tempfile
import time
from pathlib import Path

from services.journal.core import EntryRecord
from services.journal.journal import Journal
from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.config import JournalSettings, LedgerstoreSettings
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
    await asyncio.gather(*(writer(ledger) for ledger in range(1, writers + 1)))
    elapsed = time.perf_counter() - started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await journal.close()
    stats = journal.stats
    latencies.sort()
    return {
        "entry_size_bytes": size,
        "writers": writers,
        "adds_per_s": round(len(latencies) / elapsed),
        "fsyncs_per_s": round(stats.journal_sync / elapsed),
        "batch_entries_mean": round(stats.journal_flush_batch_records_sum / stats.journal_sync, 1),
        "batch_entries_max": stats.journal_flush_batch_records_max,
        "add_p50_ms": round(latencies[len(latencies) // 2], 3),
        "add_p99_ms": round(latencies[int(len(latencies) * 0.99)], 3),
        "entries": len(latencies),
    }


async def ledgerstore_reads(bookie_dir: Path, seconds: float) -> dict:
    settings = LedgerstoreSettings()
    store = LedgerStore(bookie_dir, settings)
    await store.open()
    await store.catch_up()
    await store.checkpoint()
    keys = [
        (ledger, entry)
        for ledger, info in store.ledgers.items()
        for entry in range(info.last_entry_id + 1)
    ]
    await store.close()
    rng = random.Random(7)

    def rate(fn, batch: list) -> float:
        count, deadline = 0, time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            for item in batch:
                fn(item)
            count += len(batch)
        return count / (time.perf_counter() - started)

    store = LedgerStore(bookie_dir, settings.model_copy(update={"read_ahead_cache_batch_size": 1}))
    await store.open()
    sample = rng.sample(keys, min(len(keys), 2000))
    lookups = rate(lambda k: store.index.lookup(*k), sample)
    # Cold: an empty read cache and random order (read-ahead cannot help), one per call.
    cold_items = [wire.ReadItem(*k) for k in rng.sample(keys, min(len(keys), 5000))]
    started = time.perf_counter()
    for item in cold_items:
        await store.read([item])
    cold = len(cold_items) / (time.perf_counter() - started)
    # Warm: the same entries again, now in the read cache.
    started = time.perf_counter()
    for item in cold_items:
        await store.read([item])
    warm = len(cold_items) / (time.perf_counter() - started)
    hits = store.stats.read_cache_hits
    await store.close()
    return {
        "entries": len(keys),
        "index_lookups_per_s": round(lookups),
        "cold_reads_per_s": round(cold),
        "warm_reads_per_s": round(warm),
        "warm_read_cache_hits": hits,
    }


def index_candidates(directory: Path, count: int) -> dict:
    rng = random.Random(1)
    rows = [(ledger, entry) for ledger in range(count // 1000) for entry in range(1000)]
    probes = rng.sample(rows, min(len(rows), 20_000))
    results = {"entries": len(rows), "sqlite_wal": _bench_sqlite(directory, rows, probes)}
    try:
        import lmdb  # noqa: F401
    except ImportError:
        results["lmdb"] = "not installed (pip install lmdb)"
    else:
        results["lmdb"] = _bench_lmdb(directory, rows, probes)
    return results


CHECKPOINT_ROWS = 10_000  # rows per transaction, like one checkpoint's worth


def _bench_sqlite(directory: Path, rows: list, probes: list) -> dict:
    conn = sqlite3.connect(directory / "bench.sqlite", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE entries (ledger_id INTEGER, entry_id INTEGER, log_id INTEGER, "
        "offset INTEGER, size INTEGER, PRIMARY KEY (ledger_id, entry_id)) WITHOUT ROWID"
    )
    started = time.perf_counter()
    for at in range(0, len(rows), CHECKPOINT_ROWS):
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO entries VALUES (?, ?, 1, ?, 1024)",
            ((ledger, entry, entry * 1024) for ledger, entry in rows[at : at + CHECKPOINT_ROWS]),
        )
        conn.execute("COMMIT")
    inserts = len(rows) / (time.perf_counter() - started)
    started = time.perf_counter()
    for ledger, entry in probes:
        conn.execute(
            "SELECT log_id, offset, size FROM entries WHERE ledger_id = ? AND entry_id = ?",
            (ledger, entry),
        ).fetchone()
    lookups = len(probes) / (time.perf_counter() - started)
    conn.close()
    return {"inserts_per_s": round(inserts), "lookups_per_s": round(lookups)}


def _bench_lmdb(directory: Path, rows: list, probes: list) -> dict:
    import lmdb

    env = lmdb.open(str(directory / "bench.lmdb"), map_size=1 << 32, sync=True)
    key = struct.Struct(">Qq")
    value = struct.Struct(">QQI")
    started = time.perf_counter()
    for at in range(0, len(rows), CHECKPOINT_ROWS):
        with env.begin(write=True) as txn:
            for ledger, entry in rows[at : at + CHECKPOINT_ROWS]:
                txn.put(key.pack(ledger, entry), value.pack(1, entry * 1024, 1024))
    inserts = len(rows) / (time.perf_counter() - started)
    started = time.perf_counter()
    with env.begin() as txn:
        for ledger, entry in probes:
            value.unpack(txn.get(key.pack(ledger, entry)))
    lookups_one_txn = len(probes) / (time.perf_counter() - started)
    started = time.perf_counter()
    for ledger, entry in probes:
        with env.begin() as txn:
            value.unpack(txn.get(key.pack(ledger, entry)))
    lookups = len(probes) / (time.perf_counter() - started)
    env.close()
    return {
        "inserts_per_s": round(inserts),
        "lookups_per_s": round(lookups),
        "lookups_per_s_one_txn": round(lookups_one_txn),
    }


async def run(args: argparse.Namespace) -> dict:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="quire-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    bookie_dir = base / "bookie"
    result = {
        "machine": {"cpus": os.cpu_count(), "dir": str(base)},
        "raw_fsync_4k": raw_fsync_rate(base, args.seconds),
        "journal": await journal_adds(
            bookie_dir / "journal", args.seconds, args.writers, args.entry_size
        ),
        "ledgerstore": await ledgerstore_reads(bookie_dir, args.seconds),
        "index": index_candidates(base, args.index_entries),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.ledgerstore.bench")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--writers", type=int, default=64, help="concurrent adders")
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--index-entries", type=int, default=200_000)
    parser.add_argument("--dir", help="where to write (default: a new temp dir)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
