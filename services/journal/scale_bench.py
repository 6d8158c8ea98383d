"""The journal with many ledgers (no NATS, no ledgerstore):
`python -m services.journal.scale_bench --ledgers 100000`.

Writes one entry to each of N ledgers through the real `Journal` (group commits, fsync),
then measures what each ledger costs the journal:
- memory: tracemalloc over a restart (`Journal.open`: the replayed durable state and its
  live copy), divided by N;
- checkpoints: the snapshot rows and bytes the first LastLogMark move writes (every
  ledger, the file is new), then one after writing to a single ledger;
- restart: the time of `Journal.open` (snapshot + journal files after the mark).
Figures depend on the machine: the command prints them, rerun it where you compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

from services.journal.journal import Journal
from shared import bench_report, wire
from shared.bookie.journal_format import EntryRecord
from shared.config import JournalSettings
from shared.digest import DigestManager

KEY = b"k" * 20
SUBMIT_RECORDS = 1000  # records a submit: the queue's default bound is larger


def settings() -> JournalSettings:
    return JournalSettings(max_backups=0, queue_size=10 * SUBMIT_RECORDS)


async def run_journal(directory: Path, records: list[EntryRecord], checkpoint: bool) -> dict:
    """One life of the journal: open (a new file), submit `records`, move the LastLogMark
    to the end if `checkpoint`; the snapshot rows and bytes that took, and its time."""
    journal = Journal(directory, settings())
    await journal.open()
    writer = asyncio.create_task(journal.run_writer())
    for at in range(0, len(records), SUBMIT_RECORDS):
        await journal.submit(records[at : at + SUBMIT_RECORDS], now_ms=time.monotonic() * 1000)
    started = time.perf_counter()
    if checkpoint:
        await journal.checkpoint(journal.durable_position)
    elapsed_ms = (time.perf_counter() - started) * 1000
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    await journal.close()
    return {
        "snapshot_rows": journal.stats.journal_snapshot_rows,
        "snapshot_bytes": journal.stats.journal_snapshot_bytes,
        "checkpoint_ms": round(elapsed_ms, 1),
    }


async def restart(directory: Path, ledgers: int) -> dict:
    """Open the journal twice: timed, then under tracemalloc (which slows it)."""
    journal = Journal(directory, settings())
    started = time.perf_counter()
    await journal.open()
    open_ms = (time.perf_counter() - started) * 1000
    assert len(journal.durable) == ledgers, len(journal.durable)
    await journal.close()
    del journal
    tracemalloc.start()
    journal = Journal(directory, settings())
    await journal.open()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    await journal.close()
    return {"open_ms": round(open_ms), "memory_bytes_per_ledger": round(held / ledgers)}


def entries(ledger_ids: range, entry_id: int) -> list[EntryRecord]:
    digest = DigestManager("crc32c")
    code = wire.DIGEST_CODES[digest.digest_type]
    payload = b"p" * 16
    return [
        EntryRecord.of(KEY, digest.sign(ledger_id, entry_id, entry_id - 1, 16, payload), code)
        for ledger_id in ledger_ids
    ]


async def run(args: argparse.Namespace) -> dict:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="quire-bench-"))
    directory = base / "bookie" / "journal"
    n = args.ledgers
    started = time.perf_counter()
    await run_journal(directory, entries(range(1, n + 1), 0), checkpoint=False)
    write_s = time.perf_counter() - started
    # One ledger written, then the mark moves to a new file (each life starts one): the
    # first snapshot holds every ledger, the next only the one written since.
    first = await run_journal(directory, entries(range(1, 2), 1), checkpoint=True)
    one = await run_journal(directory, entries(range(2, 3), 1), checkpoint=True)
    return {
        "machine": {"cpus": os.cpu_count(), "dir": str(base)},
        "ledgers": n,
        "write_entries_per_s": round(n / write_s),
        "first_checkpoint_every_ledger": first,
        "checkpoint_after_one_ledger_written": one,
        "restart": await restart(directory, n),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.journal.scale_bench")
    parser.add_argument("--ledgers", type=int, default=100_000)
    parser.add_argument("--dir", help="where to write (default: a new temp dir)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    bench_report.emit(asyncio.run(run(args)), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
