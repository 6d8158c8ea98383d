"""The ledgerstore with many ledgers (no NATS, no journal service):
`python -m services.ledgerstore.scale_bench --ledgers 100000`.

Its input is journal files written with the journal's format (one entry to each of N
ledgers, then one more entry to one ledger); it applies them through the real
`LedgerStore` and reports:
- memory: tracemalloc over a restart (`LedgerStore.open`: the index's ledger facts),
  divided by N;
- checkpoints (flushes): the entries and ledger rows each commits to the index, first
  with every ledger new, then after one entry to a single ledger;
- restart: the time of `open` and of the `catch_up` after it.
Figures depend on the machine: the command prints them, rerun it where you compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path

from services.ledgerstore.core import EntryLocation, LedgerInfo
from services.ledgerstore.storage import Usage
from services.ledgerstore.store import LedgerStore
from shared import bench_report, wire
from shared.bookie.journal_format import (
    EntryRecord,
    JournalPosition,
    encode_batch,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from shared.config import LedgerstoreSettings
from shared.digest import DigestManager

KEY = b"k" * 20
BATCH_RECORDS = 1000  # records a group commit


def write_journal_file(directory: Path, file_id: int, ledger_ids: range, entry_id: int) -> None:
    digest = DigestManager("crc32c")
    code = wire.DIGEST_CODES[digest.digest_type]
    payload = b"p" * 16
    records = [
        encode_record(
            EntryRecord.of(KEY, digest.sign(ledger_id, entry_id, entry_id - 1, 16, payload), code)
        )
        for ledger_id in ledger_ids
    ]
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / journal_file_name(file_id), "wb") as f:
        f.write(encode_file_header(file_id))
        for at in range(0, len(records), BATCH_RECORDS):
            f.write(encode_batch(records[at : at + BATCH_RECORDS]))


class CountingStore(LedgerStore):
    """Counts what each checkpoint commits to the index."""

    commits: list[dict]

    async def open(self) -> None:
        await super().open()
        self.commits = []
        commit = self.index.commit

        def counted(
            entries: Mapping[tuple[int, int], EntryLocation],
            ledgers: Mapping[int, LedgerInfo],
            positions: Sequence[JournalPosition],
            *args,
        ) -> Usage:
            self.commits.append({"entries": len(entries), "ledger_rows": len(ledgers)})
            return commit(entries, ledgers, positions, *args)

        self.index.commit = counted  # type: ignore[method-assign]


async def checkpoint(store: CountingStore) -> dict:
    await store.catch_up()
    started = time.perf_counter()
    await store.checkpoint()
    return {**store.commits[-1], "checkpoint_ms": round((time.perf_counter() - started) * 1000)}


async def restart(bookie_dir: Path, ledgers: int) -> dict:
    """Open the store twice: timed, then under tracemalloc (which slows it)."""
    store = LedgerStore(bookie_dir, LedgerstoreSettings())
    started = time.perf_counter()
    await store.open()
    open_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    await store.catch_up()
    catch_up_ms = (time.perf_counter() - started) * 1000
    assert len(store.ledgers) == ledgers, len(store.ledgers)
    await store.close()
    del store
    tracemalloc.start()
    store = LedgerStore(bookie_dir, LedgerstoreSettings())
    await store.open()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    await store.close()
    return {
        "open_ms": round(open_ms),
        "catch_up_ms": round(catch_up_ms),
        "memory_bytes_per_ledger": round(held / ledgers),
    }


async def run(args: argparse.Namespace) -> dict:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="quire-bench-"))
    bookie_dir = base / "bookie"
    n = args.ledgers
    write_journal_file(bookie_dir / "journal", 1, range(1, n + 1), 0)
    store = CountingStore(bookie_dir, LedgerstoreSettings())
    await store.open()
    first = await checkpoint(store)
    write_journal_file(bookie_dir / "journal", 2, range(1, 2), 1)
    one = await checkpoint(store)
    await store.close()
    return {
        "machine": {"cpus": os.cpu_count(), "dir": str(base)},
        "ledgers": n,
        "first_checkpoint_every_ledger": first,
        "checkpoint_after_one_ledger_written": one,
        "restart": await restart(bookie_dir, n),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.ledgerstore.scale_bench")
    parser.add_argument("--ledgers", type=int, default=100_000)
    parser.add_argument("--dir", help="where to write (default: a new temp dir)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    bench_report.emit(asyncio.run(run(args)), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
