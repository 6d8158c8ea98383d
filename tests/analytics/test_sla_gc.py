"""The `gc_reclaim` table on a hand-written story, against figures worked out by hand and
against the oracle (tests/support/sla_oracle/gc.py)."""

from __future__ import annotations

import pytest

from analytics.sla.gc import gc_reclaim
from analytics.sla.options import SlaOptions
from tests.support.sla import T0_MS, assert_same_rows, event, oracle_input, rows, spark_input
from tests.support.sla_oracle import gc as oracle

pytestmark = pytest.mark.slow


def at(s: float) -> int:
    return T0_MS + int(s * 1000)


def gc_dropped(s, ledger_id, bookie_id) -> dict:
    source = f"{bookie_id}.ledgerstore"
    return event("gc.ledger_deleted", at(s), source, ledger_id=ledger_id, bookie_id=bookie_id)


def entrylog_deleted(s, bookie_id, log_id, ledgers: dict[int, int]) -> dict:
    return event(
        "gc.entrylog_deleted",
        at(s),
        f"{bookie_id}.ledgerstore",
        bookie_id=bookie_id,
        dir="/data/0",
        log_id=log_id,
        bytes=sum(ledgers.values()),
        reason="no_live_ledger",
        ledgers={str(k): v for k, v in ledgers.items()},
        ledgers_truncated=False,
    )


def compacted(s, bookie_id, log_id, ledgers: dict[int, int]) -> dict:
    compaction = event(
        "gc.compacted",
        at(s),
        f"{bookie_id}.ledgerstore",
        bookie_id=bookie_id,
        dir="/data/0",
        log_id=log_id,
        new_log_id=log_id + 100,
        usage=0.1,
        entries=10,
        bytes_copied=50,
        bytes_reclaimed=sum(ledgers.values()),
        ledgers={str(k): v for k, v in ledgers.items()},
        ledgers_truncated=False,
    )
    compaction["data"]["kind"] = "minor"  # data's own "kind" (event() takes it as the event's)
    return compaction


# Ledger 20 deleted at 1 s: g1's GC drops it at 3 s and gets its bytes back from a deleted
# entry log (5 s) and a compaction (7 s); g2 drops it at 4 s but has reclaimed nothing yet; g3
# lists it but never reported dropping it (no row). Ledger 21's delete is before the input.
# Ledger 22 is dropped before --since (no row).
STORY = [
    event("ledger.deleted", at(1), "metadata", ledger_id=20, boot_id=None),
    event("ledger.deleted", at(0.2), "metadata", ledger_id=22, boot_id=None),
    gc_dropped(0.5, 22, "g1"),
    gc_dropped(2, 21, "g1"),
    gc_dropped(3, 20, "g1"),
    gc_dropped(4, 20, "g2"),
    entrylog_deleted(5, "g1", 1, {20: 300, 21: 100}),
    compacted(7, "g1", 2, {20: 200}),
    entrylog_deleted(8, "g3", 1, {20: 999}),
]


def test_gc_reclaim_over_entry_logs_and_a_compaction(spark):
    options = SlaOptions(end_ms=at(10), since_ms=at(1))
    table = rows(gc_reclaim(spark_input(spark, STORY), options))
    assert_same_rows(table, oracle.gc_reclaim(oracle_input(STORY), options))
    figures = {
        (r["ledger_id"], r["bookie_id"]): (
            r["deleted_at"],
            r["gc_deleted_at"],
            r["reclaimed_at"],
            r["bytes_reclaimed"],
            r["delete_to_gc_s"],
            r["delete_to_reclaim_s"],
        )
        for r in table
    }
    assert figures == {
        (20, "g1"): (at(1), at(3), at(7), 500, 2.0, 6.0),
        (20, "g2"): (at(1), at(4), None, 0, 3.0, None),
        (21, "g1"): (None, at(2), at(5), 100, None, None),
    }
