"""TABLES-A's SLA tables on hand-written event stories: each table's Spark rows equal its
oracle's (tests/support/sla_oracle), and the figures that matter are also checked by hand, so
that an oracle that agrees with a wrong Spark table is caught too."""

from __future__ import annotations

import pytest

from analytics.sla.availability import bookie_availability
from analytics.sla.completeness import completeness
from analytics.sla.ensembles import ensemble_changes
from analytics.sla.latency import ack_latency
from analytics.sla.options import SlaOptions
from analytics.sla.recoveries import recoveries
from tests.support import sla_oracle
from tests.support.sla import T0_MS, assert_same_rows, event, oracle_input, rows, spark_input
from tests.support.sla_oracle.availability import bookie_availability as availability_oracle
from tests.support.sla_oracle.completeness import completeness as completeness_oracle
from tests.support.sla_oracle.ensembles import ensemble_changes as ensembles_oracle
from tests.support.sla_oracle.latency import ack_latency as latency_oracle
from tests.support.sla_oracle.recoveries import recoveries as recoveries_oracle

pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000
S = 1000  # a second, in ms

COLUMNS = {
    "ack_latency": [
        "window_start", "window_s", "group", "ensemble_size", "write_quorum", "ack_quorum",
        "bookie_id", "count", "p50_ms", "p99_ms", "p999_ms", "target_ms", "within_target",
        "attainment", "bytes",
    ],
    "recoveries": [
        "ledger_id", "fenced_at", "bookies_fenced", "recovery_started_at", "closed_at",
        "fence_to_close_s", "recovered_entries", "last_entry_id",
    ],
    "ensemble_changes": [
        "window_start", "window_s", "bookie_id", "replaced_out", "replaced_in", "ledgers",
    ],
    "bookie_availability": ["bookie_id", "state", "start", "end", "open", "duration_s"],
    "completeness": [
        "source", "boot_id", "events", "first_seq", "last_seq", "missing", "dropped_reported",
        "completeness",
    ],
}  # fmt: skip
TABLES = {
    "ack_latency": (ack_latency, latency_oracle),
    "recoveries": (recoveries, recoveries_oracle),
    "ensemble_changes": (ensemble_changes, ensembles_oracle),
    "bookie_availability": (bookie_availability, availability_oracle),
    "completeness": (completeness, completeness_oracle),
}
assert sla_oracle.__doc__  # the oracles' package, documented


def both(spark, name: str, events: list, options: SlaOptions) -> list[dict]:
    """The table's Spark rows, checked equal to its oracle's; the oracle's rows."""
    function, oracle = TABLES[name]
    table = function(spark_input(spark, events, options.until_ms), options)
    assert table.columns == COLUMNS[name]
    dicts = [e for e in events if isinstance(e, dict)]
    expected = oracle(oracle_input(dicts, options.until_ms), options)
    assert_same_rows(rows(table), expected)
    return expected


def by(rows_: list[dict], **match) -> dict:
    found = [r for r in rows_ if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, rows_)
    return found[0]


def test_every_table_of_an_empty_input_is_empty_with_its_columns(spark):
    for name in TABLES:
        assert both(spark, name, [], SlaOptions(end_ms=T0_MS)) == []


def acknowledged(ts_ms, ledger_id, ensemble, shape, latency_us, bytes_, **kw) -> dict:
    e, qw, qa = shape
    return event(
        "entries.acknowledged",
        ts_ms,
        ledger_id=ledger_id,
        count=sum(latency_us.values()),
        bytes=bytes_,
        ensemble=ensemble,
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=qa,
        latency_us=latency_us,
        **kw,
    )


def latency_story() -> list:
    one = acknowledged(T0_MS + 10 * S, 1, ["b1", "b2", "b3"], (3, 3, 2), {"2000": 1}, 10)
    # The next hour: 1000 entries whose nearest ranks fall on bucket boundaries: the 500th is
    # the last at 100 us, the 990th the last at 1,000 us, the 999th the one at 10,000 us (the
    # target, which counts as within it).
    a = acknowledged(T0_MS + HOUR_MS + 5 * S, 2, ["b1", "b2", "b3"], (3, 3, 2),
                     {"100": 500, "1000": 490}, 1000)  # fmt: skip
    b = acknowledged(T0_MS + HOUR_MS + 6 * S, 3, ["b2", "b3", "b4"], (3, 2, 2),
                     {"5000": 8, "10000": 1, "20000": 1}, 50)  # fmt: skip
    old_style = event("entries.acknowledged", T0_MS + HOUR_MS + 7 * S, ledger_id=4, count=5,
                      latency_ms_p50=1, latency_ms_p99=2, latency_ms_max=3)  # fmt: skip
    unknown = event("entries.someday", T0_MS + HOUR_MS + 8 * S, ledger_id=2,
                    latency_us={"1": 100})  # fmt: skip
    return [one, a, b, dict(b), old_style, unknown, b"not json", b'{"schema_version": "x"}']


def test_ack_latency_percentiles_on_rank_boundaries_per_group_and_window(spark):
    story = latency_story()
    table = both(spark, "ack_latency", story, SlaOptions(end_ms=T0_MS + 2 * HOUR_MS))
    w0, w1 = T0_MS, T0_MS + HOUR_MS
    # A window with one entry: every percentile is that entry's bucket.
    assert by(table, window_start=w0, group="all") == {
        "window_start": w0, "window_s": 3600, "group": "all", "ensemble_size": None,
        "write_quorum": None, "ack_quorum": None, "bookie_id": None, "count": 1,
        "p50_ms": 2.0, "p99_ms": 2.0, "p999_ms": 2.0, "target_ms": 10.0, "within_target": 1,
        "attainment": 1.0, "bytes": 10,
    }  # fmt: skip
    every = by(table, window_start=w1, group="all")
    assert (every["count"], every["p50_ms"], every["p99_ms"], every["p999_ms"]) == (
        1000, 0.1, 1.0, 10.0,
    )  # fmt: skip
    assert (every["within_target"], every["attainment"], every["bytes"]) == (999, 0.999, 1050)
    wide = by(table, window_start=w1, group="shape", write_quorum=3)
    assert (wide["count"], wide["p50_ms"], wide["p99_ms"], wide["p999_ms"]) == (990, 0.1, 1.0, 1.0)
    narrow = by(table, window_start=w1, group="shape", write_quorum=2)
    assert (narrow["count"], narrow["p50_ms"], narrow["p99_ms"], narrow["attainment"]) == (
        10, 5.0, 20.0, 0.9,
    )  # fmt: skip
    # Per bookie: the entries of the events whose ensemble held it.
    assert by(table, window_start=w1, bookie_id="b1")["count"] == 990
    assert by(table, window_start=w1, bookie_id="b2")["count"] == 1000
    assert by(table, window_start=w1, bookie_id="b4")["bytes"] == 50
    assert len(table) == 5 + 7  # the first hour: all, 1 shape, 3 bookies; the next: 1, 2, 4


def test_ack_latency_counts_only_the_period_and_its_target(spark):
    story = latency_story()
    options = SlaOptions(end_ms=T0_MS + 2 * HOUR_MS, since_ms=T0_MS + HOUR_MS, target_ms=5)
    table = both(spark, "ack_latency", story, options)
    assert {r["window_start"] for r in table} == {T0_MS + HOUR_MS}
    assert by(table, group="all")["within_target"] == 998  # 10,000 us is beyond 5 ms
    # Until the second hour: the first one only (events from `until` are not input).
    table = both(
        spark, "ack_latency", story, SlaOptions(end_ms=T0_MS + HOUR_MS, until_ms=T0_MS + HOUR_MS)
    )
    assert {r["window_start"] for r in table} == {T0_MS}


def test_recoveries_from_first_fence_to_close_and_one_never_closed(spark):
    fence = "ledger.fenced"
    story = [
        # Ledger 10: fenced on two bookies (one fence event duplicated), recovered, closed.
        first_fence := event(fence, T0_MS + 1000, "bookie-1.journal", ledger_id=10,
                             bookie_id="b1", lac=39, last_entry_id=39),
        dict(first_fence),
        event(fence, T0_MS + 1200, "bookie-2.journal", ledger_id=10, bookie_id="b2", lac=39,
              last_entry_id=41),
        event("ledger.recovered", T0_MS + 3000, ledger_id=10, last_entry_id=41,
              recovered_entries=2, started_ts_ms=T0_MS + 900, duration_ms=2100),
        event("ledger.closed", T0_MS + 3100, "metadata", boot_id=None, ledger_id=10, version=4,
              state="CLOSED", previous_state="IN_RECOVERY", last_entry_id=41, length=4200),
        # Ledger 11: fenced, never recovered nor closed by the end.
        event(fence, T0_MS + 5000, "bookie-3.journal", ledger_id=11, bookie_id="b3", lac=-1,
              last_entry_id=-1),
        # Ledger 12: fenced before the period: not a row, though it closes in the period.
        event(fence, T0_MS - 10_000, "bookie-1.journal", ledger_id=12, bookie_id="b1", lac=3,
              last_entry_id=3),
        event("ledger.closed", T0_MS + 100, "metadata", boot_id=None, ledger_id=12,
              state="CLOSED", previous_state="IN_RECOVERY", last_entry_id=3),
        # Ledger 13: closed by its writer: no fence, no row.
        event("ledger.closed", T0_MS + 200, "metadata", boot_id=None, ledger_id=13,
              state="CLOSED", previous_state="OPEN", last_entry_id=7),
        # Ledger 14: nothing to recover (the event comes all the same), state in lower case.
        event(fence, T0_MS + 7000, "bookie-2.journal", ledger_id=14, bookie_id="b2", lac=-1,
              last_entry_id=-1),
        event("ledger.recovered", T0_MS + 7300, ledger_id=14, last_entry_id=-1,
              recovered_entries=0, started_ts_ms=T0_MS + 6990, duration_ms=310),
        event("ledger.closed", T0_MS + 7400, "metadata", boot_id=None, ledger_id=14,
              state="closed", previous_state="in_recovery", last_entry_id=-1),
    ]  # fmt: skip
    table = both(spark, "recoveries", story, SlaOptions(end_ms=T0_MS + 8000, since_ms=T0_MS))
    assert sorted(r["ledger_id"] for r in table) == [10, 11, 14]
    assert by(table, ledger_id=10) == {
        "ledger_id": 10, "fenced_at": T0_MS + 1000, "bookies_fenced": 2,
        "recovery_started_at": T0_MS + 900, "closed_at": T0_MS + 3100, "fence_to_close_s": 2.1,
        "recovered_entries": 2, "last_entry_id": 41,
    }  # fmt: skip
    assert by(table, ledger_id=11) == {
        "ledger_id": 11, "fenced_at": T0_MS + 5000, "bookies_fenced": 1,
        "recovery_started_at": None, "closed_at": None, "fence_to_close_s": None,
        "recovered_entries": None, "last_entry_id": None,
    }  # fmt: skip
    assert by(table, ledger_id=14)["fence_to_close_s"] == 0.4


def test_ensemble_changes_per_bookie_and_window(spark):
    def changed(ts_ms, ledger_id, *replaced):
        replaced_ = [{"index": i, "old": old, "new": new} for i, old, new in replaced]
        return event(
            "ledger.ensemble_changed",
            ts_ms,
            ledger_id=ledger_id,
            first_entry_id=5,
            version=3,
            replaced=replaced_,
        )

    story = [
        changed(T0_MS - 1000, 9, (0, "b9", "b8")),  # before the period
        changed(T0_MS + 1000, 1, (1, "b2", "b5")),
        changed(T0_MS + 2000, 2, (1, "b2", "b5"), (0, "b1", "b6")),
        changed(T0_MS + HOUR_MS + 1000, 1, (1, "b5", "b2")),
        event("ledger.updated", T0_MS + 3000, "metadata", boot_id=None, ledger_id=1,
              ensemble_changed=True, segments=[]),  # re-replication: not a writer's change
    ]  # fmt: skip
    table = both(
        spark, "ensemble_changes", story, SlaOptions(end_ms=T0_MS + 2 * HOUR_MS, since_ms=T0_MS)
    )
    got = {
        (r["window_start"], r["bookie_id"]): (r["replaced_out"], r["replaced_in"], r["ledgers"])
        for r in table
    }
    assert got == {
        (T0_MS, "b2"): (2, 0, 2),
        (T0_MS, "b5"): (0, 2, 2),
        (T0_MS, "b1"): (1, 0, 1),
        (T0_MS, "b6"): (0, 1, 1),
        (T0_MS + HOUR_MS, "b5"): (1, 0, 1),
        (T0_MS + HOUR_MS, "b2"): (0, 1, 1),
    }


def test_bookie_availability_intervals_of_a_flapping_bookie_clipped_and_open_at_the_end(spark):
    def registered(ts_ms, bookie_id, state):
        return event("bookie.registered", ts_ms, "metadata", boot_id=None, bookie_id=bookie_id,
                     state=state, previous_state=None, lease_expires_at=ts_ms + 10_000)  # fmt: skip

    def audited(kind, ts_ms, bookie_id, after):
        return event(kind, ts_ms, "auditor", bookie_id=bookie_id, before=None, after=after)

    story = [
        registered(T0_MS - 100 * S, "b1", "writable"),
        audited("bookie.lost", T0_MS + 10 * S, "b1", "lost"),
        registered(T0_MS + 20 * S, "b1", "writable"),
        audited("bookie.available", T0_MS + 21 * S, "b1", "writable"),  # the same state: merged
        audited("bookie.readonly", T0_MS + 30 * S, "b1", "readonly"),
        audited("bookie.lost", T0_MS + 40 * S, "b1", "lost"),
        audited("bookie.available", T0_MS + 41 * S, "b1", "writable"),
        audited("bookie.lost", T0_MS + 42 * S, "b1", "lost"),
        # The journal's own disk check: not availability.
        event("bookie.readonly", T0_MS + 50 * S, "bookie-1.journal", bookie_id="b1",
              disk_usage=0.97),
        # b2 went before the period: one interval left, unregistered through the period.
        registered(T0_MS - 200 * S, "b2", "writable"),
        audited("bookie.lost", T0_MS - 150 * S, "b2", "lost"),
        event("bookie.unregistered", T0_MS - 100 * S, "metadata", boot_id=None, bookie_id="b2"),
        registered(T0_MS + 5 * S, "b3", "writable"),
    ]  # fmt: skip
    options = SlaOptions(end_ms=T0_MS + 60 * S, since_ms=T0_MS)
    table = both(spark, "bookie_availability", story, options)

    def intervals(bookie_id):
        found = sorted((r for r in table if r["bookie_id"] == bookie_id), key=lambda r: r["start"])
        return [
            ((r["start"] - T0_MS) // S, (r["end"] - T0_MS) // S, r["state"], r["open"])
            for r in found
        ]

    assert intervals("b1") == [
        (0, 10, "up", False),
        (10, 20, "lost", False),
        (20, 30, "up", False),
        (30, 40, "read_only", False),
        (40, 41, "lost", False),
        (41, 42, "up", False),
        (42, 60, "lost", True),
    ]
    assert intervals("b2") == [(0, 60, "unregistered", True)]
    assert intervals("b3") == [(5, 60, "up", True)]
    assert by(table, bookie_id="b1", open=True)["duration_s"] == 18.0


def test_completeness_per_publisher_instance(spark):
    gateway = [event("ledger.created", T0_MS + i, seq=i) for i in (1, 2, 4, 5)]  # 3 was lost
    dropped = event("events.dropped", T0_MS + 6, seq=6, dropped=1,
                    by_kind={"ledger.created": 1}, first_seq=3, last_seq=3)  # fmt: skip
    story = [
        *gateway,
        dict(gateway[0]),  # stored twice: one event
        dropped,
        event("ledger.created", T0_MS - 10 * S, boot_id="boot-2", seq=1),  # before `since`: counted
        event("ledger.created", T0_MS + 7, boot_id="boot-2", seq=2),
        event("ledger.created", T0_MS + 8, "metadata", boot_id=None),
        event("ledger.deleted", T0_MS + 9, "metadata", boot_id=None),
    ]
    table = both(spark, "completeness", story, SlaOptions(end_ms=T0_MS + 10, since_ms=T0_MS))
    assert by(table, boot_id="boot-1") == {
        "source": "gateway", "boot_id": "boot-1", "events": 5, "first_seq": 1, "last_seq": 6,
        "missing": 1, "dropped_reported": 1, "completeness": 5 / 6,
    }  # fmt: skip
    assert by(table, boot_id="boot-2")["completeness"] == 1.0
    assert by(table, source="metadata") == {
        "source": "metadata", "boot_id": None, "events": 2, "first_seq": None, "last_seq": None,
        "missing": None, "dropped_reported": 0, "completeness": None,
    }  # fmt: skip
