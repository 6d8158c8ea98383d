"""journal.journal_directories: where a bookie's journal lives, by the same path rules as
ledgerstore.ledger_directories, and one of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.config import QuireSettings


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


def test_more_than_one_journal_directory_is_refused_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", '["/mnt/j1","/mnt/j2"]')
    with pytest.raises(ValidationError, match="one journal directory per bookie"):
        QuireSettings()
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", "[]")
    with pytest.raises(ValidationError, match="at least 1"):
        QuireSettings()


def test_the_journal_never_shares_a_ledger_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", '["/mnt/disk1"]')
    monkeypatch.setenv("QUIRE_LEDGERSTORE__LEDGER_DIRECTORIES", '["/mnt/disk1","/mnt/disk2"]')
    with pytest.raises(ValidationError, match="give the journal a directory of its own"):
        QuireSettings()
