"""The outbox publisher: stored changes -> events on JetStream and ledger watch
notifications, in outbox order, exactly once.

Every metadata instance runs one; the store's outbox lock lets one publish at a time (in
PostgreSQL a session advisory lock, released when its connection dies). The leader reads
a batch, publishes it pipelined with `Nats-Msg-Id` = the change's event id, waits for
every acknowledgement, and only then marks the batch published. A crash or a NATS outage
between publish and mark republishes the batch with the same ids, and JetStream drops
the copies (its duplicate window, 120 s for the events stream). A failed batch is retried
as a whole, never skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from nats.aio.client import Client as NatsClient

from services.metadata import core
from services.metadata.core import OutboxRecord
from services.metadata.store import MetadataStore, OutboxReader, StoreError
from shared.aio import wait_event
from shared.events import Event
from shared.natsfast import publish_soon
from shared.subjects import Subjects

log = logging.getLogger(__name__)

# How long a publisher that does not hold the lock waits before trying again: the longest
# an instance's death leaves events unpublished.
STANDBY_RETRY_S = 1.0
# Back-off after a failed publish or a PostgreSQL error (doubles up to the maximum).
RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0


class OutboxPublisher:
    def __init__(
        self,
        store: MetadataStore,
        nc: NatsClient,
        subjects: Subjects,
        source: str,
        *,
        batch_size: int,
        poll_interval_ms: int,
        ack_timeout_s: float = 5.0,
    ) -> None:
        self._store = store
        self._nc = nc
        self._js = nc.jetstream()
        self._subjects = subjects
        self._source = source
        self._batch_size = batch_size
        self._poll_interval_s = poll_interval_ms / 1000
        self._ack_timeout_s = ack_timeout_s
        self._wake = asyncio.Event()
        self.is_leader = False
        self.published = 0  # events acknowledged by JetStream
        self.failures = 0

    def poke(self) -> None:
        """Something was committed: look now instead of at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        """Forever: hold the lock and publish, or wait for whoever holds it to die."""
        delay_s = RETRY_MIN_S
        while True:
            try:
                async with self._store.outbox() as reader:
                    if reader is None:
                        await asyncio.sleep(STANDBY_RETRY_S)
                        continue
                    self.is_leader = True
                    log.info("outbox publisher leads")
                    await self._lead(reader)
            except StoreError as exc:
                self.failures += 1
                log.warning("outbox publisher lost PostgreSQL", extra={"err": str(exc)})
                await asyncio.sleep(delay_s)
                delay_s = min(RETRY_MAX_S, delay_s * 2)
            finally:
                self.is_leader = False

    async def _lead(self, reader: OutboxReader) -> None:
        published: Sequence[OutboxRecord] = ()
        while True:
            self._wake.clear()
            # The batch just acknowledged is marked published by the read of the next one
            # (one round trip): at once, as a separate mark would be.
            records = await reader.fetch(self._batch_size, published)
            published = ()
            if not records:
                await wait_event(self._wake, self._poll_interval_s)
                continue
            await self._publish_until_acknowledged(reader.instance_id, records)
            published = records

    async def _publish_until_acknowledged(
        self, instance_id: str, records: Sequence[OutboxRecord]
    ) -> None:
        delay_s = RETRY_MIN_S
        while True:
            try:
                await self.publish(instance_id, records)
                return
            except Exception as exc:  # NATS down or JetStream unavailable: same batch again
                self.failures += 1
                log.warning("outbox publish failed", extra={"err": repr(exc)})
                await asyncio.sleep(delay_s)
                delay_s = min(RETRY_MAX_S, delay_s * 2)

    async def publish(self, instance_id: str, records: Sequence[OutboxRecord]) -> None:
        """Publish `records` in order, pipelined; return once JetStream acknowledged every
        event, then send the watch notifications. Raises if any is not acknowledged."""
        acks = []
        watches = []
        for record in records:
            events, watch = core.outbox_events(record)
            for index, spec in enumerate(events):
                event = Event(
                    event_id=core.event_id(instance_id, record.outbox_id, index),
                    kind=spec.kind,
                    ts_ms=record.ts_ms,
                    source=self._source,
                    ledger_id=record.ledger_id,
                    bookie_id=record.bookie_id,
                    data=spec.data,
                )
                acks.append(
                    await self._js.publish_async(
                        self._subjects.event(spec.kind),
                        event.model_dump_json().encode(),
                        headers={"Nats-Msg-Id": event.event_id},
                    )
                )
            if watch is not None:
                watches.append(watch)
        try:
            await asyncio.wait_for(asyncio.gather(*acks), self._ack_timeout_s)
        except BaseException:
            for ack in acks:
                ack.cancel()
            raise
        self.published += len(acks)
        for watch in watches:
            # Core NATS, best effort: watchers re-read when they must be sure. Queued in the
            # client's pending buffer without an await (`publish_soon`): the batch's
            # notifications go out in one socket write at the end of this turn.
            publish_soon(
                self._nc,
                self._subjects.ledger_watch(watch.ledger_id),
                watch.model_dump_json().encode(),
            )
