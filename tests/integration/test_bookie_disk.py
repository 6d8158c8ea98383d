"""Disk usage thresholds: above diskUsageThreshold the bookie turns read-only (registered
as such in metadata, adds answer READ_ONLY, reads keep working, recovery adds are taken
while the disk keeps min_usable_size_for_high_priority_writes_bytes free); below the
low-water mark it turns writable again. The disk usage source is the test's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.journal import service as journal_service
from shared import wire
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.models import BookieState
from shared.service import ServiceRuntime
from shared.status import BookieStatus
from shared.subjects import Subjects
from tests.integration.test_bookie import KEY, Bookie, frame
from tests.support.inprocess import running_service


class FakeDisk:
    def __init__(self) -> None:
        self.used_fraction = 0.5

    def __call__(self, path: Path) -> tuple[int, int]:
        return int(self.used_fraction * 1000), 1000


async def wait_for(predicate, what: str) -> None:
    for _ in range(400):
        if await predicate():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"timed out waiting for {what}")


async def test_disk_thresholds_turn_the_bookie_read_only_and_back(
    nc, settings: QuireSettings, fresh_database_url: str
) -> None:
    settings = settings.model_copy(
        update={
            "database_url": fresh_database_url,
            "ledgerstore": settings.ledgerstore.model_copy(
                update={
                    "disk_check_interval_ms": 20,
                    "flush_interval_ms": 50,
                    # The fake disk has 1000 bytes: at 97 % used, 30 are free.
                    "min_usable_size_for_high_priority_writes_bytes": 20,
                }
            ),
        }
    )
    disk = FakeDisk()
    client = Bookie(nc, settings)
    meta = MetadataClient(nc, Subjects(settings.subject_prefix))
    rt = ServiceRuntime("journal", settings, "journal")
    async with running_service("metadata", settings):
        await rt.start()
        try:
            await journal_service.main(rt, disk_usage=disk)
            async with running_service("ledgerstore", settings):
                await exercise(client, meta, settings, disk)
            metrics = rt.metrics.scrape()  # type: ignore[attr-defined]
            assert metrics.value("quire_journal_add_rejected_total", status="READ_ONLY") >= 4
            refused = metrics.value("bookkeeper_server_ADD_ENTRY_REQUEST_count", success="false")
            assert refused >= 4
        finally:
            rt.stop()
            await rt.shutdown()


async def exercise(client: Bookie, meta: MetadataClient, settings, disk: FakeDisk) -> None:
    async def state() -> BookieState | None:
        bookies = {b.bookie_id: b for b in await meta.list_bookies()}
        found = bookies.get(settings.bookie_id)
        return found.state if found else None

    await wait_for(lambda: _is(state, BookieState.WRITABLE), "registered writable")
    assert await client.add([frame(50, 0)]) == [BookieStatus.OK]

    disk.used_fraction = 0.97  # above diskUsageThreshold (0.95)
    await wait_for(lambda: _is(state, BookieState.READONLY), "registered read-only")
    assert await client.add([frame(50, 1, 0)]) == [BookieStatus.READ_ONLY]
    assert (await client.read([(50, 0)]))[0].status is BookieStatus.OK
    # A high-priority write (a recovery add: the replicator's) is still taken, next to a
    # normal add in the same request that is not.
    mixed = [
        wire.AddItem(wire.FLAG_RECOVERY_ADD, KEY, frame(51, 0)),
        wire.AddItem(0, KEY, frame(52, 0)),
    ]
    assert await client.add_items(mixed) == [BookieStatus.OK, BookieStatus.READ_ONLY]
    assert (await client.read([(51, 0)]))[0].status is BookieStatus.OK

    disk.used_fraction = 0.99  # 10 bytes free: below the high-priority minimum
    await wait_for(lambda: _refused_recovery(client), "recovery adds refused on a full disk")

    disk.used_fraction = 0.92  # between the marks: stays read-only (no flapping)
    await asyncio.sleep(0.2)
    assert await client.add([frame(50, 1, 0)]) == [BookieStatus.READ_ONLY]

    disk.used_fraction = 0.85  # below diskUsageLwmThreshold (0.90)
    await wait_for(lambda: _is(state, BookieState.WRITABLE), "writable again")
    assert await client.add([frame(50, 1, 0)]) == [BookieStatus.OK]


async def _refused_recovery(client: Bookie) -> bool:
    statuses = await client.add([frame(51, 1, 0)], flags=wire.FLAG_RECOVERY_ADD)
    return statuses == [BookieStatus.READ_ONLY]


async def _is(state, expected: BookieState) -> bool:
    return await state() is expected
