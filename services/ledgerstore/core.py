"""The ledgerstore's pure core: entry log format, per-ledger facts, how to follow the
journal's files, and the authority rule for "no such entry". No IO, no clock.

An entry log (`entrylog-NNNNNN.log`, BookKeeper's interleaved EntryLogger) is a 16-byte
header, then entries of many ledgers in arrival order:

    header  magic "QELG" | version u16 | reserved u16 | log_id u64
    entry   size u32 (16 + frame length) | ledger u64 | entry i64 | frame

The index maps (ledger, entry) to (log_id, offset of the entry's size field, frame length).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from services.journal.core import (
    EntryRecord,
    FenceRecord,
    JournalPosition,
    LacRecord,
    MasterKeyRecord,
    Record,
)
from shared.digest import HEADER_SIZE, DigestManager, DigestMismatch, DigestType, parse_header
from shared.status import BookieStatus
from shared.wire import DIGEST_TYPES

FORMAT_VERSION = 1
ENTRYLOG_MAGIC = b"QELG"
ENTRYLOG_HEADER = struct.Struct(">4sHHQ")
ENTRYLOG_HEADER_SIZE = ENTRYLOG_HEADER.size  # 16
ENTRY_HEAD = struct.Struct(">IQq")  # size, ledger, entry
ENTRY_HEAD_SIZE = ENTRY_HEAD.size  # 20
_LOG_NAME = re.compile(r"^entrylog-(\d{6,})\.log$")


class EntryLogFormatError(ValueError):
    pass


def entry_log_name(log_id: int) -> str:
    return f"entrylog-{log_id:06d}.log"


def parse_entry_log_name(name: str) -> int | None:
    match = _LOG_NAME.match(name)
    return int(match.group(1)) if match else None


def encode_entry_log_header(log_id: int) -> bytes:
    return ENTRYLOG_HEADER.pack(ENTRYLOG_MAGIC, FORMAT_VERSION, 0, log_id)


def check_entry_log_header(buf: bytes, log_id: int) -> None:
    if len(buf) < ENTRYLOG_HEADER_SIZE:
        raise EntryLogFormatError("entry log header cut short")
    magic, version, _, got = ENTRYLOG_HEADER.unpack_from(buf, 0)
    if magic != ENTRYLOG_MAGIC or version != FORMAT_VERSION or got != log_id:
        raise EntryLogFormatError(f"not entry log {log_id} (magic {magic!r}, id {got})")


@dataclass(frozen=True, slots=True)
class EntryLocation:
    log_id: int
    offset: int  # of the entry's size field
    size: int  # frame length
    dir: int = 0  # index of the ledger directory holding the log

    @property
    def frame_offset(self) -> int:
        return self.offset + ENTRY_HEAD_SIZE


def encode_entry(ledger_id: int, entry_id: int, frame: bytes) -> bytes:
    return ENTRY_HEAD.pack(ENTRY_HEAD_SIZE - 4 + len(frame), ledger_id, entry_id) + frame


def decode_entry_head(buf: bytes) -> tuple[int, int, int]:
    """(ledger_id, entry_id, frame length) from an entry's 20-byte head."""
    size, ledger_id, entry_id = ENTRY_HEAD.unpack_from(buf, 0)
    return ledger_id, entry_id, size - (ENTRY_HEAD_SIZE - 4)


def frame_matches(frame: bytes, ledger_id: int, entry_id: int) -> bool:
    """Whether a stored frame claims to be the entry asked for. The digest is checked by
    the reader (the gateway); a frame that is not even the right entry is damage here."""
    if len(frame) < HEADER_SIZE:
        return False
    got_ledger, got_entry, _, _ = parse_header(frame)
    return (got_ledger, got_entry) == (ledger_id, entry_id)


def verify_stored(frame: bytes, ledger_id: int, entry_id: int, digest_code: int) -> str | None:
    """Why a frame read from disk is not the entry asked for (None: it is). The digest is
    checked where the bookie can: crc32 and crc32c. hmac needs the ledger's password and
    the bookie never has it; dummy and unknown (0) carry nothing to check."""
    if not frame_matches(frame, ledger_id, entry_id):
        return "stored frame is not the entry asked for"
    digest_type = DIGEST_TYPES.get(digest_code)
    if digest_type not in (DigestType.CRC32, DigestType.CRC32C):
        return None
    try:
        DigestManager(digest_type).verify(frame, ledger_id, entry_id)
    except DigestMismatch as exc:
        return str(exc)
    return None


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


# -- the authority rule -------------------------------------------------------------------


def limbo_absent_status(info: LedgerInfo | None, entry_id: int, caught_up: bool) -> BookieStatus:
    """`absent_status` on a bookie whose disk was wiped (its cookie is in limbo): absence
    is only claimed for entries at or after the first one it stored since the wipe; the
    rest it may have held before, so the answer is UNKNOWN_LEDGER_STATE."""
    if info is None or info.first_entry_id < 0 or entry_id < info.first_entry_id:
        return BookieStatus.UNKNOWN_LEDGER_STATE
    return absent_status(True, caught_up)


def absent_status(ledger_known: bool, caught_up: bool) -> BookieStatus:
    """The answer for an entry the index does not have. Recovery trusts NO_ENTRY and
    NO_LEDGER to mean "never written here", so they need everything the journal had
    acknowledged applied; otherwise the honest answer is UNKNOWN_LEDGER_STATE."""
    if not caught_up:
        return BookieStatus.UNKNOWN_LEDGER_STATE
    return BookieStatus.NO_ENTRY if ledger_known else BookieStatus.NO_LEDGER
