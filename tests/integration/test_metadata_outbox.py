"""The transactional outbox over real NATS and PostgreSQL: events in commit order, exactly
once, through service and NATS restarts; one publisher among many instances; ledger
watches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from quire.infra import start_nats
from services.metadata.outbox import OutboxPublisher
from services.metadata.postgres import PostgresMetadataStore
from shared.config import QuireSettings
from shared.events import ensure_event_stream
from shared.metaclient import MetadataClient
from shared.models import LedgerState, Segment, UpdateLedgerRequest
from shared.subjects import Subjects
from tests.support.events import stream_events
from tests.support.inprocess import running_service, wait_until_serving
from tests.support.metadata import ENSEMBLE, create_request


@pytest.fixture
async def store(fresh_database_url: str) -> AsyncIterator[PostgresMetadataStore]:
    opened = await PostgresMetadataStore.open(fresh_database_url, pool_size=4, timeout_s=5.0)
    yield opened
    await opened.close()


async def connect_nats(url: str, name: str):
    """A client that reconnects forever, as the services' own."""
    return await nats.connect(
        url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2
    )


async def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def publisher(store, nc, subjects: Subjects) -> OutboxPublisher:
    return OutboxPublisher(store, nc, subjects, "metadata", batch_size=4, poll_interval_ms=10)


async def test_restart_between_commit_and_publish_publishes_exactly_once(
    store: PostgresMetadataStore, settings: QuireSettings, nc
) -> None:
    subjects = Subjects(settings.subject_prefix)
    await ensure_event_stream(nc.jetstream(), subjects)
    for _ in range(6):
        await store.create_ledger(create_request(), 0)  # committed; no publisher yet
    # An instance publishes the first batch and dies before marking it published.
    async with store.outbox() as reader:
        assert reader is not None
        first = await reader.fetch(4)
        await publisher(store, nc, subjects).publish(reader.instance_id, first)
    assert len(await stream_events(nc.jetstream(), subjects)) == 4
    # The next one publishes everything still in the outbox: the first four again (same
    # Nats-Msg-Id, dropped by JetStream) and the rest.
    second = publisher(store, nc, subjects)
    task = asyncio.create_task(second.run())
    try:

        async def all_acknowledged() -> bool:
            return second.published >= 6

        await wait_for(all_acknowledged)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    async with store.outbox() as reader:
        assert reader is not None and await reader.fetch(10) == []  # all marked published
    events = await stream_events(nc.jetstream(), subjects)
    assert [(e["kind"], e["ledger_id"]) for e in events] == [
        ("ledger.created", i) for i in range(6)
    ]
    assert len({e["event_id"] for e in events}) == 6


@pytest.mark.slow
async def test_nats_restart_loses_and_duplicates_nothing(
    store: PostgresMetadataStore, tmp_path: Path
) -> None:
    server = await asyncio.to_thread(start_nats, tmp_path / "nats")
    port = int(server.url.rsplit(":", 1)[1])
    subjects = Subjects("outboxnats")
    nc = await connect_nats(server.url, "outbox-test")
    task = asyncio.create_task(publisher(store, nc, subjects).run())
    checker = None
    try:
        await ensure_event_stream(nc.jetstream(), subjects)
        for _ in range(5):
            await store.create_ledger(create_request(), 0)

        async def published(count: int):
            async def check() -> bool:
                async with store.outbox() as reader:
                    # The publisher holds the lock; the outbox drains when it is done.
                    assert reader is None
                return len(await stream_events(checker.jetstream(), subjects)) >= count

            return check

        checker = await nats.connect(server.url)
        await wait_for(await published(5))
        await checker.close()
        await asyncio.to_thread(server.stop)
        for _ in range(5):
            await store.create_ledger(create_request(), 0)  # committed while NATS is down
        server = await asyncio.to_thread(start_nats, tmp_path / "nats", port)
        checker = await connect_nats(server.url, "checker")
        await wait_for(await published(10), timeout_s=30)
        await asyncio.sleep(0.5)  # nothing more comes
        events = await stream_events(checker.jetstream(), subjects)
        assert [e["ledger_id"] for e in events] == list(range(10))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for client in (nc, checker):
            if client is not None and not client.is_closed:
                await client.close()
        await asyncio.to_thread(server.stop)


async def test_instances_share_one_publisher_and_keep_order(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    meta_settings = settings.model_copy(update={"database_url": fresh_database_url})
    subjects = Subjects(meta_settings.subject_prefix)
    client = MetadataClient(nc, subjects)
    async with (
        running_service("metadata", meta_settings, "metadata-1") as one,
        running_service("metadata", meta_settings, "metadata-2") as two,
    ):
        await wait_until_serving(client)
        ledgers = [await client.create_ledger(create_request()) for _ in range(30)]
        for ledger in ledgers[:10]:
            await client.update_ledger(
                UpdateLedgerRequest(
                    ledger_id=ledger.ledger_id,
                    expected_version=0,
                    state=LedgerState.CLOSED,
                    last_entry_id=-1,
                    length=0,
                )
            )

        async def all_there() -> bool:
            return len(await stream_events(nc.jetstream(), subjects)) >= 40

        await wait_for(all_there)
        leaders = [rt.outbox_publisher.is_leader for rt in (one, two)]
        assert sorted(leaders) == [False, True]
    events = await stream_events(nc.jetstream(), subjects)
    assert [(e["kind"], e["ledger_id"]) for e in events] == [
        ("ledger.created", i) for i in range(30)
    ] + [("ledger.closed", i) for i in range(10)]


async def test_watch_ledger_sees_every_change_then_the_delete(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    meta_settings = settings.model_copy(update={"database_url": fresh_database_url})
    client = MetadataClient(nc, Subjects(meta_settings.subject_prefix))
    async with running_service("metadata", meta_settings):
        await wait_until_serving(client)
        ledger = await client.create_ledger(create_request())
        seen: list = []
        watching = asyncio.Event()

        async def watch() -> None:
            async for metadata in client.watch_ledger(ledger.ledger_id):
                seen.append(metadata)
                watching.set()

        task = asyncio.create_task(watch())
        await asyncio.wait_for(watching.wait(), 10)
        changed = await client.update_ledger(
            UpdateLedgerRequest(
                ledger_id=ledger.ledger_id,
                expected_version=0,
                segments=[
                    Segment(first_entry_id=0, bookies=ENSEMBLE),
                    Segment(first_entry_id=3, bookies=["bookie-1", "bookie-2", "bookie-4"]),
                ],
            )
        )
        closed = await client.update_ledger(
            UpdateLedgerRequest(
                ledger_id=ledger.ledger_id,
                expected_version=1,
                state=LedgerState.CLOSED,
                last_entry_id=2,
                length=30,
            )
        )
        await client.delete_ledger(ledger.ledger_id)
        await asyncio.wait_for(task, 10)
    assert seen == [ledger, changed, closed, None]
