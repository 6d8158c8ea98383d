"""The replication worker's decisions, pure (BookKeeper's ReplicationWorker): what to do
with a claimed under-replicated ledger, what to do once its fragments were copied, how
long a ledger this worker failed stays away from every worker, and when a claim is lost.

Time comes in as `now_ms` (wall-clock milliseconds, as the queue's `marked_at`); the
replicator service (`services/replicator/service.py`) does the IO (this is in `shared/` so
that the simulator can take the same decisions). Which fragments a ledger has on which
bookies is the protocol library's rule (`shared/protocol/replication.py`); the driver
passes its answers in, so that this module keeps no second copy of it.

A claim that must wait (an open ledger inside its grace period, a failed ledger backing
off) is not released at once: the queue hands out the oldest mark first, so a released
ledger would come straight back to the next claim. The worker renews the claim once with
the wait as its lease and leaves it; when that lease lapses any worker may claim the
ledger again. BookKeeper holds its ZooKeeper lock for the wait and then releases it; a
lapsing lease does the same without a timer, and without one of a dead worker either.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set
from dataclasses import dataclass
from enum import StrEnum

# BookKeeper's NUM_OF_EXPONENTIAL_BACKOFF_RETRIALS: the first failures of a ledger wait
# 1/32, 1/16, ... 1/2 of lockReleaseOfFailedLedgerGracePeriod, later ones all of it.
NUM_OF_EXPONENTIAL_BACKOFF_RETRIALS = 5
# BookKeeper's REPLICATED_FAILED_LEDGERS_MAXSIZE: failure counts a worker remembers (the
# least recently failed are forgotten first).
REPLICATED_FAILED_LEDGERS_MAXSIZE = 2_000
# The leases the queue accepts (`shared.models.UnderreplicatedClaimRequest.lease_ms`).
LEASE_MS_MIN = 100
LEASE_MS_MAX = 3_600_000


class Action(StrEnum):
    """What a worker does with a ledger it claimed."""

    # The ledger is gone (deleted since it was marked): nothing to keep replicated.
    MARK_REPLICATED = "mark_replicated"
    # It cannot be worked on (no stored keys, an odd mark): hold it for a failure backoff.
    DEFER_FAILED = "defer_failed"
    # Copy the closed fragments on the marked bookies; then see `after_replication`.
    REPLICATE = "replicate"
    # Fence and recover it (its open last segment has a marked bookie and its grace period
    # is over), then copy as REPLICATE.
    RECOVER_AND_REPLICATE = "recover_and_replicate"


class Outcome(StrEnum):
    """What a worker does with its claim after copying."""

    # Nothing left on the marked bookies: `urq.replicated` with the mark version claimed.
    DONE = "done"
    # The open last segment still has a marked bookie: hold the claim until the grace
    # period ends, when a worker claims it again and recovers it.
    DEFER_OPEN = "defer_open"
    # Closed fragments are still on the marked bookies: a failure (backoff).
    DEFER_FAILED = "defer_failed"


class Reason(StrEnum):
    """Why a claim was released or deferred: the `reason` of `autorecovery.released`."""

    LEDGER_DELETED = "ledger_deleted"
    NO_KEYS = "no_keys"
    ODD_MARK = "odd_mark"
    OPEN_GRACE = "open_ledger_grace_period"
    NOT_REPLICATED = "fragments_left"
    FAILED = "replication_failed"
    # The claim was no longer this worker's while it worked (its lease lapsed).
    CLAIM_LOST = "claim_lost"
    # `urq.replicated` refused: a newer mark came meanwhile (the ledger stays queued) or
    # the claim was no longer this worker's.
    STILL_MARKED = "still_marked"
    # The replicator is shutting down: its claim goes back to the queue at once.
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class ClaimFacts:
    """What the driver found out about a claimed ledger, for `plan_claim`."""

    # Bookies named by the mark (the queue keeps them sorted and unique).
    missing_bookies: tuple[str, ...]
    marked_at_ms: int
    # False: the ledger was deleted since it was marked.
    ledger_exists: bool
    # The ledger's metadata holds its keys (`shared.digest.LedgerKeys.of`).
    has_keys: bool
    # `shared.protocol.replication.open_fragment_on(metadata, missing_bookies)`: an OPEN or
    # IN_RECOVERY ledger whose last (open) segment has a marked bookie.
    open_fragment_on_marked: bool


@dataclass(frozen=True)
class Plan:
    action: Action
    reason: Reason | None = None


def grace_remaining_ms(marked_at_ms: int, now_ms: int, grace_period_ms: int) -> int:
    """How long an open ledger marked at `marked_at_ms` still waits for its writer (0:
    its grace period is over)."""
    return max(0, marked_at_ms + grace_period_ms - now_ms)


def bookies_to_replace(
    marked: Sequence[str],
    alive: Set[str],
    open_segment: Set[str],
    intact: Set[str],
    misplaced: Set[str] = frozenset(),
) -> tuple[str, ...]:
    """Which of a claim's marked bookies to copy the ledger off: all of them but those that
    are registered alive, are not in the ledger's open last segment, and read back every
    entry they store of it intact (`intact`: checked by the driver, digest and all), unless
    the placement policy still wants them moved (`misplaced`: the auditor's placement
    repair, re-checked now; an intact replica is the point of such a mark).

    A mark can outlive its cause: the auditor marks the ledgers of a bookie whose
    registration lapsed for a moment (a stalled process), and the bookie comes back with
    every replica. Replacing it anyway copies for nothing, and on a cluster with one spare
    bookie it cannot be done at all: it is excluded as a replacement, so the bookie truly
    lost in the same segment finds no replacement and the ledger is never repaired
    (BookKeeper's worker re-checks a ledger's fragments, LedgerChecker, before copying).
    A bookie named for a damaged replica does not read back intact, so it is replaced.
    The open last segment of a ledger not closed cannot be checked (its end is unknown):
    a marked bookie there stays to be replaced, once the ledger is fenced and closed."""
    return tuple(
        b
        for b in marked
        if b in misplaced or not (b in alive and b not in open_segment and b in intact)
    )


def plan_claim(facts: ClaimFacts, now_ms: int, grace_period_ms: int) -> Plan:
    """What to do with a ledger just claimed (BookKeeper's `rereplicate(ledgerId)`)."""
    if not facts.ledger_exists:
        return Plan(Action.MARK_REPLICATED, Reason.LEDGER_DELETED)
    if not facts.missing_bookies:
        return Plan(Action.DEFER_FAILED, Reason.ODD_MARK)
    if not facts.has_keys:
        return Plan(Action.DEFER_FAILED, Reason.NO_KEYS)
    if facts.open_fragment_on_marked and (
        grace_remaining_ms(facts.marked_at_ms, now_ms, grace_period_ms) == 0
    ):
        return Plan(Action.RECOVER_AND_REPLICATE)
    # Inside the grace period the closed fragments are copied now all the same; the open
    # one is left to the writer (`after_replication` says DEFER_OPEN).
    return Plan(Action.REPLICATE)


def after_replication(fragments_left: int, open_fragment_on_marked: bool) -> Outcome:
    """What to do with the claim once the closed fragments were copied: BookKeeper's
    re-check of the ledger's fragments after its copy. `fragments_left` are the closed
    fragments still on the marked bookies in the metadata as stored after the copy."""
    if fragments_left:
        return Outcome.DEFER_FAILED
    if open_fragment_on_marked:
        return Outcome.DEFER_OPEN
    return Outcome.DONE


def failed_ledger_backoff_ms(failures_before: int, grace_period_ms: int) -> int:
    """How long a ledger that failed `failures_before` times already waits after this
    failure (BookKeeper's deferLedgerLockReleaseOfFailedLedger)."""
    if failures_before >= NUM_OF_EXPONENTIAL_BACKOFF_RETRIALS:
        return grace_period_ms
    base_ms = grace_period_ms // 2**NUM_OF_EXPONENTIAL_BACKOFF_RETRIALS
    return base_ms * 2**failures_before


def hold_lease_ms(wait_ms: int) -> int:
    """The lease that holds a deferred claim for `wait_ms`, within what the queue accepts."""
    return min(LEASE_MS_MAX, max(LEASE_MS_MIN, wait_ms))


class FailedLedgers:
    """The ledgers this worker failed to replicate and how often (bounded, least recently
    failed forgotten first), for the exponential backoff; a success forgets the ledger."""

    def __init__(self, max_size: int = REPLICATED_FAILED_LEDGERS_MAXSIZE) -> None:
        assert max_size >= 1
        self._max_size = max_size
        self._failures: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def failures(self, ledger_id: int) -> int:
        return self._failures.get(ledger_id, 0)

    def record_failure(self, ledger_id: int, grace_period_ms: int) -> int:
        """Count a failure; the backoff it gets (ms)."""
        before = self._failures.pop(ledger_id, 0)
        self._failures[ledger_id] = before + 1
        while len(self._failures) > self._max_size:
            self._failures.popitem(last=False)
        return failed_ledger_backoff_ms(before, grace_period_ms)

    def forget(self, ledger_id: int) -> None:
        self._failures.pop(ledger_id, None)


class ClaimLease:
    """A worker's own view of its claim's lease: renew every third of it; held only until
    the lease it last obtained runs out, counted from before it asked (so that a worker
    whose renewals fail stops no later than the queue lets another worker in)."""

    def __init__(self, lease_ms: int, asked_at_ms: int) -> None:
        assert lease_ms >= 3
        self.lease_ms = lease_ms
        self.held_until_ms = asked_at_ms + lease_ms

    @property
    def renew_interval_ms(self) -> int:
        return self.lease_ms // 3

    def renewed(self, asked_at_ms: int) -> None:
        self.held_until_ms = asked_at_ms + self.lease_ms

    def held(self, now_ms: int) -> bool:
        return now_ms < self.held_until_ms
