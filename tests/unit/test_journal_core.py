"""The journal's pure core: record codec (torn tails, damage), file headers, snapshot and
lastMark, group-commit planning, and the bookie's per-ledger rules."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from services.journal.core import (
    FILE_HEADER_SIZE,
    BookieLedgerState,
    EntryRecord,
    FenceRecord,
    FlushPlan,
    GroupCommitPolicy,
    JournalFormatError,
    JournalPosition,
    LacRecord,
    LedgerStateRecord,
    MasterKeyRecord,
    ScanStop,
    batch_length,
    check_file_header,
    decode_last_mark,
    decode_snapshot,
    disk_read_only,
    encode_file_header,
    encode_last_mark,
    encode_record,
    encode_record_generic,
    encode_snapshot,
    is_torn_tail,
    journal_file_name,
    parse_journal_file_name,
    plan_group_commit,
    scan_records,
)
from shared.digest import DigestManager
from shared.status import BookieStatus
from shared.wire import FLAG_RECOVERY_ADD

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
    record = replace(entry(5, 7, 6, b"x" * 1000), digest_code=digest_code)
    assert encode_record(record) == encode_record_generic(record)
    with pytest.raises(ValueError, match="master key"):
        encode_record(replace(record, master_key=b"short"))


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
    assert is_torn_tail(data[: len(data) - cut], scan.end)


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
    assert not is_torn_tail(damaged, scan.end)


def test_damage_in_the_last_record_is_a_torn_tail() -> None:
    data, starts = _three()
    damaged = _flip(data, len(data) - 1)
    scan = scan_records(damaged)
    assert scan.stop is ScanStop.BAD and scan.end == starts[2]
    assert is_torn_tail(damaged, scan.end)


def test_zeros_after_the_last_record_are_a_torn_tail() -> None:
    data, _ = _three()
    scan = scan_records(data + bytes(4096))
    assert scan.stop is ScanStop.BAD and scan.end == len(data)
    assert is_torn_tail(data + bytes(4096), scan.end)


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
    assert decode_snapshot(data) == (JournalPosition(3, 99), records)
    for damaged in [
        data[:-1],
        _flip(data, len(data) - 3),
        data[:10],
        encode_snapshot(JournalPosition(3, 99), records)[:-30],
    ]:
        with pytest.raises(JournalFormatError):
            decode_snapshot(damaged)


def test_positions_order_by_file_then_offset() -> None:
    assert JournalPosition(1, 500) < JournalPosition(2, 16) < JournalPosition(2, 17)


# -- group commit -------------------------------------------------------------------------

WAITING = GroupCommitPolicy(
    max_group_wait_ms=2.0,
    buffered_writes_threshold_bytes=1000,
    buffered_entries_threshold=10,
    flush_when_queue_empty=False,
)
EAGER = GroupCommitPolicy(2.0, 1000, 10, flush_when_queue_empty=True)


@pytest.mark.parametrize(
    ("policy", "records", "size", "oldest_ms", "now_ms", "expected"),
    [
        (WAITING, 0, 0, 0.0, 50.0, FlushPlan(False, None)),
        (EAGER, 0, 0, 0.0, 50.0, FlushPlan(False, None)),
        (EAGER, 1, 10, 100.0, 100.0, FlushPlan(True)),  # idle writer, nothing more to wait for
        (WAITING, 1, 10, 100.0, 100.0, FlushPlan(False, 2.0)),
        (WAITING, 1, 10, 100.0, 101.5, FlushPlan(False, 0.5)),
        (WAITING, 1, 10, 100.0, 102.0, FlushPlan(True)),  # waited max_group_wait_ms
        (WAITING, 3, 1000, 100.0, 100.0, FlushPlan(True)),  # byte threshold
        (WAITING, 10, 100, 100.0, 100.0, FlushPlan(True)),  # entry threshold
        (WAITING, 9, 999, 100.0, 101.0, FlushPlan(False, 1.0)),
    ],
)
def test_plan_group_commit(policy, records, size, oldest_ms, now_ms, expected) -> None:
    assert plan_group_commit(policy, records, size, oldest_ms, now_ms) == expected


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([], 0),
        ([10], 1),
        ([10] * 5, 5),
        ([10] * 25, 10),  # entry threshold caps a batch
        ([400, 400, 400], 2),  # byte threshold caps a batch
        ([5000, 10], 1),  # an oversized record goes alone
        ([10, 5000], 1),
    ],
)
def test_batch_length(sizes: list[int], expected: int) -> None:
    assert batch_length(EAGER, sizes) == expected


# -- BookieLedgerState --------------------------------------------------------------------

# Each step: (operation, arguments, expected status or None for an apply).
SCENARIOS = {
    "first add sets the key": [
        ("add", (1, KEY_A, 0), BookieStatus.OK),
        ("add", (1, KEY_B, 0), BookieStatus.UNAUTHORIZED),
        ("add", (1, KEY_A, 0), BookieStatus.OK),
        ("add", (2, KEY_B, 0), BookieStatus.OK),
    ],
    "fenced refuses normal adds, takes recovery adds": [
        ("add", (1, KEY_A, 0), BookieStatus.OK),
        ("fence", (1, KEY_A), BookieStatus.OK),
        ("add", (1, KEY_A, 0), BookieStatus.FENCED),
        ("add", (1, KEY_A, FLAG_RECOVERY_ADD), BookieStatus.OK),
        ("add", (1, KEY_B, FLAG_RECOVERY_ADD), BookieStatus.UNAUTHORIZED),
    ],
    "fence of an unknown ledger sets its key": [
        ("fence", (5, KEY_B), BookieStatus.OK),
        ("add", (5, KEY_A, FLAG_RECOVERY_ADD), BookieStatus.UNAUTHORIZED),
        ("add", (5, KEY_B, 0), BookieStatus.FENCED),
        ("fence", (5, KEY_A), BookieStatus.UNAUTHORIZED),
    ],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_bookie_ledger_state_rules(name: str) -> None:
    state = BookieLedgerState()
    for step, (op, args, expected) in enumerate(SCENARIOS[name]):
        if op == "add":
            ledger_id, key, flags = args
            got = state.check_add(ledger_id, key, flags)
            if got is BookieStatus.OK:
                state.apply(entry(ledger_id, step, key=key))
        else:
            ledger_id, key = args
            got = state.check_master_key(ledger_id, key)
            if got is BookieStatus.OK:
                if state.needs_master_key(ledger_id):
                    state.apply(MasterKeyRecord(ledger_id, key))
                state.apply(FenceRecord(ledger_id))
        assert got is expected, f"step {step}: {op}{args}"


def test_lac_is_the_max_of_piggybacked_and_explicit() -> None:
    state = BookieLedgerState()
    state.apply(entry(1, 0, lac=-1))
    state.apply(entry(1, 2, lac=1))
    state.apply(entry(1, 1, lac=0))  # out of order: LAC and last entry never go back
    facts = state.get(1)
    assert facts is not None and (facts.lac, facts.last_entry_id) == (1, 2)
    state.apply(LacRecord(1, 7))
    assert state.get(1).lac == 7
    state.apply(entry(1, 3, lac=2))
    assert state.get(1).lac == 7
    state.apply(LacRecord(1, 5))
    assert state.get(1).lac == 7


def test_snapshot_records_rebuild_the_same_state() -> None:
    state = BookieLedgerState()
    for record in [
        entry(1, 0),
        entry(1, 1, 0),
        MasterKeyRecord(2, KEY_B),
        FenceRecord(2),
        LacRecord(3, 4),
        entry(4, 0, key=KEY_B),
        FenceRecord(4),
    ]:
        state.apply(record)
    rebuilt = BookieLedgerState()
    _, records = decode_snapshot(encode_snapshot(JournalPosition(1, 16), state.snapshot_records()))
    for record in records:
        rebuilt.apply(record)
    assert rebuilt.snapshot_records() == state.snapshot_records()
    # Ledger 3 got an explicit LAC before any key: its key is still unset after reload.
    assert rebuilt.needs_master_key(3)
    assert rebuilt.check_add(3, KEY_B, 0) is BookieStatus.OK
    assert rebuilt.check_add(4, KEY_B, 0) is BookieStatus.FENCED


def test_copy_is_independent() -> None:
    state = BookieLedgerState()
    state.apply(entry(1, 0))
    other = state.copy()
    other.apply(FenceRecord(1))
    assert not state.get(1).fenced and other.get(1).fenced


FORBIDDEN = {"asyncio", "nats", "sqlalchemy", "time", "random", "os", "sqlite3", "aiofiles"}


@pytest.mark.parametrize("path", ["services/journal/core.py", "services/ledgerstore/core.py"])
def test_cores_are_pure(path: str) -> None:
    tree = ast.parse((Path(__file__).parents[2] / path).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN


@pytest.mark.parametrize(
    ("read_only", "usage", "expected"),
    [
        (False, 0.50, False),
        (False, 0.95, True),  # at diskUsageThreshold
        (False, 0.92, False),  # between the marks, writable stays writable
        (True, 0.92, True),  # ... and read-only stays read-only (no flapping)
        (True, 0.90, True),  # at the low-water mark
        (True, 0.89, False),  # below it: writable again
    ],
)
def test_disk_usage_thresholds(read_only: bool, usage: float, expected: bool) -> None:
    assert disk_read_only(read_only, usage, threshold=0.95, lwm_threshold=0.90) is expected
