"""The auditor: watches the bookie registry and reports bookies that are lost (their lease
lapsed), turn read-only, or come back. Marking their ledgers under-replicated, and the
election of a single auditor, come with the auto-recovery work (wave 2)."""

from __future__ import annotations

import asyncio
import json
import logging

from nats.micro.request import Request

from services.auditor.core import bookie_transitions
from shared.metaclient import MetadataClient, MetadataError
from shared.models import BookieState
from shared.service import ServiceRuntime

log = logging.getLogger(__name__)

AUDIT_INTERVAL_S = 1.0
EVENT_KINDS = {
    BookieState.LOST: "bookie.lost",
    BookieState.READONLY: "bookie.readonly",
    BookieState.WRITABLE: "bookie.available",
}


class Auditor:
    def __init__(self, rt: ServiceRuntime) -> None:
        self._rt = rt
        self._meta = MetadataClient(rt.nc, rt.subjects, rt.settings.request_timeout_ms / 1000)
        self.known: dict[str, BookieState] = {}
        self.audits = 0

    async def audit_once(self) -> None:
        bookies = await self._meta.list_bookies()
        for change in bookie_transitions(self.known, bookies):
            self.known[change.bookie_id] = change.after
            if change.before is None and change.after is BookieState.WRITABLE:
                continue  # first sight of a healthy bookie: nothing to report
            log.warning(
                "bookie state changed",
                extra={"bookie": change.bookie_id, "before": change.before, "after": change.after},
            )
            self._rt.events.emit(
                EVENT_KINDS[change.after],
                bookie_id=change.bookie_id,
                before=change.before,
                after=change.after,
            )
        self.audits += 1

    async def run(self) -> None:
        while True:
            try:
                await self.audit_once()
            except MetadataError as exc:
                log.warning("audit skipped: metadata unavailable", extra={"err": str(exc)})
            await asyncio.sleep(AUDIT_INTERVAL_S)

    async def status(self, request: Request) -> None:
        await request.respond(
            json.dumps(
                {
                    "audits": self.audits,
                    "bookies": {k: v.value for k, v in self.known.items()},
                }
            ).encode()
        )


async def main(rt: ServiceRuntime) -> None:
    auditor = Auditor(rt)
    await rt.add_endpoint("status", rt.subjects.service("auditor", "status"), auditor.status)
    rt.spawn(auditor.run(), "audit-loop")
