"""The ledgerstore alone (no NATS, no journal service): `python -m
services.ledgerstore.bench`. Its input is a journal file written directly with the
journal's format (`shared.bookie.journal_format`), as group commits of one entry per
ledger; the journal's own figures are `python -m services.journal.bench`.

Measures, on this machine's disk (`--mode all`, the default):
- ledgerstore index lookups/s, cold reads/s (read cache empty, random order) and warm
  reads/s (from the read cache);
- the index candidates: SQLite (WAL) against LMDB (if the `lmdb` package is installed),
  inserts/s in checkpoint-sized transactions and point lookups/s.

`--mode read` measures a catch-up read: `--entries` entries of `--entry-size` bytes over
`--writers` ledgers are applied and flushed, the entry logs and the index are dropped from
the page cache (POSIX_FADV_DONTNEED), then every ledger is read from its first entry in
requests of `--batch` entries (every `--stride`th entry: 3 is a reader of an E3/Qw3 ledger
asking each bookie in turn), `--in-flight` requests at a time, cold and then again warm:
entries/s and MB/s of each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import struct
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from services.ledgerstore.store import LedgerStore
from shared import bench_report, wire
from shared.bookie.journal_format import (
    EntryRecord,
    encode_batch,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from shared.config import LedgerstoreSettings
from shared.digest import DigestManager
from shared.status import BookieStatus

KEY = b"k" * 20


def write_journal(directory: Path, entries: int, ledgers: int, size: int) -> None:
    """Journal file 1 with `entries` entries of `size` bytes over `ledgers` ledgers, in
    batches of one entry per ledger (as that many concurrent adders make them)."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = DigestManager("crc32c")
    code = wire.DIGEST_CODES[digest.digest_type]
    payload = os.urandom(size)
    with open(directory / journal_file_name(1), "wb") as f:
        f.write(encode_file_header(1))
        batch: list[bytes] = []
        for n in range(entries):
            ledger_id, entry_id = 1 + n % ledgers, n // ledgers
            frame = digest.sign(ledger_id, entry_id, entry_id - 1, size, payload)
            batch.append(encode_record(EntryRecord.of(KEY, frame, code)))
            if len(batch) == ledgers:
                f.write(encode_batch(batch))
                batch = []
        if batch:
            f.write(encode_batch(batch))


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


def drop_page_cache(store: LedgerStore) -> None:
    """Hand back the page cache of the entry logs and the index, as a cold bookie has it."""
    paths = [path for logger in store.loggers for path in logger.directory.iterdir()]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


async def read_ledgers(store: LedgerStore, args: argparse.Namespace) -> dict:
    """Read every entry a reader with this stride asks this bookie for, in requests of
    `args.batch`, `args.in_flight` requests at a time; entries/s and MB/s."""
    requests = []
    for ledger_id, info in sorted(store.ledgers.items()):
        ids = list(range(0, info.last_entry_id + 1, args.stride))
        for at in range(0, len(ids), args.batch):
            requests.append([wire.ReadItem(ledger_id, e) for e in ids[at : at + args.batch]])
    slots = asyncio.Semaphore(args.in_flight)
    entries = size = 0

    async def one(items: list[wire.ReadItem]) -> None:
        nonlocal entries, size
        async with slots:
            results = await store.read(items)
        assert all(r.status is BookieStatus.OK for r in results), "a read failed"
        entries += len(results)
        size += sum(len(r.frame) for r in results)

    started = time.perf_counter()
    await asyncio.gather(*(one(items) for items in requests))
    elapsed_s = time.perf_counter() - started
    return {
        "entries": entries,
        "requests": len(requests),
        "seconds": round(elapsed_s, 3),
        "entries_per_s": round(entries / elapsed_s),
        "mb_per_s": round(size / elapsed_s / 1e6, 1),
    }


async def catch_up_reads(bookie_dir: Path, args: argparse.Namespace) -> dict:
    settings = LedgerstoreSettings()
    store = LedgerStore(bookie_dir, settings)
    await store.open()
    await store.catch_up()
    await store.checkpoint()
    await store.close()
    store = LedgerStore(bookie_dir, settings)
    drop_page_cache(store)
    await store.open()
    cold = await read_ledgers(store, args)
    warm = await read_ledgers(store, args)
    stats = asdict(store.stats)
    await store.close()
    return {
        "batch": args.batch,
        "stride": args.stride,
        "in_flight": args.in_flight,
        "cold": cold,
        "warm": warm,
        "stats": {key: stats[key] for key in sorted(stats) if key.startswith(READ_STATS)},
    }


READ_STATS = ("ledgerstore_read", "read_cache", "readahead", "index")


async def run(args: argparse.Namespace) -> dict:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="quire-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    bookie_dir = base / "bookie"
    write_journal(bookie_dir / "journal", args.entries, args.writers, args.entry_size)
    if args.mode == "read":
        return {
            "machine": {"cpus": os.cpu_count(), "dir": str(base)},
            "entry_size": args.entry_size,
            "read": await catch_up_reads(bookie_dir, args),
        }
    result = {
        "machine": {"cpus": os.cpu_count(), "dir": str(base)},
        "ledgerstore": await ledgerstore_reads(bookie_dir, args.seconds),
        "index": index_candidates(base, args.index_entries),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.ledgerstore.bench")
    parser.add_argument("--mode", choices=("all", "read"), default="all")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--entries", type=int, default=50_000, help="entries to read")
    parser.add_argument("--writers", type=int, default=64, help="ledgers written at once")
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--index-entries", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100, help="read mode: entries a request")
    parser.add_argument("--stride", type=int, default=1, help="read mode: every nth entry")
    parser.add_argument("--in-flight", type=int, default=4, help="read mode: requests at once")
    parser.add_argument("--dir", help="where to write (default: a new temp dir)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    bench_report.emit(asyncio.run(run(args)), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
