"""The journal's on-disk format: records, journal files, the LastLogMark and the
ledger-state snapshot. Pure: no IO, no clock.

The journal service writes these bytes; the ledgerstore (which follows the journal's
files), the storage CLI (`quire shell readjournal|lastmark`) and the simulator read or
build them with the same code.

A journal file (`journal-NNNNNN.log`) is a 16-byte header, then records:

    file header  magic "QJNL" | version u16 | reserved u16 | file_id u64
    record       size u32 | crc u32 | kind u8 | body (size - 1 bytes)

`crc` is CRC32C over the size field, the kind and the body, so a torn or flipped size
is caught as surely as a flipped payload byte. Record kinds and their bodies:

    ENTRY         master_key 20s | frame     (ledger, entry, LAC come from the frame header)
    MASTER_KEY    ledger u64 | master_key 20s
    FENCE         ledger u64
    LAC           ledger u64 | lac i64       (an explicit LAC, BookKeeper's writeLac)
    LEDGER_STATE  ledger u64 | master_key 20s | flags u8 | lac i64 | last_entry i64
                  (only in a version 1 ledger-state snapshot; flags: 1 fenced, 2 deleted)
    BATCH         count u32 | size u32       (format 2: opens each group commit; the
                                              `size` bytes after it are its `count` records)
    ENTRY_DIGEST  digest u8 | master_key 20s | frame   (format 2: ENTRY plus the code of
                                              the ledger's digest type, 0 = unknown)
    DELETED       ledger u64                 (the garbage collector found the ledger gone
                                              from metadata: the bookie forgets it, its
                                              key, fence and entries; in journal order, so
                                              a replay forgets it at the same point)

Why BATCH: a group commit is one write then one fdatasync, and the next one starts only
after that fsync returned. So after a crash only the LAST batch can be partly on disk,
and its pages may land in any order (a record torn in its middle while a later record of
it survived). A bad record followed by valid records of the same batch is therefore a
torn tail; a bad record followed by a later valid BATCH header is damage to bytes that
were once fsynced, and the journal refuses to start.

The ledger-state snapshot (`ledgers.snapshot`, version 2) is an 8-byte header, then
segments, each appended (and fsynced) at a checkpoint:

    file header  magic "QJSN" | version u16 | reserved u16
    segment      file_id u64 | offset u64 | count u32 | crc u32 | count rows
    row          ledger u64 | master_key 20s | flags u8 | lac i64 | last_entry i64

`crc` is CRC32C over the segment's position, count and rows. A segment holds the ledgers
that changed since the one before it, as of its position; the facts as of the last
segment's position are all the rows in order, a later row of a ledger winning. A row with
flag 2 (deleted) is a tombstone: the ledger was deleted since an earlier row named it. So a
checkpoint writes what changed, not every ledger ever seen; the file is rewritten whole
(one segment) once it holds more rows than twice the ledgers.

A position is (file_id, offset): the byte offset just after a record, i.e. where the next
record starts. Positions only grow: the journal never appends to a file it replayed.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import NamedTuple

import crc32c as _crc32c

from shared.digest import HEADER_SIZE, MASTER_KEY_SIZE, DigestMismatch, parse_header

FORMAT_VERSION = 2  # 2: group commits open with a BATCH record
READABLE_VERSIONS = (1, 2)
# 2: segments appended at checkpoints, each with the ledgers changed since the last one
# (1: one full list of LEDGER_STATE records, still read)
SNAPSHOT_VERSION = 2
JOURNAL_MAGIC = b"QJNL"
SNAPSHOT_MAGIC = b"QJSN"
FILE_HEADER = struct.Struct(">4sHHQ")
FILE_HEADER_SIZE = FILE_HEADER.size  # 16
RECORD_HEAD = struct.Struct(">II")  # size, crc
RECORD_HEAD_SIZE = RECORD_HEAD.size  # 8
# A record is at most one entry (<= the gateway's max entry size, 5 MiB by default) plus its
# key; anything larger in a size field is damage, not data.
MAX_RECORD_SIZE = 64 * 1024 * 1024
NO_KEY = b""
ZERO_KEY = bytes(MASTER_KEY_SIZE)  # NO_KEY in a snapshot (a SHA-1 is never all zeros)

_SIZE = struct.Struct(">I")
_KIND = struct.Struct(">B")
_LEDGER = struct.Struct(">Q")
_MASTER_KEY = struct.Struct(f">Q{MASTER_KEY_SIZE}s")
_LAC = struct.Struct(">Qq")
_LEDGER_STATE = struct.Struct(f">Q{MASTER_KEY_SIZE}sBqq")
_BATCH = struct.Struct(">II")
_DIGEST_CODE = struct.Struct(">B")
_SNAPSHOT_FILE_HEAD = struct.Struct(">4sHH")  # magic, version, reserved
_SNAPSHOT_HEAD_V1 = struct.Struct(">4sHHQQI")  # ... and file_id, offset, count
_SEGMENT_HEAD = struct.Struct(">QQI")  # file_id, offset, count; then crc u32, then the rows
_FILE_NAME = re.compile(r"^journal-(\d{6,})\.log$")
# Beside the journal files in the journal directory:
LAST_MARK = "lastMark"  # encode_last_mark: where replay starts
SNAPSHOT = "ledgers.snapshot"  # encode_snapshot: the ledger facts as of a position


class JournalFormatError(ValueError):
    """Bytes that are not a valid journal record, file header or snapshot."""


def journal_file_name(file_id: int) -> str:
    return f"journal-{file_id:06d}.log"


def parse_journal_file_name(name: str) -> int | None:
    match = _FILE_NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, order=True, slots=True)
class JournalPosition:
    file_id: int
    offset: int

    def to_json(self) -> dict[str, int]:
        return {"file": self.file_id, "offset": self.offset}

    @classmethod
    def from_json(cls, data: dict) -> JournalPosition:
        file_id, offset = data["file"], data["offset"]
        if not (isinstance(file_id, int) and isinstance(offset, int)):
            raise JournalFormatError(f"bad journal position {data!r}")
        if file_id < 1 or offset < 0:
            raise JournalFormatError(f"bad journal position {data!r}")
        return cls(file_id, offset)


# The very beginning of the journal: file ids start at 1.
JOURNAL_START = JournalPosition(1, 0)


# -- records ------------------------------------------------------------------------------


class RecordKind(IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    LAC = 4
    LEDGER_STATE = 5
    BATCH = 6
    ENTRY_DIGEST = 7
    DELETED = 8


class EntryRecord(NamedTuple):
    """An entry's record. A NamedTuple, not a frozen dataclass like the other records: one
    is built for every add (admission) and every replayed or followed entry (decode), and
    a tuple is built in a third of the time (a frozen dataclass sets each field through
    object.__setattr__). Compare records by `type(record) is EntryRecord` or isinstance,
    never with plain tuples."""

    master_key: bytes
    frame: bytes
    ledger_id: int
    entry_id: int
    lac: int
    # The ledger's digest type as the add's flags carried it (shared.wire digest codes);
    # 0: unknown, the bookie does not verify this entry's digest on reads.
    digest_code: int = 0

    @classmethod
    def of(cls, master_key: bytes, frame: bytes, digest_code: int = 0) -> EntryRecord:
        """An entry record; DigestMismatch if the frame has no complete header."""
        ledger_id, entry_id, lac, _length = parse_header(frame)
        return cls(master_key, frame, ledger_id, entry_id, lac, digest_code)


@dataclass(frozen=True, slots=True)
class MasterKeyRecord:
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class FenceRecord:
    ledger_id: int


@dataclass(frozen=True, slots=True)
class LacRecord:
    ledger_id: int
    lac: int


@dataclass(frozen=True, slots=True)
class LedgerStateRecord:
    ledger_id: int
    master_key: bytes
    fenced: bool
    lac: int
    last_entry_id: int
    deleted: bool = False  # a snapshot's tombstone: the ledger is gone since earlier rows

    @property
    def flags(self) -> int:
        return int(self.fenced) | (STATE_DELETED if self.deleted else 0)


@dataclass(frozen=True, slots=True)
class LedgerDeletedRecord:
    """The bookie forgets a ledger (its garbage collector found it gone from metadata)."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class BatchRecord:
    count: int  # records in the batch after this one
    size: int  # their bytes


Record = (
    EntryRecord
    | MasterKeyRecord
    | FenceRecord
    | LacRecord
    | LedgerStateRecord
    | BatchRecord
    | LedgerDeletedRecord
)
STATE_FENCED = 1  # LEDGER_STATE flags
STATE_DELETED = 2


def _body(record: Record) -> tuple[RecordKind, bytes]:
    match record:
        case EntryRecord(master_key=key, frame=frame, digest_code=code):
            return RecordKind.ENTRY_DIGEST, _DIGEST_CODE.pack(code) + key + frame
        case BatchRecord(count=count, size=size):
            return RecordKind.BATCH, _BATCH.pack(count, size)
        case MasterKeyRecord(ledger_id=ledger_id, master_key=key):
            return RecordKind.MASTER_KEY, _MASTER_KEY.pack(ledger_id, key)
        case FenceRecord(ledger_id=ledger_id):
            return RecordKind.FENCE, _LEDGER.pack(ledger_id)
        case LedgerDeletedRecord(ledger_id=ledger_id):
            return RecordKind.DELETED, _LEDGER.pack(ledger_id)
        case LacRecord(ledger_id=ledger_id, lac=lac):
            return RecordKind.LAC, _LAC.pack(ledger_id, lac)
        case LedgerStateRecord():
            return RecordKind.LEDGER_STATE, _LEDGER_STATE.pack(
                record.ledger_id,
                record.master_key,
                record.flags,
                record.lac,
                record.last_entry_id,
            )
    raise TypeError(f"not a journal record: {record!r}")


def encode_record(record: Record) -> bytes:
    if type(record) is EntryRecord:
        return encode_entry_record(record)
    return encode_record_generic(record)


def encode_record_generic(record: Record) -> bytes:
    """Any record through `_body` (entries take a faster path with the same bytes)."""
    kind, body = _body(record)
    if isinstance(record, EntryRecord | MasterKeyRecord) and len(record.master_key) != 20:
        raise ValueError("master key must be 20 bytes")
    size = _SIZE.pack(1 + len(body))
    kind_byte = _KIND.pack(kind)
    crc = _crc32c.crc32c(body, _crc32c.crc32c(kind_byte, _crc32c.crc32c(size)))
    return b"".join((size, struct.pack(">I", crc), kind_byte, body))


_ENTRY_DIGEST_KIND_VALUE = int(RecordKind.ENTRY_DIGEST)
# An entry record's bytes before its frame: what its crc covers (size, kind, digest code,
# key), and as written (size, crc, kind, digest code, key).
_ENTRY_CRC_HEAD = struct.Struct(f">IBB{MASTER_KEY_SIZE}s")
_ENTRY_HEAD = struct.Struct(f">IIBB{MASTER_KEY_SIZE}s")


def encode_entry_record(record: EntryRecord) -> bytes:
    """`encode_record` of an entry, the hot path of every add: the same bytes as through
    `_body`, two packs, two crc calls and one concatenation."""
    master_key, frame = record.master_key, record.frame
    if len(master_key) != MASTER_KEY_SIZE:
        raise ValueError("master key must be 20 bytes")
    size = 2 + MASTER_KEY_SIZE + len(frame)
    code = record.digest_code
    crc = _crc32c.crc32c(
        frame,
        _crc32c.crc32c(_ENTRY_CRC_HEAD.pack(size, _ENTRY_DIGEST_KIND_VALUE, code, master_key)),
    )
    return _ENTRY_HEAD.pack(size, crc, _ENTRY_DIGEST_KIND_VALUE, code, master_key) + frame


def _fixed(fmt: struct.Struct, body: memoryview, kind: RecordKind) -> tuple:
    if len(body) != fmt.size:
        raise JournalFormatError(f"{kind.name} record body of {len(body)} bytes")
    return fmt.unpack(body)


_ENTRY_DIGEST_VALUE = int(RecordKind.ENTRY_DIGEST)
_ENTRY_MIN_BODY = 1 + MASTER_KEY_SIZE + HEADER_SIZE


def decode_body(kind_value: int, body: memoryview) -> Record:
    if kind_value == _ENTRY_DIGEST_VALUE and len(body) >= _ENTRY_MIN_BODY:
        # Every add's record (the bookie's hot path): no enum lookup, no re-slicing.
        frame = bytes(body[1 + MASTER_KEY_SIZE :])
        ledger_id, entry_id, lac, _length = parse_header(frame)
        return EntryRecord(
            bytes(body[1 : 1 + MASTER_KEY_SIZE]), frame, ledger_id, entry_id, lac, body[0]
        )
    try:
        kind = RecordKind(kind_value)
    except ValueError as exc:
        raise JournalFormatError(f"unknown record kind {kind_value}") from exc
    if kind is RecordKind.ENTRY or kind is RecordKind.ENTRY_DIGEST:
        code = 0
        if kind is RecordKind.ENTRY_DIGEST:
            code, body = body[0] if len(body) else 0, body[1:]
        if len(body) < MASTER_KEY_SIZE + HEADER_SIZE:
            raise JournalFormatError(f"entry record body of {len(body)} bytes")
        try:
            return EntryRecord.of(
                bytes(body[:MASTER_KEY_SIZE]), bytes(body[MASTER_KEY_SIZE:]), code
            )
        except DigestMismatch as exc:
            raise JournalFormatError(str(exc)) from exc
    if kind is RecordKind.BATCH:
        return BatchRecord(*_fixed(_BATCH, body, kind))
    if kind is RecordKind.MASTER_KEY:
        return MasterKeyRecord(*_fixed(_MASTER_KEY, body, kind))
    if kind is RecordKind.FENCE:
        return FenceRecord(*_fixed(_LEDGER, body, kind))
    if kind is RecordKind.LAC:
        return LacRecord(*_fixed(_LAC, body, kind))
    if kind is RecordKind.DELETED:
        return LedgerDeletedRecord(*_fixed(_LEDGER, body, kind))
    ledger_id, key, flags, lac, last = _fixed(_LEDGER_STATE, body, kind)
    return _state_record(ledger_id, key, flags, lac, last)


def _state_record(ledger_id: int, key: bytes, flags: int, lac: int, last: int) -> LedgerStateRecord:
    return LedgerStateRecord(
        ledger_id, key, bool(flags & STATE_FENCED), lac, last, bool(flags & STATE_DELETED)
    )


class ScanStop(Enum):
    END = "end"  # every byte was a complete, valid record
    INCOMPLETE = "incomplete"  # the last record runs past the end of the bytes
    BAD = "bad"  # a record that is complete but fails its checks


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    start: int  # offset of the record's first byte
    end: int  # offset just after it: the position once it is applied
    record: Record


@dataclass(frozen=True, slots=True)
class ScanResult:
    records: list[ScannedRecord]
    end: int  # offset just after the last valid record (where scanning stopped)
    stop: ScanStop
    reason: str = ""
    # For INCOMPLETE: how many bytes from `end` the stopping record needs.
    needed_bytes: int = 0


def _try_record(buf: memoryview, at: int) -> tuple[ScanStop | None, str, int, Record | None]:
    """(None, "", end, record) for a valid record at `at`, else the stop and why."""
    available = len(buf) - at
    if available < RECORD_HEAD_SIZE:
        return ScanStop.INCOMPLETE, "record header cut short", RECORD_HEAD_SIZE, None
    size, crc = RECORD_HEAD.unpack_from(buf, at)
    if size < 1 or size > MAX_RECORD_SIZE:
        return ScanStop.BAD, f"impossible record size {size}", 0, None
    if available < RECORD_HEAD_SIZE + size:
        return ScanStop.INCOMPLETE, "record cut short", RECORD_HEAD_SIZE + size, None
    payload = buf[at + RECORD_HEAD_SIZE : at + RECORD_HEAD_SIZE + size]
    if _crc32c.crc32c(payload, _crc32c.crc32c(buf[at : at + 4])) != crc:
        return ScanStop.BAD, "checksum mismatch", 0, None
    try:
        record = decode_body(payload[0], payload[1:])
    except JournalFormatError as exc:
        return ScanStop.BAD, str(exc), 0, None
    return None, "", at + RECORD_HEAD_SIZE + size, record


def scan_records(
    buf: bytes | memoryview, base_offset: int = 0, max_records: int | None = None
) -> ScanResult:
    """Decode the records in `buf`, which holds a file's bytes from `base_offset` on.
    Stops at the end, at an incomplete record, at a bad one, or after `max_records`."""
    view = memoryview(buf)
    records: list[ScannedRecord] = []
    at = 0
    while at < len(view):
        if max_records is not None and len(records) >= max_records:
            return ScanResult(records, base_offset + at, ScanStop.END)
        stop, reason, end_or_needed, record = _try_record(view, at)
        if stop is not None:
            needed = end_or_needed if stop is ScanStop.INCOMPLETE else 0
            return ScanResult(records, base_offset + at, stop, reason, needed)
        assert record is not None
        records.append(ScannedRecord(base_offset + at, base_offset + end_or_needed, record))
        at = end_or_needed
    return ScanResult(records, base_offset + at, ScanStop.END)


def next_valid_record(buf: bytes | memoryview, start: int, batch_only: bool = False) -> int | None:
    """The offset of the first valid record (a BATCH record if `batch_only`) at or after
    `start`, or None. Used to tell a tear from damage, and to resynchronise past damage
    when the operator allows it."""
    view = memoryview(buf)
    for at in range(start, len(view) - RECORD_HEAD_SIZE + 1):
        stop, _, _, record = _try_record(view, at)
        if stop is None and (not batch_only or isinstance(record, BatchRecord)):
            return at
    return None


def encode_batch(records: Sequence[bytes]) -> bytes:
    """One group commit as written: a BATCH record, then the encoded records."""
    body = b"".join(records)
    return encode_record(BatchRecord(len(records), len(body))) + body


# -- file headers -------------------------------------------------------------------------


def encode_file_header(file_id: int, version: int = FORMAT_VERSION) -> bytes:
    return FILE_HEADER.pack(JOURNAL_MAGIC, version, 0, file_id)


def file_format_version(buf: bytes | memoryview) -> int:
    """The format version in a complete file header (check it first)."""
    return FILE_HEADER.unpack_from(buf, 0)[1]


def check_file_header(buf: bytes | memoryview, file_id: int) -> bool:
    """True if `buf` starts with the header of journal file `file_id`; False if it is too
    short to tell (a file being created); JournalFormatError if it is another file."""
    if len(buf) < FILE_HEADER_SIZE:
        if not any(
            bytes(buf) == encode_file_header(file_id, v)[: len(buf)] for v in READABLE_VERSIONS
        ):
            raise JournalFormatError("not a Quire journal file header")
        return False
    magic, version, _, got_id = FILE_HEADER.unpack_from(buf, 0)
    if magic != JOURNAL_MAGIC:
        raise JournalFormatError("not a Quire journal file (bad magic)")
    if version not in READABLE_VERSIONS:
        raise JournalFormatError(f"unsupported journal format version {version}")
    if got_id != file_id:
        raise JournalFormatError(f"header says file {got_id}, name says {file_id}")
    return True


# -- LastLogMark and the ledger-state snapshot --------------------------------------------


def encode_last_mark(position: JournalPosition) -> bytes:
    return json.dumps(position.to_json()).encode()


def decode_last_mark(data: bytes) -> JournalPosition:
    try:
        return JournalPosition.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalFormatError(f"bad lastMark: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A decoded ledger-state snapshot: the ledger facts as of `position`."""

    position: JournalPosition  # replay applies the journal's records after it
    records: list[LedgerStateRecord]  # in file order: a later record of a ledger wins
    version: int
    # Why the bytes after the last complete segment were not read ("" if there were none):
    # an append torn by a crash. Safe to ignore, because the journal writes the LastLogMark
    # (and deletes files) only after the append is fsynced; replay still checks that the
    # journal files after `position` exist.
    torn: str = ""

    @property
    def appendable(self) -> bool:
        """Whether the next checkpoint may append a segment (else it rewrites the file)."""
        return self.version == SNAPSHOT_VERSION and not self.torn


def encode_snapshot(position: JournalPosition, records: Sequence[LedgerStateRecord]) -> bytes:
    """A whole snapshot file: the facts of every ledger as of `position`, one segment."""
    head = _SNAPSHOT_FILE_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0)
    return head + encode_snapshot_segment(position, records)


def encode_snapshot_segment(
    position: JournalPosition, records: Sequence[LedgerStateRecord]
) -> bytes:
    """A segment to append to a snapshot file: the facts of the ledgers that changed since
    the file's last segment, as of `position`."""
    pack = _LEDGER_STATE.pack
    body = b"".join(
        pack(r.ledger_id, r.master_key, r.flags, r.lac, r.last_entry_id) for r in records
    )
    head = _SEGMENT_HEAD.pack(position.file_id, position.offset, len(records))
    return head + _SIZE.pack(_crc32c.crc32c(body, _crc32c.crc32c(head))) + body


def decode_snapshot(data: bytes) -> Snapshot:
    if len(data) < _SNAPSHOT_FILE_HEAD.size:
        raise JournalFormatError("snapshot shorter than its header")
    magic, version, _ = _SNAPSHOT_FILE_HEAD.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC or version not in (1, SNAPSHOT_VERSION):
        raise JournalFormatError("not a Quire ledger-state snapshot")
    if version == 1:
        return _decode_snapshot_v1(data)
    view = memoryview(data)
    at = _SNAPSHOT_FILE_HEAD.size
    records: list[LedgerStateRecord] = []
    position: JournalPosition | None = None
    torn = ""
    segment_size = _SEGMENT_HEAD.size + _SIZE.size
    while at < len(view):
        if len(view) - at < segment_size:
            torn = f"segment header cut short at offset {at}"
            break
        file_id, offset, count = _SEGMENT_HEAD.unpack_from(view, at)
        (crc,) = _SIZE.unpack_from(view, at + _SEGMENT_HEAD.size)
        end = at + segment_size + count * _LEDGER_STATE.size
        body = view[at + segment_size : end]
        if end > len(view):
            torn = f"segment cut short at offset {at}"
            break
        if _crc32c.crc32c(body, _crc32c.crc32c(view[at : at + _SEGMENT_HEAD.size])) != crc:
            torn = f"segment checksum mismatch at offset {at}"
            break
        records.extend(_state_record(*row) for row in _LEDGER_STATE.iter_unpack(body))
        position = JournalPosition(file_id, offset)
        at = end
    if position is None:
        raise JournalFormatError(f"snapshot without a complete segment ({torn or 'empty'})")
    return Snapshot(position, records, version, torn)


def _decode_snapshot_v1(data: bytes) -> Snapshot:
    """Version 1: one full list of LEDGER_STATE journal records, each with its crc."""
    if len(data) < _SNAPSHOT_HEAD_V1.size:
        raise JournalFormatError("snapshot shorter than its header")
    _, _, _, file_id, offset, count = _SNAPSHOT_HEAD_V1.unpack_from(data, 0)
    scan = scan_records(memoryview(data)[_SNAPSHOT_HEAD_V1.size :])
    if scan.stop is not ScanStop.END or len(scan.records) != count:
        raise JournalFormatError(f"damaged snapshot ({scan.reason or 'record count'})")
    records = [s.record for s in scan.records]
    if not all(isinstance(r, LedgerStateRecord) for r in records):
        raise JournalFormatError("snapshot holds records other than ledger state")
    return Snapshot(JournalPosition(file_id, offset), records, 1)  # type: ignore[arg-type]


# -- replay's starting point ---------------------------------------------------------------


# Opens the journal's refusal of such a file: the operator reads it, and the fault suite's
# nemesis (quire/faults/nemesis.py) tells this refusal from one of damage by it.
SHORT_JOURNAL = "journal shorter than its recorded durable position"


@dataclass(frozen=True, slots=True)
class ShortJournal:
    """A journal file that ends before a position recorded as durable in it: bytes that
    were fsynced (and, for the LastLogMark, applied by the ledgerstore) are gone."""

    recorded_by: str  # the file that recorded the position (LAST_MARK or SNAPSHOT)
    position: JournalPosition
    size: int | None  # the journal file's size; None when the file is missing


def journal_shorter_than_recorded(
    sizes: Mapping[int, int], recorded: Mapping[str, JournalPosition | None]
) -> ShortJournal | None:
    """The first of the `recorded` positions (by recording file name: the LastLogMark,
    the ledger-state snapshot's) that the journal files, `sizes` (file id -> bytes), do not
    reach; None if they reach all of them.

    Replay starts at such a position and counts everything before it durable: a file cut
    below it (a disk that lied about fsync, a truncation from outside) would have the
    journal start past the file's end and write new records at offsets the ledgerstore
    believes it has already applied. Bytes past a position are not checked here (a torn
    tail after it is replay's to truncate). A position at offset 0 needs no bytes (the
    very start, before any file was made)."""
    for recorded_by, position in recorded.items():
        if position is None or position.offset == 0:
            continue
        size = sizes.get(position.file_id)
        if size is None or size < position.offset:
            return ShortJournal(recorded_by, position, size)
    return None
