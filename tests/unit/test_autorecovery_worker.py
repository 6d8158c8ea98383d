"""The replication worker's decisions (shared/autorecovery_worker.py), table-driven."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.autorecovery_worker import (
    LEASE_MS_MAX,
    LEASE_MS_MIN,
    Action,
    ClaimFacts,
    ClaimLease,
    FailedLedgers,
    Outcome,
    Plan,
    Reason,
    after_replication,
    bookies_to_replace,
    failed_ledger_backoff_ms,
    grace_remaining_ms,
    hold_lease_ms,
    plan_claim,
)
from shared.config import ReplicatorSettings

GRACE_MS = 30_000
MARKED_AT = 1_000_000


def facts(**changes) -> ClaimFacts:
    values = {
        "missing_bookies": ("bookie-2",),
        "marked_at_ms": MARKED_AT,
        "ledger_exists": True,
        "has_keys": True,
        "open_fragment_on_marked": False,
    }
    return ClaimFacts(**{**values, **changes})


@pytest.mark.parametrize(
    ("claim", "now_ms", "plan"),
    [
        # A closed ledger (or an open one whose open segment has no marked bookie): copy.
        (facts(), MARKED_AT, Plan(Action.REPLICATE)),
        # Deleted since the mark: nothing to keep replicated.
        (
            facts(ledger_exists=False),
            MARKED_AT,
            Plan(Action.MARK_REPLICATED, Reason.LEDGER_DELETED),
        ),
        # Deleted wins over everything else that is odd about it.
        (
            facts(ledger_exists=False, has_keys=False, missing_bookies=()),
            MARKED_AT,
            Plan(Action.MARK_REPLICATED, Reason.LEDGER_DELETED),
        ),
        # A ledger created before keys were stored cannot be copied.
        (facts(has_keys=False), MARKED_AT, Plan(Action.DEFER_FAILED, Reason.NO_KEYS)),
        # A mark that names no bookie is odd: backed off, never a crash.
        (facts(missing_bookies=()), MARKED_AT, Plan(Action.DEFER_FAILED, Reason.ODD_MARK)),
        # Open segment on a marked bookie, inside the grace period: copy the closed ones.
        (facts(open_fragment_on_marked=True), MARKED_AT, Plan(Action.REPLICATE)),
        (
            facts(open_fragment_on_marked=True),
            MARKED_AT + GRACE_MS - 1,
            Plan(Action.REPLICATE),
        ),
        # ... and once it is over: fence and recover first.
        (
            facts(open_fragment_on_marked=True),
            MARKED_AT + GRACE_MS,
            Plan(Action.RECOVER_AND_REPLICATE),
        ),
        # No keys: not even recovered (it needs the master key to fence).
        (
            facts(open_fragment_on_marked=True, has_keys=False),
            MARKED_AT + GRACE_MS,
            Plan(Action.DEFER_FAILED, Reason.NO_KEYS),
        ),
    ],
)
def test_plan_claim(claim: ClaimFacts, now_ms: int, plan: Plan) -> None:
    assert plan_claim(claim, now_ms, GRACE_MS) == plan


def test_a_zero_grace_period_recovers_at_once() -> None:
    plan = plan_claim(facts(open_fragment_on_marked=True), MARKED_AT, 0)
    assert plan == Plan(Action.RECOVER_AND_REPLICATE)


@pytest.mark.parametrize(
    ("fragments_left", "open_fragment", "outcome"),
    [
        (0, False, Outcome.DONE),
        (0, True, Outcome.DEFER_OPEN),
        (1, False, Outcome.DEFER_FAILED),
        # A closed fragment left is a failure even while the open one waits.
        (2, True, Outcome.DEFER_FAILED),
    ],
)
def test_after_replication(fragments_left: int, open_fragment: bool, outcome: Outcome) -> None:
    assert after_replication(fragments_left, open_fragment) == outcome


@pytest.mark.parametrize(
    ("now_ms", "remaining_ms"),
    [
        (MARKED_AT - 5, GRACE_MS + 5),  # clocks a little apart: the mark seems in the future
        (MARKED_AT, GRACE_MS),
        (MARKED_AT + 10_000, GRACE_MS - 10_000),
        (MARKED_AT + GRACE_MS, 0),
        (MARKED_AT + GRACE_MS + 1, 0),
    ],
)
def test_grace_remaining(now_ms: int, remaining_ms: int) -> None:
    assert grace_remaining_ms(MARKED_AT, now_ms, GRACE_MS) == remaining_ms


@pytest.mark.parametrize(
    ("failures_before", "backoff_ms"),
    # BookKeeper's: 1/32 of the grace period, doubling, then all of it from the 6th on.
    [(0, 9_375), (1, 18_750), (2, 37_500), (3, 75_000), (4, 150_000), (5, 300_000), (40, 300_000)],
)
def test_failed_ledger_backoff(failures_before: int, backoff_ms: int) -> None:
    assert failed_ledger_backoff_ms(failures_before, 300_000) == backoff_ms


def test_failed_ledgers_count_back_off_and_forget() -> None:
    failed = FailedLedgers()
    assert [failed.record_failure(7, 3_200) for _ in range(7)] == [
        100,
        200,
        400,
        800,
        1_600,
        3_200,
        3_200,
    ]
    assert failed.failures(7) == 7
    assert failed.record_failure(8, 3_200) == 100  # counted per ledger
    failed.forget(7)
    assert failed.failures(7) == 0 and failed.record_failure(7, 3_200) == 100


def test_failed_ledgers_are_bounded_least_recently_failed_forgotten_first() -> None:
    failed = FailedLedgers(max_size=2)
    failed.record_failure(1, 3_200)
    failed.record_failure(2, 3_200)
    failed.record_failure(1, 3_200)  # 1 failed most recently now
    failed.record_failure(3, 3_200)
    assert len(failed) == 2
    assert (failed.failures(1), failed.failures(2), failed.failures(3)) == (2, 0, 1)


@pytest.mark.parametrize(
    ("wait_ms", "lease_ms"),
    [(0, LEASE_MS_MIN), (99, LEASE_MS_MIN), (5_000, 5_000), (10**9, LEASE_MS_MAX)],
)
def test_hold_lease_stays_within_what_the_queue_accepts(wait_ms: int, lease_ms: int) -> None:
    assert hold_lease_ms(wait_ms) == lease_ms


def test_claim_lease_is_held_until_the_last_lease_obtained_runs_out() -> None:
    lease = ClaimLease(9_000, asked_at_ms=100)
    assert lease.renew_interval_ms == 3_000
    assert lease.held(9_099) and not lease.held(9_100)
    lease.renewed(asked_at_ms=3_100)  # counted from the asking, not the answer
    assert lease.held(12_099) and not lease.held(12_100)


def test_a_zero_replication_rate_is_refused() -> None:
    """BookKeeper's replicationRateByBytes is positive or -1; 0 would copy nothing, ever."""
    with pytest.raises(ValidationError):
        ReplicatorSettings(replication_rate_by_bytes=0)
    assert ReplicatorSettings(replication_rate_by_bytes=-1).replication_rate_by_bytes == -1


@pytest.mark.parametrize(
    ("marked", "alive", "open_segment", "intact", "replace"),
    [
        # Lost: replaced whatever else is said of it.
        (("b2",), set(), set(), set(), ("b2",)),
        (("b2",), set(), set(), {"b2"}, ("b2",)),
        # Back, every entry it stores read back intact: a mark that outlived its cause.
        (("b1", "b2"), {"b1"}, set(), {"b1"}, ("b2",)),
        (("b1",), {"b1"}, set(), {"b1"}, ()),
        # Alive but a replica is damaged (or did not answer): replaced.
        (("b1", "b2"), {"b1"}, set(), set(), ("b1", "b2")),
        # In the open last segment: not checkable yet, replaced once fenced and closed.
        (("b1", "b2"), {"b1"}, {"b1", "b2", "b3"}, {"b1"}, ("b1", "b2")),
    ],
)
def test_bookies_to_replace(
    marked: tuple, alive: set, open_segment: set, intact: set, replace: tuple
) -> None:
    assert bookies_to_replace(marked, alive, open_segment, intact) == replace


def test_a_misplaced_bookie_is_replaced_though_intact() -> None:
    """The placement check's mark: the bookie is alive and intact, and the policy still
    wants it moved (or no longer does: then the mark outlived its cause)."""
    assert bookies_to_replace(("b1",), {"b1"}, set(), {"b1"}, {"b1"}) == ("b1",)
    assert bookies_to_replace(("b1",), {"b1"}, set(), {"b1"}, set()) == ()
