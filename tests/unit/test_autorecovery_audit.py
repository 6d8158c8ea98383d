"""The auditor's pure decisions (shared.autorecovery): tables and scenarios."""

from __future__ import annotations

import pytest

from shared.autorecovery import (
    FragmentCheck,
    LostBookieAudit,
    MarkDecision,
    MarkReason,
    PlacementProblem,
    PlacementViolation,
    ReadOutcome,
    StoredFragment,
    bookies_to_mark,
    corrupt_entry_mark,
    fragments_on,
    mark_decisions,
    missing_bookies,
    placement_violations,
    plan_check_all,
    plan_replicas_check,
    read_outcome,
)
from shared.digest import DigestType
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.protocol.placement import PlacementPolicy, PlacementRules
from shared.protocol.replication import segment_range, stored_entry_ids
from shared.quorum import write_set
from shared.status import BookieStatus


def ledger(
    segments: list[tuple[int, list[str]]],
    state: LedgerState = LedgerState.CLOSED,
    last_entry_id: int | None = None,
    write_quorum: int = 2,
    ledger_id: int = 7,
) -> LedgerMetadata:
    size = len(segments[0][1])
    return LedgerMetadata(
        ledger_id=ledger_id,
        state=state,
        ensemble_size=size,
        write_quorum=write_quorum,
        ack_quorum=write_quorum,
        digest=DigestType.CRC32C,
        last_entry_id=last_entry_id,
        segments=[Segment(first_entry_id=f, bookies=b) for f, b in segments],
    )


# -- segments and fragments (their rules are shared.protocol.replication's, used here) ----

ABC = ["a", "b", "c"]
BCD = ["b", "c", "d"]


@pytest.mark.parametrize(
    ("metadata", "index", "expected"),
    [
        (ledger([(0, ABC)], last_entry_id=9), 0, (0, 9)),
        (ledger([(0, ABC), (5, BCD)], last_entry_id=9), 0, (0, 4)),
        (ledger([(0, ABC), (5, BCD)], last_entry_id=9), 1, (5, 9)),
        (ledger([(0, ABC)], last_entry_id=None), 0, (0, -1)),  # closed empty
        (ledger([(0, ABC), (0, BCD)], last_entry_id=3), 0, (0, -1)),  # replaced at once
        (ledger([(0, ABC), (5, BCD)], LedgerState.OPEN), 1, (5, None)),
        (ledger([(0, ABC), (5, BCD)], LedgerState.IN_RECOVERY), 0, (0, 4)),
        # Closed before the next segment's first entry: nothing past the last entry.
        (ledger([(0, ABC), (5, BCD), (9, ABC)], last_entry_id=6), 1, (5, 6)),
        (ledger([(0, ABC), (5, BCD), (9, ABC)], last_entry_id=6), 2, (9, 6)),
        (ledger([(0, ABC), (5, BCD), (9, ABC)], LedgerState.OPEN), 1, (5, 8)),
    ],
)
def test_segment_range(metadata: LedgerMetadata, index: int, expected: tuple) -> None:
    assert segment_range(metadata, index) == expected


@pytest.mark.parametrize("size,qw", [(3, 2), (3, 3), (5, 2), (4, 1), (1, 1)])
@pytest.mark.parametrize("first,last", [(0, 0), (0, 1), (3, 11), (7, 7), (2, 40)])
def test_stored_entries_are_the_write_set_of_each_entry(size, qw, first, last) -> None:
    metadata = ledger([(0, [f"b{i}" for i in range(size)])], last_entry_id=last, write_quorum=qw)
    for index in range(size):
        expected = [e for e in range(first, last + 1) if index in write_set(e, metadata.quorum)]
        assert list(stored_entry_ids(metadata.quorum, first, last, index)) == expected
        got = [f for f in fragments_on(metadata, [f"b{index}"])]
        on_whole = [e for e in range(0, last + 1) if index in write_set(e, metadata.quorum)]
        if on_whole:
            (fragment,) = got
            assert (fragment.first_entry_id, fragment.last_entry_id) == (on_whole[0], on_whole[-1])
        else:
            assert got == []


def test_fragments_on_name_segment_and_ensemble_index() -> None:
    metadata = ledger([(0, ABC), (5, BCD)], last_entry_id=9)
    assert fragments_on(metadata, ["b"]) == [
        StoredFragment(7, 0, 0, 0, 4, 1, "b"),  # index 1 holds entries 0, 1, 3, 4
        StoredFragment(7, 1, 5, 5, 9, 0, "b"),
    ]
    assert fragments_on(metadata, ["a", "d"]) == [
        StoredFragment(7, 0, 0, 0, 3, 0, "a"),  # index 0 holds 0, 2, 3
        StoredFragment(7, 1, 5, 5, 8, 2, "d"),  # index 2 holds 5, 7, 8
    ]


@pytest.mark.parametrize(
    ("metadata", "bookies", "expected"),
    [
        # A lost bookie of any segment holding its entries is named.
        (ledger([(0, ABC), (5, BCD)], last_entry_id=9), {"a"}, ["a"]),
        (ledger([(0, ABC), (5, BCD)], last_entry_id=9), {"a", "d", "x"}, ["a", "d"]),
        (ledger([(0, ABC)], last_entry_id=9), {"x"}, []),
        # A bookie named where it holds no entry of a closed ledger is named too (as
        # BookKeeper's Auditor): the replicator replaces it there with nothing to copy.
        (ledger([(0, ABC), (0, BCD)], last_entry_id=3), {"a"}, ["a"]),
        (ledger([(0, ABC)], last_entry_id=None), {"a"}, ["a"]),
        # One entry, E=3, Qw=2: index 2 ("c") holds nothing, and is named all the same.
        (ledger([(0, ABC)], last_entry_id=0), {"c"}, ["c"]),
        (ledger([(0, ABC)], last_entry_id=0), {"b", "c"}, ["b", "c"]),
        # An open ledger's last segment may hold entries: it counts.
        (ledger([(0, ABC)], LedgerState.OPEN), {"c"}, ["c"]),
        (ledger([(0, ABC), (4, BCD)], LedgerState.IN_RECOVERY), {"d"}, ["d"]),
    ],
)
def test_bookies_to_mark(metadata: LedgerMetadata, bookies: set, expected: list) -> None:
    assert bookies_to_mark(metadata, bookies) == expected


# -- lost-bookie delay --------------------------------------------------------------------


def look(audit: LostBookieAudit, now: float, alive: str, delay: float, lost: str = "") -> frozenset:
    return audit.observe(now, set(alive), set(lost), delay)


def test_no_delay_audits_a_lost_bookie_at_once() -> None:
    audit = LostBookieAudit()
    assert look(audit, 0, "abc", 0) == frozenset()
    assert look(audit, 1, "ab", 0) == {"c"}
    assert look(audit, 2, "ab", 0) == frozenset()  # audited once, not at every look


def test_delay_waits_then_audits() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abc", 10)
    assert look(audit, 1, "ab", 10) == frozenset()
    assert audit.due_at_s == 11
    assert look(audit, 10.9, "ab", 10) == frozenset()
    assert look(audit, 11, "ab", 10) == {"c"}
    assert look(audit, 12, "ab", 10) == frozenset()


def test_the_bookie_returning_within_the_delay_cancels_the_audit() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abc", 10)
    look(audit, 1, "ab", 10)
    assert look(audit, 5, "abc", 10) == frozenset()
    assert audit.due_at_s is None and audit.waiting == set()
    assert look(audit, 30, "abc", 10) == frozenset()
    # Lost again later: a new wait of its own.
    assert look(audit, 31, "ab", 10) == frozenset()
    assert audit.due_at_s == 41


def test_a_second_bookie_lost_while_waiting_audits_both_now() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abcd", 60)
    assert look(audit, 1, "abc", 60) == frozenset()
    assert look(audit, 2, "ab", 60) == {"c", "d"}
    assert audit.due_at_s is None
    assert look(audit, 100, "ab", 60) == frozenset()  # not waited for again


def test_two_bookies_lost_at_one_look_are_audited_now() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abcd", 60)
    assert look(audit, 1, "ab", 60) == {"c", "d"}


def test_a_new_delay_reschedules_the_waiting_audit_from_now() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abc", 60)
    look(audit, 1, "ab", 60)
    assert look(audit, 5, "ab", 10) == frozenset()
    assert audit.due_at_s == 15
    assert look(audit, 6, "ab", 0) == {"c"}


def test_a_new_leader_starts_afresh_and_waits_for_registrations_already_lapsed() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abc", 10)
    look(audit, 1, "ab", 10)
    audit.reset()  # leadership lost and won again
    assert look(audit, 50, "ab", 10, lost="c") == frozenset()
    assert audit.due_at_s == 60
    assert look(audit, 60, "ab", 10, lost="c") == {"c"}


def test_run_now_cuts_the_wait_short() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abc", 60)
    look(audit, 1, "ab", 60)
    assert audit.run_now() == {"c"}
    assert audit.due_at_s is None
    assert look(audit, 70, "ab", 60) == frozenset()
    assert audit.run_now() == frozenset()


def test_a_bookie_that_unregistered_is_lost_too() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abc", 0)
    assert look(audit, 1, "ab", 0) == {"c"}  # not in the registry at all now


def test_a_removed_registration_is_no_new_loss() -> None:
    """A decommissioned bookie leaves the registry: it was lost (lapsed) before, so its
    absence from every later look, and from a new leader's first look, audits nothing."""
    audit = LostBookieAudit()
    look(audit, 0, "abc", 0)
    assert look(audit, 1, "ab", 0, lost="c") == {"c"}
    audit.forget("c")
    assert look(audit, 2, "ab", 0) == frozenset()
    audit.reset()
    assert look(audit, 3, "ab", 0) == frozenset()
    # A new bookie registering with that id later is a bookie like any other.
    look(audit, 4, "abc", 0)
    assert look(audit, 5, "ab", 0) == {"c"}


def test_forgetting_a_waiting_bookie_drops_its_wait() -> None:
    audit = LostBookieAudit()
    look(audit, 0, "abc", 60)
    assert look(audit, 1, "ab", 60, lost="c") == frozenset()
    audit.forget("c")
    assert audit.waiting == set() and audit.due_at_s is None
    assert look(audit, 61, "ab", 60) == frozenset()
    assert audit.run_now() == frozenset()


def test_first_look_of_a_healthy_cluster_audits_nothing() -> None:
    audit = LostBookieAudit()
    assert look(audit, 0, "abc", 0) == frozenset()


# -- check planning -----------------------------------------------------------------------


def entries_by_bookie(checks: list[FragmentCheck]) -> dict[tuple[int, str], tuple[int, ...]]:
    return {(c.fragment.segment_index, c.fragment.bookie_id): c.entry_ids for c in checks}


def test_check_all_reads_first_and_last_entry_of_each_fragment() -> None:
    metadata = ledger([(0, ABC), (5, BCD)], last_entry_id=20)
    assert entries_by_bookie(plan_check_all(metadata, 0)) == {
        (0, "a"): (0, 3),
        (0, "b"): (0, 4),
        (0, "c"): (1, 4),
        (1, "b"): (5, 20),
        (1, "c"): (6, 19),
        (1, "d"): (5, 20),
    }


def test_check_all_adds_the_verification_percentage_of_the_others() -> None:
    metadata = ledger([(0, ["a", "b"])], last_entry_id=101, write_quorum=1)
    # "a" holds the even entries 0..100: 49 between its first and last.
    (check_a, check_b) = plan_check_all(metadata, 50)
    assert check_a.fragment.bookie_id == "a"
    middle = [e for e in check_a.entry_ids if e not in (0, 100)]
    assert len(middle) == 49 * 50 // 100
    assert all(e % 2 == 0 for e in check_a.entry_ids)
    assert len(plan_check_all(metadata, 100)[0].entry_ids) == 51
    assert plan_check_all(metadata, 0)[0].entry_ids == (0, 100)


def test_check_all_skips_the_open_fragment_and_empty_ones() -> None:
    metadata = ledger([(0, ABC), (5, BCD)], LedgerState.OPEN)
    assert {c.fragment.segment_index for c in plan_check_all(metadata, 0)} == {0}
    assert plan_check_all(ledger([(0, ABC)], last_entry_id=None), 100) == []


def test_replicas_check_reads_every_entry_on_every_replica() -> None:
    metadata = ledger([(0, ABC), (5, BCD)], last_entry_id=9)
    plan = entries_by_bookie(plan_replicas_check(metadata))
    for entry_id in range(10):
        segment_index = 0 if entry_id < 5 else 1
        segment = metadata.segments[segment_index]
        holders = {segment.bookies[i] for i in write_set(entry_id, metadata.quorum)}
        assert {b for (s, b), es in plan.items() if s == segment_index and entry_id in es} == (
            holders
        )
    assert sum(len(es) for es in plan.values()) == 10 * 2


# -- classification -----------------------------------------------------------------------

CHECK = MarkReason.REPLICAS_CHECK


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ([("a", ReadOutcome.OK), ("b", ReadOutcome.OK)], []),
        ([("a", ReadOutcome.MISSING)], [MarkDecision(7, ("a",), CHECK)]),
        (
            [("a", ReadOutcome.CORRUPT), ("b", ReadOutcome.MISSING), ("a", ReadOutcome.OK)],
            [MarkDecision(7, ("a", "b"), CHECK)],
        ),
        (
            [("a", ReadOutcome.LIMBO), ("a", ReadOutcome.MISSING)],
            [MarkDecision(7, ("a",), MarkReason.LIMBO)],
        ),
        (
            [("a", ReadOutcome.LIMBO), ("b", ReadOutcome.CORRUPT)],
            [
                MarkDecision(7, ("a",), MarkReason.LIMBO),
                MarkDecision(7, ("b",), CHECK),
            ],
        ),
        ([("a", ReadOutcome.UNREACHABLE), ("b", ReadOutcome.UNREACHABLE)], []),
    ],
)
def test_mark_decisions(outcomes: list, expected: list) -> None:
    assert mark_decisions(7, outcomes, CHECK) == expected


# -- placement ----------------------------------------------------------------------------


def test_placement_violations() -> None:
    registered = {"a", "b", "c", "d"}
    assert placement_violations(ledger([(0, ABC), (5, BCD)], last_entry_id=9), registered) == []
    assert placement_violations(ledger([(0, ["a", "a", "b"])], last_entry_id=9), registered) == [
        PlacementViolation(7, 0, PlacementProblem.TOO_FEW_BOOKIES, ("a",))
    ]
    assert placement_violations(
        ledger([(0, ABC), (5, ["b", "x", "x"])], last_entry_id=9), registered
    ) == [
        PlacementViolation(7, 1, PlacementProblem.TOO_FEW_BOOKIES, ("x",)),
        PlacementViolation(7, 1, PlacementProblem.UNREGISTERED_BOOKIE, ("x",)),
    ]
    # A segment that holds no entry is not counted.
    assert (
        placement_violations(ledger([(0, ["x", "b", "c"]), (0, BCD)], last_entry_id=3), registered)
        == []
    )


def test_placement_violations_under_a_policy() -> None:
    """A segment failing the policy names the bookies whose move (to writable bookies) makes
    it adhere; one meeting it softly is reported and names none."""
    racks = {"a": "/z/r1", "b": "/z/r1", "c": "/z/r2", "d": "/z/r2"}
    rackaware = PlacementPolicy(PlacementRules(policy="rackaware"))
    one_rack_pair = ledger([(0, ["a", "b", "c", "d"])], last_entry_id=9)  # (a, b), (c, d)
    [found] = placement_violations(one_rack_pair, racks, rackaware, {"e": "/z/r1", "f": "/z/r2"})
    assert found.problem is PlacementProblem.NOT_ADHERING and len(found.bookie_ids) == 2
    assert "1 rack(s), want 2" in found.reason
    [stuck] = placement_violations(one_rack_pair, racks, rackaware, {})
    assert stuck.problem is PlacementProblem.NOT_ADHERING and stuck.bookie_ids == ()
    alternating = ledger([(0, ["a", "c", "b", "d"])], last_entry_id=9)
    assert placement_violations(alternating, racks, rackaware, {}) == []
    zones = {
        "a": "/z1/u1",
        "b": "/z1/u2",
        "c": "/z2/u1",
        "d": "/z2/u2",
        "e": "/z1/u3",
        "f": "/z2/u3",
    }
    zoneaware = PlacementPolicy(PlacementRules(policy="zoneaware"))
    two_zones = ledger([(0, ["a", "c", "b", "d", "e", "f"])], last_entry_id=9, write_quorum=3)
    [soft] = placement_violations(two_zones, zones, zoneaware, {})
    assert soft.problem is PlacementProblem.SOFTLY_ADHERING and soft.bookie_ids == ()


# -- entry.corrupt events -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            {"kind": "entry.corrupt", "ledger_id": 3, "bookie_id": "b1", "data": {}},
            MarkDecision(3, ("b1",), MarkReason.ENTRY_CORRUPT),
        ),
        ({"kind": "entry.corrupt", "ledger_id": 3}, None),
        ({"kind": "entry.corrupt", "ledger_id": "3", "bookie_id": "b1"}, None),
        ({"kind": "entry.corrupt", "ledger_id": True, "bookie_id": "b1"}, None),
        ({"kind": "entry.corrupt", "ledger_id": -1, "bookie_id": "b1"}, None),
        ({"kind": "entry.corrupt", "ledger_id": 3, "bookie_id": ""}, None),
        ({"kind": "ledger.created", "ledger_id": 3, "bookie_id": "b1"}, None),
        ([1, 2], None),
        (None, None),
    ],
)
def test_corrupt_entry_mark(event: object, expected: MarkDecision | None) -> None:
    assert corrupt_entry_mark(event) == expected


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (BookieStatus.OK, ReadOutcome.OK),
        (BookieStatus.NO_ENTRY, ReadOutcome.MISSING),
        (BookieStatus.NO_LEDGER, ReadOutcome.MISSING),
        (BookieStatus.CORRUPT, ReadOutcome.CORRUPT),
        (BookieStatus.UNKNOWN_LEDGER_STATE, ReadOutcome.LIMBO),
        (BookieStatus.TOO_MANY_REQUESTS, ReadOutcome.UNREACHABLE),
        (BookieStatus.IO_ERROR, ReadOutcome.UNREACHABLE),
        (BookieStatus.BAD_REQUEST, ReadOutcome.UNREACHABLE),
    ],
)
def test_read_outcome(status: BookieStatus, outcome: ReadOutcome) -> None:
    assert read_outcome(status) is outcome


@pytest.mark.parametrize(
    ("alive", "expected"),
    [
        ({"a", "b", "c", "d"}, []),
        ({"b", "c", "d"}, ["a"]),
        ({"b", "c"}, ["a", "d"]),
        (set(), ["a", "b", "c", "d"]),
    ],
)
def test_missing_bookies(alive: set, expected: list) -> None:
    assert missing_bookies(ledger([(0, ABC), (5, BCD)], last_entry_id=9), alive) == expected
    # A bookie named only by an empty segment is missed too (the replicator replaces it).
    assert missing_bookies(ledger([(0, ["x", "b", "c"]), (0, BCD)], last_entry_id=3), alive) == [
        b for b in [*expected, "x"] if b != "a"
    ]
