"""Journal files on a temp dir: replay truncates a torn tail, refuses damage before it,
the writer commits in groups and bounds its queue, checkpoints delete old files and keep
the ledger facts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from services.journal.journal import (
    SHORT_JOURNAL,
    Journal,
    JournalStartupError,
    QueueFull,
    replay,
)
from shared.bookie.journal_dir import journal_files
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    SNAPSHOT,
    EntryRecord,
    FenceRecord,
    JournalPosition,
    MasterKeyRecord,
    encode_batch,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from shared.config import JournalSettings
from shared.digest import DigestManager

KEY = b"k" * 20
DIGEST = DigestManager("crc32c")


def entry(ledger_id: int, entry_id: int) -> EntryRecord:
    payload = f"{ledger_id}:{entry_id}".encode()
    return EntryRecord.of(
        KEY, DIGEST.sign(ledger_id, entry_id, entry_id - 1, len(payload), payload)
    )


def write_file(directory: Path, file_id: int, records: list, tail: bytes = b"") -> bytes:
    """A journal file as the writer makes it: one group commit (batch) per record."""
    batches = b"".join(encode_batch([encode_record(r)]) for r in records)
    data = encode_file_header(file_id) + batches + tail
    (directory / journal_file_name(file_id)).write_bytes(data)
    return data


def test_replay_rebuilds_state_across_files(tmp_path: Path) -> None:
    write_file(tmp_path, 1, [entry(1, 0), entry(1, 1)])
    data = write_file(tmp_path, 2, [MasterKeyRecord(2, KEY), FenceRecord(2), entry(1, 2)])
    replayed = replay(tmp_path)
    assert replayed.durable == JournalPosition(2, len(data))
    assert replayed.last_file_id == 2
    assert replayed.state.get(1).last_entry_id == 2 and replayed.state.get(2).fenced


@pytest.mark.parametrize("cut", [1, 10, 30])
def test_torn_tail_of_the_last_file_is_truncated_and_logged(
    tmp_path: Path, caplog, cut: int
) -> None:
    good = write_file(tmp_path, 1, [entry(1, 0)])
    torn = encode_record(entry(1, 1))[:-cut]
    write_file(tmp_path, 2, [entry(1, 1)], tail=torn)
    size2 = (tmp_path / journal_file_name(2)).stat().st_size - len(torn)
    with caplog.at_level(logging.WARNING):
        replayed = replay(tmp_path)
    assert replayed.durable == JournalPosition(2, size2)
    assert (tmp_path / journal_file_name(2)).stat().st_size == size2
    assert (tmp_path / journal_file_name(1)).read_bytes() == good
    assert "truncating torn journal tail" in caplog.text


def test_bad_record_before_the_tail_refuses_to_start(tmp_path: Path) -> None:
    records = [entry(1, e) for e in range(3)]
    data = bytearray(write_file(tmp_path, 1, records))
    batch_head = len(encode_batch([]))
    second = FILE_HEADER_SIZE + len(encode_batch([encode_record(records[0])])) + batch_head
    data[second + 12] ^= 0x01
    (tmp_path / journal_file_name(1)).write_bytes(bytes(data))
    with pytest.raises(JournalStartupError) as err:
        replay(tmp_path)
    assert journal_file_name(1) in str(err.value) and f"offset {second}" in str(err.value)
    assert (tmp_path / journal_file_name(1)).read_bytes() == bytes(data)  # left untouched


def test_damage_in_a_file_that_is_not_last_refuses(tmp_path: Path) -> None:
    write_file(tmp_path, 1, [entry(1, 0)], tail=encode_record(entry(1, 1))[:-3])
    write_file(tmp_path, 2, [entry(1, 2)])
    with pytest.raises(JournalStartupError, match="not last"):
        replay(tmp_path)


def test_missing_file_in_the_middle_refuses(tmp_path: Path) -> None:
    write_file(tmp_path, 1, [])
    write_file(tmp_path, 3, [])
    with pytest.raises(JournalStartupError, match=r"missing.*\[2\]"):
        replay(tmp_path)


def test_deleted_files_without_snapshot_refuse(tmp_path: Path) -> None:
    write_file(tmp_path, 2, [entry(1, 0)])
    with pytest.raises(JournalStartupError, match="snapshot"):
        replay(tmp_path)


def test_torn_header_of_a_new_last_file_is_rewritten(tmp_path: Path) -> None:
    write_file(tmp_path, 1, [entry(1, 0)])
    (tmp_path / journal_file_name(2)).write_bytes(encode_file_header(2)[:7])
    assert replay(tmp_path).durable == JournalPosition(2, FILE_HEADER_SIZE)
    assert (tmp_path / journal_file_name(2)).read_bytes() == encode_file_header(2)


def settings(**update) -> JournalSettings:
    return JournalSettings().model_copy(update={"max_backups": 0, **update})


async def test_writer_commits_in_groups_and_queue_is_bounded(tmp_path: Path) -> None:
    journal = Journal(tmp_path, settings(queue_size=5), fatal=pytest.fail)
    await journal.open()
    assert journal_files(tmp_path) == [1]
    futures = [
        journal.submit([entry(1, e) for e in range(3)], now_ms=0),
        journal.submit([entry(1, 3), entry(1, 4)], now_ms=0),
    ]
    with pytest.raises(QueueFull):
        journal.submit([entry(1, 5)], now_ms=0)
    writer = asyncio.create_task(journal.run_writer())
    positions = await asyncio.gather(*futures)
    assert len(set(positions)) == 1  # one group commit for all five
    assert journal.stats.journal_sync == 1 and journal.stats.journal_flush_batch_records_max == 5
    assert journal.durable.get(1).last_entry_id == 4
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    await journal.close()


async def test_a_submit_split_over_commits_is_durable_only_after_its_last(tmp_path: Path) -> None:
    # Two records per group commit: one submit of five spans three commits.
    journal = Journal(tmp_path, settings(buffered_entries_threshold=2), fatal=pytest.fail)
    await journal.open()
    durable = journal.submit([entry(1, e) for e in range(5)], now_ms=0)
    writer = asyncio.create_task(journal.run_writer())
    position = await durable
    assert journal.stats.journal_sync == 3
    assert position == journal.durable_position  # the third commit's, not the first's
    assert journal.durable.get(1).last_entry_id == 4
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    await journal.close()


async def test_checkpoint_deletes_old_files_and_replay_keeps_the_facts(tmp_path: Path) -> None:
    journal = Journal(tmp_path, settings(), fatal=pytest.fail)
    await journal.open()
    writer = asyncio.create_task(journal.run_writer())
    await journal.submit([MasterKeyRecord(9, KEY), FenceRecord(9), entry(1, 0)], now_ms=0)
    await journal.close()
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)

    journal = Journal(tmp_path, settings(), fatal=pytest.fail)  # restart: file 2
    await journal.open()
    writer = asyncio.create_task(journal.run_writer())
    position = await journal.submit([entry(1, 1)], now_ms=0)
    assert position.file_id == 2
    mark, deleted = await journal.checkpoint(JournalPosition(99, 0))  # clamped to durable
    assert mark == position and deleted == [1]
    assert journal_files(tmp_path) == [2] and (tmp_path / SNAPSHOT).exists()
    assert await journal.checkpoint(JournalPosition(1, 20)) == (mark, [])  # never goes back
    await journal.close()
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)

    replayed = replay(tmp_path)
    assert replayed.mark == mark
    assert replayed.state.get(9).fenced and replayed.state.get(9).master_key == KEY
    assert replayed.state.get(1).last_entry_id == 1


async def checkpointed_journal(directory: Path) -> JournalPosition:
    """A journal with a master key, a fence and entries, checkpointed at its end (the
    LastLogMark and the snapshot both there). Returns the mark."""
    journal = Journal(directory, settings(), fatal=pytest.fail)
    await journal.open()
    writer = asyncio.create_task(journal.run_writer())
    await journal.submit([MasterKeyRecord(9, KEY), FenceRecord(9)], now_ms=0)
    await journal.submit([entry(1, e) for e in range(4)], now_ms=0)
    mark, _ = await journal.checkpoint(JournalPosition(99, 0))
    await journal.close()
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    return mark


@pytest.mark.parametrize("cut", [1, 30, "header", "all"])
async def test_a_journal_cut_below_its_recorded_position_refuses(
    tmp_path: Path, cut: int | str
) -> None:
    """Bytes that were fsynced and checkpointed are gone (fsync lied, or an outside
    truncation): replay refuses, naming the file, its size and the recorded position,
    instead of starting with a durable position past the file's end."""
    mark = await checkpointed_journal(tmp_path)
    path = tmp_path / journal_file_name(mark.file_id)
    size = {"header": FILE_HEADER_SIZE, "all": 0}.get(cut) if isinstance(cut, str) else None
    size = mark.offset - cut if size is None else size  # type: ignore[operator]
    with open(path, "r+b") as f:
        f.truncate(size)
    with pytest.raises(JournalStartupError) as err:
        replay(tmp_path)
    text = str(err.value)
    assert SHORT_JOURNAL in text and "refusing to start" in text
    assert f"{path} is {size} bytes long" in text and f"offset {mark.offset}" in text
    assert "quire shell decommissionbookie" in text and "limbo" in text
    assert path.stat().st_size == size  # left as it was found, for the operator


async def test_a_journal_missing_the_file_of_its_recorded_position_refuses(
    tmp_path: Path,
) -> None:
    mark = await checkpointed_journal(tmp_path)
    for file_id in journal_files(tmp_path):
        (tmp_path / journal_file_name(file_id)).unlink()
    with pytest.raises(JournalStartupError, match=f"{journal_file_name(mark.file_id)} is missing"):
        replay(tmp_path)


async def test_a_journal_reaching_its_recorded_position_starts(tmp_path: Path) -> None:
    """Exactly at the mark (a torn tail past it is only truncated)."""
    mark = await checkpointed_journal(tmp_path)
    path = tmp_path / journal_file_name(mark.file_id)
    with open(path, "ab") as f:
        f.write(encode_record(entry(1, 4))[:-5])
    replayed = replay(tmp_path)
    assert replayed.durable == mark and replayed.state.get(9).fenced
    assert path.stat().st_size == mark.offset
