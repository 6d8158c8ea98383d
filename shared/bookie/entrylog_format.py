"""The entry log's on-disk format (BookKeeper's interleaved EntryLogger). Pure: no IO.

An entry log (`entrylog-NNNNNN.log`, in a ledger directory) is a 16-byte header, then
entries of many ledgers in arrival order:

    header  magic "QELG" | version u16 | reserved u16 | log_id u64
    entry   size u32 (16 + frame length) | ledger u64 | entry i64 | frame

The ledgerstore writes and reads them; `quire shell readlog` reads them.
"""

from __future__ import annotations

import re
import struct

FORMAT_VERSION = 1
ENTRYLOG_MAGIC = b"QELG"
ENTRYLOG_HEADER = struct.Struct(">4sHHQ")
ENTRYLOG_HEADER_SIZE = ENTRYLOG_HEADER.size  # 16
ENTRY_HEAD = struct.Struct(">IQq")  # size, ledger, entry
ENTRY_HEAD_SIZE = ENTRY_HEAD.size  # 20
# A compaction writes its new log under this suffix, renamed when complete and fsynced.
COMPACTING_SUFFIX = ".compacting"
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


def encode_entry(ledger_id: int, entry_id: int, frame: bytes) -> bytes:
    return ENTRY_HEAD.pack(ENTRY_HEAD_SIZE - 4 + len(frame), ledger_id, entry_id) + frame


def decode_entry_head(buf: bytes) -> tuple[int, int, int]:
    """(ledger_id, entry_id, frame length) from an entry's 20-byte head."""
    size, ledger_id, entry_id = ENTRY_HEAD.unpack_from(buf, 0)
    return ledger_id, entry_id, size - (ENTRY_HEAD_SIZE - 4)
