"""The ledgerstore's pure core: where entries are, per-ledger facts, and how to follow
the journal's files. No IO, no clock.

The entry log format is `shared.bookie.entrylog_format`, the index schema
`shared.bookie.index_schema`, and the read answer for an absent entry (the authority
rule) `shared.bookie.rules`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from shared.bookie.entrylog_format import ENTRY_HEAD_SIZE
from shared.bookie.journal_format import (
    EntryRecord,
    FenceRecord,
    JournalPosition,
    LacRecord,
    MasterKeyRecord,
    Record,
)
from shared.digest import HEADER_SIZE, DigestManager, DigestMismatch, DigestType, parse_header
from shared.wire import DIGEST_TYPES


class EntryLocation(NamedTuple):
    """An entry in the entry logs, as the index holds it. A named tuple, not a dataclass:
    one is made per entry read from the index and per entry flushed, and a named tuple is
    made in about half the time of a frozen dataclass (issue 20, reads beside writes)."""

    log_id: int
    offset: int  # of the entry's size field
    size: int  # frame length
    dir: int = 0  # index of the ledger directory holding the log

    @property
    def frame_offset(self) -> int:
        return self.offset + ENTRY_HEAD_SIZE


def frame_matches(frame: bytes, ledger_id: int, entry_id: int) -> bool:
    """Whether a stored frame claims to be the entry asked for. The digest is checked by
    the reader (the gateway); a frame that is not even the right entry is damage here."""
    if len(frame) < HEADER_SIZE:
        return False
    got_ledger, got_entry, _, _ = parse_header(frame)
    return (got_ledger, got_entry) == (ledger_id, entry_id)


# The digest types a bookie can check, by wire code: one manager each, not one per frame.
_CHECKSUMS = {
    code: DigestManager(kind)
    for code, kind in DIGEST_TYPES.items()
    if kind in (DigestType.CRC32, DigestType.CRC32C)
}


def verify_stored(frame: bytes, ledger_id: int, entry_id: int, digest_code: int) -> str | None:
    """Why a frame read from disk is not the entry asked for (None: it is). The digest is
    checked where the bookie can: crc32 and crc32c. hmac needs the ledger's password and
    the bookie never has it; dummy and unknown (0) carry nothing to check."""
    if not frame_matches(frame, ledger_id, entry_id):
        return "stored frame is not the entry asked for"
    manager = _CHECKSUMS.get(digest_code)
    if manager is None:
        return None
    try:
        manager.check(frame, ledger_id, entry_id)
    except DigestMismatch as exc:
        return str(exc)
    return None


# -- planning a read from disk ------------------------------------------------------------

# Two entries further apart than this in an entry log are read with two preads: reading
# the bytes between costs less than a second IO below it (a reader asking every third
# entry of 1 KiB entries skips 2 KiB between them).
READ_GAP_MAX_BYTES = 64 * 1024
# The most bytes one pread of a run of entries reads.
READ_SPAN_MAX_BYTES = 8 * 1024 * 1024
# Entry ids of one ledger further apart than this are looked up by separate range queries
# (a sparse request must not scan the index rows between its entries).
INDEX_GAP_MAX_ENTRIES = 64


def read_ahead_ids(asked: Sequence[int], limit: int) -> list[int]:
    """The entries a reader that asked `asked` (ascending ids of one ledger) asks next: as
    many again (at most `limit`), after the last, with the request's stride (1: a block of
    entries; 3: a reader of an E3/Qw3 ledger asking each bookie every third entry); a
    request without one stride is read ahead as a block."""
    if not asked or limit <= 0:
        return []
    steps = {b - a for a, b in zip(asked, asked[1:], strict=False)}
    stride = steps.pop() if len(steps) == 1 else 1
    last = asked[-1]
    return [last + stride * k for k in range(1, min(len(asked), limit) + 1)]


def id_ranges(ids: Sequence[int], gap_max: int = INDEX_GAP_MAX_ENTRIES) -> list[tuple[int, int]]:
    """Ascending `ids` as [first, last] ranges, one per run whose neighbours are at most
    `gap_max` apart: one index range query each."""
    ranges: list[tuple[int, int]] = []
    for entry_id in ids:
        if ranges and entry_id - ranges[-1][1] <= gap_max:
            ranges[-1] = (ranges[-1][0], entry_id)
        else:
            ranges.append((entry_id, entry_id))
    return ranges


def plan_spans(
    located: Sequence[tuple[tuple[int, int], EntryLocation]],
    gap_max_bytes: int = READ_GAP_MAX_BYTES,
    span_max_bytes: int = READ_SPAN_MAX_BYTES,
) -> list[list[tuple[tuple[int, int], EntryLocation]]]:
    """Group ((ledger, entry), location)s into spans that one pread each reads: same entry log, in
    file order, neighbours at most `gap_max_bytes` apart, at most `span_max_bytes` long."""
    ordered = sorted(located, key=lambda kl: (kl[1].dir, kl[1].log_id, kl[1].offset))
    spans: list[list[tuple[tuple[int, int], EntryLocation]]] = []
    for key, location in ordered:
        if spans:
            first, last = spans[-1][0][1], spans[-1][-1][1]
            end = last.frame_offset + last.size
            if (
                location.dir == first.dir
                and location.log_id == first.log_id
                and 0 <= location.offset - end <= gap_max_bytes
                and location.frame_offset + location.size - first.offset <= span_max_bytes
            ):
                spans[-1].append((key, location))
                continue
        spans.append([(key, location)])
    return spans


def ledger_dir_index(ledger_id: int, dir_count: int) -> int:
    """Which ledger directory stores a ledger's entries (BookKeeper: ledger id modulo
    the number of ledgerDirectories)."""
    return ledger_id % dir_count


# -- per-ledger facts ---------------------------------------------------------------------


@dataclass(slots=True)
class LedgerInfo:
    """What the ledgerstore knows of a ledger: its last stored entry and its LAC (the max
    of every piggybacked and explicit LAC it has applied)."""

    last_entry_id: int = -1
    lac: int = -1
    digest_code: int = 0  # shared.wire digest code of the ledger's entries (0: unknown)
    first_entry_id: int = -1  # the lowest entry applied here (-1: none)


def apply_to_ledgers(ledgers: dict[int, LedgerInfo], record: Record) -> int | None:
    """Apply a journal record's ledger facts; returns the ledger id it touched."""
    if type(record) is EntryRecord:  # nearly every record: no pattern matching for it
        info = ledgers.get(record.ledger_id)
        if info is None:
            info = ledgers[record.ledger_id] = LedgerInfo()
        entry_id = record.entry_id
        if entry_id > info.last_entry_id:
            info.last_entry_id = entry_id
        if record.lac > info.lac:
            info.lac = record.lac
        if info.first_entry_id < 0 or entry_id < info.first_entry_id:
            info.first_entry_id = entry_id
        if record.digest_code:
            info.digest_code = record.digest_code
        return record.ledger_id
    match record:
        case LacRecord():
            info = ledgers.setdefault(record.ledger_id, LedgerInfo())
            info.lac = max(info.lac, record.lac)
            return record.ledger_id
        case MasterKeyRecord() | FenceRecord():
            # A fenced or keyed ledger exists on this bookie even with no entries: its LAC
            # read answers -1, not NO_LEDGER.
            ledgers.setdefault(record.ledger_id, LedgerInfo())
            return record.ledger_id
    return None


# -- following the journal ----------------------------------------------------------------


class CursorAction(Enum):
    READ = "read"  # read the file the position is in
    WAIT = "wait"  # the file does not exist yet: the journal has not started it
    GAP = "gap"  # the file is gone but later ones exist: records were lost to us


def locate(position: JournalPosition, file_ids: Sequence[int]) -> CursorAction:
    """What to do at `position` given the journal files that exist now."""
    if position.file_id in file_ids:
        return CursorAction.READ
    if any(file_id > position.file_id for file_id in file_ids):
        return CursorAction.GAP
    return CursorAction.WAIT


def next_file(position: JournalPosition, file_ids: Sequence[int]) -> JournalPosition | None:
    """Where to go once `position` is at the end of its file: the start of the next file
    if the journal has started one (then this file is complete), else None (keep
    reading this one)."""
    later = [i for i in file_ids if i > position.file_id]
    if not later:
        return None
    return JournalPosition(position.file_id + 1, 0)
