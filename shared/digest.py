"""Entry frames and their digests, as BookKeeper's DigestManager lays them out.

A frame is what a bookie stores and returns for one entry:

    ledger_id u64 | entry_id u64 | lac i64 | length u64 | digest (0, 4 or 20 bytes) | payload

`length` is the ledger's length in bytes including this entry. The digest covers the
32-byte header and the payload, so a bookie that mixes up ledgers, entries or bytes is
caught by the reader. Every read verifies it.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import crc32c as _crc32c

HEADER = struct.Struct(">QQqQ")
HEADER_SIZE = HEADER.size  # 32
_CRC = struct.Struct(">I")
MASTER_KEY_SIZE = 20


class DigestType(StrEnum):
    CRC32 = "crc32"
    CRC32C = "crc32c"
    HMAC = "hmac"
    DUMMY = "dummy"


DIGEST_SIZES = {DigestType.CRC32: 4, DigestType.CRC32C: 4, DigestType.HMAC: 20, DigestType.DUMMY: 0}


class DigestMismatch(Exception):
    """The frame does not match its digest, or not the entry it was asked for."""


def master_key(password: bytes) -> bytes:
    """The key bookies hold per ledger (BookKeeper's `generateMasterKey`): never the password."""
    return hashlib.sha1(b"ledger" + password).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC key of the `hmac` digest (BookKeeper's MacDigestManager)."""
    return hashlib.sha1(b"mac" + password).digest()


class _StoresKeys(Protocol):
    """What `LedgerKeys.of` needs of a ledger's metadata (shared.models.LedgerMetadata,
    which imports this module): the hex of its stored keys, "" when none are stored."""

    @property
    def master_key(self) -> str: ...

    @property
    def mac_key(self) -> str: ...


@dataclass(frozen=True, slots=True)
class LedgerKeys:
    """The keys a client derives from a ledger's password: the master key the bookies hold
    per ledger, and the HMAC key of the `hmac` digest. With them (stored in the ledger's
    metadata) a replicator writes and signs a ledger's entries without its password."""

    master_key: bytes
    mac_key: bytes

    @classmethod
    def from_password(cls, password: bytes) -> LedgerKeys:
        return cls(master_key(password), mac_key(password))

    @classmethod
    def of(cls, metadata: _StoresKeys) -> LedgerKeys | None:
        """The keys stored in a ledger's metadata; None for a ledger created before keys
        were stored (it cannot be re-replicated)."""
        if not metadata.master_key or not metadata.mac_key:
            return None
        return cls(bytes.fromhex(metadata.master_key), bytes.fromhex(metadata.mac_key))


@dataclass(frozen=True, slots=True)
class EntryFrame:
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes


def parse_header(frame: bytes | memoryview) -> tuple[int, int, int, int]:
    """(ledger_id, entry_id, lac, length) of a frame, without checking its digest."""
    if len(frame) < HEADER_SIZE:
        raise DigestMismatch(f"frame of {len(frame)} bytes is shorter than its header")
    return HEADER.unpack_from(frame, 0)


class DigestManager:
    """Signs and verifies frames of one ledger."""

    def __init__(self, digest_type: DigestType | str, password: bytes = b"") -> None:
        self.digest_type = DigestType(digest_type)
        self.digest_size = DIGEST_SIZES[self.digest_type]
        self._mac_key = mac_key(password) if self.digest_type is DigestType.HMAC else b""
        # The crc of the checksum types, picked once: `verify` runs once per entry read.
        self._crc = {DigestType.CRC32C: _crc32c.crc32c, DigestType.CRC32: zlib.crc32}.get(
            self.digest_type
        )

    @classmethod
    def for_keys(cls, digest_type: DigestType | str, keys: LedgerKeys) -> DigestManager:
        """The digest manager of a ledger known by its keys, not its password."""
        manager = cls(digest_type)
        if manager.digest_type is DigestType.HMAC:
            manager._mac_key = keys.mac_key
        return manager

    def _digest(self, header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        match self.digest_type:
            case DigestType.CRC32C:
                return struct.pack(">I", _crc32c.crc32c(payload, _crc32c.crc32c(header)))
            case DigestType.CRC32:
                return struct.pack(">I", zlib.crc32(payload, zlib.crc32(header)))
            case DigestType.HMAC:
                mac = hmac.new(self._mac_key, header, hashlib.sha1)
                mac.update(payload)
                return mac.digest()
            case DigestType.DUMMY:
                return b""
        raise AssertionError(self.digest_type)

    def sign(self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        header = HEADER.pack(ledger_id, entry_id, lac, length)
        return b"".join((header, self._digest(header, payload), payload))

    def verify(self, frame: bytes, ledger_id: int, entry_id: int) -> EntryFrame:
        """The entry in `frame`, or DigestMismatch if it is damaged or not the one asked for."""
        lac, length = self.check(frame, ledger_id, entry_id)
        return EntryFrame(ledger_id, entry_id, lac, length, self.payload(frame))

    def payload(self, frame: bytes) -> bytes:
        """The payload of a frame (`check` it first)."""
        return bytes(frame[HEADER_SIZE + self.digest_size :])

    def check(self, frame: bytes, ledger_id: int, entry_id: int) -> tuple[int, int]:
        """`verify` without copying the payload out (a bookie checks frames it serves
        whole): the frame's (lac, length), or DigestMismatch."""
        got_ledger, got_entry, lac, length = parse_header(frame)
        if (got_ledger, got_entry) != (ledger_id, entry_id):
            raise DigestMismatch(
                f"asked for {ledger_id}:{entry_id}, frame holds {got_ledger}:{got_entry}"
            )
        start = HEADER_SIZE + self.digest_size
        if len(frame) < start:
            raise DigestMismatch(f"frame of {len(frame)} bytes is too short for its digest")
        view = memoryview(frame)
        crc = self._crc
        if crc is not None:
            # A checksum is no secret: a plain compare of the integers, no bytes packed.
            matches = (
                crc(view[start:], crc(view[:HEADER_SIZE]))
                == _CRC.unpack_from(frame, HEADER_SIZE)[0]
            )
        else:
            expected = self._digest(view[:HEADER_SIZE], view[start:])
            matches = hmac.compare_digest(expected, view[HEADER_SIZE:start])
        if not matches:
            raise DigestMismatch(f"digest mismatch on entry {ledger_id}:{entry_id}")
        return lac, length
