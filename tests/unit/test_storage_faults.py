"""The bookie's storage under injected faults (tests/support/faultfs.py): a crash at every
file operation of the journal and of a checkpoint, followed by each kind of power loss;
fsync EIO; write ENOSPC; flipped bits. Invariants: nothing acknowledged is lost, replay
ends exactly after the acknowledged entries (plus at most a dense prefix of the one batch
in flight), corrupt data is never returned, index and entry logs agree."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.journal.journal import Journal, JournalStartupError, replay
from services.ledgerstore.core import verify_stored
from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.bookie.fault_files import FAIL_NEXT_FSYNC, FAIL_NEXT_WRITE, FaultFiles
from shared.bookie.files import OS_FILES, FileLayer
from shared.bookie.journal_dir import journal_files
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    SNAPSHOT,
    EntryRecord,
    FenceRecord,
    MasterKeyRecord,
    decode_snapshot,
    encode_batch,
    encode_file_header,
    encode_record,
    journal_file_name,
    scan_records,
)
from shared.config import JournalSettings, LedgerstoreSettings
from shared.digest import DigestManager
from shared.status import BookieStatus
from tests.support.faultfs import EIO, ENOSPC, Crash, FaultyFiles, flip_bit

KEY = b"k" * 20
DIGEST = DigestManager("crc32c")
CRC32C = wire.DIGEST_CODES[DIGEST.digest_type]
MODES = ["lose", "tear", "holes"]


def entry(ledger_id: int, entry_id: int, size: int = 200) -> EntryRecord:
    payload = bytes([entry_id % 251]) * size
    frame = DIGEST.sign(ledger_id, entry_id, entry_id - 1, size * (entry_id + 1), payload)
    return EntryRecord.of(KEY, frame, CRC32C)


def journal_settings(**update) -> JournalSettings:
    return JournalSettings().model_copy(update={"max_backups": 0, "max_size_mb": 1, **update})


def journal_entries(directory: Path) -> list[tuple[int, int]]:
    found = []
    for file_id in journal_files(directory):
        data = (directory / journal_file_name(file_id)).read_bytes()
        for scanned in scan_records(memoryview(data)[FILE_HEADER_SIZE:]).records:
            if isinstance(scanned.record, EntryRecord):
                found.append((scanned.record.ledger_id, scanned.record.entry_id))
    return found


class Fatal:
    """Records fail-stop calls instead of exiting the test process."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


async def run_journal(
    directory: Path, files: FileLayer, batches: list[list[EntryRecord]], fatal: Fatal
) -> list[tuple[int, int]]:
    """Submit the batches one after another; the (ledger, entry) acknowledged before the
    journal died (or all of them)."""
    journal = Journal(directory, journal_settings(), fatal=fatal, files=files)
    acked: list[tuple[int, int]] = []
    try:
        await journal.open()
    except (Crash, OSError):
        return acked
    writer = asyncio.create_task(journal.run_writer())
    try:
        for batch in batches:
            waiting = journal.submit(batch, now_ms=0)
            await asyncio.wait({waiting, writer}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                break
            acked.extend((r.ledger_id, r.entry_id) for r in batch)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await journal.close()
    return acked


BATCHES = [[entry(1, e) for e in range(b * 4, b * 4 + 4)] for b in range(6)]
SUBMITTED = [(r.ledger_id, r.entry_id) for batch in BATCHES for r in batch]


async def journal_ops(tmp_path: Path) -> int:
    files = FaultyFiles()
    await run_journal(tmp_path / "dry", files, BATCHES, Fatal())
    return files.ops


@pytest.mark.parametrize("mode", MODES)
async def test_a_crash_at_any_journal_operation_loses_no_acknowledged_entry(
    tmp_path: Path, mode: str
) -> None:
    total = await journal_ops(tmp_path)
    assert total > 12  # create + a write and an fdatasync per batch
    for crash_at in range(total + 1):
        directory = tmp_path / f"{mode}-{crash_at}"
        files = FaultyFiles(seed=crash_at)
        files.crash_at(crash_at)
        acked = await run_journal(directory, files, BATCHES, Fatal())
        files.power_loss(mode)
        # A torn tail, even with a hole in the middle of the last batch, is recovered.
        replayed = replay(directory)
        found = journal_entries(directory)
        assert set(acked) <= set(found), (crash_at, mode)
        # Exactly the acknowledged entries, plus at most a dense prefix of the batch that
        # was being committed: never a gap, never an entry that was not submitted.
        assert found == SUBMITTED[: len(found)], (crash_at, mode, found)
        assert len(found) <= len(acked) + 4
        last = replayed.state.get(1).last_entry_id if 1 in replayed.state else -1
        assert last == len(found) - 1
        # The restarted journal appends after the recovered tail.
        more = await run_journal(directory, OS_FILES, [[entry(2, 0)]], Fatal())
        assert more == [(2, 0)]


@pytest.mark.parametrize(("kind", "err"), [("fsync", EIO), ("write", ENOSPC)])
async def test_a_failed_fsync_or_write_is_fatal_and_never_acknowledged(
    tmp_path: Path, kind: str, err: int
) -> None:
    files = FaultyFiles()
    fatal = Fatal()
    journal = Journal(tmp_path, journal_settings(), fatal=fatal, files=files)
    await journal.open()
    writer = asyncio.create_task(journal.run_writer())
    await journal.submit([entry(1, 0)], now_ms=0)
    files.fail_next(kind, err)
    doomed = journal.submit([entry(1, 1), entry(1, 2)], now_ms=0)
    with pytest.raises(OSError):
        await writer
    assert len(fatal.reasons) == 1 and "journal write/fsync" in fatal.reasons[0]
    assert not doomed.done()  # never acknowledged (the process exits)
    await journal.close()
    files.power_loss("lose")
    assert journal_entries(tmp_path) == [(1, 0)]


@pytest.mark.parametrize(("fault", "err"), [(FAIL_NEXT_FSYNC, "EIO"), (FAIL_NEXT_WRITE, "ENOSPC")])
async def test_a_failed_fsync_or_write_of_a_checkpoint_is_fatal(
    tmp_path: Path, fault: str, err: str
) -> None:
    # The fault suite's EIO landed on the ledger-state snapshot a checkpoint writes, and the
    # journal went on acknowledging adds on the failed disk. The suite's own file layer.
    files = FaultFiles(tmp_path / "faults")
    fatal = Fatal()
    journal = Journal(tmp_path / "journal", journal_settings(), fatal=fatal, files=files)
    await journal.open()
    writer = asyncio.create_task(journal.run_writer())
    await journal.submit([entry(1, 0)], now_ms=0)
    (tmp_path / "faults" / fault).write_text(err)
    with pytest.raises(OSError):
        await journal.checkpoint(journal.durable_position)
    assert len(fatal.reasons) == 1 and "journal checkpoint" in fatal.reasons[0]
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    await journal.close()


def write_journal(directory: Path, batches: list[list[EntryRecord]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = encode_file_header(1) + b"".join(
        encode_batch([encode_record(r) for r in batch]) for batch in batches
    )
    path = directory / journal_file_name(1)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("skip", [False, True])
def test_mid_journal_damage_is_refused_unless_the_operator_allows_it(
    tmp_path: Path, skip: bool
) -> None:
    path = write_journal(tmp_path, BATCHES)
    flip_bit(path, FILE_HEADER_SIZE + 400, 3)  # inside the first batch
    if not skip:
        with pytest.raises(JournalStartupError) as err:
            replay(tmp_path)
        assert str(path) in str(err.value) and "offset" in str(err.value)
        assert "SKIP_REPLAY_JOURNAL_INVALID_RECORD" in str(err.value)
        return
    replayed = replay(tmp_path, skip_invalid_records=True)
    # The damaged batch is skipped; everything after it is replayed.
    assert replayed.state.get(1).last_entry_id == SUBMITTED[-1][1]
    assert path.stat().st_size == len(write_journal(tmp_path / "x", BATCHES).read_bytes())


def test_damage_below_the_last_mark_is_refused_even_at_the_tail(tmp_path: Path) -> None:
    path = write_journal(tmp_path, BATCHES)
    size = path.stat().st_size
    (tmp_path / "lastMark").write_text(f'{{"file": 1, "offset": {size}}}')
    flip_bit(path, size - 3)  # the last batch: looks torn, but it was checkpointed
    with pytest.raises(JournalStartupError, match="LastLogMark"):
        replay(tmp_path)


# -- the ledgerstore ----------------------------------------------------------------------


def store_settings(**update) -> LedgerstoreSettings:
    return LedgerstoreSettings().model_copy(
        update={"log_size_limit_bytes": 4096, "read_ahead_cache_batch_size": 8, **update}
    )


async def check_store(bookie_dir: Path, expected: list[tuple[int, int]]) -> None:
    """Reopen with real files: every journal entry reads back verified, and every index
    row points at the entry it names."""
    store = LedgerStore(bookie_dir, store_settings(), fatal=pytest.fail)
    await store.open()
    assert await store.catch_up()
    items = [wire.ReadItem(ledger, e) for ledger, e in expected]
    results = await store.read(items)
    assert [r.status for r in results] == [BookieStatus.OK] * len(items)
    for result in results:
        assert verify_stored(result.frame, result.ledger_id, result.entry_id, CRC32C) is None
    await store.checkpoint()
    for ledger_id in {ledger for ledger, _ in expected}:
        for entry_id, location in store.index.ledger_entries(ledger_id):
            frame = store.loggers[location.dir].read(location)
            assert verify_stored(frame, ledger_id, entry_id, CRC32C) is None
    await store.close()


async def checkpoint_run(bookie_dir: Path, files: FileLayer) -> None:
    """Apply the journal in two steps with a checkpoint after each, then move the
    journal's LastLogMark, as the services do."""
    journal_dir = bookie_dir / "journal"
    store = LedgerStore(bookie_dir, store_settings(), fatal=Fatal(), files=files)
    journal = Journal(journal_dir, journal_settings(), fatal=Fatal(), files=files)
    try:
        await store.open()
        await store.catch_up()
        await store.checkpoint()
        write_journal_more(journal_dir)
        await store.catch_up()
        positions = await store.checkpoint()
        await journal.open()
        assert positions is not None
        await journal.checkpoint(positions[0])
    finally:
        await journal.close()


def write_journal_more(journal_dir: Path) -> None:
    data = encode_file_header(2) + encode_batch([encode_record(entry(2, e)) for e in range(10)])
    (journal_dir / journal_file_name(2)).write_bytes(data)


@pytest.mark.parametrize("mode", MODES)
async def test_index_and_entry_logs_agree_after_a_crash_at_any_point_of_a_checkpoint(
    tmp_path: Path, mode: str
) -> None:
    dry = FaultyFiles()
    write_journal(tmp_path / "dry" / "journal", BATCHES)
    await checkpoint_run(tmp_path / "dry", dry)
    assert any("index.commit" in name for name in dry.op_names)
    expected = SUBMITTED + [(2, e) for e in range(10)]
    for crash_at in range(dry.ops + 1):
        bookie_dir = tmp_path / f"{mode}-{crash_at}"
        write_journal(bookie_dir / "journal", BATCHES)
        files = FaultyFiles(seed=crash_at)
        files.crash_at(crash_at)
        try:
            await checkpoint_run(bookie_dir, files)
        except Crash:
            pass
        files.power_loss(mode)
        if not (bookie_dir / "journal" / journal_file_name(2)).exists():
            write_journal_more(bookie_dir / "journal")
        replay(bookie_dir / "journal")  # the journal still starts
        await check_store(bookie_dir, expected)


async def fence_lives(directory: Path, files: FaultyFiles, fenced: list[int]) -> None:
    """Three lives of a journal, each fencing ledgers then moving the LastLogMark to its
    own file: the second writes the snapshot whole, the third appends a segment to it.
    `fenced` gets each ledger whose fence was acknowledged."""
    for ledgers in ([1, 2], [3], [4]):
        if files.crashed:
            return
        journal = Journal(directory, journal_settings(), fatal=Fatal(), files=files)
        writer: asyncio.Task | None = None
        try:
            await journal.open()
            writer = asyncio.create_task(journal.run_writer())
            for ledger_id in ledgers:
                waiting = journal.submit(
                    [MasterKeyRecord(ledger_id, KEY), FenceRecord(ledger_id)], 0
                )
                await asyncio.wait({waiting, writer}, return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    return
                fenced.append(ledger_id)
            await journal.checkpoint(journal.durable_position)
        except Crash:
            return
        finally:
            if writer is not None:
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
            await journal.close()


@pytest.mark.parametrize("mode", MODES)
async def test_a_crash_at_any_point_of_a_snapshot_append_loses_no_fence(
    tmp_path: Path, mode: str
) -> None:
    dry = FaultyFiles()
    await fence_lives(tmp_path / "dry", dry, [])
    assert "write_atomic ledgers.snapshot" in dry.op_names  # whole, then appended:
    assert "write ledgers.snapshot" in dry.op_names
    assert decode_snapshot((tmp_path / "dry" / SNAPSHOT).read_bytes()).records[-1].ledger_id == 4
    torn = 0
    for crash_at in range(dry.ops + 1):
        directory = tmp_path / f"{mode}-{crash_at}"
        files = FaultyFiles(seed=crash_at)
        files.crash_at(crash_at)
        fenced: list[int] = []
        await fence_lives(directory, files, fenced)
        files.power_loss(mode)
        snapshot = directory / SNAPSHOT
        torn += snapshot.exists() and bool(decode_snapshot(snapshot.read_bytes()).torn)
        state = replay(directory).state  # starts: a torn segment is ignored
        assert all(state.get(i) is not None and state.get(i).fenced for i in fenced), (
            crash_at,
            mode,
        )
        await fence_lives(directory, FaultyFiles(), [])  # and goes on after it
        assert replay(directory).state.get(4).fenced
    assert torn > 0 or mode == "lose"  # "lose" drops the unsynced append whole


async def test_a_flipped_bit_in_an_entry_log_is_never_returned(tmp_path: Path) -> None:
    write_journal(tmp_path / "journal", BATCHES)
    store = LedgerStore(tmp_path, store_settings(), fatal=pytest.fail)
    corrupt: list[tuple[int, int]] = []
    store._on_corrupt = lambda ledger, e, why: corrupt.append((ledger, e))
    await store.open()
    await store.catch_up()
    await store.checkpoint()
    location = store.index.lookup(1, 5)
    flip_bit(store.ledger_dirs[0] / f"entrylog-{location.log_id:06d}.log", location.offset + 60)
    results = await store.read([wire.ReadItem(1, e) for e in range(4, 8)])
    assert [r.status for r in results] == [
        BookieStatus.OK,
        BookieStatus.CORRUPT,
        BookieStatus.OK,
        BookieStatus.OK,
    ]
    assert results[1].frame == b"" and corrupt == [(1, 5)]
    assert store.stats.ledgerstore_read_entry_corrupt == 1
    await store.close()


async def test_write_cache_double_buffer_read_cache_and_read_ahead(tmp_path: Path) -> None:
    write_journal(tmp_path / "journal", BATCHES)
    # A tiny write cache: applying must flush on the way (back-pressure), and reads see
    # every entry wherever it is (write cache, flushing buffer, read cache, entry log).
    settings = store_settings(write_cache_max_size_bytes=4096)
    store = LedgerStore(tmp_path, settings, fatal=pytest.fail)
    await store.open()
    assert await store.catch_up()
    assert store.stats.throttled_write_requests >= 1 and store.stats.flush >= 1
    await store.checkpoint()
    # Read-ahead serves what the reader asks next: as many entries again as it asked.
    results = await store.read([wire.ReadItem(1, e) for e in range(4)])
    assert [r.status for r in results] == [BookieStatus.OK] * 4
    assert store.stats.readahead_batch_count == 1 and store.stats.readahead_batch_size == 4
    lookups = store.stats.index_lookups
    results = await store.read([wire.ReadItem(1, e) for e in range(4, 8)])
    assert [r.status for r in results] == [BookieStatus.OK] * 4
    assert store.stats.read_cache_hits == 4 and store.stats.index_lookups == lookups
    await store.close()


async def test_ledger_directories_spread_ledgers_by_id(tmp_path: Path) -> None:
    batches = [[entry(ledger, e) for e in range(3)] for ledger in (1, 2, 3, 4)]
    write_journal(tmp_path / "journal", batches)
    dirs = [tmp_path / "d0", tmp_path / "d1"]
    store = LedgerStore(tmp_path, store_settings(), fatal=pytest.fail, ledger_dirs=dirs)
    await store.open()
    await store.catch_up()
    await store.checkpoint()
    assert {store.index.lookup(ledger, 0).dir for ledger in (2, 4)} == {0}
    assert {store.index.lookup(ledger, 0).dir for ledger in (1, 3)} == {1}
    await store.close()
    again = LedgerStore(tmp_path, store_settings(), fatal=pytest.fail, ledger_dirs=dirs)
    await again.open()
    results = await again.read([wire.ReadItem(ledger, 2) for ledger in (1, 2, 3, 4)])
    assert [r.status for r in results] == [BookieStatus.OK] * 4
    await again.close()


def test_the_fault_layer_without_faults_writes_what_os_files_write(tmp_path: Path) -> None:
    # Contract: the fake behaves like the real layer until a fault is injected.
    for name, files in (("real", OS_FILES), ("faulty", FaultyFiles())):
        fd = files.create(tmp_path / name, b"head")
        files.write(fd, b"-body")
        files.fdatasync(fd)
        files.close(fd)
        files.truncate(tmp_path / name, 7)
        files.write_atomic(tmp_path / f"{name}.mark", b"m")
    assert (tmp_path / "real").read_bytes() == (tmp_path / "faulty").read_bytes() == b"head-bo"
    faulty = FaultyFiles()
    fd = faulty.create(tmp_path / "lost", b"head")
    faulty.write(fd, b"unsynced")
    faulty.power_loss("lose")
    assert (tmp_path / "lost").read_bytes() == b"head"


async def test_the_ledgerstore_follows_a_journal_started_past_damage(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"
    path = write_journal(journal_dir, BATCHES)
    flip_bit(path, FILE_HEADER_SIZE + 400, 3)  # inside the first batch (entries 0-3)
    replay(journal_dir, skip_invalid_records=True)
    write_journal_more(journal_dir)  # the journal started file 2 after replaying
    store = LedgerStore(
        tmp_path, store_settings(), fatal=pytest.fail, skip_invalid_journal_records=True
    )
    await store.open()
    results = await store.read([wire.ReadItem(1, 2), wire.ReadItem(1, 4), wire.ReadItem(2, 9)])
    assert [r.status for r in results] == [
        BookieStatus.UNKNOWN_LEDGER_STATE,  # lost with the skipped batch: never NO_ENTRY
        BookieStatus.OK,
        BookieStatus.OK,
    ]
    await store.checkpoint()
    await store.close()
    again = LedgerStore(tmp_path, store_settings(), fatal=pytest.fail)
    await again.open()  # the doubt is persisted with the checkpoint
    assert (await again.read([wire.ReadItem(1, 1)]))[0].status is (
        BookieStatus.UNKNOWN_LEDGER_STATE
    )
    await again.close()
