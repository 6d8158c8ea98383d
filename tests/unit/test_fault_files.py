"""The fault suite's FileLayer (shared/bookie/fault_files.py) and the runner's disk faults
(quire/faults/disk.py) on plain files: what files.log records, what a power loss then
leaves, the one-shot IO failures, unsafe-no-fsync, bit flips, the clock offset."""

from __future__ import annotations

import errno
import random
import time

import pytest

from quire.faults import disk as faults_disk
from shared import clock
from shared.bookie.entrylog_format import encode_entry, encode_entry_log_header, entry_log_name
from shared.bookie.fault_files import (
    FAIL_NEXT_FSYNC,
    FILES_LOG,
    UNSAFE_NO_FSYNC,
    FaultFiles,
    files_for,
    replay_files_log,
)
from shared.bookie.files import OS_FILES
from shared.bookie.index_schema import INDEX_FILE
from shared.bookie.journal_format import (
    LAST_MARK,
    SNAPSHOT,
    EntryRecord,
    JournalPosition,
    encode_batch,
    encode_file_header,
    encode_last_mark,
    encode_record,
    journal_file_name,
)
from shared.digest import DigestManager, DigestType
from tests.support.wait import until


@pytest.fixture
def dirs(tmp_path):
    data, faults = tmp_path / "data", tmp_path / "faults"
    data.mkdir()
    return data, faults


def fates(faults):
    return replay_files_log((faults / FILES_LOG).read_text().splitlines())


def test_no_faults_dir_is_the_production_layer(tmp_path):
    assert files_for(None) is OS_FILES
    assert isinstance(files_for(tmp_path), FaultFiles)


def test_records_durable_sizes_and_names(dirs):
    data, faults = dirs
    files = FaultFiles(faults)
    path = data / "a.log"
    fd = files.create(path, b"HEAD")
    files.write(fd, b"x" * 10)
    files.fdatasync(fd)
    files.write(fd, b"y" * 5)  # never synced
    files.close(fd)
    fate = fates(faults)[str(path)]
    assert (fate.durable_size, fate.named) == (14, True)  # create fsyncs its directory

    fd = files.open_append(path)  # known: its durable size stays 14
    files.close(fd)
    assert fates(faults)[str(path)].durable_size == 14
    files.truncate(path, 12)
    assert fates(faults)[str(path)].durable_size == 12


def test_a_create_over_an_existing_file_fails_and_is_not_logged(dirs):
    data, faults = dirs
    files = FaultFiles(faults)
    (data / "a.log").write_bytes(b"there")
    with pytest.raises(FileExistsError):
        files.create(data / "a.log", b"HEAD")
    faults_disk.power_loss([faults], "lose", random.Random(1))
    assert (data / "a.log").read_bytes() == b"there"


def test_power_loss_lose_and_tear(dirs):
    data, faults = dirs
    files = FaultFiles(faults)
    path = data / "a.log"
    fd = files.create(path, b"HEAD")
    files.write(fd, b"x" * 100)
    files.close(fd)
    done = faults_disk.power_loss([faults], "tear", random.Random(1))
    assert 4 <= path.stat().st_size <= 104
    assert not (faults / FILES_LOG).exists()  # consumed: what is left is durable

    files = FaultFiles(faults)
    fd = files.open_append(path)  # first seen since the loss: durable as it is
    size = path.stat().st_size
    files.write(fd, b"z" * 50)
    files.close(fd)
    done = faults_disk.power_loss([faults], "lose", random.Random(1))
    assert path.stat().st_size == size
    assert done["cut"] == [{"path": str(path), "from": size + 50, "to": size}]


def test_power_loss_removes_names_never_made_durable(dirs):
    data, faults = dirs
    files = FaultFiles(faults)
    (data / "old").write_bytes(b"old")  # there before the log: durable
    files.write_atomic(data / "old", b"new")  # rename over it, then a directory fsync
    files.write_atomic(data / "fresh", b"f")
    fd = files.create(data / "kept", b"k")
    files.close(fd)
    target = data / "renamed"
    files.rename(data / "kept", target)  # no directory fsync after it
    done = faults_disk.power_loss([faults], "lose", random.Random(1))
    assert (data / "old").read_bytes() == b"new"
    assert (data / "fresh").read_bytes() == b"f"
    assert not target.exists()
    assert done["removed"] == [str(target)]


def test_fail_next_fires_once_and_leaves_nothing_durable(dirs):
    data, faults = dirs
    files = FaultFiles(faults)
    fd = files.create(data / "a.log", b"HEAD")
    faults_disk.fail_next(faults, "fsync", "EIO")
    files.write(fd, b"x" * 10)
    with pytest.raises(OSError) as failed:
        files.fdatasync(fd)
    assert failed.value.errno == errno.EIO
    assert not (faults / FAIL_NEXT_FSYNC).exists()
    assert fates(faults)[str(data / "a.log")].durable_size == 4
    files.fdatasync(fd)  # consumed: the next one succeeds

    faults_disk.fail_next(faults, "write", "ENOSPC")
    with pytest.raises(OSError) as failed:
        files.write(fd, b"y" * 10)
    assert failed.value.errno == errno.ENOSPC
    assert (data / "a.log").stat().st_size == 14 + 5  # a failed write may leave a part
    files.write(fd, b"z")
    files.close(fd)
    with pytest.raises(ValueError):
        faults_disk.fail_next(faults, "fsync", "EPERM")


def test_unsafe_no_fsync_skips_data_syncs_only(dirs):
    data, faults = dirs
    faults.mkdir()
    (faults / UNSAFE_NO_FSYNC).touch()
    files = FaultFiles(faults)
    fd = files.create(data / "a.log", b"HEAD")  # the header is still made durable
    files.write(fd, b"x" * 10)
    files.fdatasync(fd)
    files.fsync(fd)
    files.close(fd)
    with open(data / "a.log", "ab") as f:  # as a process that died wrote it
        f.write(b"y")
    files.sync_file(data / "a.log")  # replay's sync: a data sync too
    faults_disk.power_loss([faults], "lose", random.Random(1))
    assert (data / "a.log").read_bytes() == b"HEAD"


def test_sync_file_makes_what_a_dead_process_wrote_durable(dirs):
    data, faults = dirs
    files = FaultFiles(faults)
    fd = files.create(data / "a.log", b"HEAD")
    files.write(fd, b"x" * 10)  # then the process died, before its fsync
    files.close(fd)
    FaultFiles(faults).sync_file(data / "a.log")  # the next incarnation, at replay
    faults_disk.power_loss([faults], "lose", random.Random(1))
    assert (data / "a.log").stat().st_size == 14


def _journal(path, entries):
    records = [encode_record(EntryRecord.of(bytes(20), frame)) for frame in entries]
    path.write_bytes(encode_file_header(1) + encode_batch(records))


def test_flip_bit_lands_in_a_whole_record(tmp_path):
    digest = DigestManager(DigestType.CRC32C, b"")
    frames = [digest.sign(7, e, e - 1, 4, b"data") for e in range(3)]
    journal = tmp_path / journal_file_name(1)
    _journal(journal, frames)
    before = journal.read_bytes()
    flipped = faults_disk.flip_bit(journal, random.Random(3))
    after = journal.read_bytes()
    assert flipped["flipped"] and flipped["ledger_id"] == 7
    diff = [i for i in range(len(before)) if before[i] != after[i]]
    assert diff == [flipped["offset"]] and flipped["offset"] >= 16

    log = tmp_path / entry_log_name(1)
    body = b"".join(encode_entry(7, e, frames[e]) for e in range(3))
    for seed in range(20):
        log.write_bytes(encode_entry_log_header(1) + body + b"\x00\x00")  # a torn tail
        flipped = faults_disk.flip_bit(log, random.Random(seed))
        assert 16 <= flipped["offset"] < 16 + len(body)
        assert flipped["in"] in ("head", "data")


async def test_clock_offset_is_read_from_the_faults_dir(tmp_path):
    clock.use_faults_dir(tmp_path)
    try:
        assert abs(clock.wall_s() - time.time()) < 5
        faults_disk.set_clock_offset(tmp_path, 3_600_000)
        await until(lambda: clock.wall_ms() - time.time() * 1000 > 3_590_000, "offset seen")
        faults_disk.set_clock_offset(tmp_path, 0)
        await until(lambda: abs(clock.wall_s() - time.time()) < 5, "offset back to 0")
    finally:
        clock.use_faults_dir(None)
    assert abs(clock.wall_s() - time.time()) < 5


def test_flip_bit_says_whether_journal_records_were_checkpointed(tmp_path):
    digest = DigestManager(DigestType.CRC32C, b"")
    journal = tmp_path / journal_file_name(1)
    _journal(journal, [digest.sign(7, e, e - 1, 4, b"data") for e in range(3)])
    assert faults_disk.flip_bit(journal, random.Random(1))["checkpointed"] is False
    (tmp_path / LAST_MARK).write_bytes(encode_last_mark(JournalPosition(1, journal.stat().st_size)))
    assert faults_disk.flip_bit(journal, random.Random(1))["checkpointed"] is True


def test_bookie_files_and_wipe(tmp_path):
    bookie = tmp_path / "bookie-1"
    (bookie / "journal").mkdir(parents=True)
    (bookie / "ledgers").mkdir()
    for name in (journal_file_name(1), LAST_MARK, SNAPSHOT):
        (bookie / "journal" / name).write_bytes(b"x")
    for name in (entry_log_name(1), INDEX_FILE, INDEX_FILE + "-wal"):
        (bookie / "ledgers" / name).write_bytes(b"x")
    (bookie / "cookie").write_text("{}")
    files = faults_disk.bookie_files(tmp_path, "bookie-1")
    assert {kind: len(paths) for kind, paths in files.items()} == {
        "journal": 1,
        "journal_meta": 2,
        "entrylog": 1,
        "index": 2,
        "cookie": 1,
    }
    faults = tmp_path / "faults"
    FaultFiles(faults)  # creates its files.log
    done = faults_disk.wipe_bookie(tmp_path, "bookie-1", [faults])
    assert done["removed"]["journal"] == 1
    assert not bookie.exists() and not (faults / FILES_LOG).exists()


def test_bookie_files_and_wipe_follow_a_journal_on_its_own_disk(tmp_path, monkeypatch):
    # What the bookie's processes get from the same environment: the journal elsewhere.
    monkeypatch.setenv("QUIRE_JOURNAL__JOURNAL_DIRECTORIES", f'["{tmp_path / "jdisk"}"]')
    journal = tmp_path / "jdisk" / "bookie-1"
    journal.mkdir(parents=True)
    for name in (journal_file_name(1), journal_file_name(2), LAST_MARK):
        (journal / name).write_bytes(b"x")
    (tmp_path / "data" / "bookie-1" / "ledgers").mkdir(parents=True)
    files = faults_disk.bookie_files(tmp_path / "data", "bookie-1")
    assert files["journal"] == [journal / journal_file_name(1), journal / journal_file_name(2)]
    assert files["journal_meta"] == [journal / LAST_MARK]
    done = faults_disk.wipe_bookie(tmp_path / "data", "bookie-1")
    assert done["removed"]["journal"] == 2
    assert not journal.exists() and not (tmp_path / "data" / "bookie-1").exists()
