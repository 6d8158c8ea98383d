"""Several journal directories per bookie (journal.journal_directories): one journal each,
a ledger's records in journal ledger_id % count, each journal with its own LastLogMark,
snapshot and replay, and the ledgerstore following every one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from shared import wire
from shared.bookie.cookie import COOKIE_FILE, CookieMismatch
from shared.bookie.journal_dir import (
    decode_journal_position,
    encode_journal_position,
    journal_files,
)
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    BatchRecord,
    EntryRecord,
    FenceRecord,
    JournalFormatError,
    JournalPosition,
    LacRecord,
    scan_records,
)
from shared.config import QuireSettings
from shared.status import BookieStatus
from tests.integration.test_bookie import (
    KEY,
    OTHER_KEY,
    Bookie,
    assert_remembered,
    bookie,
    frame,
    rolling_frames,
    spawn,
    wait_serving,
    write_and_recover,
)
from tests.support.inprocess import running_service
from tests.support.shell import shell
from tests.support.wait import until


def two_journals(settings: QuireSettings, tmp_path: Path, **journal: object) -> QuireSettings:
    """The first journal in the bookie's dir, the second on a 'disk' of its own."""
    dirs = ["journal", str(tmp_path / "journal-disk")]
    return settings.model_copy(
        update={
            "journal": settings.journal.model_copy(update={"journal_directories": dirs, **journal})
        }
    )


def records_by_journal(settings: QuireSettings) -> list[list]:
    """Every record of each journal directory's files, read raw."""
    found = []
    for directory in settings.journal_dirs:
        records = []
        for file_id in journal_files(directory):
            data = (directory / f"journal-{file_id:06d}.log").read_bytes()
            scanned = scan_records(memoryview(data)[FILE_HEADER_SIZE:]).records
            records += [s.record for s in scanned if not isinstance(s.record, BatchRecord)]
        found.append(records)
    return found


async def test_each_ledger_is_journaled_in_its_journal_and_all_of_it_survives_restarts(
    nc, settings: QuireSettings, tmp_path: Path
) -> None:
    settings = two_journals(settings, tmp_path)
    client = Bookie(nc, settings)
    frames = {(ledger, e): frame(ledger, e, e - 1) for ledger in (40, 41, 42, 43) for e in range(5)}
    async with bookie(settings):
        # One request spanning both journals: answered once both are durable.
        statuses = await client.add([frames[(ledger, 0)] for ledger in (40, 41, 42, 43)])
        assert statuses == [BookieStatus.OK] * 4
        assert (await client.fence(41)).status is BookieStatus.OK
        recovery = [frames[(41, e)] for e in range(1, 5)]
        assert await client.add(recovery, flags=wire.FLAG_RECOVERY_ADD) == [BookieStatus.OK] * 4
        assert await client.add([frames[(41, 5 - 1)]]) == [BookieStatus.FENCED]
        rest = [frames[(ledger, e)] for ledger in (40, 42, 43) for e in range(1, 5)]
        assert await client.add(rest) == [BookieStatus.OK] * len(rest)
        assert await client.write_lacs([(42, KEY, 3), (43, KEY, 4), (43, OTHER_KEY, 4)]) == [
            BookieStatus.OK,
            BookieStatus.OK,
            BookieStatus.UNAUTHORIZED,
        ]
        results = await client.read(list(frames))
        assert {(r.ledger_id, r.entry_id): r.frame for r in results} == frames
        stats = await client.stats("journal")
        for directory in settings.journal_dirs:
            assert stats.value("quire_journal_dir_syncs_total", journal_dir=str(directory)) > 0
        info = json.loads(await client.call("info", b""))
        assert [j["dir"] for j in info["journals"]] == [str(d) for d in settings.journal_dirs]
        assert [j["ledgers"] for j in info["journals"]] == [2, 2] and info["ledgers"] == 4
    even, odd = records_by_journal(settings)
    assert {r.ledger_id for r in even} == {40, 42} and {r.ledger_id for r in odd} == {41, 43}
    assert [r.entry_id for r in even if isinstance(r, EntryRecord) and r.ledger_id == 40] == [
        *range(5)
    ]
    assert any(isinstance(r, FenceRecord) for r in odd)
    assert {r.ledger_id for r in even + odd if isinstance(r, LacRecord)} == {42, 43}
    # The storage shell reads the journal it is told to.
    odd = await shell(settings, "readjournal", "--journal", "1")
    assert {row["ledger_id"] for row in odd if "ledger_id" in row} == {41, 43}
    mark = await shell(settings, "lastmark", "--journal", "1")
    assert mark["journal_files"] == journal_files(settings.journal_dirs[1])
    # Every journal directory outside the bookie's dir keeps a copy of the cookie.
    cookie = json.loads((settings.bookie_dir / COOKIE_FILE).read_text())
    assert cookie["more_journal_dirs"] == [str(settings.journal_dirs[1].resolve())]
    assert json.loads((settings.journal_dirs[1] / COOKIE_FILE).read_text()) == cookie

    async with bookie(settings):
        results = await client.read(list(frames))
        assert {(r.ledger_id, r.entry_id): r.frame for r in results} == frames
        assert await client.add([frame(41, 5, 4)]) == [BookieStatus.FENCED]
        assert await client.add([frame(43, 5, 4)], key=OTHER_KEY) == [BookieStatus.UNAUTHORIZED]
        assert [(await client.read_lac(ledger)).lac for ledger in (42, 43)] == [3, 4]
        # Deleting ledgers of both journals: each journal's position in the answer.
        reply = json.loads(await client.call("journal.delete", b'{"ledgers": [40, 41, 43]}'))
        assert reply["ok"] is True, reply
        assert sorted(p["journal"] for p in reply["positions"]) == [0, 1]
        fenced = await client.fence(41, OTHER_KEY)  # forgotten: starts afresh
        assert (fenced.status, fenced.last_entry_id) == (BookieStatus.OK, -1)

    # The journal directories are the bookie's: one of them gone from the settings refuses.
    one = settings.model_copy(
        update={"journal": settings.journal.model_copy(update={"journal_directories": ["journal"]})}
    )
    with pytest.raises(CookieMismatch, match="more_journal_dirs"):
        async with running_service("journal", one):
            pass


async def test_each_journal_checkpoints_and_deletes_its_own_files(
    nc, settings: QuireSettings, tmp_path: Path
) -> None:
    # Small files and frequent checkpoints: each journal rolls and deletes files below its
    # own LastLogMark, so the restart rebuilds fences and keys from each one's snapshot.
    settings = two_journals(settings, tmp_path, max_size_mb=1, max_backups=0)
    settings = settings.model_copy(
        update={
            "ledgerstore": settings.ledgerstore.model_copy(
                update={"flush_interval_ms": 50, "log_size_limit_bytes": 256 * 1024}
            )
        }
    )
    client = Bookie(nc, settings)
    frames = rolling_frames(60, 61)
    async with bookie(settings):
        await write_and_recover(client, frames, 60, 61)

        async def both_checkpointed() -> bool:
            return all(min(journal_files(d)) > 1 for d in settings.journal_dirs)

        await until(both_checkpointed, "each journal to delete files below its LastLogMark")
    async with bookie(settings):
        await assert_remembered(client, frames, 60, 61)


@pytest.mark.slow
async def test_kill_9_with_two_journals_loses_no_acknowledged_entry(
    nc, settings: QuireSettings, tmp_path: Path
) -> None:
    settings = two_journals(settings, tmp_path)
    env = {"QUIRE_JOURNAL__JOURNAL_DIRECTORIES": json.dumps(settings.journal.journal_directories)}
    client = Bookie(nc, settings)
    procs: list[subprocess.Popen] = []
    acked: dict[tuple[int, int], bytes] = {}
    try:
        procs = [spawn(kind, settings, tmp_path, env) for kind in ("journal", "ledgerstore")]
        await wait_serving(client, procs)

        async def writer(ledger_id: int) -> None:
            for e in range(1_000):
                data = frame(ledger_id, e, e - 1)
                try:
                    statuses = await client.add([data], key=KEY)
                except Exception:
                    return  # the bookie died under us: the outcome is unknown
                assert statuses == [BookieStatus.OK]
                acked[(ledger_id, e)] = data

        # Ledgers of both journals.
        tasks = [asyncio.create_task(writer(ledger_id)) for ledger_id in (30, 31, 32, 33)]
        await until(lambda: len(acked) >= 800, "800 acknowledged adds")
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=10)
        await asyncio.gather(*tasks)
        assert {ledger for ledger, _ in acked} == {30, 31, 32, 33}
        assert all(journal_files(d) for d in settings.journal_dirs)

        procs = [spawn(kind, settings, tmp_path, env) for kind in ("journal", "ledgerstore")]
        await wait_serving(client, procs)
        results = await client.read(list(acked))
        missing = [
            (r.ledger_id, r.entry_id, r.status)
            for r in results
            if r.status is not BookieStatus.OK or r.frame != acked[(r.ledger_id, r.entry_id)]
        ]
        assert missing == []
        for ledger_id in (30, 31, 32, 33):
            last = max(e for ledger, e in acked if ledger == ledger_id)
            assert (await client.read_lac(ledger_id)).last_entry_id >= last
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_positions_name_their_journal() -> None:
    position = JournalPosition(3, 77)
    assert decode_journal_position(encode_journal_position(1, position), 2) == (1, position)
    # Without "journal": the first journal's (one journal, as before there were several).
    assert decode_journal_position(b'{"file": 3, "offset": 77}', 1) == (0, position)
    for bad in (encode_journal_position(2, position), b'{"journal": -1, "file": 3}', b"[]"):
        with pytest.raises(JournalFormatError):
            decode_journal_position(bad, 2)
