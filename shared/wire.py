"""The compact binary encoding of bookie requests and replies.

Entries travel as raw frames (see `shared.digest`), never as base64 JSON, and adds and
reads go in batches: one NATS message carries many entries for one bookie. Every
message starts with a version byte; every reply then carries a batch status
(`BookieStatus`) before its items, so a malformed request gets BAD_REQUEST back.

    add request     v u8 | n u32 | n x (flags u8 | master_key 20s | len u32 | frame)
                    (flags: bit 0 recovery add, bits 4-7 digest type code)
    add reply       v u8 | status u16 | n u32 | n x (ledger u64 | entry i64 | status u16)
    read request    v u8 | n u32 | timeout_ms u32 | n x (ledger u64 | entry i64 | flags u8)
                    (timeout_ms: how long the client waits for the answer, 0 = no limit; a
                    bookie drops a request that waited longer in its queue, unread)
    read reply      v u8 | status u16 | n u32 | n x (ledger u64 | entry i64 | status u16 |
                                                     len u32 | frame)
    read_lac req    v u8 | ledger u64
    read_lac reply  v u8 | status u16 | lac i64 | last_entry i64
    fence request   v u8 | ledger u64 | master_key 20s
    fence reply     v u8 | status u16 | lac i64 | last_entry i64
    write_lac req   v u8 | n x (ledger u64 | master_key 20s | lac i64)      (n >= 1)
    write_lac reply v u8 | n x status u16   (or one status: the whole request refused)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import starmap

from shared.digest import MASTER_KEY_SIZE, DigestType
from shared.status import BookieStatus

VERSION = 1

FLAG_RECOVERY_ADD = 0x01  # an add by recovery: allowed on a fenced ledger
# Bits 4-7 of an add item's flags: the ledger's digest type, so that the bookie can verify
# what it stores on every read. 0 = unknown (an older sender): the bookie does not verify.
DIGEST_CODE_SHIFT = 4
DIGEST_CODES: dict[DigestType, int] = {
    DigestType.CRC32: 1,
    DigestType.CRC32C: 2,
    DigestType.HMAC: 3,
    DigestType.DUMMY: 4,
}
DIGEST_TYPES: dict[int, DigestType] = {code: kind for kind, code in DIGEST_CODES.items()}


def add_flags(digest_type: DigestType | str | None, recovery: bool = False) -> int:
    """The flags byte of an add item."""
    code = DIGEST_CODES[DigestType(digest_type)] if digest_type is not None else 0
    return (code << DIGEST_CODE_SHIFT) | (FLAG_RECOVERY_ADD if recovery else 0)


def digest_code_of(flags: int) -> int:
    """The digest type code in an add item's flags (0: unknown)."""
    return (flags >> DIGEST_CODE_SHIFT) & 0x0F


_COUNT = struct.Struct(">BI")
_REPLY_HEAD = struct.Struct(">BHI")
_ADD_ITEM = struct.Struct(f">B{MASTER_KEY_SIZE}sI")
_ADD_RESULT = struct.Struct(">QqH")
_READ_HEAD = struct.Struct(">BII")
_READ_ITEM = struct.Struct(">QqB")
_READ_RESULT = struct.Struct(">QqHI")
_LEDGER = struct.Struct(">BQ")
_LAC_REPLY = struct.Struct(">BHqq")
_FENCE_REQ = struct.Struct(f">BQ{MASTER_KEY_SIZE}s")
_WRITE_LAC_ITEM = struct.Struct(f">Q{MASTER_KEY_SIZE}sq")
_STATUS = struct.Struct(">H")


class WireError(ValueError):
    """A message that does not decode: the sender gets BAD_REQUEST."""


@dataclass(frozen=True, slots=True)
class AddItem:
    flags: int
    master_key: bytes
    frame: bytes


@dataclass(frozen=True, slots=True)
class AddResult:
    ledger_id: int
    entry_id: int
    status: BookieStatus


@dataclass(frozen=True, slots=True)
class ReadItem:
    ledger_id: int
    entry_id: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class ReadRequest:
    items: list[ReadItem]
    timeout_ms: int = 0  # the client's budget for the answer; 0: it waits without limit


@dataclass(frozen=True, slots=True)
class ReadResult:
    ledger_id: int
    entry_id: int
    status: BookieStatus
    frame: bytes = b""


@dataclass(frozen=True, slots=True)
class LacReply:
    status: BookieStatus
    lac: int = -1
    last_entry_id: int = -1


def _check_version(data: bytes) -> None:
    if not data:
        raise WireError("empty message")
    if data[0] != VERSION:
        raise WireError(f"unknown wire version {data[0]}")


_STATUSES: dict[int, BookieStatus] = {status.value: status for status in BookieStatus}


def _status(value: int) -> BookieStatus:
    # A dict, not BookieStatus(value): an enum call per entry of every reply adds up.
    status = _STATUSES.get(value)
    if status is None:
        raise WireError(f"unknown bookie status {value}")
    return status


def _unpack(fmt: struct.Struct, data: bytes | memoryview, offset: int) -> tuple:
    if offset + fmt.size > len(data):
        raise WireError("message truncated")
    return fmt.unpack_from(data, offset)


# -- add ---------------------------------------------------------------------------------


def encode_add_request(items: list[AddItem]) -> bytes:
    parts = [_COUNT.pack(VERSION, len(items))]
    for item in items:
        if len(item.master_key) != MASTER_KEY_SIZE:
            raise ValueError("master key must be 20 bytes")
        parts.append(_ADD_ITEM.pack(item.flags, item.master_key, len(item.frame)))
        parts.append(item.frame)
    return b"".join(parts)


# An add item as the bookie decodes it: (flags, master_key, frame), a plain tuple (no
# object per entry on the bookie's hot path; `decode_add_request` gives `AddItem`s).
RawAddItem = tuple[int, bytes, bytes]
# An add result as the bookie encodes it: (ledger_id, entry_id, status).
AddResultRow = tuple[int, int, BookieStatus]


def decode_add_request(data: bytes) -> list[AddItem]:
    return [AddItem(*item) for item in decode_add_items(data)]


def decode_add_items(data: bytes) -> list[RawAddItem]:
    """`decode_add_request` as tuples (the journal's path: one per entry of every add)."""
    _check_version(data)
    data = bytes(data)
    total = len(data)
    _, count = _unpack(_COUNT, data, 0)
    offset = _COUNT.size
    unpack = _ADD_ITEM.unpack_from
    item_size = _ADD_ITEM.size
    items: list[RawAddItem] = []
    append = items.append
    for _ in range(count):
        start = offset + item_size
        if start > total:
            raise WireError("message truncated")
        flags, key, size = unpack(data, offset)
        offset = start + size
        if offset > total:
            raise WireError("add request truncated")
        append((flags, key, data[start:offset]))
    if offset != total:
        raise WireError("trailing bytes after add request")
    return items


def encode_add_reply(status: BookieStatus, results: list[AddResult]) -> bytes:
    return encode_add_reply_rows(status, [(r.ledger_id, r.entry_id, r.status) for r in results])


def encode_add_reply_rows(status: BookieStatus, rows: Sequence[AddResultRow]) -> bytes:
    """`encode_add_reply` of (ledger_id, entry_id, status) rows (the journal's path)."""
    return _REPLY_HEAD.pack(VERSION, status, len(rows)) + b"".join(starmap(_ADD_RESULT.pack, rows))


def decode_add_reply(data: bytes) -> tuple[BookieStatus, list[AddResult]]:
    _check_version(data)
    _, status, count = _unpack(_REPLY_HEAD, data, 0)
    start = _REPLY_HEAD.size
    end = start + count * _ADD_RESULT.size
    if end > len(data):
        raise WireError("message truncated")
    results = [
        AddResult(ledger_id, entry_id, _status(st))
        for ledger_id, entry_id, st in _ADD_RESULT.iter_unpack(memoryview(data)[start:end])
    ]
    return _status(status), results


# -- read --------------------------------------------------------------------------------


def encode_read_request(items: list[ReadItem], timeout_ms: int = 0) -> bytes:
    """`timeout_ms`: how long the sender will wait for the answer (0: without limit)."""
    parts = [_READ_HEAD.pack(VERSION, len(items), timeout_ms)]
    parts.extend(_READ_ITEM.pack(i.ledger_id, i.entry_id, i.flags) for i in items)
    return b"".join(parts)


def read_request_timeout_ms(data: bytes) -> int:
    """Check a read request's framing without decoding its items; its timeout_ms."""
    _check_version(data)
    _, count, timeout_ms = _unpack(_READ_HEAD, data, 0)
    # The length also tells a request without the timeout (5 + 17n bytes) from one with it.
    if len(data) != _READ_HEAD.size + count * _READ_ITEM.size:
        raise WireError("read request has the wrong length")
    return timeout_ms


def decode_read_request(data: bytes) -> ReadRequest:
    timeout_ms = read_request_timeout_ms(data)
    count = (len(data) - _READ_HEAD.size) // _READ_ITEM.size
    items = [
        ReadItem(*_READ_ITEM.unpack_from(data, _READ_HEAD.size + i * _READ_ITEM.size))
        for i in range(count)
    ]
    return ReadRequest(items, timeout_ms)


def encode_read_reply(status: BookieStatus, results: list[ReadResult]) -> bytes:
    parts = [_REPLY_HEAD.pack(VERSION, status, len(results))]
    for r in results:
        parts.append(_READ_RESULT.pack(r.ledger_id, r.entry_id, r.status, len(r.frame)))
        parts.append(r.frame)
    return b"".join(parts)


def decode_read_reply(data: bytes) -> tuple[BookieStatus, list[ReadResult]]:
    _check_version(data)
    view = memoryview(data)
    _, status, count = _unpack(_REPLY_HEAD, view, 0)
    offset = _REPLY_HEAD.size
    results = []
    for _ in range(count):
        ledger_id, entry_id, st, size = _unpack(_READ_RESULT, view, offset)
        offset += _READ_RESULT.size
        if offset + size > len(view):
            raise WireError("read reply truncated")
        results.append(
            ReadResult(ledger_id, entry_id, _status(st), bytes(view[offset : offset + size]))
        )
        offset += size
    return _status(status), results


# -- LAC, fence --------------------------------------------------------------------------


def encode_read_lac_request(ledger_id: int) -> bytes:
    return _LEDGER.pack(VERSION, ledger_id)


def decode_read_lac_request(data: bytes) -> int:
    _check_version(data)
    if len(data) != _LEDGER.size:
        raise WireError("read_lac request has the wrong length")
    return _LEDGER.unpack(data)[1]


def encode_lac_reply(reply: LacReply) -> bytes:
    return _LAC_REPLY.pack(VERSION, reply.status, reply.lac, reply.last_entry_id)


def decode_lac_reply(data: bytes) -> LacReply:
    _check_version(data)
    if len(data) != _LAC_REPLY.size:
        raise WireError("LAC reply has the wrong length")
    _, status, lac, last = _LAC_REPLY.unpack(data)
    return LacReply(_status(status), lac, last)


def encode_fence_request(ledger_id: int, master_key: bytes) -> bytes:
    return _FENCE_REQ.pack(VERSION, ledger_id, master_key)


def decode_fence_request(data: bytes) -> tuple[int, bytes]:
    _check_version(data)
    if len(data) != _FENCE_REQ.size:
        raise WireError("fence request has the wrong length")
    _, ledger_id, key = _FENCE_REQ.unpack(data)
    return ledger_id, key


WriteLacItem = tuple[int, bytes, int]  # ledger id, master key, LAC


def encode_write_lac_request(items: Sequence[WriteLacItem]) -> bytes:
    """Explicit LACs of one or more ledgers for one bookie (one item is the classic
    write_lac)."""
    if not items:
        raise ValueError("a write_lac request carries at least one item")
    return bytes([VERSION]) + b"".join(_WRITE_LAC_ITEM.pack(*item) for item in items)


def decode_write_lac_request(data: bytes) -> list[WriteLacItem]:
    _check_version(data)
    size = len(data) - 1
    if size < _WRITE_LAC_ITEM.size or size % _WRITE_LAC_ITEM.size:
        raise WireError("write_lac request has the wrong length")
    return list(_WRITE_LAC_ITEM.iter_unpack(memoryview(data)[1:]))


def encode_write_lac_reply(statuses: Sequence[BookieStatus]) -> bytes:
    return bytes([VERSION]) + b"".join(_STATUS.pack(status) for status in statuses)


def decode_write_lac_reply(data: bytes, count: int) -> list[BookieStatus]:
    """The status of each of `count` items; a reply of one status answers them all."""
    _check_version(data)
    size = len(data) - 1
    if size == _STATUS.size:
        return [_status(_STATUS.unpack_from(data, 1)[0])] * count
    if size != count * _STATUS.size:
        raise WireError("write_lac reply has the wrong length")
    return [_status(st) for (st,) in _STATUS.iter_unpack(memoryview(data)[1:])]
