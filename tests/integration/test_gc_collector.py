"""The ledgerstore's garbage collector (services.ledgerstore.gc) against the real metadata
service (real NATS and PostgreSQL) and a small fake of the ledgerstore API it drives
(LedgerStore's entry_logs, delete_dead_entry_logs, compact_entry_log...): which ledgers it
deletes and when it refuses to, the compaction it runs, the events and counters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from services.ledgerstore.gc import GarbageCollector, GcError
from shared.bookie.gc import CompactionResult, EntryLogMetadata
from shared.bookie.journal_format import JournalPosition
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving
from tests.support.metadata import create_request

HOUR_MS = 3_600_000


class FakeStore:
    """The ledgerstore API the collector drives, in memory: ledgers, sealed entry logs with
    their live ledgers, DELETED records applied in journal order."""

    def __init__(self, ledgers: list[int], logs: list[EntryLogMetadata] = ()) -> None:
        self.ledgers = {ledger_id: None for ledger_id in ledgers}
        self.logs = {(m.dir, m.log_id): m for m in logs}
        self.journaled: list[list[int]] = []  # journal.delete requests, in order
        self.position = JournalPosition(1, 0)
        self.applied = JournalPosition(1, 0)
        self.checkpoints = 0
        self.compacted: list[tuple[int, int]] = []
        self.next_log_id = 1000
        self.on_compact: Callable[[], None] = lambda: None
        self.fail_delete = False

    async def journal_delete(self, ledger_ids: list[int]) -> dict[int, JournalPosition]:
        if self.fail_delete:
            raise GcError("journal refused journal.delete")
        self.journaled.append(list(ledger_ids))
        self.position = JournalPosition(1, self.position.offset + 9 * len(ledger_ids))
        return {0: self.position}

    async def catch_up(self) -> bool:
        return True

    async def apply_through(self, positions: dict[int, JournalPosition]) -> bool:
        for ledger_id in self.journaled[-1]:
            self.ledgers.pop(ledger_id, None)
        self.applied = positions[0]
        return True

    async def checkpoint(self) -> None:
        self.checkpoints += 1
        for meta in self.logs.values():
            meta.forget([ledger_id for ledger_id in meta.ledgers if ledger_id not in self.ledgers])

    def entry_logs(self) -> list[EntryLogMetadata]:
        return [m.copy() for m in self.logs.values()]

    def current_entry_logs(self) -> list[tuple[int, int, int]]:
        return [(0, 9999, 123)]

    async def delete_dead_entry_logs(self) -> list[EntryLogMetadata]:
        dead = [m for m in self.logs.values() if m.is_empty()]
        for meta in dead:
            del self.logs[(meta.dir, meta.log_id)]
        return dead

    async def compact_entry_log(
        self, dir: int, log_id: int, should_stop: Callable[[], bool]
    ) -> CompactionResult:
        self.on_compact()
        if should_stop():
            return CompactionResult(dir, log_id, None, 0, 0, 0, aborted=True)
        meta = self.logs.pop((dir, log_id))
        self.next_log_id += 1
        self.logs[(dir, self.next_log_id)] = EntryLogMetadata(
            dir, self.next_log_id, meta.live_bytes, dict(meta.ledgers)
        )
        self.compacted.append((dir, log_id))
        return CompactionResult(
            dir,
            log_id,
            self.next_log_id,
            1,
            meta.live_bytes,
            meta.size_bytes - meta.live_bytes,
            deleted_ledgers=dict(meta.deleted),
        )


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def collector(
    store: FakeStore,
    settings: QuireSettings,
    metadata,
    clock: Clock | None = None,
    disk_used: float = 0.1,
    **gc_settings,
) -> tuple[GarbageCollector, list[tuple[str, dict]]]:
    events: list[tuple[str, dict]] = []

    def emit(kind: str, /, **data) -> None:
        events.append((kind, data))

    gc = GarbageCollector(
        store,
        settings.ledgerstore.model_copy(update=gc_settings),
        bookie_id="bookie-1",
        ledger_dirs=[Path("/")],
        metadata=metadata,
        journal_delete=store.journal_delete,
        checkpoint=store.checkpoint,
        emit=emit,
        disk_usage=lambda path: (int(disk_used * 1000), 1000),
        clock_ms=clock or Clock(),
    )
    return gc, events


@pytest.fixture
def meta_settings(settings: QuireSettings, fresh_database_url: str) -> QuireSettings:
    return settings.model_copy(update={"database_url": fresh_database_url})


@pytest.fixture
async def metadata(meta_settings: QuireSettings, nc) -> AsyncIterator[MetadataClient]:
    async with running_service("metadata", meta_settings):
        client = MetadataClient(nc, Subjects(meta_settings.subject_prefix), timeout_s=2.0)
        await wait_until_serving(client)
        yield client


async def create(metadata: MetadataClient, ids: list[int]) -> None:
    for ledger_id in ids:
        await metadata.create_ledger(create_request(ledger_id))


# -- ledger GC ------------------------------------------------------------------------------


async def test_ledgers_gone_from_metadata_are_deleted_and_the_others_kept(
    metadata, meta_settings
) -> None:
    await create(metadata, list(range(1, 31)))
    for ledger_id in (3, 4, 17, 30):
        await metadata.delete_ledger(ledger_id)
    # The bookie holds ledgers 1..30, and 40 (never in this listing: deleted long ago).
    store = FakeStore([*range(1, 31), 40], [EntryLogMetadata(0, 1, 100, {3: 40, 4: 40})])
    gc, events = collector(store, meta_settings, metadata)
    run = await gc.run_once()
    assert store.journaled == [[3, 4, 17, 30, 40]]
    assert set(store.ledgers) == set(range(1, 31)) - {3, 4, 17, 30}
    assert store.applied == store.position and store.checkpoints == 1
    assert (run.ledgers_deleted, run.entry_logs_deleted, run.skipped) == (5, 1, "")
    assert run.reclaimed_by_deletion_bytes == 100
    assert [d["ledger_id"] for k, d in events if k == "gc.ledger_deleted"] == [3, 4, 17, 30, 40]
    # The log held only ledgers 3 and 4 and the rest of it was garbage already.
    assert (
        "gc.entrylog_deleted",
        {
            "bookie_id": "bookie-1",
            "dir": 0,
            "log_id": 1,
            "bytes": 100,
            "reason": "no_live_ledger",
            "ledgers": {"3": 40, "4": 40},
            "ledgers_truncated": False,
        },
    ) in events
    assert gc.stats.deleted_ledger_count == 5 and gc.stats.gc_runs == 1
    assert gc.stats.reclaimed_deletion_space_bytes == 100
    # A second run finds nothing more to do.
    run = await gc.run_once()
    assert run.ledgers_deleted == 0 and len(store.journaled) == 1


async def test_metadata_of_another_cluster_instance_deletes_nothing(
    metadata, meta_settings
) -> None:
    # A new, empty metadata database (or the wrong URL) lists no ledger and confirms every
    # one as gone: the cookie's instance id keeps the bookie from believing it.
    await create(metadata, [1, 2])
    store = FakeStore([1, 2, 3], [])
    gc, events = collector(store, meta_settings, metadata)
    gc.instance_id = "another-instance"
    run = await gc.run_once()
    assert store.journaled == [] and set(store.ledgers) == {1, 2, 3}
    assert "another-instance" in run.skipped and "nothing deleted" in run.skipped
    assert not [k for k, _ in events if k == "gc.ledger_deleted"]
    # Its own instance: ledger 3, gone from metadata, is deleted.
    gc.instance_id = await metadata.instance_id()
    run = await gc.run_once()
    assert store.journaled == [[3]] and run.skipped == ""


async def test_metadata_unreachable_deletes_nothing_and_says_why(meta_settings, nc) -> None:
    # No metadata service at all on these subjects: the listing cannot even start.
    client = MetadataClient(nc, Subjects(meta_settings.subject_prefix), timeout_s=0.5)
    store = FakeStore([1, 2, 3])
    gc, events = collector(store, meta_settings, client)
    run = await gc.run_once()
    assert store.journaled == [] and set(store.ledgers) == {1, 2, 3}
    assert run.ledgers_deleted == 0
    assert run.skipped.startswith("metadata listing failed")
    assert gc.details()["lastSkipped"] == run.skipped
    assert not [e for e in events if e[0] == "gc.ledger_deleted"]


class FailingAfter:
    """The real metadata client whose listing fails after `pages` pages: a partial answer."""

    def __init__(self, client: MetadataClient, pages: int) -> None:
        self.client = client
        self.pages = pages

    async def ledger_ranges(self, after=None, limit=10_000):
        if self.pages == 0:
            raise TimeoutError("metadata slow")
        self.pages -= 1
        return await self.client.ledger_ranges(after, 2)  # small pages: several of them

    async def get_ledger(self, ledger_id):
        return await self.client.get_ledger(ledger_id)


async def test_a_listing_that_fails_part_way_deletes_nothing(metadata, meta_settings) -> None:
    await create(metadata, [1, 2, 5, 6, 9, 10])
    store = FakeStore([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])  # 3, 4, 7, 8, 11 gone
    gc, _ = collector(store, meta_settings, FailingAfter(metadata, pages=2))
    run = await gc.run_once()
    assert store.journaled == [] and len(store.ledgers) == 11
    assert "metadata slow" in run.skipped


class HidingLedger:
    """The real metadata client, whose listing misses ledger `hidden` (a listing that
    looks complete but is wrong): verify_metadata_on_gc must catch it with ledger.get."""

    def __init__(self, client: MetadataClient, hidden: int) -> None:
        self.client = client
        self.hidden = hidden

    async def ledger_ranges(self, after=None, limit=10_000):
        page = await self.client.ledger_ranges(after, limit)
        ids = [i for first, last in page.ranges for i in range(first, last + 1)]
        runs = [(i, i) for i in ids if i != self.hidden]
        return page.model_copy(update={"ranges": runs})

    async def get_ledger(self, ledger_id):
        return await self.client.get_ledger(ledger_id)


@pytest.mark.parametrize(("verify", "deleted"), [(True, [[2]]), (False, [[2, 3]])])
async def test_verify_metadata_on_gc_keeps_a_ledger_metadata_still_has(
    metadata, meta_settings, verify, deleted
) -> None:
    await create(metadata, [1, 3])
    store = FakeStore([1, 2, 3])
    gc, _ = collector(store, meta_settings, HidingLedger(metadata, 3), verify_metadata_on_gc=verify)
    run = await gc.run_once()
    assert store.journaled == deleted
    if verify:
        assert run.skipped == "metadata did not confirm 1 deletions: kept"
        assert 3 in store.ledgers


async def test_a_failed_run_is_counted_and_the_next_one_runs(metadata, meta_settings) -> None:
    await create(metadata, [1])
    store = FakeStore([1, 2])
    store.fail_delete = True
    gc, _ = collector(store, meta_settings, metadata, gc_wait_time_ms=3_600_000)
    task = asyncio.create_task(gc.run_forever())
    try:
        with pytest.raises(GcError):
            await gc.trigger()
        assert gc.stats.gc_failures == 1
        store.fail_delete = False
        run = await gc.trigger()
        assert run.ledgers_deleted == 1 and store.journaled == [[2]]
        assert gc.stats.gc_runs == 2
    finally:
        await gc.close()
        task.cancel()


# -- compaction -----------------------------------------------------------------------------


def logs() -> list[EntryLogMetadata]:
    return [
        EntryLogMetadata(0, 1, 1000, {1: 500}),  # 0.5
        EntryLogMetadata(0, 2, 1000, {1: 50}),  # 0.05
        EntryLogMetadata(1, 3, 1000, {1: 150}),  # 0.15
        EntryLogMetadata(0, 4, 1000, {1: 900}),  # 0.9
    ]


async def test_a_forced_major_compacts_below_its_threshold_lowest_usage_first(
    metadata, meta_settings
) -> None:
    await create(metadata, [1])
    store = FakeStore([1], logs())
    gc, events = collector(store, meta_settings, metadata)
    run = await gc.run_once(forced=True, force_major=True)
    assert store.compacted == [(0, 2), (1, 3), (0, 1)]
    assert (run.major, run.minor, run.entry_logs_compacted) == (True, False, 3)
    assert run.reclaimed_by_compaction_bytes == 950 + 850 + 500
    assert gc.stats.major_compaction_count == 1 and gc.stats.minor_compaction_count == 0
    compacted = [d for k, d in events if k == "gc.compacted"]
    assert [(d["log_id"], d["kind"], d["usage"]) for d in compacted] == [
        (2, "major", 0.05),
        (3, "major", 0.15),
        (1, "major", 0.5),
    ]
    reasons = [d["reason"] for k, d in events if k == "gc.entrylog_deleted"]
    assert reasons == ["compacted"] * 3
    details = gc.details()
    assert details["majorCompactionCounter"] == 1 and details["lastMajorCompactionTime"] > 0


async def test_a_compaction_lists_the_deleted_ledgers_whose_bytes_it_reclaimed(
    metadata, meta_settings
) -> None:
    await create(metadata, [1, 2, 3])
    await metadata.delete_ledger(2)
    await metadata.delete_ledger(3)
    store = FakeStore([1, 2, 3], [EntryLogMetadata(0, 1, 1000, {1: 100, 2: 300, 3: 500})])
    gc, events = collector(store, meta_settings, metadata)
    await gc.run_once(forced=True, force_major=True)
    assert store.compacted == [(0, 1)]
    [compacted] = [d for k, d in events if k == "gc.compacted"]
    assert compacted["ledgers"] == {"3": 500, "2": 300} and not compacted["ledgers_truncated"]
    assert list(compacted["ledgers"]) == ["3", "2"]  # the largest first
    # The compacted log's deletion leaves them to gc.compacted: listed once, counted once.
    [deleted] = [d for k, d in events if k == "gc.entrylog_deleted"]
    assert deleted["reason"] == "compacted" and deleted["ledgers"] == {}


async def test_a_forced_gc_without_flags_compacts_nothing(metadata, meta_settings) -> None:
    await create(metadata, [1])
    store = FakeStore([1], logs())
    gc, _ = collector(store, meta_settings, metadata)
    run = await gc.run_once(forced=True)
    assert store.compacted == [] and not run.major and not run.minor


async def test_compaction_follows_its_intervals(metadata, meta_settings) -> None:
    await create(metadata, [1])
    store = FakeStore([1], logs())
    clock = Clock()
    gc, _ = collector(store, meta_settings, metadata, clock)
    assert (await gc.run_once()).minor is False  # an interval after the start, not before
    clock.now_ms += HOUR_MS + 1
    run = await gc.run_once()
    assert run.minor and store.compacted == [(0, 2), (1, 3)]  # below 0.2 only
    run = await gc.run_once()
    assert not run.minor  # the clock moved with that run
    clock.now_ms += 24 * HOUR_MS
    assert (await gc.run_once()).major


async def test_the_time_limit_stops_compaction(metadata, meta_settings) -> None:
    await create(metadata, [1])
    store = FakeStore([1], logs())
    clock = Clock()

    def slow() -> None:
        clock.now_ms += 600

    store.on_compact = slow
    gc, _ = collector(store, meta_settings, metadata, clock, major_compaction_max_time_ms=1000)
    run = await gc.run_once(forced=True, force_major=True)
    # The first log takes 600 ms, the second passes the 1000 ms limit and is abandoned.
    assert store.compacted == [(0, 2)] and run.entry_logs_compacted == 1


async def test_suspending_during_a_compaction_stops_it(metadata, meta_settings) -> None:
    await create(metadata, [1])
    store = FakeStore([1], logs())
    clock = Clock()
    gc, _ = collector(store, meta_settings, metadata, clock)
    clock.now_ms += 25 * 24 * HOUR_MS  # both kinds due

    def operator_suspends() -> None:
        if store.compacted:
            gc.set_suspended(major=True)

    store.on_compact = operator_suspends
    run = await gc.run_once()
    assert run.major and store.compacted == [(0, 2)]
    assert gc.details()["suspendMajor"] is True
    clock.now_ms += HOUR_MS + 1  # the major run moved the minor clock too
    run = await gc.run_once()
    assert run.minor and not run.major  # major suspended: the minor one runs instead


@pytest.mark.parametrize(("allow", "compacted"), [(False, []), (True, [(0, 2), (1, 3), (0, 1)])])
async def test_a_full_disk_suspends_compaction_unless_force_gc_is_allowed(
    metadata, meta_settings, allow, compacted
) -> None:
    await create(metadata, [1])
    store = FakeStore([1], logs())
    clock = Clock()
    gc, _ = collector(
        store,
        meta_settings,
        metadata,
        clock,
        disk_used=0.99,
        is_force_gc_allow_when_no_space=allow,
    )
    clock.now_ms += 25 * 24 * HOUR_MS  # both kinds due
    await gc.run_once()
    assert gc.disk_full
    assert store.compacted == compacted


async def test_explain_says_what_pins_each_log_and_what_happens_next(
    metadata, meta_settings
) -> None:
    store = FakeStore([1, 2], [EntryLogMetadata(0, 1, 1000, {1: 50, 2: 100})])
    gc, _ = collector(store, meta_settings, metadata)
    gc.set_suspended(major=True)
    explained = gc.explain()
    sealed, current = explained["logs"]
    assert sealed["ledgers"] == [{"ledger_id": 2, "bytes": 100}, {"ledger_id": 1, "bytes": 50}]
    assert (sealed["usage"], sealed["next_minor"], sealed["next_major"]) == (
        0.15,
        "compact: usage 0.15 < 0.2",
        "suspended",
    )
    assert current["current"] and current["next_minor"] == "current log: never compacted"
    assert explained["suspendMajor"] and not explained["suspendMinor"]
    assert explained["next_minor_ms"] == 1_000_000 + HOUR_MS


# -- traces ---------------------------------------------------------------------------------


async def test_a_run_is_a_background_trace_with_its_listing_deletion_and_compactions(
    metadata, meta_settings
) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from shared import telemetry

    exporter = InMemorySpanExporter()
    # The default sampler (a 0.1 % ratio): a GC run is recorded all the same.
    provider = telemetry.build_provider("ledgerstore", bookie_id="bookie-1", environ={})
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install_provider(provider)
    try:
        await create(metadata, [1, 2])
        await metadata.delete_ledger(2)
        store = FakeStore([1, 2], logs())
        gc, _ = collector(store, meta_settings, metadata)
        await gc.run_once(forced=True, force_major=True)
    finally:
        telemetry.install_provider(None)
    spans = exporter.get_finished_spans()
    (run,) = [s for s in spans if s.name == "gc.run"]
    assert run.parent is None and run.attributes["quire.bookie_id"] == "bookie-1"
    assert run.attributes["quire.gc.ledgers_deleted"] == 1
    assert run.attributes["quire.gc.entry_logs_compacted"] == 3
    children = [s for s in spans if s.parent and s.parent.span_id == run.context.span_id]
    assert [s.name for s in children] == [
        "gc.list_ledgers",
        "gc.verify_ledgers",
        "gc.delete_ledgers",
        "gc.delete_entry_logs",
        "compaction.run",
        "compaction.run",
        "compaction.run",
    ]
    listing = children[0]
    requests = [s for s in spans if s.parent and s.parent.span_id == listing.context.span_id]
    assert requests and all(s.name.startswith("send ") for s in requests)
    compactions = [
        (s.attributes["quire.log_id"], s.attributes["quire.usage"]) for s in children[4:]
    ]
    assert compactions == [(2, 0.05), (3, 0.15), (1, 0.5)]
    assert all(s.attributes["quire.bytes"] == 1000 for s in children[4:])
    assert children[2].attributes["quire.ledgers"] == 1
