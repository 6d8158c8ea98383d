"""A bookie (journal + ledgerstore) against real NATS: adds answered after the journal has
the record, reads back byte-exact, fencing, master keys, bad input, LastLogMark, restart,
and kill -9 of real processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest

from shared import wire
from shared.bookie.journal_dir import journal_files
from shared.bookie.journal_format import FILE_HEADER_SIZE, EntryRecord, scan_records
from shared.bookie_client import BookieClient
from shared.config import QuireSettings
from shared.digest import DigestManager, master_key
from shared.metrics import Scrape, scrape
from shared.requests import request
from shared.status import BookieStatus
from shared.subjects import Subjects
from tests.support.inprocess import running_service

KEY = master_key(b"secret")
OTHER_KEY = master_key(b"other")
DIGEST = DigestManager("crc32c")


def frame(ledger_id: int, entry_id: int, lac: int = -1, payload: bytes | None = None) -> bytes:
    payload = payload if payload is not None else f"entry {ledger_id}:{entry_id}".encode()
    return DIGEST.sign(ledger_id, entry_id, lac, len(payload), payload)


class Bookie:
    """Talks to one bookie the way the gateway does: shared.wire over NATS requests."""

    def __init__(self, nc, settings: QuireSettings) -> None:
        self.nc = nc
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)

    async def call(self, op: str, data: bytes, timeout: float = 10.0) -> bytes:
        subject = self.subjects.bookie(self.settings.bookie_id, op)
        msg = await request(self.nc, subject, data, timeout_s=timeout)
        return msg.data

    async def add(
        self, frames: list[bytes], key: bytes = KEY, flags: int = 0
    ) -> list[BookieStatus]:
        return await self.add_items([wire.AddItem(flags, key, f) for f in frames])

    async def add_items(self, items: list[wire.AddItem]) -> list[BookieStatus]:
        status, results = wire.decode_add_reply(
            await self.call("add", wire.encode_add_request(items))
        )
        assert status is BookieStatus.OK
        return [r.status for r in results]

    async def read(self, pairs: list[tuple[int, int]]) -> list[wire.ReadResult]:
        data = wire.encode_read_request([wire.ReadItem(ledger, e) for ledger, e in pairs])
        status, results = wire.decode_read_reply(await self.call("read", data))
        assert status is BookieStatus.OK
        return results

    async def read_lac(self, ledger_id: int) -> wire.LacReply:
        return wire.decode_lac_reply(
            await self.call("read_lac", wire.encode_read_lac_request(ledger_id))
        )

    async def fence(self, ledger_id: int, key: bytes = KEY) -> wire.LacReply:
        return wire.decode_lac_reply(
            await self.call("fence", wire.encode_fence_request(ledger_id, key))
        )

    async def write_lac(self, ledger_id: int, lac: int, key: bytes = KEY) -> BookieStatus:
        (status,) = await self.write_lacs([(ledger_id, key, lac)])
        return status

    async def write_lacs(self, items: list[wire.WriteLacItem]) -> list[BookieStatus]:
        data = wire.encode_write_lac_request(items)
        return wire.decode_write_lac_reply(await self.call("write_lac", data), len(items))

    async def stats(self, kind: str) -> Scrape:
        """The metrics of the bookie's `kind` process (started by `bookie`)."""
        return await scrape(METRICS_URLS[kind])


# The metrics URL of each service of the running `bookie` (kind -> URL).
METRICS_URLS: dict[str, str] = {}


@asynccontextmanager
async def bookie(settings: QuireSettings):
    settings = settings.model_copy(update={"metrics_port": 0})  # each on a free port
    async with AsyncExitStack() as stack:
        for kind in ("journal", "ledgerstore"):
            rt = await stack.enter_async_context(running_service(kind, settings))
            METRICS_URLS[kind] = rt.metrics_url  # type: ignore[attr-defined]
        yield


async def test_probes_beside_the_metrics(settings: QuireSettings) -> None:
    # deploy/k8s probes every service's metrics port: /healthz (the event loop runs) and
    # /readyz (set up and on NATS); a service that is gone answers neither.
    async with bookie(settings):
        bases = {kind: url.removesuffix("/metrics") for kind, url in METRICS_URLS.items()}
        async with httpx.AsyncClient() as http:
            for base in bases.values():
                for probe in ("healthz", "readyz"):
                    answer = await http.get(f"{base}/{probe}")
                    assert (answer.status_code, answer.text) == (200, "ok\n"), probe
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"{bases['journal']}/readyz")


def journal_entries(settings: QuireSettings) -> set[tuple[int, int]]:
    """(ledger, entry) of every entry record in the bookie's journal files, read raw."""
    directory = settings.bookie_dir / "journal"
    found = set()
    for file_id in journal_files(directory):
        data = (directory / f"journal-{file_id:06d}.log").read_bytes()
        for scanned in scan_records(memoryview(data)[FILE_HEADER_SIZE:]).records:
            if isinstance(scanned.record, EntryRecord):
                found.add((scanned.record.ledger_id, scanned.record.entry_id))
    return found


async def test_adds_are_journaled_before_ack_and_read_back_byte_exact(nc, settings) -> None:
    client = Bookie(nc, settings)
    async with bookie(settings):
        frames = {(ledger, e): frame(ledger, e, e - 1) for ledger in (1, 2**40) for e in range(30)}
        for e in range(30):
            batch = [frames[(1, e)], frames[(2**40, e)]]
            assert await client.add(batch) == [BookieStatus.OK] * 2
            # Acknowledged means written to the journal file (and fsynced) already.
            assert {(1, e), (2**40, e)} <= journal_entries(settings)
        # The ledgerstore serves them at once: an acked entry is never reported absent.
        results = await client.read(list(frames))
        assert [r.status for r in results] == [BookieStatus.OK] * len(frames)
        assert {(r.ledger_id, r.entry_id): r.frame for r in results} == frames
        lac = await client.read_lac(1)
        assert (lac.status, lac.lac, lac.last_entry_id) == (BookieStatus.OK, 28, 29)
        stats = await client.stats("journal")
        assert stats.value("quire_journal_add_entries_total") == 60
        assert 1 <= stats.value("bookie_journal_JOURNAL_SYNC_count", success="true") <= 30
        assert stats.value("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_sum") == 60
        added = stats.value("bookie_journal_JOURNAL_ADD_ENTRY_count", success="true")
        requested = stats.value("bookkeeper_server_ADD_ENTRY_REQUEST_count", success="true")
        assert added == requested == 60


async def test_adds_beyond_the_limit_in_progress_wait_and_are_all_answered(nc, settings) -> None:
    # journal.max_adds_in_progress_limit 1: one request waits for its group commit at a
    # time, the others wait in the journal's queue and are taken as each is answered (a
    # malformed one among them is answered BAD_REQUEST at its turn).
    journal = settings.journal.model_copy(update={"max_adds_in_progress_limit": 1})
    limited = settings.model_copy(update={"journal": journal})
    client = Bookie(nc, limited)
    async with bookie(limited):
        frames = [frame(7, e, e - 1) for e in range(40)]
        adds = [client.add([f]) for f in frames]
        malformed = client.call("add", b"\x07garbage")
        answers = await asyncio.wait_for(asyncio.gather(*adds[:20], malformed, *adds[20:]), 30)
        assert wire.decode_add_reply(answers.pop(20)) == (BookieStatus.BAD_REQUEST, [])
        assert answers == [[BookieStatus.OK]] * len(frames)
        assert {(7, e) for e in range(40)} <= journal_entries(limited)
        stats = await client.stats("journal")
        assert stats.value("quire_journal_add_requests_waiting") == 0
        assert stats.value("quire_journal_add_requests_queued") == 0
        assert stats.value("bookkeeper_server_ADD_ENTRY_REQUEST_count", success="true") == 40


async def test_bookie_client_reads_carry_its_read_timeout(nc, settings) -> None:
    """The budget a bookie drops a queued read by is the client's own read timeout; the
    bookie's read queue shows in its stats."""
    bookies = BookieClient(
        nc, Subjects(settings.subject_prefix), add_timeout_ms=1000, read_timeout_ms=1234
    )
    client = Bookie(nc, settings)
    async with bookie(settings):
        assert await client.add([frame(5, 0)]) == [BookieStatus.OK]
        seen: list[wire.ReadRequest] = []
        subject = Subjects(settings.subject_prefix).bookie(settings.bookie_id, "read")

        async def record(msg) -> None:  # a plain subscriber: a copy of every request
            seen.append(wire.decode_read_request(msg.data))

        sub = await nc.subscribe(subject, cb=record)
        status, [result] = await bookies.read(settings.bookie_id, [wire.ReadItem(5, 0)])
        deadline = asyncio.get_running_loop().time() + 10
        while not seen and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # the copy's callback runs on its own task
        await sub.unsubscribe()
        assert (status, result.frame) == (BookieStatus.OK, frame(5, 0))
        assert seen == [wire.ReadRequest([wire.ReadItem(5, 0)], 1234)]
        stats = await client.stats("ledgerstore")
        assert stats.value("quire_ledgerstore_read_requests_total") == 1
        assert stats.value("bookkeeper_server_READ_ENTRY_REQUEST_count", success="true") == 1
        assert stats.value("quire_ledgerstore_read_requests_rejected_total") == 0
        assert stats.value("quire_ledgerstore_read_requests_expired_total") == 0


async def test_absent_entries_and_ledgers(nc, settings) -> None:
    client = Bookie(nc, settings)
    async with bookie(settings):
        assert await client.add([frame(5, 0), frame(5, 1, 0)]) == [BookieStatus.OK] * 2
        results = await client.read([(5, 1), (5, 2), (6, 0)])
        assert [r.status for r in results] == [
            BookieStatus.OK,
            BookieStatus.NO_ENTRY,
            BookieStatus.NO_LEDGER,
        ]
        assert (await client.read_lac(6)).status is BookieStatus.NO_LEDGER


async def test_fence_then_normal_add_is_fenced_and_recovery_add_passes(nc, settings) -> None:
    client = Bookie(nc, settings)
    async with bookie(settings):
        events = await nc.jetstream().subscribe(
            Subjects(settings.subject_prefix).event("ledger.fenced"), ordered_consumer=True
        )
        assert await client.add([frame(7, 0), frame(7, 1, 0)]) == [BookieStatus.OK] * 2
        fenced = await client.fence(7)
        assert (fenced.status, fenced.lac, fenced.last_entry_id) == (BookieStatus.OK, 0, 1)
        assert await client.add([frame(7, 2, 1)]) == [BookieStatus.FENCED]
        assert await client.add([frame(7, 2, 1)], flags=wire.FLAG_RECOVERY_ADD) == [BookieStatus.OK]
        assert (await client.fence(7)).status is BookieStatus.OK  # idempotent
        # Fencing a ledger this bookie never saw makes it known, empty and fenced.
        assert (await client.fence(8)).status is BookieStatus.OK
        assert await client.add([frame(8, 0)]) == [BookieStatus.FENCED]
        lac8 = await client.read_lac(8)
        assert (lac8.status, lac8.lac, lac8.last_entry_id) == (BookieStatus.OK, -1, -1)
        event = json.loads((await events.next_msg(timeout=5)).data)
        assert (event["kind"], event["ledger_id"], event["bookie_id"]) == (
            "ledger.fenced",
            7,
            settings.bookie_id,
        )
        await events.unsubscribe()


async def test_wrong_master_key_is_unauthorized(nc, settings) -> None:
    client = Bookie(nc, settings)
    async with bookie(settings):
        assert await client.add([frame(9, 0)]) == [BookieStatus.OK]
        assert await client.add([frame(9, 1)], key=OTHER_KEY) == [BookieStatus.UNAUTHORIZED]
        assert (await client.fence(9, key=OTHER_KEY)).status is BookieStatus.UNAUTHORIZED
        assert await client.write_lac(9, 0, key=OTHER_KEY) is BookieStatus.UNAUTHORIZED
        # In one batch: the first add of a new ledger sets the key for the rest.
        assert await client.add([frame(10, 0)]) == [BookieStatus.OK]
        mixed = [wire.AddItem(0, KEY, frame(11, 0)), wire.AddItem(0, OTHER_KEY, frame(11, 1))]
        _, results = wire.decode_add_reply(await client.call("add", wire.encode_add_request(mixed)))
        assert [r.status for r in results] == [BookieStatus.OK, BookieStatus.UNAUTHORIZED]
        assert [r.status for r in await client.read([(9, 1), (11, 1)])] == [
            BookieStatus.NO_ENTRY,
            BookieStatus.NO_ENTRY,
        ]


async def test_explicit_lac(nc, settings) -> None:
    client = Bookie(nc, settings)
    async with bookie(settings):
        assert await client.add([frame(12, e, e - 1) for e in range(4)]) == [BookieStatus.OK] * 4
        assert (await client.read_lac(12)).lac == 2
        assert await client.write_lac(12, 3) is BookieStatus.OK
        assert (await client.read_lac(12)).lac == 3
        assert await client.write_lac(12, 1) is BookieStatus.OK  # never goes back
        assert (await client.read_lac(12)).lac == 3


async def test_explicit_lacs_of_several_ledgers_in_one_request(nc, settings) -> None:
    """A client merges the explicit LACs of its ledgers for a bookie: each item is checked
    on its own (key, LAC) and answered in order; the good ones are durable when answered."""
    client = Bookie(nc, settings)
    async with bookie(settings):
        assert await client.add([frame(20, e, e - 1) for e in range(3)]) == [BookieStatus.OK] * 3
        statuses = await client.write_lacs(
            [
                (20, KEY, 2),  # known ledger, its key
                (21, KEY, 5),  # a ledger new here: its key is journalled first
                (20, OTHER_KEY, 9),  # the wrong key
                (22, KEY, -2),  # no such LAC
                (21, KEY, 6),  # the same ledger again, later in the request
            ]
        )
        assert statuses == [
            BookieStatus.OK,
            BookieStatus.OK,
            BookieStatus.UNAUTHORIZED,
            BookieStatus.BAD_REQUEST,
            BookieStatus.OK,
        ]
        assert [(await client.read_lac(ledger)).lac for ledger in (20, 21)] == [2, 6]
        assert (await client.read_lac(22)).status is BookieStatus.NO_LEDGER


@pytest.mark.parametrize(
    ("op", "data"),
    [
        ("add", b""),
        ("add", b"\x07garbage"),
        ("add", b"\x01\x00\x00\x00\x05"),
        ("fence", b"\x01short"),
        ("write_lac", b"\x01"),
        ("read", b"\x01\x00\x00\x00\x02xx"),
        ("read_lac", b"\x02" + bytes(8)),
    ],
)
async def test_malformed_requests_get_bad_request_and_the_bookie_keeps_serving(
    nc, settings, op: str, data: bytes
) -> None:
    client = Bookie(nc, settings)
    async with bookie(settings):
        reply = await client.call(op, data)
        if op == "add":
            assert wire.decode_add_reply(reply) == (BookieStatus.BAD_REQUEST, [])
        elif op == "read":
            assert wire.decode_read_reply(reply) == (BookieStatus.BAD_REQUEST, [])
        elif op == "write_lac":
            assert wire.decode_write_lac_reply(reply, 1) == [BookieStatus.BAD_REQUEST]
        else:
            assert wire.decode_lac_reply(reply).status is BookieStatus.BAD_REQUEST
        # A frame without a complete header is a bad item, not a bad batch.
        assert await client.add([b"short", frame(13, 0)]) == [
            BookieStatus.BAD_REQUEST,
            BookieStatus.OK,
        ]
        assert (await client.read([(13, 0)]))[0].frame == frame(13, 0)


def rolling_frames(written: int, recovered: int) -> dict[tuple[int, int], bytes]:
    """60 frames of 20 KB for each of two ledgers: enough to roll 1 MB journal files."""
    payload = os.urandom(20_000)
    return {
        (ledger, e): frame(ledger, e, e - 1, payload + bytes([e]))
        for ledger in (written, recovered)
        for e in range(60)
    }


async def write_and_recover(
    client: Bookie, frames: dict[tuple[int, int], bytes], written: int, recovered: int
) -> None:
    """Add `written`'s frames one by one; fence `recovered` and add its frames as recovery
    adds: a master key and a fence for a restart to remember."""
    assert await client.add([frames[(written, 0)]]) == [BookieStatus.OK]
    assert (await client.fence(recovered)).status is BookieStatus.OK
    for e in range(1, 60):
        assert await client.add([frames[(written, e)]]) == [BookieStatus.OK]
    recovery = [frames[(recovered, e)] for e in range(60)]
    assert await client.add(recovery, flags=wire.FLAG_RECOVERY_ADD) == [BookieStatus.OK] * 60


async def assert_remembered(
    client: Bookie, frames: dict[tuple[int, int], bytes], written: int, recovered: int
) -> None:
    """After a restart: every frame reads back, the fence holds and the key is checked."""
    results = await client.read(list(frames))
    assert {(r.ledger_id, r.entry_id): r.frame for r in results} == frames
    assert await client.add([frame(recovered, 60, 59)]) == [BookieStatus.FENCED]
    assert await client.add([frame(written, 60, 59)], key=OTHER_KEY) == [BookieStatus.UNAUTHORIZED]
    assert await client.add([frame(written, 60, 59)]) == [BookieStatus.OK]


async def test_restart_reads_everything_and_remembers_fences_and_keys(nc, settings) -> None:
    # Small files and frequent checkpoints: journal files roll and old ones are deleted,
    # so the restart must rebuild fences and keys from the snapshot, not from file 1.
    settings = settings.model_copy(
        update={
            "journal": settings.journal.model_copy(update={"max_size_mb": 1, "max_backups": 0}),
            "ledgerstore": settings.ledgerstore.model_copy(
                update={"flush_interval_ms": 50, "log_size_limit_bytes": 256 * 1024}
            ),
        }
    )
    client = Bookie(nc, settings)
    frames = rolling_frames(20, 21)
    async with bookie(settings):
        await write_and_recover(client, frames, 20, 21)
        for _ in range(100):
            stats = await client.stats("journal")
            if stats.value("quire_journal_files_deleted_total") >= 1:
                break
            await asyncio.sleep(0.05)
        assert stats.value("quire_journal_files_deleted_total") >= 1, stats
        assert len(list((settings.bookie_dir / "ledgers").glob("entrylog-*.log"))) > 1
    assert min(journal_files(settings.bookie_dir / "journal")) > 1
    async with bookie(settings):
        await assert_remembered(client, frames, 20, 21)
        lac = await client.read_lac(20)
        assert (lac.lac, lac.last_entry_id) == (59, 60)
    # A wiped ledgerstore under a journal whose first files are gone: it cannot know what
    # it lost, so it must never say "no such entry" (recovery would trust that).
    shutil.rmtree(settings.bookie_dir / "ledgers")
    async with bookie(settings):
        results = await client.read([(20, 0), (20, 61), (99, 0)])
        assert {r.status for r in results} == {BookieStatus.UNKNOWN_LEDGER_STATE}
        assert (await client.read_lac(99)).status is BookieStatus.UNKNOWN_LEDGER_STATE


def quick_flush(settings: QuireSettings) -> QuireSettings:
    return settings.model_copy(
        update={"ledgerstore": settings.ledgerstore.model_copy(update={"flush_interval_ms": 50})}
    )


async def flushed_to_entry_log(
    client: Bookie, settings: QuireSettings, data: bytes
) -> tuple[Path, int]:
    """Wait until `data` is in an entry log and indexed (the write cache was flushed and
    the flush committed): (log, offset)."""
    for _ in range(200):
        stats = await client.stats("ledgerstore")
        if stats.value("bookie_write_cache_count") == 0 and stats.value(
            "quire_ledgerstore_flushed_entries_total"
        ) == stats.value("quire_ledgerstore_add_entries_total"):
            for path in settings.bookie_dir.glob("ledgers/entrylog-*.log"):
                at = path.read_bytes().find(data)
                if at >= 0:
                    return path, at
        await asyncio.sleep(0.05)
    raise AssertionError("entry never reached an entry log")


def damage(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


async def test_a_stored_frame_that_is_not_the_entry_asked_for_is_corrupt(nc, settings) -> None:
    settings = quick_flush(settings)
    client = Bookie(nc, settings)
    marker = os.urandom(32)
    async with bookie(settings):
        assert await client.add([frame(40, 0, payload=marker)]) == [BookieStatus.OK]
        assert (await client.read([(40, 0)]))[0].status is BookieStatus.OK
        # Damage the stored copy: its header now claims entry 1.
        path, at = await flushed_to_entry_log(client, settings, frame(40, 0, payload=marker))
        damage(path, at + 8, (1).to_bytes(8, "big"))
        result = (await client.read([(40, 0)]))[0]
        assert (result.status, result.frame) == (BookieStatus.CORRUPT, b"")


@pytest.mark.parametrize("digest", ["crc32", "crc32c"])
async def test_a_digest_mismatch_on_disk_is_corrupt_counted_and_reported(
    nc, settings, digest: str
) -> None:
    settings = quick_flush(settings)
    client = Bookie(nc, settings)
    signer = DigestManager(digest)
    payloads = [os.urandom(64) for _ in range(3)]
    frames = [signer.sign(41, e, e - 1, 64 * (e + 1), p) for e, p in enumerate(payloads)]
    flags = wire.add_flags(digest)
    async with bookie(settings):
        events = await nc.jetstream().subscribe(
            Subjects(settings.subject_prefix).event("entry.corrupt"), ordered_consumer=True
        )
        assert await client.add(frames, flags=flags) == [BookieStatus.OK] * 3
        path, at = await flushed_to_entry_log(client, settings, frames[1])
        await flushed_to_entry_log(client, settings, frames[2])
        damage(path, at + len(frames[1]) - 1, bytes([frames[1][-1] ^ 0x40]))  # one payload bit
        results = await client.read([(41, 0), (41, 1), (41, 2)])
        assert [r.status for r in results] == [
            BookieStatus.OK,
            BookieStatus.CORRUPT,
            BookieStatus.OK,
        ]
        assert results[1].frame == b"" and [results[0].frame, results[2].frame] == [
            frames[0],
            frames[2],
        ]
        # Read again (now through the read cache for its neighbours): still never returned.
        assert (await client.read([(41, 1)]))[0].status is BookieStatus.CORRUPT
        stats = await client.stats("ledgerstore")
        assert stats.value("quire_ledgerstore_read_entries_corrupt_total") == 2
        event = json.loads((await events.next_msg(timeout=5)).data)
        assert (event["kind"], event["ledger_id"], event["bookie_id"]) == (
            "entry.corrupt",
            41,
            settings.bookie_id,
        )
        assert event["data"]["entry_id"] == 1
        await events.unsubscribe()


async def test_without_a_digest_type_the_bookie_does_not_verify_the_payload(nc, settings) -> None:
    # Flags 0 (an older gateway): digest unknown, only the header is checked.
    settings = quick_flush(settings)
    client = Bookie(nc, settings)
    data = frame(42, 0, payload=os.urandom(64))
    async with bookie(settings):
        assert await client.add([data]) == [BookieStatus.OK]
        path, at = await flushed_to_entry_log(client, settings, data)
        damage(path, at + len(data) - 1, bytes([data[-1] ^ 0x01]))
        result = (await client.read([(42, 0)]))[0]
        assert result.status is BookieStatus.OK and result.frame != data


# -- real processes -----------------------------------------------------------------------


def spawn(
    kind: str, settings: QuireSettings, log_dir: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen:
    """One of the bookie's processes (`kind`: journal or ledgerstore; or bookie, the two
    co-hosted in one process), logging to log_dir; `extra_env` last."""
    env = dict(
        os.environ,
        QUIRE_NATS_URL=settings.nats_url,
        QUIRE_SUBJECT_PREFIX=settings.subject_prefix,
        QUIRE_DATA_DIR=str(settings.data_dir),
        QUIRE_BOOKIE_ID=settings.bookie_id,
        # Checkpoints during the test: the restart resumes from a persisted position.
        QUIRE_LEDGERSTORE__FLUSH_INTERVAL_MS="100",
    )
    env.update(extra_env or {})
    with open(log_dir / f"{kind}.log", "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{kind}"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
            start_new_session=True,
        )


async def wait_serving(client: Bookie, procs: list[subprocess.Popen]) -> None:
    for _ in range(300):
        assert all(p.poll() is None for p in procs), "a bookie process exited"
        try:
            await client.read_lac(0)  # the ledgerstore serves
            await client.call("info", b"")  # and the journal
            return
        except Exception:
            await asyncio.sleep(0.05)
    raise AssertionError("bookie processes did not start serving")


@pytest.mark.slow
@pytest.mark.parametrize(
    "kinds", [("journal", "ledgerstore"), ("bookie",)], ids=["separate", "cohosted"]
)
async def test_kill_9_of_both_processes_loses_no_acknowledged_entry(
    nc, settings, tmp_path, kinds
) -> None:
    # Co-hosted (services.bookie): the ledgerstore took the records from the journal in
    # process; after the kill it catches up from the journal files, as separate ones do.
    client = Bookie(nc, settings)
    procs: list[subprocess.Popen] = []
    acked: dict[tuple[int, int], bytes] = {}
    try:
        procs = [spawn(kind, settings, tmp_path) for kind in kinds]
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

        tasks = [asyncio.create_task(writer(ledger_id)) for ledger_id in (30, 31, 32)]
        while len(acked) < 600:
            await asyncio.sleep(0.01)
        # Before the kill too, every acknowledged entry reads back (co-hosted: applied from
        # the handoff, not from the journal file).
        results = await client.read(list(acked)[:600])
        assert [r.frame for r in results] == [acked[key] for key in list(acked)[:600]]
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=10)
        await asyncio.gather(*tasks)
        assert len(acked) >= 600

        procs = [spawn(kind, settings, tmp_path) for kind in kinds]
        await wait_serving(client, procs)
        results = await client.read(list(acked))
        missing = [
            (r.ledger_id, r.entry_id, r.status)
            for r in results
            if r.status is not BookieStatus.OK or r.frame != acked[(r.ledger_id, r.entry_id)]
        ]
        assert missing == []
        for ledger_id in (30, 31, 32):
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
