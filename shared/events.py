"""Domain events: JSON on the JetStream stream QUIRE_EVENTS, read by Spark and anyone.

Every event has a schema version, a timestamp, its kind, its source and its ids. The
publisher queues events (bounded) and publishes them in the background, so that a slow
or restarting NATS never stalls the data path; what it had to drop it counts. An event
emitted in a sampled span is published in a PRODUCER span of that trace, and carries its
`traceparent` to the consumers (who link to it: see `telemetry.nats_consumer_span`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError
from opentelemetry.trace import SpanContext
from pydantic import BaseModel, Field

from shared.subjects import Subjects
from shared.telemetry import current_span_context, inject_headers, nats_client_span

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)


class Event(BaseModel):
    schema_version: int = SCHEMA_VERSION
    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    kind: str  # dotted, e.g. "ledger.created"
    ts_ms: int = Field(default_factory=lambda: int(time.time() * 1000))
    source: str  # the service instance, e.g. "bookie-1.journal"
    ledger_id: int | None = None
    bookie_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


async def ensure_event_stream(js: JetStreamContext, subjects: Subjects) -> None:
    """Create the events stream if it is missing (idempotent, safe to race)."""
    config = StreamConfig(
        name=subjects.event_stream,
        subjects=[subjects.events_wildcard],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=7 * 24 * 3600.0,
        duplicate_window=120.0,
    )
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        # Another service created it first, perhaps with other limits: use it as it is.
        if "already in use" not in str(exc):
            raise


class EventPublisher:
    def __init__(
        self, js: JetStreamContext, subjects: Subjects, source: str, queue_size: int = 10_000
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._source = source
        # Each event with the span it was emitted in: it is published later, elsewhere.
        self._queue: asyncio.Queue[tuple[Event, SpanContext | None]] = asyncio.Queue(
            maxsize=queue_size
        )
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.dropped = 0

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
        event = Event(
            kind=kind, source=self._source, ledger_id=ledger_id, bookie_id=bookie_id, data=data
        )
        try:
            self._queue.put_nowait((event, current_span_context()))
        except asyncio.QueueFull:
            self.dropped += 1

    async def _run(self) -> None:
        while True:
            event, emitted_in = await self._queue.get()
            if emitted_in is None:
                await self._publish(event)
            else:
                subject = self._subjects.event(event.kind)
                with nats_client_span(subject, operation="publish", parent=emitted_in):
                    await self._publish(event)
            self._queue.task_done()

    async def _publish(self, event: Event) -> None:
        payload = event.model_dump_json().encode()
        for attempt in range(5):
            try:
                await self._js.publish(
                    self._subjects.event(event.kind),
                    payload,
                    headers=inject_headers({"Nats-Msg-Id": event.event_id}),
                    timeout=5,
                )
                self.published += 1
                return
            except Exception as exc:  # NATS down or JetStream unavailable: retry, then drop
                log.warning(
                    "event publish failed",
                    extra={"kind": event.kind, "err": repr(exc), "attempt": attempt},
                )
                await asyncio.sleep(0.2 * (attempt + 1))
        self.dropped += 1

    async def close(self, timeout_s: float = 5.0) -> None:
        """Publish what is queued (up to `timeout_s`), then stop."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            log.warning("events left unpublished at shutdown", extra={"count": self._queue.qsize()})
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
