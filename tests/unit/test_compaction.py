"""The ledgerstore's side of garbage collection on a real store over a temp dir: DELETED
records applied (reads answer as for a ledger never seen, the index rows go at the next
checkpoint, a zombie writer's later entries survive), entry log usage kept in the index
(the invariant after every operation, rebuilt from the logs when missing), dead log
deletion and compaction (space reclaimed, every live entry reads back, reads during
compaction succeed), and a crash at every step of them."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from services.ledgerstore.compaction import Compaction
from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.bookie import index_schema as sql
from shared.bookie.entrylog_format import (
    ENTRY_HEAD_SIZE,
    ENTRYLOG_HEADER_SIZE,
    EntryLogFormatError,
)
from shared.bookie.files import OS_FILES, FileLayer
from shared.bookie.journal_format import (
    EntryRecord,
    LedgerDeletedRecord,
    Record,
    encode_batch,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from shared.config import LedgerstoreSettings
from shared.digest import DigestManager
from shared.status import BookieStatus
from tests.support.faultfs import ENOSPC, Crash, FaultyFiles

KEY = b"k" * 20
DIGEST = DigestManager("crc32c")
CRC32C = wire.DIGEST_CODES[DIGEST.digest_type]


def frame(ledger_id: int, entry_id: int) -> bytes:
    payload = f"entry {ledger_id}:{entry_id} ".encode() * 10
    return DIGEST.sign(ledger_id, entry_id, entry_id - 1, len(payload), payload)


def entry(ledger_id: int, entry_id: int) -> EntryRecord:
    return EntryRecord.of(KEY, frame(ledger_id, entry_id), CRC32C)


def write_journal(bookie_dir: Path, file_id: int, records: list[Record]) -> None:
    journal_dir = bookie_dir / "journal"
    journal_dir.mkdir(parents=True, exist_ok=True)
    data = encode_file_header(file_id) + encode_batch([encode_record(r) for r in records])
    (journal_dir / journal_file_name(file_id)).write_bytes(data)


def settings(**update) -> LedgerstoreSettings:
    return LedgerstoreSettings().model_copy(
        update={
            "log_size_limit_bytes": 16 * 1024,
            "compaction_rate_by_entries": 1_000_000,
            **update,
        }
    )


async def open_store(
    bookie_dir: Path, files: FileLayer = OS_FILES, dirs: int = 1, **update
) -> LedgerStore:
    ledger_dirs = [bookie_dir / f"ledgers{n}" for n in range(dirs)] if dirs > 1 else None
    store = LedgerStore(
        bookie_dir, settings(**update), pytest.fail, files=files, ledger_dirs=ledger_dirs
    )
    await store.open()
    assert await store.catch_up()
    return store


def abandon(store: LedgerStore) -> None:
    """The process died: drop the store without its close (no checkpoint)."""
    store.index.close()
    for logger in store.loggers:
        for fd in logger._read_fds.values():
            os.close(fd)
        logger._read_fds.clear()
    for pool in (store._read_threads, store._write_threads, store._compaction_thread):
        pool.shutdown()


async def read_all(store: LedgerStore, keys: list[tuple[int, int]]) -> list[wire.ReadResult]:
    return await store.read([wire.ReadItem(ledger, e) for ledger, e in keys])


async def assert_live(store: LedgerStore, live: list[tuple[int, int]]) -> None:
    results = await read_all(store, live)
    bad = [(r.ledger_id, r.entry_id, r.status) for r in results if r.status != BookieStatus.OK]
    assert not bad, bad[:5]
    assert all(r.frame == frame(r.ledger_id, r.entry_id) for r in results)


async def assert_gone(store: LedgerStore, ledgers: list[int]) -> None:
    results = await read_all(store, [(ledger, 0) for ledger in ledgers])
    assert {r.status for r in results} == {BookieStatus.NO_LEDGER}
    for ledger in ledgers:
        assert store.index.ledger_entries(ledger) == []
        assert ledger not in store.ledgers


def check_usage(store: LedgerStore) -> None:
    """The invariant: every index row pointing into a log has a usage row for (log,
    ledger), here with exactly the bytes of those rows (these tests rewrite no entry); the
    store's metadata agrees with the table; no usage row names a log that is gone."""
    conn = sqlite3.connect(store.index.path)
    try:
        counted = {
            (d, log_id, sql.from_sql_id(ledger)): size
            for d, log_id, ledger, size in conn.execute(
                "SELECT dir, log_id, ledger_id, SUM(size + ?) FROM entries "
                "GROUP BY dir, log_id, ledger_id",
                (ENTRY_HEAD_SIZE,),
            )
        }
        usage = {
            (d, log_id, sql.from_sql_id(ledger)): size
            for d, log_id, ledger, size in conn.execute(sql.SELECT_USAGE)
        }
    finally:
        conn.close()
    assert usage == counted
    in_memory = {
        (meta.dir, meta.log_id, ledger): size
        for meta in store._logs.values()
        for ledger, size in meta.ledgers.items()
    }
    assert in_memory == usage
    for d, log_id, _ in usage:
        assert store.loggers[d].path(log_id).exists()


def log_files(bookie_dir: Path) -> list[Path]:
    return sorted((bookie_dir / "ledgers").glob("entrylog-*"))


def disk_bytes(bookie_dir: Path) -> int:
    return sum(p.stat().st_size for p in log_files(bookie_dir))


# -- applying DELETED records -----------------------------------------------------------


async def test_a_deleted_ledger_reads_as_never_seen_and_its_rows_go_at_the_next_checkpoint(
    tmp_path: Path,
) -> None:
    write_journal(tmp_path, 1, [entry(ledger, e) for e in range(5) for ledger in (1, 2)])
    store = await open_store(tmp_path)
    await store.checkpoint()
    check_usage(store)
    await assert_live(store, [(1, 0)])  # in the read cache now
    write_journal(tmp_path, 2, [LedgerDeletedRecord(1), entry(3, 0)])
    assert await store.catch_up()
    # Before the checkpoint the index still has its rows: reads must not see them.
    assert store.index.ledger_entries(1)
    results = await read_all(store, [(1, 0), (1, 4)])
    assert [r.status for r in results] == [BookieStatus.NO_LEDGER] * 2
    assert (await store.read_lac(1)).status is BookieStatus.NO_LEDGER
    await store.checkpoint()
    await assert_gone(store, [1])
    await assert_live(store, [(2, e) for e in range(5)] + [(3, 0)])
    check_usage(store)
    await store.close()
    again = await open_store(tmp_path)
    await assert_gone(again, [1])
    await assert_live(again, [(2, e) for e in range(5)])
    check_usage(again)
    await again.close()


async def test_a_zombie_writers_entries_after_the_deletion_survive_it(tmp_path: Path) -> None:
    write_journal(tmp_path, 1, [entry(1, e) for e in range(5)])
    store = await open_store(tmp_path)
    await store.checkpoint()
    # Unflushed entries before the deletion go with it; those after it stay.
    write_journal(tmp_path, 2, [entry(1, 5), LedgerDeletedRecord(1), entry(1, 7)])
    assert await store.catch_up()
    results = await read_all(store, [(1, 0), (1, 5), (1, 7)])
    assert [r.status for r in results] == [
        BookieStatus.NO_ENTRY,
        BookieStatus.NO_ENTRY,
        BookieStatus.OK,
    ]
    await store.checkpoint()
    assert [e for e, _ in store.index.ledger_entries(1)] == [7]
    check_usage(store)
    await store.close()
    again = await open_store(tmp_path)
    results = await read_all(again, [(1, 0), (1, 7)])
    assert [r.status for r in results] == [BookieStatus.NO_ENTRY, BookieStatus.OK]
    await again.close()


class HeldCommit(FileLayer):
    """Holds a checkpoint at its index commit until released (a thread-side wait)."""

    def __init__(self) -> None:
        self.holding = False
        self.reached = threading.Event()
        self.release = threading.Event()

    def point(self, name: str) -> None:
        if name == "index.commit" and self.holding:
            self.reached.set()
            assert self.release.wait(30)


async def test_a_deletion_applied_while_a_checkpoint_flushes_the_ledger(tmp_path: Path) -> None:
    files = HeldCommit()
    write_journal(tmp_path, 1, [entry(2, 0)])
    store = await open_store(tmp_path, files)
    await store.checkpoint()
    write_journal(tmp_path, 2, [entry(1, e) for e in range(3)])
    assert await store.catch_up()
    files.holding = True
    flush = asyncio.create_task(store.checkpoint())
    assert await asyncio.to_thread(files.reached.wait, 30)
    write_journal(tmp_path, 3, [LedgerDeletedRecord(1)])
    assert await store.catch_up()
    # The flushing buffer holds the ledger's entries: not served any more.
    assert [r.status for r in await read_all(store, [(1, 0)])] == [BookieStatus.NO_LEDGER]
    files.holding = False
    files.release.set()
    await flush
    # Its rows were committed by that checkpoint, before the deletion: still masked.
    assert store.index.ledger_entries(1)
    assert [r.status for r in await read_all(store, [(1, 0)])] == [BookieStatus.NO_LEDGER]
    await store.checkpoint()
    await assert_gone(store, [1])
    check_usage(store)
    await store.close()


async def test_apply_through_a_position(tmp_path: Path) -> None:
    write_journal(tmp_path, 1, [entry(1, 0), LedgerDeletedRecord(1)])
    store = LedgerStore(tmp_path, settings(), pytest.fail)
    await store.open()
    end = store.tailers[0].end_position()
    assert end is not None
    assert await store.apply_through({0: end})
    assert store.applied[0] >= end
    assert 1 not in store.ledgers
    await store.close()


async def test_a_crash_at_any_point_of_a_deleting_checkpoint_replays_to_the_same_state(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    write_journal(template, 1, [entry(ledger, e) for e in range(10) for ledger in (1, 2, 3)])
    store = await open_store(template)
    await store.checkpoint()
    await store.close()
    write_journal(template, 2, [LedgerDeletedRecord(1), entry(1, 20), LedgerDeletedRecord(3)])

    async def run(bookie_dir: Path, files: FaultyFiles) -> None:
        store = await open_store(bookie_dir, files)
        try:
            await store.checkpoint()
        except Crash:
            abandon(store)
            raise
        await store.close()

    dry = FaultyFiles()
    shutil.copytree(template, tmp_path / "dry")
    await run(tmp_path / "dry", dry)
    assert "index.commit" in dry.op_names
    for crash_at in range(dry.ops):
        bookie_dir = tmp_path / f"crash-{crash_at}"
        shutil.copytree(template, bookie_dir)
        files = FaultyFiles()
        files.crash_at(crash_at)
        with pytest.raises(Crash):
            await run(bookie_dir, files)
        files.power_loss()
        again = await open_store(bookie_dir)
        await again.checkpoint()
        await assert_live(again, [(2, e) for e in range(10)] + [(1, 20)])
        await assert_gone(again, [3])
        results = await read_all(again, [(1, 0)])
        assert results[0].status is BookieStatus.NO_ENTRY
        check_usage(again)
        await again.close()


# -- usage, dead logs, compaction -------------------------------------------------------

LEDGERS = list(range(1, 41))
KEPT = LEDGERS[::10]  # 4 of 40 live: 90% deleted
ENTRIES = 20
BLOCK = list(range(100, 110))  # written one after another, all deleted: whole logs die


async def build(bookie_dir: Path, dirs: int = 1) -> list[tuple[int, int]]:
    """Many ledgers written interleaved over many small logs, 90% of them then deleted
    and checkpointed; the live entries."""
    records: list[Record] = [entry(ledger, e) for e in range(ENTRIES) for ledger in LEDGERS]
    write_journal(bookie_dir, 1, records[: len(records) // 2])
    store = await open_store(bookie_dir, dirs=dirs)
    await store.checkpoint()  # two flushes: entries of a ledger in several logs
    write_journal(bookie_dir, 2, records[len(records) // 2 :])
    assert await store.catch_up()
    await store.checkpoint()
    write_journal(bookie_dir, 3, [entry(ledger, e) for ledger in BLOCK for e in range(ENTRIES)])
    assert await store.catch_up()
    await store.checkpoint()
    deleted = [x for x in LEDGERS + BLOCK if x not in KEPT]
    write_journal(bookie_dir, 4, [LedgerDeletedRecord(x) for x in deleted])
    assert await store.catch_up()
    await store.checkpoint()
    check_usage(store)
    await store.close()
    return [(ledger, e) for ledger in KEPT for e in range(ENTRIES)]


async def collect(store: LedgerStore) -> None:
    """One garbage collection's work on the store: dead logs, then every other log."""
    await store.delete_dead_entry_logs()
    check_usage(store)
    for meta in store.entry_logs():
        result = await store.compact_entry_log(meta.dir, meta.log_id, lambda: False)
        assert not result.aborted
        check_usage(store)
    await store.delete_dead_entry_logs()


async def test_deleting_and_compacting_reclaims_the_space_and_keeps_every_live_entry(
    tmp_path: Path,
) -> None:
    live = await build(tmp_path)
    store = await open_store(tmp_path)
    sealed = store.entry_logs()
    assert len(sealed) > 5
    assert {meta.log_id for meta in sealed} == {
        log_id for d, log_id in store._logs if not store._is_current(d, log_id)
    }
    before = disk_bytes(tmp_path)
    await collect(store)
    live_bytes = sum(meta.live_bytes for meta in store._logs.values())
    assert live_bytes == sum(ENTRY_HEAD_SIZE + len(frame(*k)) for k in live)
    after = disk_bytes(tmp_path)
    assert after < before
    # The current log is never compacted: count it by its live bytes only.
    current = store.current_entry_logs()[0]
    sealed_bytes = after - (current[2] + ENTRYLOG_HEADER_SIZE)
    sealed_live = sum(m.live_bytes for m in store.entry_logs())
    assert sealed_bytes <= 1.5 * sealed_live
    assert all(meta.usage > 0.6 for meta in store.entry_logs())
    await assert_live(store, live)
    await assert_gone(store, [x for x in LEDGERS + BLOCK if x not in KEPT])
    await store.close()
    again = await open_store(tmp_path)
    await assert_live(again, live)
    check_usage(again)
    await again.close()


async def test_a_stopped_compaction_changes_nothing(tmp_path: Path) -> None:
    live = await build(tmp_path)
    store = await open_store(tmp_path)
    target = max(store.entry_logs(), key=lambda m: m.live_bytes)
    files_before = log_files(tmp_path)
    result = await store.compact_entry_log(target.dir, target.log_id, lambda: True)
    assert result.aborted and result.new_log_id is None
    assert log_files(tmp_path) == files_before
    check_usage(store)
    await assert_live(store, live)
    await store.close()


async def test_a_compaction_whose_caller_is_cancelled_is_stopped_and_awaited_by_close(
    tmp_path: Path,
) -> None:
    # The service stopping cancels the collector mid-copy: close must stop the copy at its
    # next batch and wait for it, not shut the index under its thread.
    live = await build(tmp_path)
    store = await open_store(tmp_path)
    target = max(store.entry_logs(), key=lambda m: m.live_bytes)
    started = threading.Event()
    release = threading.Event()

    def should_stop() -> bool:
        started.set()
        release.wait(10)
        return False

    caller = asyncio.create_task(store.compact_entry_log(target.dir, target.log_id, should_stop))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0)  # close has begun: it waits for the compaction
    assert not closing.done()
    release.set()
    await closing
    # Finished or stopped at its next batch, it ended before close went on: no copy left.
    assert not list(tmp_path.rglob("*.compacting"))
    again = await open_store(tmp_path)
    await assert_live(again, live)
    check_usage(again)
    await again.close()


async def test_reads_of_live_ledgers_while_logs_are_compacted_and_deleted(tmp_path: Path) -> None:
    # A read cache too small for any frame: every read goes to the entry logs.
    live = await build(tmp_path)
    store = await open_store(tmp_path, read_ahead_cache_max_size_bytes=1)
    done = asyncio.Event()
    rounds = 0

    async def reader() -> None:
        nonlocal rounds
        while not done.is_set() or rounds == 0:
            await assert_live(store, live)
            rounds += 1

    task = asyncio.create_task(reader())
    await collect(store)
    done.set()
    await task
    assert rounds >= 1
    await store.close()


async def test_usage_is_rebuilt_from_the_logs_when_the_index_lacks_it(tmp_path: Path) -> None:
    live = await build(tmp_path)
    store = await open_store(tmp_path)
    expected = {key: meta.ledgers for key, meta in store._logs.items() if meta.ledgers}
    await store.close()
    conn = sqlite3.connect(tmp_path / "ledgers" / sql.INDEX_FILE)
    with conn:
        conn.execute("DELETE FROM entry_log_usage")
        conn.execute("DELETE FROM facts WHERE key = ?", (sql.USAGE_FACT,))
    conn.close()
    again = await open_store(tmp_path)
    assert {k: m.ledgers for k, m in again._logs.items() if m.ledgers} == expected
    check_usage(again)
    await collect(again)
    await assert_live(again, live)
    await again.close()
    # Marked: not rebuilt again (a row removed now stays removed).
    conn = sqlite3.connect(tmp_path / "ledgers" / sql.INDEX_FILE)
    assert conn.execute(sql.SELECT_FACTS).fetchall().count((sql.USAGE_FACT, "1")) == 1
    conn.close()


@pytest.mark.parametrize("step", ["delete", "compact"])
async def test_a_crash_at_every_step_loses_nothing_and_leaks_at_most_one_log(
    tmp_path: Path, step: str
) -> None:
    template = tmp_path / "template"
    live = await build(template)
    deleted = [x for x in LEDGERS + BLOCK if x not in KEPT]

    async def run(bookie_dir: Path, files: FaultyFiles) -> None:
        store = await open_store(bookie_dir, files)
        await store.checkpoint()
        try:
            if step == "delete":
                assert any(m.is_empty() for m in store.entry_logs())
                files.gc_from = files.ops
                await store.delete_dead_entry_logs()
            else:
                await store.delete_dead_entry_logs()
                target = max(store.entry_logs(), key=lambda m: m.live_bytes)
                files.gc_from = files.ops
                await store.compact_entry_log(target.dir, target.log_id, lambda: False)
        except Crash:
            abandon(store)
            raise
        await store.close()

    dry = FaultyFiles()
    shutil.copytree(template, tmp_path / "dry")
    await run(tmp_path / "dry", dry)
    first = dry.gc_from
    if step == "compact":
        assert {"compaction.switch", "compaction.switched"} <= set(dry.op_names[first:])
    else:
        assert len([n for n in dry.op_names[first:] if n.startswith("unlink")]) > 1
    for crash_at in range(first, dry.ops):
        bookie_dir = tmp_path / f"crash-{crash_at}"
        shutil.copytree(template, bookie_dir)
        files = FaultyFiles()
        files.crash_at(crash_at)
        with pytest.raises(Crash):
            await run(bookie_dir, files)
        files.power_loss()
        again = await open_store(bookie_dir)
        await assert_live(again, live)
        await assert_gone(again, deleted)
        check_usage(again)
        assert not list((bookie_dir / "ledgers").glob("*.compacting"))
        if step == "compact":
            assert len([m for m in again.entry_logs() if m.is_empty()]) <= 1, crash_at
        await collect(again)
        assert not [m for m in again.entry_logs() if m.is_empty()]
        await assert_live(again, live)
        await again.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


@pytest.mark.parametrize("by_bytes", [False, True])
async def test_compaction_copies_at_the_configured_rate(tmp_path: Path, by_bytes: bool) -> None:
    await build(tmp_path)
    store = await open_store(tmp_path)
    meta = max(store.entry_logs(), key=lambda m: m.live_bytes)
    rate = {"compaction_rate_by_entries": 100, "compaction_rate_by_bytes": 20_000}
    clock = FakeClock()
    compaction = Compaction(
        store.logger,
        store.index,
        settings(**rate, is_throttle_by_bytes=by_bytes),
        OS_FILES,
        meta,
        clock=clock,
        sleep=clock.sleep,
    )
    assert compaction.copy(lambda: False)
    # A token bucket starting empty: everything but the first entry's worth is waited for.
    if by_bytes:
        first = compaction.bytes_copied // compaction.entries
        expected = (compaction.bytes_copied - first) / 20_000
    else:
        expected = (compaction.entries - 1) / 100
    assert compaction.entries > 10
    assert 0.9 * expected <= clock.slept <= expected + 0.01
    # Never switched in: the copy has no usage row, so the next store removes it (at
    # open, its id being past the checkpoint's log end, or else as a dead log).
    assert compaction.new_log_id is not None
    copy = store.logger.path(compaction.new_log_id)
    assert copy.exists()
    await store.close()
    again = await open_store(tmp_path)
    await again.delete_dead_entry_logs()
    assert not copy.exists()
    check_usage(again)
    await again.close()


async def test_a_read_that_looked_up_a_log_since_deleted_looks_again(tmp_path: Path) -> None:
    live = await build(tmp_path)
    store = await open_store(tmp_path, read_ahead_cache_max_size_bytes=1)
    ledger = KEPT[0]
    stale = store.index.lookup_range(ledger, 0, ENTRIES - 1)
    await collect(store)
    assert not any(store.loggers[0].path(loc.log_id).exists() for _, loc in stale)
    real = store.index.lookup_range
    calls: list[int] = []

    def lookup_range(ledger_id: int, first: int, last: int):
        # The first lookup happened before the compaction: it names the old log.
        calls.append(ledger_id)
        if len(calls) == 1:
            return [(e, loc) for e, loc in stale if first <= e <= last]
        return real(ledger_id, first, last)

    store.index.lookup_range = lookup_range  # type: ignore[method-assign]
    await assert_live(store, [k for k in live if k[0] == ledger])
    assert len(calls) >= 2
    store.index.lookup_range = real  # type: ignore[method-assign]
    await store.close()


async def test_a_compaction_that_fails_writing_removes_its_copy(tmp_path: Path) -> None:
    live = await build(tmp_path)
    files = FaultyFiles()
    store = await open_store(tmp_path, files)
    target = max(store.entry_logs(), key=lambda m: m.live_bytes)
    before = log_files(tmp_path)
    files.fail_next("write", ENOSPC)
    with pytest.raises(OSError):
        await store.compact_entry_log(target.dir, target.log_id, lambda: False)
    assert log_files(tmp_path) == before
    check_usage(store)
    await assert_live(store, live)
    result = await store.compact_entry_log(target.dir, target.log_id, lambda: False)
    assert result.entries > 0 and not result.aborted
    await assert_live(store, live)
    await store.close()


async def test_a_log_rolled_during_a_compaction_gets_its_own_id_and_a_crash_leaks_the_copy(
    tmp_path: Path,
) -> None:
    live = await build(tmp_path)
    files = FaultyFiles()
    store = await open_store(tmp_path, files)
    await store.delete_dead_entry_logs()
    target = max(store.entry_logs(), key=lambda m: m.live_bytes)
    more = [(7, e) for e in range(200)]  # enough to roll the current log
    write_journal(tmp_path, 5, [entry(*k) for k in more])
    loop = asyncio.get_running_loop()
    current = store.logger.log_id

    def checkpoint_meanwhile() -> bool:
        # On the compaction thread, the copy's id taken: a flush that rolls the log.
        if store.logger.log_id == current:
            assert asyncio.run_coroutine_threadsafe(store.catch_up(), loop).result(30)
            asyncio.run_coroutine_threadsafe(store.checkpoint(), loop).result(30)
        return False

    point = files.point

    def crash_at_the_switch(name: str) -> None:
        if name == "compaction.switch":
            files.crash_at(files.ops)
        point(name)

    files.point = crash_at_the_switch  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await store.compact_entry_log(target.dir, target.log_id, checkpoint_meanwhile)
    abandon(store)
    files.power_loss()
    copy_id = current + 1  # taken before the roll; the writer's logs came after it
    assert store.logger.log_id > copy_id
    assert store.logger.path(copy_id).exists()
    again = await open_store(tmp_path)
    # Below the checkpoint's log end: kept at open, then removed as dead.
    assert again.logger.path(copy_id).exists()
    await assert_live(again, live + more)
    check_usage(again)
    assert [m.log_id for m in await again.delete_dead_entry_logs()] == [copy_id]
    await assert_live(again, live + more)
    await again.close()


async def test_compaction_in_each_of_several_ledger_directories(tmp_path: Path) -> None:
    live = await build(tmp_path, dirs=2)
    store = await open_store(tmp_path, dirs=2)
    assert {meta.dir for meta in store.entry_logs()} == {0, 1}
    await collect(store)
    assert all(meta.usage > 0.6 for meta in store.entry_logs())
    await assert_live(store, live)
    await store.close()
    again = await open_store(tmp_path, dirs=2)
    await assert_live(again, live)
    check_usage(again)
    await again.close()


@pytest.mark.parametrize("seed", range(3))
async def test_writes_deletions_and_collections_interleaved_keep_every_live_entry(
    tmp_path: Path, seed: int
) -> None:
    """Rounds of new entries (zombie re-creations of deleted ids among them), deletions,
    checkpoints, dead log deletion and compactions, some of them concurrent: after each
    round every live entry reads back, every deleted ledger is gone and usage is exact."""
    rng = random.Random(seed)
    store = await open_store(tmp_path, log_size_limit_bytes=8 * 1024)
    live: dict[int, list[int]] = {}
    gone: set[int] = set()
    next_entry: dict[int, int] = {}
    for round_no in range(12):
        records: list[Record] = []
        for _ in range(rng.randrange(50, 150)):
            ledger = rng.randrange(1, 30)
            entry_id = next_entry.get(ledger, 0)
            next_entry[ledger] = entry_id + 1
            records.append(entry(ledger, entry_id))
            live.setdefault(ledger, []).append(entry_id)
            gone.discard(ledger)
        for ledger in rng.sample(sorted(live), k=min(len(live), rng.randrange(0, 6))):
            records.append(LedgerDeletedRecord(ledger))
            del live[ledger]
            gone.add(ledger)
        write_journal(tmp_path, round_no + 1, records)
        assert await store.catch_up()
        logs = store.entry_logs()
        target = rng.choice(logs) if logs else None
        work = [store.checkpoint(), store.delete_dead_entry_logs()]
        if target is not None:
            work.append(store.compact_entry_log(target.dir, target.log_id, lambda: False))
        rng.shuffle(work)
        await asyncio.gather(*work)
        await store.checkpoint()
        check_usage(store)
        await assert_live(store, [(ledger, e) for ledger, ids in live.items() for e in ids])
        results = await read_all(store, [(ledger, 0) for ledger in sorted(gone)])
        assert all(r.status is BookieStatus.NO_LEDGER for r in results)
    await collect(store)
    await store.close()
    again = await open_store(tmp_path)
    check_usage(again)
    await assert_live(again, [(ledger, e) for ledger, ids in live.items() for e in ids])
    await again.close()


@pytest.mark.parametrize("field_offset", [0, 11, 19])  # the head's size, ledger, entry
async def test_compaction_never_drops_an_entry_whose_head_is_damaged(
    tmp_path: Path, field_offset: int
) -> None:
    live = await build(tmp_path)
    store = await open_store(tmp_path)
    # Regression: compaction found a log's entries by their heads alone, so an entry
    # behind a damaged head was not copied, and went with the old log (IO_ERROR after).
    # In each sealed log, one bit of the head of its first live entry flipped at rest.
    damaged = set()
    for meta in store.entry_logs():
        for ledger, _, offset, _ in store.loggers[0].scan(meta.log_id):
            if ledger in KEPT:
                path = store.loggers[0].path(meta.log_id)
                with open(path, "r+b") as f:
                    f.seek(offset + field_offset)
                    byte = f.read(1)[0]
                    f.seek(offset + field_offset)
                    f.write(bytes([byte ^ 0x04]))
                damaged.add(meta.log_id)
                break
    assert damaged
    await store.delete_dead_entry_logs()
    for meta in store.entry_logs():
        if meta.log_id in damaged:
            with pytest.raises(EntryLogFormatError, match="damaged"):
                await store.compact_entry_log(meta.dir, meta.log_id, lambda: False)
        else:
            assert not (await store.compact_entry_log(meta.dir, meta.log_id, lambda: False)).aborted
    await store.delete_dead_entry_logs()
    assert damaged <= {meta.log_id for meta in store.entry_logs()}  # kept whole
    await assert_live(store, live)
    check_usage(store)
    await store.close()
