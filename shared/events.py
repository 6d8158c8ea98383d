"""Domain events: JSON on the JetStream stream QUIRE_EVENTS, read by Spark and anyone.

Every event has a schema version, a timestamp, its kind, its source and its ids. The
publisher buffers events (bounded) and publishes them in the background, in emit order, so
that a slow or restarting NATS never stalls the data path. An event it cannot publish stays
at the head of the buffer and is retried with backoff (0.1 s doubling to 5 s) under the same
`Nats-Msg-Id` (its `event_id`) for as long as it takes. Only a full buffer drops events, the
newly emitted ones: what is buffered keeps its place, and the story's start (a bookie lost
when NATS went away) is worth more to the SLA jobs than its repeats. Drops are counted (the
metrics in shared/metrics.py) and, once a publish succeeds again, reported by an
`events.dropped` event.

Completeness: each event carries `boot_id` (random per publisher, i.e. per process start)
and `seq` (1, 2, 3... per publisher, dropped events included), so a reader counts what it
lacks from each (source, boot_id) as the gaps in seq. JetStream deduplicates a retry only
within the stream's duplicate window (120 s): a retry of a publish whose acknowledgement was
lost more than 120 s earlier is stored twice, so readers deduplicate on `event_id`.

An event emitted in a sampled span is published in a PRODUCER span of that trace (its
retries included), and carries its `traceparent` to the consumers (who link to it: see
`telemetry.nats_consumer_span`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError
from opentelemetry.trace import SpanContext
from pydantic import BaseModel, Field

from shared import clock
from shared.subjects import Subjects
from shared.telemetry import current_span_context, inject_headers, nats_client_span

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)


class Event(BaseModel):
    schema_version: int = SCHEMA_VERSION
    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    kind: str  # dotted, e.g. "ledger.created"
    ts_ms: int = Field(default_factory=clock.wall_ms)
    source: str  # the service instance, e.g. "bookie-1.journal"
    ledger_id: int | None = None
    bookie_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    # Added in schema version 1 without a bump (optional, so every older reader and event
    # stays valid): None in events not published by an EventPublisher (the metadata outbox).
    seq: int | None = None  # 1, 2, 3... per (source, boot_id); a gap is a lost event
    boot_id: str | None = None  # random per publisher instance (per process start)


async def ensure_event_stream(js: JetStreamContext, subjects: Subjects, replicas: int = 1) -> None:
    """Create the events stream if it is missing (idempotent, safe to race), with `replicas`
    copies on a NATS cluster (`QuireSettings.event_stream_replicas`)."""
    config = StreamConfig(
        name=subjects.event_stream,
        subjects=[subjects.events_wildcard],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=7 * 24 * 3600.0,
        duplicate_window=120.0,
        num_replicas=replicas,
    )
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        # Another service created it first, perhaps with other limits: use it as it is.
        if "already in use" not in str(exc):
            raise


@dataclass
class EventStats:
    """The publisher's counters, read by the metrics builders at scrape time."""

    published: int = 0
    retries: int = 0  # failed publish attempts (each is retried)
    buffered: int = 0
    dropped_by_kind: dict[str, int] = field(default_factory=dict)


class Backoff:
    """Delays between retries of one event: `initial_s` doubling up to `max_s`."""

    def __init__(self, initial_s: float = 0.1, max_s: float = 5.0) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._next = initial_s

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.initial_s


@dataclass
class Drops:
    """Events dropped since the last `events.dropped` report."""

    count: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    first_seq: int | None = None
    last_seq: int | None = None

    def add(self, kind: str, seq: int) -> None:
        self.count += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if self.first_seq is None:
            self.first_seq = seq
        self.last_seq = seq

    def report(self) -> dict[str, Any]:
        return {
            "dropped": self.count,
            "by_kind": dict(self.by_kind),
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
        }


DROPPED_KIND = "events.dropped"


class EventPublisher:
    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        source: str,
        queue_size: int = 10_000,
        backoff: Backoff | None = None,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._source = source
        self._capacity = queue_size
        self._backoff = backoff or Backoff()
        self.boot_id = uuid.uuid4().hex
        self._seq = 0
        # Each event with the span it was emitted in: it is published later, elsewhere.
        # Holds at most `queue_size` events plus one `events.dropped` report (its room).
        self._buffer: deque[tuple[Event, SpanContext | None]] = deque()
        self._report_buffered = False
        self._drops = Drops()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.stats = EventStats()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-publisher")

    def emit(
        self,
        kind: str,
        /,
        *,
        ledger_id: int | None = None,
        bookie_id: str | None = None,
        **data: Any,
    ) -> None:
        # `kind` is positional-only: an event's data may have a "kind" of its own
        # (gc.compacted's "major"/"minor").
        event = self._event(kind, ledger_id=ledger_id, bookie_id=bookie_id, data=data)
        if len(self._buffer) - self._report_buffered >= self._capacity:
            self._drops.add(kind, self._seq)
            self.stats.dropped_by_kind[kind] = self.stats.dropped_by_kind.get(kind, 0) + 1
            return
        self._append(event, current_span_context())

    def _event(self, kind: str, **fields: Any) -> Event:
        self._seq += 1
        return Event(kind=kind, source=self._source, seq=self._seq, boot_id=self.boot_id, **fields)

    def _append(self, event: Event, emitted_in: SpanContext | None) -> None:
        self._buffer.append((event, emitted_in))
        self.stats.buffered = len(self._buffer)
        self._idle.clear()
        self._wake.set()

    async def _run(self) -> None:
        while True:
            if not self._buffer:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            event, emitted_in = self._buffer[0]
            if emitted_in is None:
                await self._publish(event)
            else:
                subject = self._subjects.event(event.kind)
                with nats_client_span(subject, operation="publish", parent=emitted_in):
                    await self._publish(event)
            self._buffer.popleft()
            self.stats.buffered = len(self._buffer)
            if event.kind == DROPPED_KIND:
                self._report_buffered = False
            # Publishing works: report what was dropped, in its place in seq order (after
            # what is buffered), in the room kept for it. One report at a time; drops while
            # it waits go into the next.
            if self._drops.count and not self._report_buffered:
                report = self._event(DROPPED_KIND, data=self._drops.report())
                log.warning("events dropped: the buffer was full", extra=report.data)
                self._drops = Drops()
                self._report_buffered = True
                self._append(report, None)

    async def _publish(self, event: Event) -> None:
        """Publish `event`, retrying until JetStream acknowledges it (the same message id
        every time, so that JetStream stores one copy)."""
        payload = event.model_dump_json().encode()
        subject = self._subjects.event(event.kind)
        self._backoff.reset()
        while True:
            try:
                await self._js.publish(
                    subject,
                    payload,
                    headers=inject_headers({"Nats-Msg-Id": event.event_id}),
                    timeout=5,
                )
                self.stats.published += 1
                return
            except Exception as exc:  # NATS down or JetStream unavailable: retry
                self.stats.retries += 1
                delay = self._backoff.next()
                log.warning(
                    "event publish failed, retrying",
                    extra={"kind": event.kind, "err": repr(exc), "retry_in_s": delay},
                )
                await asyncio.sleep(delay)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Publish what is buffered (up to `timeout_s`), then stop."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning(
                "events left unpublished at shutdown",
                extra={"count": len(self._buffer), "dropped_unreported": self._drops.count},
            )
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
