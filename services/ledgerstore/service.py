"""The ledgerstore service: serves reads of one bookie's entries on NATS.

Endpoints on `<prefix>.bookie.<bookie_id>.<op>`:
    read               batch of (ledger, entry) -> stored frames (NO_ENTRY if absent)
    read_lac           a ledger's LAC and last stored entry (NO_LEDGER if unknown)
    ledgerstore.stats  JSON counters
Background: apply the journal when it announces a commit (`journal.committed`) or every
`journal_poll_interval_ms`; checkpoint every `flush_interval_ms` and hand the position to
the journal (`journal.checkpoint`) as its LastLogMark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import asdict

from nats.micro.request import Request

from services.journal.core import JournalFormatError, JournalPosition
from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.service import ServiceRuntime
from shared.status import BookieStatus
from shared.subjects import JOURNAL_CHECKPOINT, JOURNAL_COMMITTED

log = logging.getLogger(__name__)


class LedgerstoreService:
    def __init__(self, rt: ServiceRuntime) -> None:
        self.rt = rt
        self.settings = rt.settings.ledgerstore
        self.bookie_id = rt.settings.bookie_id
        self.store = LedgerStore(rt.settings.bookie_dir, self.settings)
        self._journal_committed = asyncio.Event()

    async def handle_read(self, request: Request) -> None:
        try:
            items = wire.decode_read_request(request.data)
        except wire.WireError as exc:
            log.warning("bad read request", extra={"err": str(exc)})
            await request.respond(wire.encode_read_reply(BookieStatus.BAD_REQUEST, []))
            return
        results = await self.store.read(items)
        await request.respond(wire.encode_read_reply(BookieStatus.OK, results))

    async def handle_read_lac(self, request: Request) -> None:
        try:
            ledger_id = wire.decode_read_lac_request(request.data)
        except wire.WireError as exc:
            log.warning("bad read_lac request", extra={"err": str(exc)})
            await request.respond(wire.encode_lac_reply(wire.LacReply(BookieStatus.BAD_REQUEST)))
            return
        await request.respond(wire.encode_lac_reply(await self.store.read_lac(ledger_id)))

    async def handle_stats(self, request: Request) -> None:
        data = asdict(self.store.stats)
        data.update(
            applied=self.store.applied.to_json(),
            checkpointed=self.store.checkpointed.to_json() if self.store.checkpointed else None,
            ledgers=len(self.store.ledgers),
            damaged=self.store.damaged,
            entry_log=self.store.logger.log_id,
        )
        await request.respond(json.dumps(data).encode())

    async def on_committed(self, msg) -> None:
        try:
            position = JournalPosition.from_json(json.loads(msg.data))
        except (ValueError, KeyError, TypeError, JournalFormatError):
            log.warning("bad journal.committed notification", extra={"data": msg.data[:100]})
            return
        self.store.journal_durable(position)
        self._journal_committed.set()

    async def follow_journal(self) -> None:
        """Apply what the journal commits, promptly on its notification, else by polling."""
        poll_s = self.settings.journal_poll_interval_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._journal_committed.wait(), poll_s)
            self._journal_committed.clear()
            await self.store.catch_up()

    async def checkpoint_forever(self) -> None:
        interval_s = self.settings.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self.checkpoint()

    async def checkpoint(self) -> None:
        position = await self.store.checkpoint()
        if position is None and self.store.checkpointed is None:
            return
        mark = position or self.store.checkpointed
        assert mark is not None
        subject = self.rt.subjects.bookie(self.bookie_id, JOURNAL_CHECKPOINT)
        try:
            # Repeated even when nothing changed: a journal that restarted learns the mark.
            msg = await self.rt.nc.request(
                subject,
                json.dumps(mark.to_json()).encode(),
                timeout=self.rt.settings.request_timeout_ms / 1000,
            )
            reply = json.loads(msg.data)
            if not reply.get("ok"):
                log.warning("journal refused checkpoint", extra={"reply": reply})
        except Exception as exc:  # journal down or restarting: the next checkpoint retries
            log.info("journal checkpoint not delivered", extra={"err": repr(exc)})


async def main(rt: ServiceRuntime) -> None:
    service = LedgerstoreService(rt)
    await service.store.open()
    rt.on_shutdown(service.store.close)
    bookie = rt.settings.bookie_id
    sub = await rt.nc.subscribe(
        rt.subjects.bookie(bookie, JOURNAL_COMMITTED), cb=service.on_committed
    )
    rt.on_shutdown(sub.unsubscribe)
    await service.store.catch_up()
    rt.spawn(service.follow_journal(), "follow-journal")
    rt.spawn(service.checkpoint_forever(), "checkpoint")
    await rt.add_endpoint("read", rt.subjects.bookie(bookie, "read"), service.handle_read)
    await rt.add_endpoint(
        "read_lac", rt.subjects.bookie(bookie, "read_lac"), service.handle_read_lac
    )
    await rt.add_endpoint(
        "ledgerstore-stats", rt.subjects.bookie(bookie, "ledgerstore.stats"), service.handle_stats
    )
    # The server has our subscriptions once this returns: no request finds no responder.
    await rt.nc.flush()
