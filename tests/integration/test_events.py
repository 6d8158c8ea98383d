"""The event publisher over a real JetStream: nothing is lost while JetStream is away (the
stream deleted, or the nats-server stopped), nothing is stored twice, order is kept; a
full buffer drops the newest events, counts them and reports them in an `events.dropped`
event whose seq gap a reader can check; a new publisher starts a new (boot_id, seq)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from quire.infra import start_nats
from shared.config import QuireSettings
from shared.events import Backoff, EventPublisher, ensure_event_stream
from shared.metrics import MetricsRegistry, events_metrics
from shared.subjects import Subjects
from tests.support.events import stream_events
from tests.support.wait import until


@pytest.fixture
def subjects(settings: QuireSettings) -> Subjects:
    return Subjects(settings.subject_prefix)


@pytest.fixture
async def publisher(nc, subjects: Subjects) -> AsyncIterator[EventPublisher]:
    js = nc.jetstream()
    await ensure_event_stream(js, subjects)
    # A short backoff cap: the test's outages end sooner than 5 s of backoff would notice.
    events = EventPublisher(js, subjects, "test-1.events", queue_size=3, backoff=Backoff(0.05, 0.2))
    events.start()
    yield events
    await events.close(timeout_s=1)
    await js.delete_stream(subjects.event_stream)


async def test_events_emitted_while_the_stream_is_gone_all_arrive_after_in_order_once(
    nc, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await ensure_event_stream(js, subjects)
    events = EventPublisher(js, subjects, "test-1.events", backoff=Backoff(0.05, 0.2))
    events.start()
    try:
        events.emit("test.first", n=0)
        await until(lambda: events.stats.published == 1, "the first event published")
        await js.delete_stream(subjects.event_stream)
        for n in range(1, 21):
            events.emit("test.a" if n % 2 else "test.b", n=n)
        await until(lambda: events.stats.retries >= 3, "publishes failing")
        assert events.stats.buffered == 20
        await ensure_event_stream(js, subjects)
        await until(lambda: events.stats.buffered == 0, "the buffer drained")
        stored = await stream_events(js, subjects)
        # The stream was recreated: what was published before is gone with the old one.
        assert [e["data"]["n"] for e in stored] == list(range(1, 21))
        assert [e["seq"] for e in stored] == list(range(2, 22))
        assert len({e["event_id"] for e in stored}) == 20
        assert {e["boot_id"] for e in stored} == {events.boot_id}
        assert events.stats.dropped_by_kind == {}
    finally:
        await events.close(timeout_s=1)
        await js.delete_stream(subjects.event_stream)


async def test_events_emitted_while_nats_is_down_are_stored_once_in_order(tmp_path: Path) -> None:
    server = await asyncio.to_thread(start_nats, tmp_path / "nats")
    port = int(server.url.rsplit(":", 1)[1])
    subjects = Subjects("eventsnats")
    nc = await nats.connect(
        server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2
    )
    js = nc.jetstream()
    events = EventPublisher(js, subjects, "test-1.events", backoff=Backoff(0.05, 0.2))
    try:
        await ensure_event_stream(js, subjects)
        events.start()
        events.emit("test.before", n=0)
        await until(lambda: events.stats.published == 1, "the first event published")
        await asyncio.to_thread(server.stop)
        for n in range(1, 11):
            events.emit("test.during", n=n)
        await until(lambda: events.stats.retries >= 1, "a publish failing")
        server = await asyncio.to_thread(start_nats, tmp_path / "nats", port)
        await until(lambda: events.stats.buffered == 0, "the buffer drained", timeout_s=60)
        stored = await stream_events(js, subjects)
        # Publishes the client buffered while disconnected and their retries carry the
        # same message id: JetStream stored each once.
        assert [e["data"]["n"] for e in stored] == list(range(11))
        assert [e["seq"] for e in stored] == list(range(1, 12))
        assert events.stats.published == 11
    finally:
        await events.close(timeout_s=1)
        await nc.close()
        await asyncio.to_thread(server.stop)


async def test_a_full_buffer_drops_the_newest_counts_and_reports_them(
    nc, subjects: Subjects, publisher: EventPublisher
) -> None:
    js = nc.jetstream()
    metrics = MetricsRegistry()
    metrics.add(events_metrics(publisher.stats))
    await js.delete_stream(subjects.event_stream)
    for n in range(1, 11):
        publisher.emit("test.a" if n % 3 else "test.b", n=n)
    assert publisher.stats.buffered == 3
    assert publisher.stats.dropped_by_kind == {"test.a": 5, "test.b": 2}
    scrape = metrics.scrape()
    assert scrape.value("quire_events_dropped_total", kind="test.a") == 5
    assert scrape.value("quire_events_dropped_total", kind="test.b") == 2
    assert scrape.value("quire_events_buffered") == 3

    await ensure_event_stream(js, subjects)
    await until(lambda: publisher.stats.published == 4, "the buffer and the report published")
    stored = await stream_events(js, subjects)
    assert [e["kind"] for e in stored] == ["test.a", "test.a", "test.b", "events.dropped"]
    assert [e["data"].get("n") for e in stored[:3]] == [1, 2, 3]
    report = stored[3]
    assert report["seq"] == 11
    assert report["data"] == {
        "dropped": 7,
        "by_kind": {"test.a": 5, "test.b": 2},
        "first_seq": 4,
        "last_seq": 10,
    }
    # What a reader of the stream counts as lost is what the publisher dropped.
    seqs = {e["seq"] for e in stored}
    assert set(range(1, max(seqs) + 1)) - seqs == set(range(4, 11))
    scrape = metrics.scrape()
    assert scrape.value("quire_events_published_total") == 4
    assert scrape.value("quire_events_publish_retries_total") >= 1
    assert scrape.value("quire_events_buffered") == 0


async def test_a_new_publisher_has_a_new_boot_id_and_counts_from_one(
    nc, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await ensure_event_stream(js, subjects)
    boots = []
    try:
        for _ in range(2):
            events = EventPublisher(js, subjects, "test-1.events")
            events.start()
            events.emit("test.a")
            events.emit("test.b")
            await events.close()
            boots.append(events.boot_id)
        stored = await stream_events(js, subjects)
        assert boots[0] != boots[1]
        assert [(e["source"], e["boot_id"], e["seq"]) for e in stored] == [
            ("test-1.events", boots[0], 1),
            ("test-1.events", boots[0], 2),
            ("test-1.events", boots[1], 1),
            ("test-1.events", boots[1], 2),
        ]
    finally:
        await js.delete_stream(subjects.event_stream)
