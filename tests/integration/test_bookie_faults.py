"""Disk faults in a real bookie's processes (journal + ledgerstore as subprocesses with
QUIRE_FAULTS_DIR, against real NATS), injected as the fault suite does it
(quire/faults/disk.py): a power loss after kill -9 keeps every acknowledged entry, and
loses some once fsync is off (proof the model bites); bit flips are never served as data;
an injected EIO or ENOSPC fail-stops the process, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from quire.faults import disk as faults_disk
from services.journal.journal import SHORT_JOURNAL
from shared import wire
from shared.bookie.entrylog_format import ENTRYLOG_HEADER_SIZE
from shared.bookie.fault_files import FILES_LOG, UNSAFE_NO_FSYNC, replay_files_log
from shared.bookie.journal_format import LAST_MARK, decode_last_mark, journal_file_name
from shared.config import QuireSettings
from shared.disk import FAIL_STOP_EXIT_CODE
from shared.status import BookieStatus
from tests.integration.test_bookie import KEY, Bookie, frame, spawn, wait_serving
from tests.support.wait import until

KINDS = ("journal", "ledgerstore")
KIND_IDS = ["separate", "cohosted"]
# Short: the add in flight when a process dies is only answered by this timeout.
ADD_TIMEOUT_S = 2.0
FLAGS = wire.add_flags("crc32c")  # the digest of `frame`: the bookie verifies what it reads


async def add_40_entries(client: Bookie, ledger_id: int) -> dict[tuple[int, int], bytes]:
    """Entries 0-39 of the ledger, 300 random bytes each, one add at a time, each acked."""
    acked = {}
    for e in range(40):
        acked[(ledger_id, e)] = frame(ledger_id, e, e - 1, payload=os.urandom(300))
        assert await client.add([acked[(ledger_id, e)]], flags=FLAGS) == [BookieStatus.OK]
    return acked


class FaultyBookie:
    """One bookie's two processes, each with its own faults dir, restartable."""

    def __init__(self, settings: QuireSettings, tmp_path: Path, **env: str) -> None:
        self.settings = settings
        self.log_dir = tmp_path
        self.env = env
        self.faults = {kind: tmp_path / "faults" / f"{settings.bookie_id}.{kind}" for kind in KINDS}
        self.procs: dict[str, subprocess.Popen] = {}

    def spawn(self, kind: str) -> None:
        extra_env = {"QUIRE_FAULTS_DIR": str(self.faults[kind]), **self.env}
        self.procs[kind] = spawn(kind, self.settings, self.log_dir, extra_env)

    async def start(self, client: Bookie) -> None:
        for kind in KINDS:
            self.spawn(kind)
        await self.serving(client)

    async def serving(self, client: Bookie) -> None:
        async def answers() -> bool:
            for kind, proc in self.procs.items():
                assert proc.poll() is None, f"{kind} exited: {self.log(kind)[-3000:]}"
            try:
                await client.read_lac(0)  # the ledgerstore serves
                await client.call("info", b"", timeout=1)  # and the journal
            except Exception:
                return False
            return True

        await until(answers, "the bookie serves")

    def kill_9(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(timeout=10)

    async def exited(self, kind: str) -> int:
        proc = self.procs[kind]
        await until(lambda: proc.poll() is not None, f"{kind} exits")
        return proc.returncode

    def log(self, kind: str) -> str:
        return (self.log_dir / f"{kind}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@asynccontextmanager
async def faulty_bookie(settings, tmp_path, **env):
    bookie = FaultyBookie(settings, tmp_path, **env)
    try:
        yield bookie
    finally:
        bookie.stop()


class Writers:
    """Writers on several ledgers, one add at a time each, keeping what was acknowledged.
    An add that fails or times out is indeterminate: never counted."""

    def __init__(self, client: Bookie, ledgers: tuple[int, ...]) -> None:
        self.client = client
        self.acked: dict[tuple[int, int], bytes] = {}
        self._tasks = [asyncio.create_task(self._write(ledger)) for ledger in ledgers]

    async def _write(self, ledger_id: int) -> None:
        for e in range(100_000):
            data = frame(ledger_id, e, e - 1, payload=os.urandom(200))
            request = wire.encode_add_request([wire.AddItem(FLAGS, KEY, data)])
            try:
                reply = await self.client.call("add", request, timeout=ADD_TIMEOUT_S)
            except Exception:
                return  # the bookie died under us: the outcome is unknown
            status, results = wire.decode_add_reply(reply)
            assert (status, [r.status for r in results]) == (BookieStatus.OK, [BookieStatus.OK])
            self.acked[(ledger_id, e)] = data

    async def finished(self) -> None:
        await asyncio.gather(*self._tasks)


async def reads_back(client: Bookie, acked: dict[tuple[int, int], bytes]) -> dict[str, list]:
    """The acknowledged entries by what a read of them gives: "ok" (the bytes written),
    "wrong" (other bytes with OK: never allowed), or the status name."""
    outcome: dict[str, list] = {}
    pairs = sorted(acked)
    for at in range(0, len(pairs), 200):
        for r in await client.read(pairs[at : at + 200]):
            key = (r.ledger_id, r.entry_id)
            if r.status is BookieStatus.OK:
                name = "ok" if r.frame == acked[key] else "wrong"
            else:
                name = r.status.name
            outcome.setdefault(name, []).append(key)
    return outcome


@pytest.mark.slow
async def test_power_loss_after_kill_9_keeps_every_acknowledged_entry(
    nc, settings, tmp_path
) -> None:
    client = Bookie(nc, settings)
    async with faulty_bookie(settings, tmp_path) as bookie:
        await bookie.start(client)
        for kind in KINDS:  # said at start, by every process that has the hooks on
            assert f"fault injection enabled from {bookie.faults[kind]}" in bookie.log(kind)
        writers = Writers(client, (30, 31, 32))
        await until(lambda: len(writers.acked) >= 300, "300 acked adds")
        bookie.kill_9()
        await writers.finished()
        faults_disk.power_loss(list(bookie.faults.values()), "lose", random.Random(7))
        await bookie.start(client)
        outcome = await reads_back(client, writers.acked)
        assert set(outcome) == {"ok"}, {k: v[:5] for k, v in outcome.items() if k != "ok"}


@pytest.mark.slow
async def test_with_fsync_off_a_power_loss_loses_acknowledged_entries(
    nc, settings, tmp_path
) -> None:
    # No checkpoint (no LastLogMark): the journal cut by the power loss is replayed as it
    # is. Past a checkpoint it refuses to start instead (the next test).
    client = Bookie(nc, settings)
    no_checkpoint = {"QUIRE_LEDGERSTORE__FLUSH_INTERVAL_MS": "3600000"}
    async with faulty_bookie(settings, tmp_path, **no_checkpoint) as bookie:
        for faults_dir in bookie.faults.values():
            faults_dir.mkdir(parents=True)
            (faults_dir / UNSAFE_NO_FSYNC).touch()
        await bookie.start(client)
        writers = Writers(client, (30, 31, 32))
        await until(lambda: len(writers.acked) >= 150, "150 acked adds")
        bookie.kill_9()
        await writers.finished()
        assert not (settings.bookie_dir / "journal" / LAST_MARK).exists()
        done = faults_disk.power_loss(list(bookie.faults.values()), "lose", random.Random(7))
        assert done["cut"]
        await bookie.start(client)
        outcome = await reads_back(client, writers.acked)
        assert "wrong" not in outcome
        assert len(outcome.get("ok", [])) < len(writers.acked)


@pytest.mark.slow
@pytest.mark.parametrize("kinds", [("journal", "ledgerstore"), ("bookie",)], ids=KIND_IDS)
async def test_a_journal_cut_below_its_checkpoint_refuses_to_start(
    nc, settings, tmp_path, kinds
) -> None:
    """What a disk that lied about fsync, or a truncation from outside, leaves: a journal
    file shorter than the LastLogMark the ledgerstore checkpointed. The journal (co-hosted:
    the bookie) refuses to start and says which file, its size, the position and what to
    do, and leaves the file as it found it; it once started past the file's end and wrote
    new records at offsets the ledgerstore had already applied."""
    client = Bookie(nc, settings)
    procs = [spawn(kind, settings, tmp_path) for kind in kinds]
    try:
        await wait_serving(client, procs)
        await add_40_entries(client, 60)
        journal = settings.bookie_dir / "journal"
        (path,) = faults_disk.bookie_files(settings.data_dir, settings.bookie_id)["journal"]

        def checkpointed() -> bool:
            mark = journal / LAST_MARK
            return mark.exists() and decode_last_mark(mark.read_bytes()).offset == (
                path.stat().st_size
            )

        await until(checkpointed, "the ledgerstore checkpoints every record")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=15)
    mark = decode_last_mark((journal / LAST_MARK).read_bytes())
    path = journal / journal_file_name(mark.file_id)
    size = mark.offset - 100
    os.truncate(path, size)

    starting = spawn(kinds[0], settings, tmp_path)  # the journal's half replays
    assert starting.wait(timeout=60) != 0
    text = (tmp_path / f"{kinds[0]}.log").read_text()
    assert text.count(SHORT_JOURNAL) >= 1 and "refusing to start" in text
    assert f"{path} is {size} bytes long" in text and f"offset {mark.offset}" in text
    assert "quire shell decommissionbookie" in text
    assert path.stat().st_size == size  # left for the operator as it was


@pytest.mark.slow
async def test_bit_flips_in_entry_logs_are_never_served_as_data(nc, settings, tmp_path) -> None:
    client = Bookie(nc, settings)
    async with faulty_bookie(settings, tmp_path) as bookie:
        await bookie.start(client)
        acked = await add_40_entries(client, 50)
        bookie.kill_9()  # a clean restart: everything is flushed to the entry log first
        await bookie.start(client)

        def entry_logs() -> list[Path]:
            return faults_disk.bookie_files(settings.data_dir, settings.bookie_id)["entrylog"]

        # The entries may be in more than one log: what the ledgerstore had not flushed
        # before the kill is replayed into the log it writes after the restart.
        await until(
            lambda: sum(p.stat().st_size for p in entry_logs()) > 40 * 300,
            "entries in the entry logs",
        )
        logs = [p for p in entry_logs() if p.stat().st_size > ENTRYLOG_HEADER_SIZE]
        rng = random.Random(11)
        flips = [faults_disk.flip_bit(rng.choice(logs), rng) for _ in range(8)]
        assert all(f["flipped"] for f in flips)
        outcome = await reads_back(client, acked)
        assert "wrong" not in outcome and set(outcome) <= {"ok", "CORRUPT"}
        hit = {(f["ledger_id"], f["entry_id"]) for f in flips if f["in"] == "data"}
        assert hit <= set(outcome.get("CORRUPT", []))
        # And after a restart (the read cache gone, the log scanned again).
        bookie.kill_9()
        await bookie.start(client)
        again = await reads_back(client, acked)
        assert "wrong" not in again and set(again.get("CORRUPT", [])) == hit


@pytest.mark.slow
async def test_injected_eio_and_enospc_fail_stop_and_lose_nothing(nc, settings, tmp_path) -> None:
    client = Bookie(nc, settings)
    async with faulty_bookie(settings, tmp_path) as bookie:
        await bookie.start(client)
        acked: dict[tuple[int, int], bytes] = {}
        # The journal's next fsync (a group commit's), then the ledgerstore's next write
        # (a flush to the entry log).
        for kind, op, errno_name in [
            ("journal", "fsync", "EIO"),
            ("ledgerstore", "write", "ENOSPC"),
        ]:
            writers = Writers(client, (60, 61) if kind == "journal" else (62, 63))
            await until(lambda w=writers: len(w.acked) >= 100, "100 acked adds")
            faults_disk.fail_next(bookie.faults[kind], op, errno_name)
            assert await bookie.exited(kind) == FAIL_STOP_EXIT_CODE
            assert f"injected by {bookie.faults[kind] / f'fail-next-{op}'}" in bookie.log(kind)
            bookie.kill_9()
            await writers.finished()
            acked.update(writers.acked)
            await bookie.start(client)
            outcome = await reads_back(client, acked)
            assert set(outcome) == {"ok"}, {k: v[:5] for k, v in outcome.items() if k != "ok"}


@pytest.mark.slow
async def test_a_bit_flipped_in_checkpointed_journal_records_does_not_stop_the_bookie(
    nc, settings, tmp_path
) -> None:
    # Regression: replay read the whole journal file, and a bad record below the
    # LastLogMark refused the start, forever (a crash loop under supervision), though
    # those entries were in the ledgerstore and a snapshot could hold their facts.
    client = Bookie(nc, settings)
    async with faulty_bookie(settings, tmp_path) as bookie:
        await bookie.start(client)
        acked = await add_40_entries(client, 50)
        assert await client.fence(50) is not None  # a fact the restart must still know
        (journal,) = faults_disk.bookie_files(settings.data_dir, settings.bookie_id)["journal"]

        def checkpointed() -> bool:
            mark = settings.bookie_dir / "journal" / LAST_MARK
            return mark.exists() and decode_last_mark(mark.read_bytes()).offset == (
                journal.stat().st_size
            )

        await until(checkpointed, "the ledgerstore checkpoints every record")
        bookie.kill_9()
        flips = [faults_disk.flip_bit(journal, random.Random(seed)) for seed in range(3)]
        assert all(f["flipped"] for f in flips)
        await bookie.start(client)
        outcome = await reads_back(client, acked)
        assert set(outcome) == {"ok"}, {k: v[:5] for k, v in outcome.items() if k != "ok"}
        statuses = await client.add([frame(50, 40, 39)], flags=FLAGS)
        assert statuses == [BookieStatus.FENCED]


@pytest.mark.slow
async def test_a_power_loss_after_a_crash_and_restart_keeps_what_the_restart_replayed(
    nc, settings, tmp_path
) -> None:
    # Regression: replay trusted a batch whose fsync the crash had cut short (it was in
    # the page cache only) without making it durable; a power loss after the restart then
    # tore it in a file that was no longer the last, and the journal refused to start.
    client = Bookie(nc, settings)
    async with faulty_bookie(settings, tmp_path) as bookie:
        await bookie.start(client)
        writers = Writers(client, (70, 71))
        await until(lambda: len(writers.acked) >= 50, "50 acked adds")
        faults_disk.fail_next(bookie.faults["journal"], "fsync", "EIO")  # written, not synced
        assert await bookie.exited("journal") == FAIL_STOP_EXIT_CODE
        bookie.kill_9()
        await writers.finished()
        acked = dict(writers.acked)
        # No checkpoint from now on: the next start still replays journal-000001 (the
        # snapshot, written at each checkpoint, stays in it).
        bookie.env["QUIRE_LEDGERSTORE__FLUSH_INTERVAL_MS"] = "3600000"
        await bookie.start(client)  # replays journal-000001, then writes journal-000002
        writers = Writers(client, (72, 73))
        await until(lambda: len(writers.acked) >= 50, "50 more acked adds")
        bookie.kill_9()
        await writers.finished()
        acked.update(writers.acked)
        # The power loss loses every unsynced byte, but one of journal-000001's: a tear.
        first = (settings.bookie_dir / "journal" / journal_file_name(1)).absolute()
        log_lines = (bookie.faults["journal"] / FILES_LOG).read_text().splitlines()
        durable = replay_files_log(log_lines)[str(first)].durable_size
        survivor = first.read_bytes()[durable : durable + 1]
        faults_disk.power_loss(list(bookie.faults.values()), "lose", random.Random(3))
        with open(first, "ab") as f:
            f.write(survivor)
        await bookie.start(client)
        outcome = await reads_back(client, acked)
        assert set(outcome) == {"ok"}, {k: v[:5] for k, v in outcome.items() if k != "ok"}
