"""The `exposure` and `exposure_timeline` tables on hand-written stories, against figures
worked out by hand and against the per-entry oracle (tests/support/sla_oracle/exposure.py)."""

from __future__ import annotations

import pytest

from analytics.sla.exposure import exposure, exposure_timeline
from analytics.sla.options import SlaOptions
from tests.support.sla_frames import T0_MS, assert_same_rows, collect, event, events_frame
from tests.support.sla_oracle import exposure as oracle

pytestmark = pytest.mark.slow

INCIDENT = ["bookie_id", "lost_at"]


def at(s: float) -> int:
    return T0_MS + int(s * 1000)


def ack(s, ledger_id, first, last, ensemble, write_quorum, nbytes) -> dict:
    data = {
        "count": last - first + 1,
        "first_entry_id": first,
        "last_entry_id": last,
        "bytes": nbytes,
        "ensemble": ensemble,
        "ensemble_size": len(ensemble),
        "write_quorum": write_quorum,
        "ack_quorum": write_quorum,
        "latency_us": {"500": last - first + 1},
    }
    return event("entries.acknowledged", at(s), "gateway", data, ledger_id=ledger_id)


def state(s, bookie_id, after, before="writable", kind="bookie.lost") -> dict:
    data = {"before": before, "after": after}
    return event(kind, at(s), "auditor-1", data, bookie_id=bookie_id)


def repaired(s, ledger_id, first, last, src, dest="spare") -> dict:
    data = {
        "worker_id": "replicator-1",
        "first_entry_id": first,
        "last_entry_id": last,
        "ensemble_index": 0,
        "bookie_src": src,
        "bookie_dest": dest,
        "entries": last - first + 1,
        "bytes": 0,
    }
    return event(
        "autorecovery.fragment_replicated", at(s), "replicator-1", data, ledger_id=ledger_id
    )


def deleted(s, ledger_id) -> dict:
    return event("ledger.deleted", at(s), "metadata", {}, ledger_id=ledger_id)


# b2 (index 1 of [b1, b2, b3], Qw 2: entries 0, 1, 3, 4, 6, 7 of ledger 1) lost at 10 s and
# repaired in two fragments; ledger 5 deleted while exposed; ledger 6 deleted before the loss.
STRIPED = [
    ack(1, 1, 0, 8, ["b1", "b2", "b3"], 2, 900),
    ack(2, 5, 0, 1, ["b1", "b2"], 2, 20),
    ack(3, 6, 0, 2, ["b2", "b3"], 2, 30),
    deleted(5, 6),
    state(10, "b2", "lost"),
    repaired(20, 1, 0, 4, "b2"),
    deleted(25, 5),
    repaired(30, 1, 5, 8, "b2"),
    repaired(31, 1, 0, 8, "b1"),  # another bookie's repair: not b2's
]
# b4 lost at 100 s: ledger 2 in two segments both holding b4 (Qw = E: every entry), each
# repaired; ledger 3 never repaired; ledger 4 (Qw 1: its even entries) acked to the old
# ensemble after the loss too; ledger 7's ack event names no ensemble.
SEGMENTS = [
    ack(50, 3, 0, 4, ["b4", "b5"], 2, 250),
    ack(90, 2, 0, 9, ["b4", "b5", "b6"], 3, 1000),
    ack(95, 2, 10, 19, ["b6", "b5", "b4"], 3, 1000),
    ack(99, 4, 0, 3, ["b4", "b8"], 1, 400),
    # An ack event from before `ensemble` was published: nothing to attribute, not exposed.
    event(
        "entries.acknowledged",
        at(99.5),
        "gateway",
        {"count": 3, "first_entry_id": 0, "last_entry_id": 2},
        ledger_id=7,
    ),
    state(100, "b4", "lost"),
    ack(105, 4, 4, 7, ["b4", "b8"], 1, 400),
    ack(106, 2, 20, 29, ["b6", "b5", "b7"], 3, 1000),  # the new ensemble: not exposed
    repaired(120, 4, 0, 7, "b4"),
    repaired(150, 2, 0, 9, "b4"),
    repaired(160, 2, 10, 19, "b4"),
]
SEGMENTS_END_MS = at(200)
# c1 (index 0: entries 0, 2, 3, 5) and c2 (index 1: entries 0, 1, 3, 4) of ledger 10 lost at
# once; c4 lost before --since; c1's loss reported again by a new auditor leader.
TWO_AT_ONCE = [
    state(0.5, "c4", "lost"),
    ack(0.1, 11, 0, 1, ["c4", "c3"], 2, 20),
    ack(1, 10, 0, 5, ["c1", "c2", "c3"], 2, 600),
    state(5, "c1", "lost"),
    state(5, "c2", "lost"),
    state(6, "c1", "lost", before=None),
    repaired(8, 10, 0, 5, "c1"),
    repaired(9, 10, 0, 5, "c2"),
]


def check(spark, events: list[dict], options: SlaOptions) -> tuple[list[dict], list[dict]]:
    """Both tables from Spark, checked against the oracle's."""
    frame = events_frame(spark, events)
    table = collect(exposure(frame, options))
    timeline = collect(exposure_timeline(frame, options))
    assert_same_rows(table, oracle.exposure(events, options), INCIDENT)
    assert_same_rows(timeline, oracle.exposure_timeline(events, options), [*INCIDENT, "ts"])
    return table, timeline


def test_striped_ensemble_repaired_in_fragments_and_deleted_ledgers(spark):
    table, timeline = check(spark, STRIPED, SlaOptions(end_ms=at(40)))
    assert table == [
        {
            "bookie_id": "b2",
            "lost_at": at(10),
            "ledgers_exposed": 2,
            "entries_exposed": 8,
            "bytes_exposed": 620,
            "entry_seconds": 4 * 10 + 2 * 20 + 2 * 15.0,
            "byte_seconds": 100 * (4 * 10 + 2 * 20) + 10 * 2 * 15.0,
            "worst_ledger_id": 1,
            "worst_first_entry_id": 6,
            "worst_last_entry_id": 7,
            "worst_exposed_s": 20.0,
            "repaired_at": at(30),
            "time_to_full_rereplication_s": 20.0,
            "still_exposed_entries": 0,
        }
    ]
    assert [(r["ts"], r["entries_exposed"], r["bytes_exposed"]) for r in timeline] == [
        (at(10), 8, 620),
        (at(20), 4, 220),
        (at(25), 2, 200),
        (at(30), 0, 0),
    ]


def test_two_segments_late_acks_and_a_fragment_never_repaired(spark):
    table, timeline = check(spark, SEGMENTS, SlaOptions(end_ms=SEGMENTS_END_MS))
    [row] = table
    assert row["ledgers_exposed"] == 3
    assert row["entries_exposed"] == 20 + 5 + 4
    assert row["bytes_exposed"] == 2000 + 250 + 400
    assert row["entry_seconds"] == 10 * 50 + 10 * 60 + 5 * 100 + 2 * 20 + 2 * 15
    assert row["byte_seconds"] == 100 * (10 * 50 + 10 * 60) + 50 * 5 * 100 + 100 * (40 + 30)
    worst = [row[c] for c in ("worst_ledger_id", "worst_first_entry_id", "worst_last_entry_id")]
    assert worst == [3, 0, 4]
    assert row["worst_exposed_s"] == 100.0
    assert row["repaired_at"] is None and row["time_to_full_rereplication_s"] is None
    assert row["still_exposed_entries"] == 5
    assert [(r["ts"], r["entries_exposed"], r["bytes_exposed"]) for r in timeline] == [
        (at(100), 27, 2450),
        (at(105), 29, 2650),
        (at(120), 25, 2250),
        (at(150), 15, 1250),
        (at(160), 5, 250),
    ]


def test_two_losses_at_once_and_one_before_the_period(spark):
    options = SlaOptions(end_ms=at(20), since_ms=at(1))
    table, timeline = check(spark, TWO_AT_ONCE, options)
    summary = {
        r["bookie_id"]: (
            r["lost_at"],
            r["entries_exposed"],
            r["entry_seconds"],
            r["worst_first_entry_id"],
            r["worst_last_entry_id"],
            r["time_to_full_rereplication_s"],
        )
        for r in table
    }
    assert summary == {
        "c1": (at(5), 4, 12.0, 0, 5, 3.0),
        "c2": (at(5), 4, 16.0, 0, 4, 4.0),
    }
    assert len(timeline) == 4


def test_a_loss_that_exposed_nothing(spark):
    events = [ack(1, 1, 0, 3, ["b1", "b2"], 2, 40), state(2, "b3", "lost")]
    table, timeline = check(spark, events, SlaOptions(end_ms=at(5)))
    [row] = table
    assert (row["entries_exposed"], row["worst_ledger_id"], row["repaired_at"]) == (0, None, at(2))
    assert timeline == [
        {"bookie_id": "b3", "lost_at": at(2), "ts": at(2), "entries_exposed": 0, "bytes_exposed": 0}
    ]
