"""The bookie's per-ledger rules: what it accepts and what it answers. Pure: no IO, no
clock. The journal service (adds, fence, write_lac), the ledgerstore (reads) and the
simulator's bookie all call these; there is no second copy.

BookKeeper's Bookie.addEntry / fenceLedger / setExplicitLac:
- the first request for a ledger sets its master key; a different key is UNAUTHORIZED;
- a fenced ledger refuses normal adds (FENCED) but takes recovery adds;
- LAC is the max of every piggybacked LAC and every explicit LAC;
- "no such entry" (NO_ENTRY, NO_LEDGER) only with authority: once everything the journal
  had acknowledged when the question came is applied; otherwise UNKNOWN_LEDGER_STATE.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shared import wire
from shared.bookie.journal_format import (
    NO_KEY,
    ZERO_KEY,
    EntryRecord,
    FenceRecord,
    JournalPosition,
    LacRecord,
    LedgerDeletedRecord,
    LedgerStateRecord,
    MasterKeyRecord,
    Record,
)
from shared.digest import HEADER as _HEADER
from shared.digest import HEADER_SIZE
from shared.status import BookieStatus

MAX_ENTRY_ID = 2**63 - 1  # the wire's i64 cannot carry a larger entry id back


@dataclass(slots=True)
class LedgerFacts:
    master_key: bytes = NO_KEY  # NO_KEY until a fence or write_lac or add sets it
    fenced: bool = False
    lac: int = -1
    last_entry_id: int = -1


class BookieLedgerState:
    """What a bookie knows about each ledger: master key, fenced flag, LAC, last entry.

    `check_*` decide whether a request may proceed; `apply` records a fact that the journal
    accepted. Replay applies records without checks: they were checked when written.

    With `track_changes`, it also keeps the ids of the ledgers whose facts changed since
    the last `take_changed` (restoring a snapshot record is not a change): the journal's
    snapshot then writes those, not every ledger.
    """

    def __init__(self, track_changes: bool = False) -> None:
        self._ledgers: dict[int, LedgerFacts] = {}
        self._changed: set[int] | None = set() if track_changes else None

    def __len__(self) -> int:
        return len(self._ledgers)

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def get(self, ledger_id: int) -> LedgerFacts | None:
        return self._ledgers.get(ledger_id)

    def check_master_key(self, ledger_id: int, master_key: bytes) -> BookieStatus:
        facts = self._ledgers.get(ledger_id)
        if facts is None or facts.master_key == NO_KEY or facts.master_key == master_key:
            return BookieStatus.OK
        return BookieStatus.UNAUTHORIZED

    def check_add(self, ledger_id: int, master_key: bytes, flags: int) -> BookieStatus:
        # `check_master_key`, then the fence, with one lookup (every add's check).
        facts = self._ledgers.get(ledger_id)
        if facts is None:
            return BookieStatus.OK
        if facts.master_key != master_key and facts.master_key != NO_KEY:
            return BookieStatus.UNAUTHORIZED
        if facts.fenced and not flags & wire.FLAG_RECOVERY_ADD:
            return BookieStatus.FENCED
        return BookieStatus.OK

    def needs_master_key(self, ledger_id: int) -> bool:
        """A fence or write_lac on a ledger without a key must journal the key first."""
        facts = self._ledgers.get(ledger_id)
        return facts is None or facts.master_key == NO_KEY

    def apply(self, record: Record) -> None:
        if type(record) is EntryRecord:  # every add, twice (live, then durable): no match
            facts = self._facts(record.ledger_id, record.master_key)
            if record.entry_id > facts.last_entry_id:
                facts.last_entry_id = record.entry_id
            if record.lac > facts.lac:
                facts.lac = record.lac
            return
        match record:
            case MasterKeyRecord():
                self._facts(record.ledger_id, record.master_key)
            case FenceRecord():
                self._facts(record.ledger_id, NO_KEY).fenced = True
            case LacRecord():
                facts = self._facts(record.ledger_id, NO_KEY)
                facts.lac = max(facts.lac, record.lac)
            case LedgerStateRecord():
                self.restore([record])
            case LedgerDeletedRecord():
                self.forget(record.ledger_id)

    def forget(self, ledger_id: int) -> None:
        """The ledger is deleted: its key, fence and LAC are gone (a later add creates it
        afresh, as on a bookie that never saw it; the garbage collector deletes it again)."""
        if self._ledgers.pop(ledger_id, None) is not None and self._changed is not None:
            self._changed.add(ledger_id)

    def restore(self, records: Iterable[LedgerStateRecord]) -> None:
        """Set the facts of a snapshot's ledgers (not a change: they are written); a
        tombstone row removes its ledger."""
        ledgers = self._ledgers
        for record in records:
            if record.deleted:
                ledgers.pop(record.ledger_id, None)
                continue
            key = NO_KEY if record.master_key == ZERO_KEY else record.master_key
            ledgers[record.ledger_id] = LedgerFacts(
                key, record.fenced, record.lac, record.last_entry_id
            )

    def _facts(self, ledger_id: int, master_key: bytes) -> LedgerFacts:
        """The ledger's facts, to be changed by the caller (so counted as changed)."""
        if self._changed is not None:
            self._changed.add(ledger_id)
        facts = self._ledgers.get(ledger_id)
        if facts is None:
            facts = self._ledgers[ledger_id] = LedgerFacts(master_key)
        elif facts.master_key == NO_KEY:
            facts.master_key = master_key
        return facts

    def take_changed(self) -> set[int]:
        """The ledgers changed since the last call (tracking must be on)."""
        assert self._changed is not None, "changes are not tracked"
        changed, self._changed = self._changed, set()
        return changed

    def restore_changed(self, ledger_ids: Iterable[int]) -> None:
        """Give back what `take_changed` returned when it could not be written."""
        assert self._changed is not None, "changes are not tracked"
        self._changed.update(ledger_ids)

    def copy(self) -> BookieLedgerState:
        """An untracked copy (the journal's live state)."""
        other = type(self)()  # a subclass (the simulator's broken rules) stays itself
        # The constructor, not dataclasses.replace: 3x faster on a restart's 100,000 ledgers.
        other._ledgers = {
            k: LedgerFacts(v.master_key, v.fenced, v.lac, v.last_entry_id)
            for k, v in self._ledgers.items()
        }
        return other

    def snapshot_records(self, ledger_ids: Iterable[int] | None = None) -> list[LedgerStateRecord]:
        """The facts of `ledger_ids` (every ledger if None), sorted by ledger. A ledger of
        `ledger_ids` that is gone (deleted) gets a tombstone row, so that a snapshot segment
        appended after rows that named it removes it."""
        ledgers = self._ledgers
        if ledger_ids is None:
            return [_state_row(i, f) for i, f in sorted(ledgers.items())]
        return [
            _state_row(i, f)
            if f is not None
            else LedgerStateRecord(i, ZERO_KEY, False, -1, -1, True)
            for i in sorted(ledger_ids)
            for f in (ledgers.get(i),)
        ]


def _state_row(ledger_id: int, facts: LedgerFacts) -> LedgerStateRecord:
    return LedgerStateRecord(
        ledger_id, facts.master_key or ZERO_KEY, facts.fenced, facts.lac, facts.last_entry_id
    )


# -- adds ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to each item of an add batch, and the records to journal for it."""

    results: list[wire.AddResult]
    records: list[EntryRecord]


def admit_adds(state: BookieLedgerState, items: Sequence[wire.AddItem]) -> Admission:
    """Check every item of an add batch against the ledger rules, in order, applying each
    admitted record to `state` (the journal's live state) at once, so that each item sees
    the ones before it. The caller journals `records` and answers `results` once they are
    durable (or, if it cannot queue them, must not have called this: see `refuse_adds`)."""
    rows, records = admit_add_items(state, [(i.flags, i.master_key, i.frame) for i in items])
    return Admission([wire.AddResult(*row) for row in rows], records)


def admit_add_items(
    state: BookieLedgerState, items: Iterable[wire.RawAddItem]
) -> tuple[list[wire.AddResultRow], list[EntryRecord]]:
    """`admit_adds` of (flags, master_key, frame) tuples, answered as (ledger_id, entry_id,
    status) rows: the journal's path, with no object per entry but the admitted record."""
    rows: list[wire.AddResultRow] = []
    admitted: list[EntryRecord] = []
    check_add, apply = state.check_add, state.apply
    for flags, master_key, frame in items:
        if len(frame) < HEADER_SIZE:  # no header
            rows.append((0, -1, BookieStatus.BAD_REQUEST))
            continue
        ledger_id, entry_id, lac, _length = _HEADER.unpack_from(frame, 0)
        if entry_id > MAX_ENTRY_ID:  # an entry id the wire's i64 cannot carry back
            rows.append((ledger_id, -1, BookieStatus.BAD_REQUEST))
            continue
        status = check_add(ledger_id, master_key, flags)
        if status is BookieStatus.OK:
            record = EntryRecord(
                master_key, frame, ledger_id, entry_id, lac, wire.digest_code_of(flags)
            )
            apply(record)
            admitted.append(record)
        rows.append((ledger_id, entry_id, status))
    return rows, admitted


def refuse_adds(items: Sequence[wire.AddItem], status: BookieStatus) -> list[wire.AddResult]:
    """The answer to a batch refused whole (READ_ONLY, TOO_MANY_REQUESTS): each item's
    ids as far as its frame tells them."""
    return [wire.AddResult(*_ids(item.frame), status) for item in items]


def refuse_add_items(
    items: Sequence[wire.RawAddItem], status: BookieStatus
) -> list[wire.AddResultRow]:
    """`refuse_adds` of (flags, master_key, frame) tuples, as rows."""
    return [(*_ids(frame), status) for _flags, _key, frame in items]


def frame_ledger_id(frame: bytes) -> int:
    """The ledger an add's frame names (0 when it has no header: refused anyway), which
    picks the journal it goes to."""
    return _ids(frame)[0]


def _ids(frame: bytes) -> tuple[int, int]:
    if len(frame) < HEADER_SIZE:
        return 0, -1
    ledger_id, entry_id, _lac, _length = _HEADER.unpack_from(frame, 0)
    return ledger_id, entry_id if entry_id <= MAX_ENTRY_ID else -1


# -- fence and explicit LAC ---------------------------------------------------------------


def meta_records(
    state: BookieLedgerState, ledger_id: int, master_key: bytes, record: FenceRecord | LacRecord
) -> tuple[BookieStatus, list[Record]]:
    """A fence or write_lac: the key check, and the records to journal (the ledger's key
    first if it has none). Nothing is applied: the caller applies them once queued."""
    status = state.check_master_key(ledger_id, master_key)
    if status is not BookieStatus.OK:
        return status, []
    if state.needs_master_key(ledger_id):
        return status, [MasterKeyRecord(ledger_id, master_key), record]
    return status, [record]


# -- reads: the authority rule ------------------------------------------------------------


def has_authority(applied: JournalPosition, acknowledged: JournalPosition) -> bool:
    """Whether the ledgerstore may claim absence: it has applied the journal up to
    `acknowledged`, the journal's durable end when the question came (every add answered
    OK before the question is below it)."""
    return applied >= acknowledged


def absent_status(ledger_known: bool, authority: bool) -> BookieStatus:
    """The answer for an entry the index does not have. Recovery trusts NO_ENTRY and
    NO_LEDGER to mean "never written here", so they need authority (`has_authority`);
    otherwise the honest answer is UNKNOWN_LEDGER_STATE."""
    if not authority:
        return BookieStatus.UNKNOWN_LEDGER_STATE
    return BookieStatus.NO_ENTRY if ledger_known else BookieStatus.NO_LEDGER


def limbo_absent_status(first_entry_id: int | None, entry_id: int, authority: bool) -> BookieStatus:
    """`absent_status` on a bookie whose disk was wiped (its cookie is in limbo): absence
    is only claimed for entries at or after the first one it stored since the wipe
    (`first_entry_id`: None if the ledger is unknown, -1 if it has no entry here); the rest
    it may have held before, so the answer is UNKNOWN_LEDGER_STATE."""
    if first_entry_id is None or first_entry_id < 0 or entry_id < first_entry_id:
        return BookieStatus.UNKNOWN_LEDGER_STATE
    return absent_status(True, authority)


def absent_entry_status(
    entry_id: int, first_entry_id: int | None, authority: bool, limbo: bool = False
) -> BookieStatus:
    """The read answer for an entry the bookie does not have: `first_entry_id` is the
    lowest entry of the ledger it has applied (None: the ledger is unknown here, -1: known
    without entries)."""
    if limbo:
        return limbo_absent_status(first_entry_id, entry_id, authority)
    return absent_status(first_entry_id is not None, authority)


def disk_read_only(read_only: bool, usage: float, threshold: float, lwm_threshold: float) -> bool:
    """Whether the bookie is read-only after a disk check (diskUsageThreshold and
    diskUsageLwmThreshold): above the threshold it turns read-only; it turns writable
    again only below the low-water mark, so it does not flap at the threshold. The journal
    registers it; the ledgerstore's garbage collector suspends or forces compaction on it."""
    if usage >= threshold:
        return True
    if read_only and usage >= lwm_threshold:
        return True
    return False
