"""The entry log format and the index schema (shared.bookie.entrylog_format,
shared.bookie.index_schema)."""

from __future__ import annotations

import sqlite3

import pytest

from shared.bookie import index_schema as sql
from shared.bookie.entrylog_format import (
    ENTRY_HEAD_SIZE,
    ENTRYLOG_HEADER_SIZE,
    EntryLogFormatError,
    check_entry_log_header,
    decode_entry_head,
    encode_entry,
    encode_entry_log_header,
    entry_log_name,
    parse_entry_log_name,
)
from shared.digest import DigestManager

DIGEST = DigestManager("crc32c")


def frame(ledger_id: int, entry_id: int, lac: int = -1, payload: bytes = b"data") -> bytes:
    return DIGEST.sign(ledger_id, entry_id, lac, len(payload), payload)


def test_entry_encoding() -> None:
    data = encode_entry(2**64 - 1, 7, frame(1, 2))
    assert decode_entry_head(data[:ENTRY_HEAD_SIZE]) == (2**64 - 1, 7, len(frame(1, 2)))
    assert data[ENTRY_HEAD_SIZE:] == frame(1, 2)


def test_entry_log_header_and_names() -> None:
    header = encode_entry_log_header(3)
    assert len(header) == ENTRYLOG_HEADER_SIZE
    check_entry_log_header(header, 3)
    for bad, log_id in [(header, 4), (header[:8], 3), (b"JUNK" + header[4:], 3)]:
        with pytest.raises(EntryLogFormatError):
            check_entry_log_header(bad, log_id)
    assert parse_entry_log_name(entry_log_name(12)) == 12
    assert parse_entry_log_name("index.sqlite") is None


@pytest.mark.parametrize(
    ("ledger_id", "stored"),
    [(0, 0), (7, 7), (2**63 - 1, 2**63 - 1), (2**63, -(2**63)), (2**64 - 1, -1)],
)
def test_ledger_ids_are_stored_as_signed_64_bit(ledger_id: int, stored: int) -> None:
    assert sql.to_sql_id(ledger_id) == stored
    assert sql.from_sql_id(stored) == ledger_id


def test_the_queries_run_on_the_schema() -> None:
    conn = sqlite3.connect(":memory:")
    conn.executescript(sql.SCHEMA)
    conn.execute(sql.INSERT_ENTRY, (sql.to_sql_id(2**64 - 1), 3, 1, 16, 40, 0))
    conn.execute(sql.INSERT_LEDGER, (sql.to_sql_id(2**64 - 1), 3, 2, 1, 3))
    conn.execute(sql.INSERT_CHECKPOINT, (1, 200, 1, 76))
    conn.execute(sql.INSERT_LOG_END, (0, 1, 76))
    conn.execute(sql.INSERT_FACT, ("unsure", "why"))
    signed = sql.to_sql_id(2**64 - 1)
    assert conn.execute(sql.SELECT_ENTRY, (signed, 3)).fetchone() == (1, 16, 40, 0)
    assert conn.execute(sql.SELECT_ENTRY_RANGE, (signed, 0, sql.MAX_ENTRY_ID)).fetchall() == [
        (3, 1, 16, 40, 0)
    ]
    assert conn.execute(sql.SELECT_LEDGER, (signed,)).fetchone() == (3, 2)
    assert conn.execute(sql.SELECT_LEDGERS).fetchall() == [(signed, 3, 2, 1, 3)]
    assert conn.execute(sql.SELECT_CHECKPOINT).fetchone() == (1, 200, 1, 76)
    assert conn.execute(sql.SELECT_LOG_ENDS).fetchall() == [(0, 1, 76)]
    assert conn.execute(sql.SELECT_FACTS).fetchall() == [("unsure", "why")]
    conn.close()
