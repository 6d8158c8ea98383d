"""journal.journal_directories: where a bookie's journals live (one per directory), by the
same path rules as ledgerstore.ledger_directories."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.journal.journal import Journal, JournalStats
from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.bookie.files import FileLayer
from shared.bookie.journal_format import (
    EntryRecord,
    MasterKeyRecord,
    encode_batch,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from shared.config import JournalSettings, LedgerstoreSettings, QuireSettings
from shared.digest import DigestManager
from shared.status import BookieStatus


def test_the_default_is_the_journal_dir_bookies_have_always_had(tmp_path: Path) -> None:
    settings = QuireSettings(data_dir=tmp_path, bookie_id="b1")
    assert settings.journal.journal_directories == ["journal"]
    assert settings.journal_dirs == [tmp_path / "b1" / "journal"]


def test_relative_under_the_bookie_absolute_with_the_bookie_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", '["/mnt/journal"]')
    assert QuireSettings(data_dir=tmp_path, bookie_id="b1").journal_dirs == [
        Path("/mnt/journal/b1")
    ]
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", '["wal"]')
    assert QuireSettings(data_dir=tmp_path, bookie_id="b1").journal_dirs == [
        tmp_path / "b1" / "wal"
    ]


def test_several_journal_directories_each_named_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", '["/mnt/j1","j2"]')
    assert QuireSettings(data_dir=tmp_path, bookie_id="b1").journal_dirs == [
        Path("/mnt/j1/b1"),
        tmp_path / "b1" / "j2",
    ]
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", '["/mnt/j1","/mnt/j1/"]')
    with pytest.raises(ValidationError, match="names a directory twice"):
        QuireSettings()
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", "[]")
    with pytest.raises(ValidationError, match="at least 1"):
        QuireSettings()


def test_the_journal_never_shares_a_ledger_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", '["/mnt/disk1"]')
    monkeypatch.setenv("QUIRE_LEDGERSTORE__LEDGER_DIRECTORIES", '["/mnt/disk1","/mnt/disk2"]')
    with pytest.raises(ValidationError, match="give the journal a directory of its own"):
        QuireSettings()


class MeetingFiles(FileLayer):
    """Each fdatasync waits until the other journal's is under way too: the journals of
    two directories only get through if they fsync at once (two disks busy together)."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier

    def fdatasync(self, fd: int) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError as exc:
            raise OSError("the other journal's fdatasync never came alongside") from exc
        super().fdatasync(fd)


async def test_the_journals_of_two_directories_fsync_at_the_same_time(tmp_path: Path) -> None:
    barrier = threading.Barrier(2, timeout=30)  # a deadline on a failure, not a timing
    failures: list[str] = []
    stats = JournalStats()
    journals = [
        Journal(
            tmp_path / d,
            JournalSettings(),
            fatal=failures.append,
            files=MeetingFiles(barrier),
            stats=stats,
        )
        for d in ("j1", "j2")
    ]
    for journal in journals:
        await journal.open()
    writers = [asyncio.create_task(journal.run_writer()) for journal in journals]
    try:
        durable = [
            journal.submit([MasterKeyRecord(ledger_id, b"k" * 20)], now_ms=0)
            for ledger_id, journal in enumerate(journals)
        ]
        assert stats.journal_queue_size == 2  # the bookie's total over its journals
        await asyncio.gather(*durable)
        assert failures == [] and [j.syncs for j in journals] == [1, 1]
        assert stats.journal_sync == 2 and stats.journal_queue_size == 0
    finally:
        for writer in writers:
            writer.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        for journal in journals:
            await journal.close()


def write_journal_file(directory: Path, file_id: int, records: list) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    data = encode_file_header(file_id) + encode_batch([encode_record(r) for r in records])
    (directory / journal_file_name(file_id)).write_bytes(data)


DIGEST = DigestManager("crc32c")


def entry(ledger_id: int, entry_id: int) -> EntryRecord:
    frame = DIGEST.sign(ledger_id, entry_id, entry_id - 1, 1, b"x")
    return EntryRecord.of(b"k" * 20, frame, wire.DIGEST_CODES[DIGEST.digest_type])


async def test_the_ledgerstore_follows_and_checkpoints_each_journal(tmp_path: Path) -> None:
    dirs = [tmp_path / "j0", tmp_path / "j1"]
    write_journal_file(dirs[0], 1, [entry(2, 0), entry(2, 1)])
    write_journal_file(dirs[1], 1, [entry(1, 0)])
    store = LedgerStore(tmp_path, LedgerstoreSettings(), pytest.fail, journal_dirs=dirs)
    await store.open()
    assert await store.catch_up()
    positions = await store.checkpoint()
    assert positions is not None and positions == store.applied
    assert [p.file_id for p in positions] == [1, 1] and positions[0] > positions[1]
    await store.close()

    # Reopened: each journal resumes at its own position; a new file in one of them only.
    write_journal_file(dirs[1], 2, [entry(1, 1), entry(3, 0)])
    store = LedgerStore(tmp_path, LedgerstoreSettings(), pytest.fail, journal_dirs=dirs)
    await store.open()
    assert store.applied == positions
    assert await store.catch_up()
    assert store.applied[0] == positions[0] and store.applied[1].file_id == 2
    assert {(ledger, info.last_entry_id) for ledger, info in store.ledgers.items()} == {
        (1, 1),
        (2, 1),
        (3, 0),
    }
    results = await store.read([wire.ReadItem(*key) for key in [(2, 1), (1, 1), (3, 0)]])
    assert [r.status for r in results] == [BookieStatus.OK] * 3
    await store.close()
