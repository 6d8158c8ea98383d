"""journal.journal_directories: where a bookie's journals live (one per directory), by the
same path rules as ledgerstore.ledger_directories."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.journal.journal import Journal, JournalStats
from shared.bookie.files import FileLayer
from shared.bookie.journal_format import MasterKeyRecord
from shared.config import JournalSettings, QuireSettings


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
