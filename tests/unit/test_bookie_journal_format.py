"""The journal's on-disk format (shared.bookie.journal_format): record codec (torn tails,
damage), file headers, snapshot and lastMark, positions."""

from __future__ import annotations

import struct

import pytest

from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    EntryRecord,
    FenceRecord,
    JournalFormatError,
    JournalPosition,
    LacRecord,
    LedgerDeletedRecord,
    LedgerStateRecord,
    MasterKeyRecord,
    ScanStop,
    ShortJournal,
    check_file_header,
    decode_last_mark,
    decode_snapshot,
    encode_file_header,
    encode_last_mark,
    encode_record,
    encode_record_generic,
    encode_snapshot,
    encode_snapshot_segment,
    journal_file_name,
    journal_shorter_than_recorded,
    next_valid_record,
    parse_journal_file_name,
    scan_records,
)
from shared.digest import DigestManager

KEY_A = b"a" * 20
KEY_B = b"b" * 20
DIGEST = DigestManager("crc32c")


def entry(
    ledger_id: int, entry_id: int, lac: int = -1, payload: bytes = b"x", key: bytes = KEY_A
) -> EntryRecord:
    return EntryRecord.of(key, DIGEST.sign(ledger_id, entry_id, lac, len(payload), payload))


RECORDS = [
    entry(1, 0, -1, b"hello"),
    entry(2**63, 5, 4, b""),
    MasterKeyRecord(7, KEY_B),
    FenceRecord(7),
    LacRecord(7, 12),
    LedgerStateRecord(9, KEY_A, True, 3, 4),
    LedgerStateRecord(9, KEY_A, False, -1, -1, deleted=True),
    LedgerDeletedRecord(2**64 - 1),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_kind_round_trips(record) -> None:
    data = encode_record(record)
    scan = scan_records(data, base_offset=100)
    assert scan.stop is ScanStop.END
    assert [s.record for s in scan.records] == [record]
    assert (scan.records[0].start, scan.records[0].end) == (100, 100 + len(data))


@pytest.mark.parametrize("digest_code", [0, 1, 2, 3])
def test_entry_fast_path_writes_the_same_bytes_as_the_generic_encoder(digest_code) -> None:
    record = entry(5, 7, 6, b"x" * 1000)._replace(digest_code=digest_code)
    assert encode_record(record) == encode_record_generic(record)
    with pytest.raises(ValueError, match="master key"):
        encode_record(record._replace(master_key=b"short"))


def test_entry_record_takes_ids_and_lac_from_the_frame() -> None:
    record = entry(3, 9, 8, b"payload")
    assert (record.ledger_id, record.entry_id, record.lac) == (3, 9, 8)


def _three() -> tuple[bytes, list[int]]:
    parts = [encode_record(r) for r in RECORDS[:3]]
    starts = [sum(len(p) for p in parts[:i]) for i in range(3)]
    return b"".join(parts), starts


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 9, 20])
def test_a_record_cut_short_is_incomplete(cut: int) -> None:
    data, starts = _three()
    scan = scan_records(data[: len(data) - cut])
    assert scan.stop is ScanStop.INCOMPLETE
    assert len(scan.records) == 2
    assert scan.end == starts[2]
    assert _torn_tail(data[: len(data) - cut], scan.end)


def _torn_tail(buf: bytes, stop_at: int) -> bool:
    """Replay's test for a torn tail in a format 1 file: no valid record after the bad
    spot (services/journal/journal.py asks `next_valid_record` the same way)."""
    return next_valid_record(buf, stop_at + 1) is None


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


@pytest.mark.parametrize("where", ["size", "crc", "kind", "body"])
def test_damage_in_the_middle_is_bad_and_not_a_torn_tail(where: str) -> None:
    data, starts = _three()
    offset = {"size": 3, "crc": 5, "kind": 8, "body": 12}[where]
    damaged = _flip(data, starts[1] + offset)
    scan = scan_records(damaged)
    # A flipped size bit can make the record look longer than the file: incomplete.
    assert scan.stop in (ScanStop.BAD, ScanStop.INCOMPLETE), scan
    assert len(scan.records) == 1 and scan.end == starts[1]
    # A valid record follows the bad one: this was durable once, never truncate it.
    assert not _torn_tail(damaged, scan.end)


def test_damage_in_the_last_record_is_a_torn_tail() -> None:
    data, starts = _three()
    damaged = _flip(data, len(data) - 1)
    scan = scan_records(damaged)
    assert scan.stop is ScanStop.BAD and scan.end == starts[2]
    assert _torn_tail(damaged, scan.end)


def test_zeros_after_the_last_record_are_a_torn_tail() -> None:
    data, _ = _three()
    scan = scan_records(data + bytes(4096))
    assert scan.stop is ScanStop.BAD and scan.end == len(data)
    assert _torn_tail(data + bytes(4096), scan.end)


def test_max_records_stops_early() -> None:
    data, starts = _three()
    scan = scan_records(data, max_records=2)
    assert scan.stop is ScanStop.END and len(scan.records) == 2 and scan.end == starts[2]


def test_incomplete_reports_bytes_needed() -> None:
    data = encode_record(entry(1, 1, payload=b"z" * 1000))
    scan = scan_records(data[:50])
    assert scan.stop is ScanStop.INCOMPLETE and scan.needed_bytes == len(data)


def test_file_header() -> None:
    header = encode_file_header(42)
    assert len(header) == FILE_HEADER_SIZE
    assert check_file_header(header + b"more", 42)
    assert not check_file_header(header[:5], 42)
    with pytest.raises(JournalFormatError):
        check_file_header(header, 41)
    with pytest.raises(JournalFormatError):
        check_file_header(b"XXXX" + header[4:], 42)
    with pytest.raises(JournalFormatError):
        check_file_header(b"QX", 42)


def test_file_names() -> None:
    assert journal_file_name(3) == "journal-000003.log"
    assert parse_journal_file_name("journal-000003.log") == 3
    assert parse_journal_file_name("journal-1234567.log") == 1234567
    assert parse_journal_file_name("lastMark") is None
    assert parse_journal_file_name("journal-000003.log.tmp") is None


def test_last_mark_round_trips_and_rejects_garbage() -> None:
    mark = JournalPosition(4, 1234)
    assert decode_last_mark(encode_last_mark(mark)) == mark
    for bad in [b"", b"{}", b'{"file": 0, "offset": 1}', b'{"file": "1", "offset": 1}', b"[1]"]:
        with pytest.raises(JournalFormatError):
            decode_last_mark(bad)


def test_snapshot_round_trips_and_detects_damage() -> None:
    records = [LedgerStateRecord(1, KEY_A, False, 3, 5), LedgerStateRecord(2, KEY_B, True, -1, -1)]
    data = encode_snapshot(JournalPosition(3, 99), records)
    snapshot = decode_snapshot(data)
    assert (snapshot.position, snapshot.records, snapshot.torn) == (
        JournalPosition(3, 99),
        records,
        "",
    )
    assert snapshot.appendable
    for damaged in [data[:-1], _flip(data, len(data) - 3), data[:10], data[:6], b"QJSN\0\x09\0\0"]:
        with pytest.raises(JournalFormatError):
            decode_snapshot(damaged)


def test_snapshot_segments_fold_and_a_torn_last_one_is_ignored() -> None:
    first = [LedgerStateRecord(1, KEY_A, False, 3, 5), LedgerStateRecord(2, KEY_B, False, 0, 0)]
    later = [
        LedgerStateRecord(2, KEY_B, True, 4, 4),
        LedgerStateRecord(1, bytes(20), False, -1, -1, True),
    ]
    data = encode_snapshot(JournalPosition(3, 99), first)
    data += encode_snapshot_segment(JournalPosition(4, 16), later)
    snapshot = decode_snapshot(data)
    assert snapshot.position == JournalPosition(4, 16)
    assert snapshot.records == first + later  # the later row of ledger 2 wins when applied
    segment = encode_snapshot_segment(JournalPosition(5, 16), later)
    for torn in [data + segment[:-1], data + segment[:10], _flip(data + segment, len(data) + 30)]:
        snapshot = decode_snapshot(torn)
        assert snapshot.position == JournalPosition(4, 16) and snapshot.torn
        assert snapshot.records == first + later and not snapshot.appendable


def test_version_1_snapshots_are_still_read() -> None:
    records = [LedgerStateRecord(1, KEY_A, False, 3, 5), LedgerStateRecord(2, KEY_B, True, -1, -1)]
    head = struct.pack(">4sHHQQI", b"QJSN", 1, 0, 3, 99, len(records))
    snapshot = decode_snapshot(head + b"".join(encode_record(r) for r in records))
    assert (snapshot.position, snapshot.records) == (JournalPosition(3, 99), records)
    assert not snapshot.appendable  # the next snapshot rewrites it as version 2


def test_positions_order_by_file_then_offset() -> None:
    assert JournalPosition(1, 500) < JournalPosition(2, 16) < JournalPosition(2, 17)


@pytest.mark.parametrize(
    ("sizes", "mark", "snapshot", "short"),
    [
        # Every recorded position reached: nothing to refuse.
        ({1: 100}, JournalPosition(1, 100), JournalPosition(1, 100), None),
        ({1: 100, 2: 16}, JournalPosition(1, 50), JournalPosition(2, 16), None),
        ({}, None, None, None),  # a fresh journal
        ({}, JournalPosition(1, 0), None, None),  # the very start needs no bytes
        ({3: 200}, None, JournalPosition(3, 120), None),  # bytes past it: replay's to check
        # The mark's file cut below the mark: the ledgerstore applied what is gone.
        ({1: 99}, JournalPosition(1, 100), JournalPosition(1, 100), ("lastMark", 1, 100, 99)),
        # The mark reached, the snapshot's later position not.
        ({1: 100, 2: 40}, JournalPosition(1, 100), JournalPosition(2, 60), ("s", 2, 60, 40)),
        # The file a position is in is missing (its name never made durable, or deleted).
        ({1: 100}, None, JournalPosition(2, 16), ("s", 2, 16, None)),
        ({}, JournalPosition(4, 70), JournalPosition(4, 70), ("lastMark", 4, 70, None)),
    ],
)
def test_journal_shorter_than_recorded(sizes, mark, snapshot, short) -> None:
    found = journal_shorter_than_recorded(sizes, {"lastMark": mark, "s": snapshot})
    if short is None:
        assert found is None
    else:
        recorded_by, file_id, offset, size = short
        assert found == ShortJournal(recorded_by, JournalPosition(file_id, offset), size)
