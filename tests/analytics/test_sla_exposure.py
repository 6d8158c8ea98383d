"""The `exposure` and `exposure_timeline` tables on hand-written stories, against figures
worked out by hand and against the per-entry oracle (tests/support/sla_oracle/exposure.py)."""

from __future__ import annotations

import json

import pytest

from analytics.sla.exposure import exposure, exposure_timeline
from analytics.sla.gc import gc_reclaim
from analytics.sla.job import table_input
from analytics.sla.options import SlaOptions
from analytics.sla.sources import FileSource, load_events
from analytics.synth import generate
from tests.support.sla import T0_MS, assert_same_rows, event, oracle_input, rows, spark_input
from tests.support.sla_oracle import exposure as oracle
from tests.support.sla_oracle import gc as gc_oracle

pytestmark = pytest.mark.slow


def at(s: float) -> int:
    return T0_MS + int(s * 1000)


def ack(s, ledger_id, first, last, ensemble, write_quorum, nbytes) -> dict:
    return event(
        "entries.acknowledged",
        at(s),
        ledger_id=ledger_id,
        count=last - first + 1,
        first_entry_id=first,
        last_entry_id=last,
        bytes=nbytes,
        ensemble=ensemble,
        ensemble_size=len(ensemble),
        write_quorum=write_quorum,
        ack_quorum=write_quorum,
        latency_us={"500": last - first + 1},
    )


def state(s, bookie_id, after, before="writable", kind="bookie.lost") -> dict:
    return event(kind, at(s), "auditor-1", bookie_id=bookie_id, before=before, after=after)


def repaired(s, ledger_id, first, last, src, dest="spare") -> dict:
    return event(
        "autorecovery.fragment_replicated",
        at(s),
        "replicator-1",
        ledger_id=ledger_id,
        worker_id="replicator-1",
        first_entry_id=first,
        last_entry_id=last,
        ensemble_index=0,
        bookie_src=src,
        bookie_dest=dest,
        entries=last - first + 1,
        bytes=0,
    )


def deleted(s, ledger_id) -> dict:
    return event("ledger.deleted", at(s), "metadata", ledger_id=ledger_id, boot_id=None)


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
        "entries.acknowledged", at(99.5), ledger_id=7, count=3, first_entry_id=0, last_entry_id=2
    ),
    state(100, "b4", "lost"),
    ack(105, 4, 4, 7, ["b4", "b8"], 1, 400),
    ack(106, 2, 20, 29, ["b6", "b5", "b7"], 3, 1000),  # the new ensemble: not exposed
    repaired(120, 4, 0, 7, "b4"),
    repaired(150, 2, 0, 9, "b4"),
    repaired(160, 2, 10, 19, "b4"),
]
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


# z3 lost, on no ensemble.
NOTHING = [ack(1, 90, 0, 3, ["z1", "z2"], 2, 40), state(2, "z3", "lost")]
# The stories share no bookie and no ledger: one Spark run checks them all.
STORIES = STRIPED + SEGMENTS + TWO_AT_ONCE + NOTHING
OPTIONS = SlaOptions(end_ms=at(200), since_ms=at(1))


COLUMNS = {
    "exposure": [
        ("bookie_id", "string"),
        ("lost_at", "timestamp"),
        ("ledgers_exposed", "bigint"),
        ("entries_exposed", "bigint"),
        ("bytes_exposed", "bigint"),
        ("entry_seconds", "double"),
        ("byte_seconds", "double"),
        ("worst_ledger_id", "bigint"),
        ("worst_first_entry_id", "bigint"),
        ("worst_last_entry_id", "bigint"),
        ("worst_exposed_s", "double"),
        ("repaired_at", "timestamp"),
        ("time_to_full_rereplication_s", "double"),
        ("still_exposed_entries", "bigint"),
    ],
    "exposure_timeline": [
        ("bookie_id", "string"),
        ("lost_at", "timestamp"),
        ("ts", "timestamp"),
        ("entries_exposed", "bigint"),
        ("bytes_exposed", "bigint"),
    ],
    "gc_reclaim": [
        ("ledger_id", "bigint"),
        ("bookie_id", "string"),
        ("deleted_at", "timestamp"),
        ("gc_deleted_at", "timestamp"),
        ("reclaimed_at", "timestamp"),
        ("bytes_reclaimed", "bigint"),
        ("delete_to_gc_s", "double"),
        ("delete_to_reclaim_s", "double"),
    ],
}


@pytest.fixture(scope="module")
def stories(spark) -> tuple[dict[str, dict], dict[str, list[tuple]]]:
    """Both tables of STORIES from Spark, checked equal to the oracle's and of the columns and
    types the report reads: the exposure rows by bookie, the timeline's (ts, entries, bytes)
    by bookie."""
    frame = spark_input(spark, STORIES, OPTIONS.until_ms)
    tables = {
        "exposure": exposure(frame, OPTIONS),
        "exposure_timeline": exposure_timeline(frame, OPTIONS),
        "gc_reclaim": gc_reclaim(frame, OPTIONS),
    }
    assert {name: df.dtypes for name, df in tables.items()} == COLUMNS
    table = rows(tables["exposure"])
    timeline = rows(tables["exposure_timeline"])
    dicts = oracle_input(STORIES, OPTIONS.until_ms)
    assert_same_rows(table, oracle.exposure(dicts, OPTIONS))
    assert_same_rows(timeline, oracle.exposure_timeline(dicts, OPTIONS))
    steps: dict[str, list[tuple]] = {}
    for r in sorted(timeline, key=lambda r: (r["bookie_id"], r["ts"])):
        assert r["lost_at"] == by_bookie(table)[r["bookie_id"]]["lost_at"]
        steps.setdefault(r["bookie_id"], []).append(
            (r["ts"], r["entries_exposed"], r["bytes_exposed"])
        )
    return by_bookie(table), steps


def by_bookie(table: list[dict]) -> dict[str, dict]:
    return {r["bookie_id"]: r for r in table}


def test_the_losses_in_the_period_once_each(stories):
    table, _ = stories
    # c4 was lost before --since; c1's repeated report is no new loss.
    assert {b: r["lost_at"] for b, r in table.items()} == {
        "b2": at(10),
        "b4": at(100),
        "c1": at(5),
        "c2": at(5),
        "z3": at(2),
    }


def test_striped_ensemble_repaired_in_fragments_and_deleted_ledgers(stories):
    table, steps = stories
    assert table["b2"] == {
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
    assert steps["b2"] == [(at(10), 8, 620), (at(20), 4, 220), (at(25), 2, 200), (at(30), 0, 0)]


def test_two_segments_late_acks_and_a_fragment_never_repaired(stories):
    table, steps = stories
    row = table["b4"]
    assert row["ledgers_exposed"] == 3
    assert row["entries_exposed"] == 20 + 5 + 4
    assert row["bytes_exposed"] == 2000 + 250 + 400
    assert row["entry_seconds"] == 10 * 50 + 10 * 60 + 5 * 100 + 2 * 20 + 2 * 15
    assert row["byte_seconds"] == 100 * (10 * 50 + 10 * 60) + 50 * 5 * 100 + 100 * (40 + 30)
    worst = [row[c] for c in ("worst_ledger_id", "worst_first_entry_id", "worst_last_entry_id")]
    assert worst == [3, 0, 4]
    assert row["worst_exposed_s"] == 100.0  # open: up to the end of the input
    assert row["repaired_at"] is None and row["time_to_full_rereplication_s"] is None
    assert row["still_exposed_entries"] == 5
    assert steps["b4"] == [
        (at(100), 27, 2450),
        (at(105), 29, 2650),
        (at(120), 25, 2250),
        (at(150), 15, 1250),
        (at(160), 5, 250),
    ]


def test_two_losses_at_once(stories):
    table, steps = stories
    summary = {
        b: (
            table[b]["entries_exposed"],
            table[b]["entry_seconds"],
            table[b]["worst_first_entry_id"],
            table[b]["worst_last_entry_id"],
            table[b]["time_to_full_rereplication_s"],
        )
        for b in ("c1", "c2")
    }
    assert summary == {"c1": (4, 12.0, 0, 5, 3.0), "c2": (4, 16.0, 0, 4, 4.0)}
    assert steps["c1"] == [(at(5), 4, 400), (at(8), 0, 0)]
    assert steps["c2"] == [(at(5), 4, 400), (at(9), 0, 0)]


def test_a_loss_that_exposed_nothing(stories):
    table, steps = stories
    row = table["z3"]
    assert (row["entries_exposed"], row["worst_ledger_id"], row["repaired_at"]) == (0, None, at(2))
    assert steps["z3"] == [(at(2), 0, 0)]


def test_exposure_and_gc_reclaim_equal_their_oracles_on_synthetic_events(spark, tmp_path):
    """~20k events of the generator's story (three bookies lost, each re-replicated ledger by
    ledger; deletes, GC runs reclaiming over several logs), read as the job reads files, cut
    by --since after the first loss's start... and --until in the middle of the second loss's
    re-replication, so that exposures are both closed and open."""
    generate(20_000, tmp_path, seed=7, bookies=6, ledgers=20, files=3)
    lines = [
        line
        for path in sorted(tmp_path.glob("events-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    events = [json.loads(line) for line in lines]
    start_ms = min(e["ts_ms"] for e in events)
    lost_ms = sorted(e["ts_ms"] for e in events if e["kind"] == "bookie.lost")
    assert len(lost_ms) == 3
    # The second loss's repairs are half done at --until; the third loss is after it.
    repairs = sorted(
        e["ts_ms"]
        for e in events
        if e["kind"] == "autorecovery.fragment_replicated" and lost_ms[1] <= e["ts_ms"] < lost_ms[2]
    )
    until_ms = repairs[len(repairs) // 2]
    options = SlaOptions(end_ms=until_ms, since_ms=start_ms + 1000, until_ms=until_ms)
    frame = table_input(load_events(spark, FileSource(str(tmp_path))), until_ms).cache()
    dicts = oracle_input(events, until_ms)

    table = rows(exposure(frame, options))
    assert_same_rows(table, oracle.exposure(dicts, options))
    first, second = sorted(table, key=lambda r: r["lost_at"])
    assert first["entries_exposed"] > 0 and first["still_exposed_entries"] == 0
    assert first["repaired_at"] is not None
    assert 0 < second["still_exposed_entries"] < second["entries_exposed"]
    assert second["repaired_at"] is None
    assert_same_rows(
        rows(exposure_timeline(frame, options)), oracle.exposure_timeline(dicts, options)
    )

    reclaim = rows(gc_reclaim(frame, options))
    assert_same_rows(reclaim, gc_oracle.gc_reclaim(dicts, options))
    assert any(r["reclaimed_at"] is None for r in reclaim)
    assert any(r["bytes_reclaimed"] > 0 and r["delete_to_reclaim_s"] > 0 for r in reclaim)
    frame.unpersist()
