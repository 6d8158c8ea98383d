"""The ledgerstore's read path: the bounded read queue (TOO_MANY_REQUESTS, requests dropped
once their sender's timeout passed), reads that wait for nothing of the write path, and
reads from disk (one index range query and one pread per run, read-ahead of what the
reader asks next, read-ahead frames checked when served)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from services.ledgerstore.read_queue import ReadQueue
from services.ledgerstore.store import WRITE_THREADS, LedgerStore
from shared import wire
from shared.bookie.journal_format import (
    EntryRecord,
    encode_batch,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from shared.config import LedgerstoreSettings
from shared.digest import DigestManager
from shared.status import BookieStatus
from tests.support.faultfs import flip_bit

KEY = b"k" * 20
DIGEST = DigestManager("crc32c")
CRC32C = wire.DIGEST_CODES[DIGEST.digest_type]
DEADLINE_S = 30.0  # a read that waits on the write path never ends: fail, do not hang


def frame(ledger_id: int, entry_id: int) -> bytes:
    payload = f"entry {ledger_id}:{entry_id}".encode() * 8
    return DIGEST.sign(ledger_id, entry_id, entry_id - 1, len(payload), payload)


def write_journal(journal_dir: Path, entries: list[tuple[int, int]], file_id: int = 1) -> None:
    journal_dir.mkdir(parents=True, exist_ok=True)
    records = [encode_record(EntryRecord.of(KEY, frame(*e), CRC32C)) for e in entries]
    data = encode_file_header(file_id) + encode_batch(records)
    (journal_dir / journal_file_name(file_id)).write_bytes(data)


async def open_store(tmp_path: Path, entries: list[tuple[int, int]], **update) -> LedgerStore:
    """A store that has applied and flushed `entries` (so they are in the index)."""
    write_journal(tmp_path / "journal", entries)
    store = LedgerStore(tmp_path, LedgerstoreSettings().model_copy(update=update), pytest.fail)
    await store.open()
    assert await store.catch_up()
    await store.checkpoint()
    return store


def items(ledger_id: int, entry_ids) -> list[wire.ReadItem]:
    return [wire.ReadItem(ledger_id, e) for e in entry_ids]


class Answers:
    """The answers a request gets (the queue's side of `nats.micro`'s Request)."""

    def __init__(self) -> None:
        self.replies: list[tuple[BookieStatus, list[wire.ReadResult]]] = []
        self.errors: list[str] = []

    async def respond(self, data: bytes = b"") -> None:
        self.replies.append(wire.decode_read_reply(data))

    async def respond_error(self, code: str, description: str) -> None:
        self.errors.append(code)


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


# -- the read queue -----------------------------------------------------------------------


async def test_a_full_queue_answers_too_many_requests_and_changes_nothing_else(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(10)])
    queue = ReadQueue(store, workers=1, max_pending=2, clock=Clock())
    # The workers are not started yet: what is offered waits in the queue.
    waiting = [Answers(), Answers()]
    for n, answers in enumerate(waiting):
        await queue.offer(answers, wire.encode_read_request(items(1, [n]), 2_000))
    refused = Answers()
    await queue.offer(refused, wire.encode_read_request(items(1, [5]), 2_000))
    assert refused.replies == [(BookieStatus.TOO_MANY_REQUESTS, [])]
    assert store.stats.ledgerstore_read_entry == 0
    assert queue.stats.read_entry_rejected == 1 and queue.stats.read_entry_queue_size == 2
    queue.start()
    await queue.drain()
    for n, answers in enumerate(waiting):
        [(status, [result])] = answers.replies
        assert status is BookieStatus.OK and result.frame == frame(1, n)
    assert store.stats.ledgerstore_read_entry == 2 and refused.replies[1:] == []
    assert queue.stats.read_entry_requests == 3 and queue.stats.read_entry_queue_size == 0
    await store.close()


async def test_a_request_that_waited_past_its_senders_timeout_is_not_read(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(10)])
    clock = Clock()
    queue = ReadQueue(store, workers=1, max_pending=10, clock=clock)
    late, patient, in_time = Answers(), Answers(), Answers()
    await queue.offer(late, wire.encode_read_request(items(1, range(5)), 100))
    await queue.offer(patient, wire.encode_read_request(items(1, [7]), 0))  # no limit
    clock.now_s += 0.1  # the first one's sender stopped waiting just now
    await queue.offer(in_time, wire.encode_read_request(items(1, [8]), 100))
    queue.start()
    await queue.drain()
    assert late.replies == [] and late.errors == []  # nobody waits for an answer
    assert [r.entry_id for _, [r] in patient.replies + in_time.replies] == [7, 8]
    # Only the two served were read: the expired request's five entries never were.
    assert store.stats.ledgerstore_read_entry == 2
    assert queue.stats.read_entry_expired == 1
    assert queue.stats.scheduling_delay.max_ms[1] == pytest.approx(100.0)
    # READ_ENTRY_REQUEST: the expired one as a failure, the two served as successes.
    assert queue.stats.request_latency.count == [1, 2]
    await store.close()


class Ticking(Clock):
    """Each reading 4 ms later than the last: a request served takes a known time."""

    def __call__(self) -> float:
        self.now_s += 0.004
        return self.now_s


async def test_reads_pause_while_the_journal_writes_and_only_then(tmp_path: Path) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(10)])
    queue = ReadQueue(store, workers=1, max_pending=10, clock=Ticking(), read_share=0.25)
    answers = [Answers() for _ in range(3)]
    for n, a in enumerate(answers):
        await queue.offer(a, wire.encode_read_request(items(1, [n]), 0))
    store.durable_notes += 1  # a group commit handed over: adds are being made durable
    queue.start()
    await queue.drain()
    assert [r.entry_id for a in answers for _, [r] in a.replies] == [0, 1, 2]
    # The first request took 12 ms of the (ticking) clock and was followed by a pause of
    # three times that (reads at most a quarter of the time); the journal noted nothing
    # more, so the next two were not.
    assert queue.stats.read_paused_s == pytest.approx(0.036)
    await store.close()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01\x00\x00\x00\x02xx",
        # The format before the timeout field: version, count, one item.
        b"\x01\x00\x00\x00\x01" + bytes(17),
        wire.encode_read_request(items(1, [0]))[:-1],
    ],
)
async def test_a_malformed_read_request_answers_bad_request(tmp_path: Path, data: bytes) -> None:
    store = await open_store(tmp_path, [(1, 0)])
    queue = ReadQueue(store, workers=1, max_pending=10)
    queue.start()
    answers = Answers()
    await queue.offer(answers, data)
    await queue.drain()
    assert answers.replies == [(BookieStatus.BAD_REQUEST, [])]
    assert store.stats.ledgerstore_read_entry == 0 and queue.stats.read_entry_queue_size == 0
    await store.close()


# -- reads do not wait for the write path ---------------------------------------------------


async def test_reads_of_stored_entries_wait_for_no_catch_up_flush_or_write_thread(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(6)])
    # More of the journal applied but not flushed: those entries are in the write cache.
    write_journal(tmp_path / "journal", [(1, e) for e in range(6, 9)], file_id=2)
    assert await store.catch_up()
    # Hold everything the write path has: its locks and every one of its threads.
    release = threading.Event()
    blocked = [store._write_threads.submit(release.wait) for _ in range(WRITE_THREADS)]
    try:
        async with store._checkpoint_lock, store._apply_lock:
            results = await asyncio.wait_for(store.read(items(1, range(9))), DEADLINE_S)
            assert [r.frame for r in results] == [frame(1, e) for e in range(9)]
            assert store.stats.write_cache_hits == 3 and store.stats.read_cache_misses == 6
    finally:
        release.set()
        for future in blocked:
            future.result()
    await store.close()


# -- reads from disk ------------------------------------------------------------------------


async def test_one_index_query_and_one_pread_per_run_and_read_ahead_of_the_next_block(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(300)])
    results = await store.read(items(1, range(100)))
    assert [r.frame for r in results] == [frame(1, e) for e in range(100)]
    assert store.stats.index_lookups == 1 and store.stats.entry_log_reads == 1
    assert store.stats.readahead_batch_size == 100  # 100-199: what the reader asks next
    results = await store.read(items(1, range(100, 200)))
    assert [r.frame for r in results] == [frame(1, e) for e in range(100, 200)]
    assert store.stats.index_lookups == 1 and store.stats.read_cache_hits == 100
    await store.close()


async def test_requests_in_flight_together_read_each_entry_from_disk_once(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(300)])
    blocks = [items(1, range(at, at + 100)) for at in (0, 100, 200)]
    results = await asyncio.gather(*(store.read(block) for block in blocks))
    assert [r.frame for block in results for r in block] == [frame(1, e) for e in range(300)]
    # The first read brings in 0-199 (its read-ahead is the second block): the second
    # waits for it; the third, whose entries nobody is bringing in, reads its own.
    assert store.stats.index_lookups == 2 and store.stats.entry_log_reads == 2
    assert store.stats.read_cache_hits == 100
    await store.close()


async def test_gaps_and_the_holes_of_a_striped_ledger(tmp_path: Path) -> None:
    # Ledger 1 has a gap (3, 4 never written here); ledger 2 is one bookie's share of an
    # E3/Qw1 ledger: every third entry. Both in one request, one index query per run.
    stored = [(1, e) for e in (0, 1, 2, 5, 6)] + [(2, e) for e in range(0, 30, 3)]
    store = await open_store(tmp_path, stored, read_ahead_cache_batch_size=3)
    asked = items(1, range(7)) + items(2, [0, 3, 6])
    results = await store.read(asked)
    assert [(r.ledger_id, r.entry_id, r.status) for r in results] == [
        (1, 0, BookieStatus.OK),
        (1, 1, BookieStatus.OK),
        (1, 2, BookieStatus.OK),
        (1, 3, BookieStatus.NO_ENTRY),
        (1, 4, BookieStatus.NO_ENTRY),
        (1, 5, BookieStatus.OK),
        (1, 6, BookieStatus.OK),
        (2, 0, BookieStatus.OK),
        (2, 3, BookieStatus.OK),
        (2, 6, BookieStatus.OK),
    ]
    assert all(r.frame == frame(r.ledger_id, r.entry_id) for r in results if r.frame)
    # Ledger 2 read ahead with the reader's stride (9, 12, 15), none of the entries a
    # reader of this bookie is never sent to (they are not here anyway).
    hits = store.stats.read_cache_hits
    results = await store.read(items(2, [9, 12, 15]))
    assert [r.frame for r in results] == [frame(2, e) for e in (9, 12, 15)]
    assert store.stats.read_cache_hits == hits + 3
    await store.close()


async def test_a_request_spanning_the_write_cache_and_the_entry_logs(tmp_path: Path) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(4)])
    write_journal(tmp_path / "journal", [(1, e) for e in range(4, 8)], file_id=2)
    results = await store.read(items(1, range(8)))
    assert [r.frame for r in results] == [frame(1, e) for e in range(8)]
    # 4-7 were not applied yet: the read caught up, then found them in the write cache.
    assert store.stats.ledgerstore_catch_up == 2 and store.stats.write_cache_hits == 4
    await store.close()


async def test_a_corrupt_frame_read_ahead_is_caught_when_served(tmp_path: Path) -> None:
    store = await open_store(tmp_path, [(1, e) for e in range(8)])
    corrupt: list[tuple[int, int]] = []
    store._on_corrupt = lambda ledger_id, entry_id, why: corrupt.append((ledger_id, entry_id))
    location = store.index.lookup(1, 5)
    flip_bit(store.ledger_dirs[0] / f"entrylog-{location.log_id:06d}.log", location.offset + 60)
    results = await store.read(items(1, range(4)))  # 4-7 read ahead, not checked yet
    assert [r.status for r in results] == [BookieStatus.OK] * 4 and corrupt == []
    results = await store.read(items(1, range(4, 8)))
    assert [r.status for r in results] == [
        BookieStatus.OK,
        BookieStatus.CORRUPT,
        BookieStatus.OK,
        BookieStatus.OK,
    ]
    assert corrupt == [(1, 5)] and results[1].frame == b""
    # Not served from the cache again: read from disk, and found corrupt again.
    [again] = await store.read(items(1, [5]))
    assert again.status is BookieStatus.CORRUPT and corrupt == [(1, 5), (1, 5)]
    await store.close()
