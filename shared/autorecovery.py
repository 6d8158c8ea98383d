"""The auditor's decisions (BookKeeper's Auditor and LedgerChecker), pure: no IO, no clock.

Everything the auditor decides is here; services/auditor/ only reads the registry, the
ledgers and the bookies, feeds what it saw in, and carries out what comes back (marks in the
under-replication queue, events, cookie removals).

Vocabulary. A ledger's segment i covers entries [first_entry_id, next segment's
first_entry_id - 1]; the last segment ends at last_entry_id once the ledger is CLOSED and is
open-ended before. A *fragment* is what one bookie of a segment stores: the segment's range
x the entries whose write set (shared.quorum.write_set) holds that bookie's ensemble index.
A bookie that stores no entry of a segment (an empty segment of a closed ledger, or a range
shorter than the ensemble) holds no fragment there: the checks read nothing of it there, but
a lost, wiped or decommissioned bookie is named wherever a segment names it
(`bookies_to_mark`), so that the replicator replaces it even there. Those rules
(a segment's range, the entries an ensemble index stores) are the replicator's too: they are
defined once, in `shared.protocol.replication`, and used here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from shared.models import LedgerMetadata
from shared.protocol.placement import Adherence, PlacementPolicy
from shared.protocol.replication import places_of, segment_range, stored_ends, stored_entry_ids
from shared.status import BookieStatus


class MarkReason(StrEnum):
    """Why a ledger was marked under-replicated (the `reason` of `autorecovery.marked`)."""

    LOST_BOOKIE = "lost_bookie"
    CHECK_ALL = "check_all"
    REPLICAS_CHECK = "replicas_check"
    ENTRY_CORRUPT = "entry_corrupt"
    LIMBO = "limbo"
    PLACEMENT = "placement"
    MANUAL = "manual"
    DECOMMISSION = "decommission"


@dataclass(frozen=True, slots=True)
class StoredFragment:
    """The entries of segment `segment_index` stored on the bookie at `ensemble_index`.

    `last_entry_id` is inclusive; None: the open last segment of a ledger not yet closed
    (its end is not known, so it cannot be checked entry by entry yet)."""

    ledger_id: int
    segment_index: int
    segment_first_entry_id: int
    first_entry_id: int
    last_entry_id: int | None
    ensemble_index: int
    bookie_id: str

    @property
    def is_open(self) -> bool:
        return self.last_entry_id is None


def fragments_on(metadata: LedgerMetadata, bookie_ids: Iterable[str]) -> list[StoredFragment]:
    """The fragments stored on `bookie_ids` that hold at least one entry, in segment order,
    trimmed to the entries stored there (`shared.protocol.replication.stored_ends`); the
    open last segment of a ledger not closed counts (it may hold entries) with
    last_entry_id None."""
    quorum = metadata.quorum
    found = []
    for place in places_of(metadata, set(bookie_ids)):
        first, last, index = place.first_entry_id, place.last_entry_id, place.ensemble_index
        ends: tuple[int, int | None] | None = (
            (first, None) if last is None else stored_ends(quorum, first, last, index)
        )
        if ends is not None:
            found.append(
                StoredFragment(
                    metadata.ledger_id,
                    place.position,
                    first,
                    ends[0],
                    ends[1],
                    index,
                    place.bookie_id,
                )
            )
    return found


def bookies_to_mark(metadata: LedgerMetadata, bookie_ids: Iterable[str]) -> list[str]:
    """Which of `bookie_ids` to name when marking this ledger: those any of its segments
    names (sorted), as BookKeeper's Auditor marks every ledger whose ensembles name a lost
    bookie. That includes a bookie named where it stores no entry (a closed ledger's empty
    last segment; E > Qw with few entries): the replicator replaces it there with nothing
    to copy, so that no ledger names a lost or decommissioned bookie for ever. Empty: the
    ledger does not need them."""
    wanted = set(bookie_ids)
    return sorted({b for segment in metadata.segments for b in segment.bookies if b in wanted})


# -- lost bookies: BookKeeper's Auditor with lostBookieRecoveryDelay ----------------------


class LostBookieAudit:
    """When to audit lost bookies (BookKeeper's Auditor.submitAuditTask).

    Fed the registry at each look (`observe`). A bookie that was alive at the previous look
    and is not now (its lease lapsed or it unregistered) is lost: the audit of its ledgers
    waits `delay_s` (lostBookieRecoveryDelay; 0: at once). A lost bookie that comes back
    before then cancels its wait. A second bookie lost while an audit waits makes it run
    now, for all of them (BookKeeper: more than one bookie down is not waited for). A new
    delay while an audit waits starts the wait again from now with the new value, as
    BookKeeper reschedules on lostBookieRecoveryDelay changes.

    A new leader starts afresh (`reset`): its first look counts every bookie the registry
    holds as lost as newly lost, so a wait cut short by a leader change is waited again
    rather than skipped.
    """

    def __init__(self) -> None:
        self.known: set[str] | None = None  # alive at the previous look; None: no look yet
        self.waiting: set[str] = set()  # lost, their audit not yet run
        self.due_at_s: float | None = None  # when the waiting audit runs
        self._delay_s: float | None = None  # the delay the wait was scheduled with

    def reset(self) -> None:
        self.known = None
        self._run()

    def observe(
        self, now_s: float, alive: set[str], registered_lost: set[str], delay_s: float
    ) -> frozenset[str]:
        """The bookies whose ledgers are to be audited now (empty: none).

        `alive`: registered and not lost; `registered_lost`: registrations that lapsed."""
        known = self.known if self.known is not None else alive | registered_lost
        newly_lost = known - alive
        self.known = set(alive)
        returned = self.waiting & alive
        self.waiting -= returned
        self.waiting |= newly_lost
        if not self.waiting:
            self.due_at_s = self._delay_s = None
            return frozenset()
        if delay_s <= 0 or len(self.waiting) > 1:
            return self._run()
        if self.due_at_s is None or delay_s != self._delay_s:
            self.due_at_s = now_s + delay_s
            self._delay_s = delay_s
        if now_s >= self.due_at_s:
            return self._run()
        return frozenset()

    def forget(self, bookie_id: str) -> None:
        """The bookie left the registry for good (decommissioned): its wait, if any, is
        dropped. Its absence from the next looks is no loss: it was not alive."""
        self.waiting.discard(bookie_id)
        if not self.waiting:
            self.due_at_s = self._delay_s = None

    def run_now(self) -> frozenset[str]:
        """The waiting bookies, their wait cut short (BookKeeper's triggerAudit: an audit
        asked for by the operator is not delayed)."""
        return self._run()

    def _run(self) -> frozenset[str]:
        due = frozenset(self.waiting)
        self.waiting.clear()
        self.due_at_s = self._delay_s = None
        return due


# -- which ledgers to check, and what the answers mean -----------------------------------


@dataclass(frozen=True, slots=True)
class FragmentCheck:
    """Entries to read from one fragment's bookie."""

    fragment: StoredFragment
    entry_ids: tuple[int, ...]


def _evenly_spread(candidates: list[int], percentage: int) -> list[int]:
    """`percentage` of `candidates`, spread evenly over them (deterministic, so a check is
    reproducible; BookKeeper picks them at random)."""
    count = len(candidates) * percentage // 100
    if count <= 0:
        return []
    step = len(candidates) / count
    return [candidates[int(i * step)] for i in range(count)]


def plan_check_all(metadata: LedgerMetadata, verification_percentage: int) -> list[FragmentCheck]:
    """BookKeeper's checkAllLedgers (LedgerChecker): for each closed fragment of each
    bookie, its first and last entry plus `verification_percentage` of the ones between
    (auditorLedgerVerificationPercentage). The open last segment of a ledger not closed is
    not checked: its end is not known yet, and its writer replaces a failing bookie."""
    checks = []
    for fragment in fragments_on(metadata, _all_bookies(metadata)):
        if fragment.last_entry_id is None:
            continue
        first, last = fragment.first_entry_id, fragment.last_entry_id
        entries = {first, last}
        if verification_percentage > 0 and last - first > 1:
            middle = list(
                stored_entry_ids(metadata.quorum, first + 1, last - 1, fragment.ensemble_index)
            )
            entries.update(_evenly_spread(middle, verification_percentage))
        checks.append(FragmentCheck(fragment, tuple(sorted(entries))))
    return checks


def plan_replicas_check(metadata: LedgerMetadata) -> list[FragmentCheck]:
    """BookKeeper's replicasCheck: every entry of every closed fragment, on its bookie."""
    return [
        FragmentCheck(
            fragment,
            tuple(
                stored_entry_ids(
                    metadata.quorum,
                    fragment.first_entry_id,
                    fragment.last_entry_id,
                    fragment.ensemble_index,
                )
            ),
        )
        for fragment in fragments_on(metadata, _all_bookies(metadata))
        if fragment.last_entry_id is not None
    ]


def _all_bookies(metadata: LedgerMetadata) -> set[str]:
    return {bookie for segment in metadata.segments for bookie in segment.bookies}


class ReadOutcome(StrEnum):
    """What one read of a check found."""

    OK = "ok"
    MISSING = "missing"  # NO_ENTRY / NO_LEDGER: the replica is not there
    CORRUPT = "corrupt"  # the bookie said CORRUPT, or the digest did not match
    LIMBO = "limbo"  # UNKNOWN_LEDGER_STATE: a wiped bookie does not know
    UNREACHABLE = "unreachable"  # no answer, or an error that says nothing of the replica


@dataclass(frozen=True, slots=True)
class MarkDecision:
    ledger_id: int
    bookie_ids: tuple[str, ...]  # sorted
    reason: MarkReason


def mark_decisions(
    ledger_id: int, outcomes: Iterable[tuple[str, ReadOutcome]], check: MarkReason
) -> list[MarkDecision]:
    """What a check's answers (bookie id, outcome) of one ledger mean: bookies that lack an
    entry or hold a damaged one are named with the check's reason; bookies in limbo with
    reason LIMBO (their whole state is unknown, whatever else they answered). An unreachable
    bookie is not marked: a registered bookie that does not answer now is not evidence of a
    lost replica, and a lost one is the lost-bookie audit's, after lostBookieRecoveryDelay
    (marking on a timeout would bypass the operator's delay)."""
    damaged: set[str] = set()
    limbo: set[str] = set()
    for bookie_id, outcome in outcomes:
        if outcome is ReadOutcome.LIMBO:
            limbo.add(bookie_id)
        elif outcome in (ReadOutcome.MISSING, ReadOutcome.CORRUPT):
            damaged.add(bookie_id)
    decisions = []
    if limbo:
        decisions.append(MarkDecision(ledger_id, tuple(sorted(limbo)), MarkReason.LIMBO))
    if damaged - limbo:
        decisions.append(MarkDecision(ledger_id, tuple(sorted(damaged - limbo)), check))
    return decisions


# -- placement ----------------------------------------------------------------------------


class PlacementProblem(StrEnum):
    TOO_FEW_BOOKIES = "too_few_bookies"  # fewer distinct bookies than the ensemble size
    UNREGISTERED_BOOKIE = "unregistered_bookie"  # names a bookie the registry does not hold
    # The placement policy (shared/protocol/placement.py) says FAIL: some write quorum spans
    # too few racks or zones. Its bookies: those whose replacement would make it adhere.
    NOT_ADHERING = "not_adhering"
    # MEETS_SOFT (zoneaware): the minimum of zones, not the desired; reported, never marked.
    SOFTLY_ADHERING = "softly_adhering"


@dataclass(frozen=True, slots=True)
class PlacementViolation:
    ledger_id: int
    segment_index: int
    problem: PlacementProblem
    bookie_ids: tuple[str, ...]  # the repeated or unregistered bookies, or those to move
    reason: str = ""  # the policy's, for NOT_ADHERING and SOFTLY_ADHERING


def placement_violations(
    metadata: LedgerMetadata,
    registered: Mapping[str, str] | set[str],
    policy: PlacementPolicy | None = None,
    writable: Mapping[str, str] | None = None,
) -> list[PlacementViolation]:
    """Segments that do not adhere to the placement rules (BookKeeper's placement policy
    check): E distinct registered bookies, and the policy's adherence of every write quorum
    (isEnsembleAdheringToPlacementPolicy). `registered` maps each registered bookie to its
    location; `writable` (bookie -> location) are the candidates that may replace the
    bookies of a segment that fails, which are named for the replicator to move
    (replaceToAdherePlacementPolicy). Segments that hold no entry are not counted."""
    policy = policy or PlacementPolicy()
    locations = registered if isinstance(registered, Mapping) else {}
    quorum = metadata.write_quorum
    found = []
    for index, segment in enumerate(metadata.segments):
        first, last = segment_range(metadata, index)
        if last is not None and last < first:
            continue
        repeated = sorted({b for b in segment.bookies if segment.bookies.count(b) > 1})
        if len(set(segment.bookies)) < metadata.ensemble_size:
            found.append(
                PlacementViolation(
                    metadata.ledger_id, index, PlacementProblem.TOO_FEW_BOOKIES, tuple(repeated)
                )
            )
        unknown = sorted(set(segment.bookies) - set(registered))
        if unknown:
            found.append(
                PlacementViolation(
                    metadata.ledger_id, index, PlacementProblem.UNREGISTERED_BOOKIE, tuple(unknown)
                )
            )
        check = policy.check(segment.bookies, quorum, locations)
        if check.adherence is Adherence.FAIL:
            positions = policy.repair(segment.bookies, quorum, writable or {}, locations)
            movers = tuple(sorted({segment.bookies[i] for i in positions}))
            problem = PlacementProblem.NOT_ADHERING
            found.append(
                PlacementViolation(metadata.ledger_id, index, problem, movers, check.reason)
            )
        elif check.adherence is Adherence.MEETS_SOFT:
            problem = PlacementProblem.SOFTLY_ADHERING
            found.append(PlacementViolation(metadata.ledger_id, index, problem, (), check.reason))
    return found


# -- entry.corrupt events ---------------------------------------------------------------


def corrupt_entry_mark(event: object) -> MarkDecision | None:
    """The mark an `entry.corrupt` event (shared.events.Event as JSON, from a ledgerstore
    that found a stored entry failing its digest) asks for; None when it is malformed."""
    if not isinstance(event, dict) or event.get("kind") != "entry.corrupt":
        return None
    ledger_id, bookie_id = event.get("ledger_id"), event.get("bookie_id")
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or ledger_id < 0:
        return None
    if not isinstance(bookie_id, str) or not bookie_id:
        return None
    return MarkDecision(ledger_id, (bookie_id,), MarkReason.ENTRY_CORRUPT)


def missing_bookies(metadata: LedgerMetadata, alive: set[str]) -> list[str]:
    """The bookie check (BookKeeper's auditBookies) for one ledger: the bookies its
    segments name that are not registered alive (sorted)."""
    return bookies_to_mark(metadata, _all_bookies(metadata) - alive)


def read_outcome(status: BookieStatus) -> ReadOutcome:
    """What a bookie's answer for one entry says of its replica (an OK answer is still to
    have its digest checked: a mismatch is CORRUPT)."""
    return _READ_OUTCOMES.get(status, ReadOutcome.UNREACHABLE)


_READ_OUTCOMES = {
    BookieStatus.OK: ReadOutcome.OK,
    BookieStatus.NO_ENTRY: ReadOutcome.MISSING,
    BookieStatus.NO_LEDGER: ReadOutcome.MISSING,
    BookieStatus.CORRUPT: ReadOutcome.CORRUPT,
    BookieStatus.UNKNOWN_LEDGER_STATE: ReadOutcome.LIMBO,
}
