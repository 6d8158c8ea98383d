"""The ledgerstore's core (entry log format, ledger facts, following the journal, the
authority rule) and its file-level pieces (entry logs, SQLite index, journal tailer) on a
temp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.ledgerstore import storage
from services.ledgerstore.cache import WriteCache
from services.ledgerstore.core import (
    CursorAction,
    EntryLocation,
    LedgerInfo,
    apply_to_ledgers,
    frame_matches,
    id_ranges,
    locate,
    next_file,
    plan_spans,
    read_ahead_ids,
)
from services.ledgerstore.storage import EntryIndex, EntryLogger, JournalTailer, TailStatus
from shared.bookie.journal_format import (
    EntryRecord,
    FenceRecord,
    JournalPosition,
    LacRecord,
    MasterKeyRecord,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from shared.digest import DigestManager

KEY = b"k" * 20
DIGEST = DigestManager("crc32c")


def frame(ledger_id: int, entry_id: int, lac: int = -1, payload: bytes = b"data") -> bytes:
    return DIGEST.sign(ledger_id, entry_id, lac, len(payload), payload)


@pytest.mark.parametrize(
    ("data", "ledger_id", "entry_id", "expected"),
    [
        (frame(1, 2), 1, 2, True),
        (frame(1, 2), 1, 3, False),
        (frame(1, 2), 2, 2, False),
        (b"short", 1, 2, False),
    ],
)
def test_frame_matches(data: bytes, ledger_id: int, entry_id: int, expected: bool) -> None:
    assert frame_matches(data, ledger_id, entry_id) is expected


def test_apply_to_ledgers() -> None:
    ledgers: dict[int, LedgerInfo] = {}
    steps = [
        (EntryRecord.of(KEY, frame(1, 2, 1)), 1, LedgerInfo(2, 1, first_entry_id=2)),
        (EntryRecord.of(KEY, frame(1, 0)), 1, LedgerInfo(2, 1, first_entry_id=0)),
        (EntryRecord.of(KEY, frame(1, 1, 0), 2), 1, LedgerInfo(2, 1, 2, 0)),
        (LacRecord(1, 5), 1, LedgerInfo(2, 5, 2, 0)),
        (LacRecord(1, 3), 1, LedgerInfo(2, 5, 2, 0)),
        (MasterKeyRecord(2, KEY), 2, LedgerInfo(-1, -1)),
        (FenceRecord(3), 3, LedgerInfo(-1, -1)),
    ]
    for record, ledger_id, expected in steps:
        assert apply_to_ledgers(ledgers, record) == ledger_id
        assert ledgers[ledger_id] == expected


@pytest.mark.parametrize(
    ("position", "files", "expected"),
    [
        (JournalPosition(1, 0), [], CursorAction.WAIT),
        (JournalPosition(1, 0), [1], CursorAction.READ),
        (JournalPosition(2, 50), [1, 2, 3], CursorAction.READ),
        (JournalPosition(4, 0), [1, 2, 3], CursorAction.WAIT),
        (JournalPosition(1, 0), [2, 3], CursorAction.GAP),  # deleted below us: lost records
        (JournalPosition(2, 90), [3], CursorAction.GAP),
    ],
)
def test_locate(position, files, expected) -> None:
    assert locate(position, files) is expected


@pytest.mark.parametrize(
    ("position", "files", "expected"),
    [
        (JournalPosition(2, 90), [2], None),
        (JournalPosition(2, 90), [2, 3], JournalPosition(3, 0)),
        (JournalPosition(2, 90), [1, 2, 3, 4], JournalPosition(3, 0)),
    ],
)
def test_next_file(position, files, expected) -> None:
    assert next_file(position, files) == expected


# -- file-level pieces --------------------------------------------------------------------


def test_entry_logger_rolls_reads_and_resumes_after_checkpoint(tmp_path: Path) -> None:
    logger = EntryLogger(tmp_path, log_size_limit_bytes=4096)
    logger.open(None)
    entries = [(1, e, frame(1, e, payload=os.urandom(1000))) for e in range(10)]
    locations = logger.append(entries)
    assert len({loc.log_id for loc in locations}) >= 3  # rolled
    for (_, _, data), location in zip(entries, locations, strict=True):
        assert logger.read(location) == data
    end = logger.sync()
    # Written after the checkpoint: gone when reopening at `end`.
    extra = logger.append([(2, e, frame(2, e, payload=os.urandom(3000))) for e in range(3)])
    logger.close()
    reopened = EntryLogger(tmp_path, log_size_limit_bytes=4096)
    reopened.open(end)
    assert (reopened.log_id, reopened.size) == end
    assert max(reopened.log_ids()) == end[0] < extra[-1].log_id
    again = reopened.append([(3, 0, frame(3, 0))])
    assert again[0] == EntryLocation(end[0], end[1], len(frame(3, 0)))
    assert reopened.read(locations[0]) == entries[0][2]
    reopened.close()


def test_an_entry_log_descriptor_evicted_while_read_stays_open_until_that_read_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "READ_FDS_MAX", 1)
    logger = EntryLogger(tmp_path, log_size_limit_bytes=4096)
    logger.open(None)
    entries = [(1, e, frame(1, e, payload=os.urandom(3000))) for e in range(2)]
    locations = logger.append(entries)
    assert locations[0].log_id != locations[1].log_id
    with logger._read_fd(locations[0].log_id) as fd:
        # Another thread's read opens the second log, evicting the first's descriptor.
        assert logger.read(locations[1]) == entries[1][2]
        os.fstat(fd)  # still open: a read under way never finds it closed or reused
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by its last reader
    logger.close()


def test_entry_index_commits_atomically_and_reloads(tmp_path: Path) -> None:
    index = EntryIndex(tmp_path / "index.sqlite")
    state = index.open()
    assert state.positions is None and state.ledgers == {}
    location = EntryLocation(1, 16, 100)
    index.commit(
        {(2**64 - 1, 0): location},
        {2**64 - 1: LedgerInfo(0, -1)},
        [JournalPosition(1, 500)],
        {0: (1, 136)},
    )
    assert index.lookup(2**64 - 1, 0) == location
    assert index.lookup(2**64 - 1, 1) is None
    index.close()
    again = EntryIndex(tmp_path / "index.sqlite")
    state = again.open()
    assert state.positions == (JournalPosition(1, 500),) and state.log_ends == {0: (1, 136)}
    assert state.ledgers == {2**64 - 1: LedgerInfo(0, -1)}
    assert again.lookup(2**64 - 1, 0) == location
    tables = {row[0] for row in again._writer.execute("SELECT name FROM sqlite_master")}
    assert "journal_positions" not in tables  # one journal: the index as it always was
    again.close()


def test_entry_index_keeps_a_position_per_journal(tmp_path: Path) -> None:
    index = EntryIndex(tmp_path / "index.sqlite", journals=3)
    assert index.open().positions is None
    positions = [JournalPosition(4, 100), JournalPosition(1, 16), JournalPosition(2, 900)]
    index.commit({}, {}, positions, {0: (1, 16)})
    index.commit({}, {}, [*positions[:2], JournalPosition(3, 16)], {0: (1, 16)})
    index.close()
    again = EntryIndex(tmp_path / "index.sqlite", journals=3)
    assert again.open().positions == (*positions[:2], JournalPosition(3, 16))
    again.close()


def _write_journal(directory: Path, file_id: int, records: list, tail: bytes = b"") -> None:
    data = encode_file_header(file_id) + b"".join(encode_record(r) for r in records) + tail
    (directory / journal_file_name(file_id)).write_bytes(data)


def test_tailer_follows_files_and_waits_at_partial_records(tmp_path: Path) -> None:
    first = [EntryRecord.of(KEY, frame(1, e)) for e in range(3)]
    partial = encode_record(EntryRecord.of(KEY, frame(1, 3)))[:-5]
    _write_journal(tmp_path, 1, first, tail=partial)
    tailer = JournalTailer(tmp_path, JournalPosition(1, 0))
    read = tailer.read()
    assert read.status is TailStatus.MORE and [s.record for s in read.records] == first
    tailer.advance(read.position)
    # A record still being written: caught up for now, position unchanged.
    read = tailer.read()
    assert read.status is TailStatus.CAUGHT_UP and read.records == []
    # Unless the journal said it is durable beyond it: then it is damage.
    tailer.durable_hint = JournalPosition(1, read.position.offset + 1)
    assert tailer.read().status is TailStatus.STALLED
    tailer.durable_hint = None
    # The journal restarted: truncated the torn record and started file 2.
    path = tmp_path / journal_file_name(1)
    path.write_bytes(path.read_bytes()[: read.position.offset])
    _write_journal(tmp_path, 2, [FenceRecord(1)])
    read = tailer.read()
    assert (read.status, read.position) == (TailStatus.MORE, JournalPosition(2, 0))
    tailer.advance(read.position)
    read = tailer.read()
    assert [s.record for s in read.records] == [FenceRecord(1)]
    tailer.advance(read.position)
    assert tailer.read().status is TailStatus.CAUGHT_UP
    tailer.close()


def test_tailer_reports_damage_and_gaps(tmp_path: Path) -> None:
    good = encode_record(FenceRecord(1))
    bad = bytearray(encode_record(LacRecord(1, 5)))
    bad[-1] ^= 0xFF
    _write_journal(tmp_path, 1, [], tail=good + bytes(bad) + good)
    tailer = JournalTailer(tmp_path, JournalPosition(1, 0))
    read = tailer.read()
    tailer.advance(read.position)
    assert tailer.read().status is TailStatus.STALLED  # newest file: the journal decides
    _write_journal(tmp_path, 2, [])
    assert tailer.read().status is TailStatus.DAMAGED  # a complete file with a bad record
    gone = JournalTailer(tmp_path, JournalPosition(1, 0))
    (tmp_path / journal_file_name(1)).unlink()
    assert gone.read().status is TailStatus.DAMAGED  # deleted below our position
    tailer.close()


def test_write_cache_flushes_sorted_by_ledger_then_entry_whatever_the_arrival_order() -> None:
    cache = WriteCache()
    arrivals = [(9, 0), (2, 0), (9, 1), (2, 1), (2, 5), (2, 3), (9, 2), (2, 4), (1, 7)]
    for ledger_id, entry_id in arrivals:
        cache.put(ledger_id, entry_id, f"{ledger_id}:{entry_id}".encode())
    cache.put(2, 3, b"2:3 again")  # a re-apply replaces, it is not a second entry
    assert [(ledger, entry) for ledger, entry, _ in cache.sorted_entries()] == sorted(arrivals)
    assert len(cache) == len(arrivals)
    assert cache.get(2, 3) == b"2:3 again" and cache.get(3, 0) is None
    assert cache.size_bytes == sum(len(frame) for _, _, frame in cache.sorted_entries())


@pytest.mark.parametrize(
    ("asked", "limit", "expected"),
    [
        ([], 100, []),
        ([7], 100, [8]),
        ([0, 1, 2, 3], 100, [4, 5, 6, 7]),
        ([0, 1, 2, 3], 2, [4, 5]),  # at most dbStorage_readAheadCacheBatchSize
        ([0, 3, 6], 100, [9, 12, 15]),  # a reader asking this bookie every third entry
        ([0, 1, 5], 100, [6, 7, 8]),  # no single stride: the block after
        ([4], 0, []),
    ],
)
def test_read_ahead_is_what_the_reader_asks_next(asked, limit, expected) -> None:
    assert read_ahead_ids(asked, limit) == expected


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([], []),
        ([5], [(5, 5)]),
        (list(range(200)), [(0, 199)]),
        (list(range(0, 300, 3)), [(0, 297)]),
        ([0, 1, 1000, 1001, 5000], [(0, 1), (1000, 1001), (5000, 5000)]),  # no scan between
    ],
)
def test_id_ranges_give_one_index_query_per_run(ids, expected) -> None:
    assert id_ranges(ids, gap_max=64) == expected


def _loc(log_id: int, offset: int, size: int = 100, dir_index: int = 0) -> EntryLocation:
    return EntryLocation(log_id, offset, size, dir_index)


def test_plan_spans_reads_nearby_frames_of_one_log_together() -> None:
    head = _loc(1, 0).frame_offset  # frames follow their entry's head
    step = head + 100
    back_to_back = [((1, e), _loc(1, e * step)) for e in range(3)]
    assert plan_spans(back_to_back) == [back_to_back]
    # Out of order in, file order out; a gap within the limit joins, beyond it splits.
    near = [((1, 1), _loc(1, 5 * step)), ((1, 0), _loc(1, 0))]
    assert plan_spans(near, gap_max_bytes=4 * step) == [sorted(near, key=lambda kl: kl[1].offset)]
    assert len(plan_spans(near, gap_max_bytes=4 * step - 1)) == 2
    # Another log or another ledger directory: another pread; so is a span too long.
    apart = [((1, 0), _loc(1, 0)), ((1, 1), _loc(2, step)), ((1, 2), _loc(1, step, 100, 1))]
    assert len(plan_spans(apart)) == 3
    assert len(plan_spans(back_to_back, span_max_bytes=2 * step)) == 2
