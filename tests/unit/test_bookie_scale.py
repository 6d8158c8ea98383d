"""A bookie costs per data, not per ledger ever seen (issue 12). Counted, never timed:
memory per ledger of each per-ledger structure (tracemalloc, under the 1 KiB aim), and the
rows a checkpoint writes after one ledger among 10,000 idle ones was written."""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from services.journal import scale_bench as journal_bench
from services.ledgerstore import scale_bench as ledgerstore_bench
from services.ledgerstore.core import LedgerInfo, apply_to_ledgers
from shared.bookie.journal_format import EntryRecord, decode_body, encode_record
from shared.bookie.rules import BookieLedgerState
from shared.digest import DigestManager

LEDGERS = 10_000
BYTES_PER_LEDGER_MAX = 1024
DIGEST = DigestManager("crc32c")


def encoded_entries() -> list[bytes]:
    """One entry per ledger, with ids large enough that no int is a cached small one."""
    return [
        encode_record(
            EntryRecord.of(
                bytes([n % 256]) * 20, DIGEST.sign(10**6 + n, 10**4, 10**4 - 1, 4, b"data"), 2
            )
        )
        for n in range(LEDGERS)
    ]


def bytes_per_ledger(apply: Callable[[EntryRecord], None]) -> float:
    """Memory held after applying one decoded entry record per ledger (decoded while
    traced, as replay and catch-up decode them, then dropped)."""
    encoded = encoded_entries()
    gc.collect()
    tracemalloc.start()
    try:
        for data in encoded:
            apply(decode_body(data[8], memoryview(data)[9:]))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return held / LEDGERS


def test_the_journals_ledger_state_costs_under_a_kib_a_ledger() -> None:
    durable = BookieLedgerState(track_changes=True)
    live = BookieLedgerState()  # the journal holds both

    def apply(record: EntryRecord) -> None:
        durable.apply(record)
        live.apply(record)

    held = bytes_per_ledger(apply)
    assert len(durable) == len(live) == LEDGERS
    assert held < BYTES_PER_LEDGER_MAX, held


def test_the_ledgerstores_ledger_info_costs_under_a_kib_a_ledger() -> None:
    ledgers: dict[int, LedgerInfo] = {}
    held = bytes_per_ledger(lambda record: apply_to_ledgers(ledgers, record))
    assert len(ledgers) == LEDGERS
    assert held < BYTES_PER_LEDGER_MAX, held


async def test_a_journal_checkpoint_after_one_ledger_writes_one_row(tmp_path: Path) -> None:
    result = await journal_bench.run(argparse.Namespace(ledgers=LEDGERS, dir=str(tmp_path)))
    first, one = (
        result["first_checkpoint_every_ledger"],
        result["checkpoint_after_one_ledger_written"],
    )
    assert first["snapshot_rows"] == LEDGERS
    # One segment: its position, count and crc (24 bytes), then one 45-byte row.
    assert (one["snapshot_rows"], one["snapshot_bytes"]) == (1, 24 + 45)
    assert result["restart"]["memory_bytes_per_ledger"] < BYTES_PER_LEDGER_MAX


async def test_a_ledgerstore_flush_after_one_ledger_commits_one_row(tmp_path: Path) -> None:
    result = await ledgerstore_bench.run(argparse.Namespace(ledgers=LEDGERS, dir=str(tmp_path)))
    first, one = (
        result["first_checkpoint_every_ledger"],
        result["checkpoint_after_one_ledger_written"],
    )
    assert (first["entries"], first["ledger_rows"]) == (LEDGERS, LEDGERS)
    assert (one["entries"], one["ledger_rows"]) == (1, 1)
    assert result["restart"]["memory_bytes_per_ledger"] < BYTES_PER_LEDGER_MAX
