"""The auditor: watches the bookie registry and reports bookies that are lost (their lease
lapsed), turn read-only, or come back (a log line and a `bookie.*` event). That is all it
does: it marks no ledger under-replicated and reads neither the auto-recovery switch nor
lostBookieRecoveryDelay, and segments that name a lost bookie keep naming it.

Several auditors may run; only the elected one audits (BookKeeper's AuditorElector). It
holds a lease in the metadata store and renews it every third of its length; it counts
itself leader only until the lease it last obtained runs out by its own clock, measured
from before it asked, so it stops auditing no later than the store lets another win.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from nats.micro.request import Request
from pydantic import BaseModel, ValidationError

from services.auditor.core import bookie_transitions
from shared.auditor_client import (
    DECOMMISSION,
    RECOVER_BOOKIE,
    TRIGGER_AUDIT,
    DecommissionCommand,
    RecoverBookieCommand,
    TriggerAuditCommand,
    error_reply,
)
from shared.autorecovery import MarkReason, bookies_to_mark
from shared.metaclient import MetadataClient, MetadataError
from shared.models import BookieState, Leadership
from shared.service import ServiceRuntime
from shared.status import ApiCodes, QuireError

log = logging.getLogger(__name__)

AUDIT_INTERVAL_S = 1.0
LEDGER_PAGE_SIZE = 100
EVENT_KINDS = {
    BookieState.LOST: "bookie.lost",
    BookieState.READONLY: "bookie.readonly",
    BookieState.WRITABLE: "bookie.available",
}


class Auditor:
    def __init__(self, rt: ServiceRuntime) -> None:
        self._rt = rt
        self._meta = MetadataClient(rt.nc, rt.subjects, rt.settings.request_timeout_ms / 1000)
        self.candidate_id = f"{rt.instance}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lease_ms = rt.settings.metadata.auditor_lease_ms
        self._leader_until = 0.0  # time.monotonic() until which we lead
        self.leadership: Leadership | None = None
        self.known: dict[str, BookieState] = {}
        self.audits = 0
        self.marks = 0  # ledgers this auditor marked
        self.commands = 0  # operator commands this auditor carried out

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._leader_until

    async def keep_leadership(self) -> None:
        """Renew the lease if we lead, else stand for election."""
        asked_at = time.monotonic()
        if self.is_leader:
            result = await self._meta.renew_auditor(self.candidate_id, self.lease_ms)
        else:
            result = await self._meta.elect_auditor(self.candidate_id, self.lease_ms)
        was_leader = self.is_leader
        self.leadership = result
        if result.is_leader:
            self._leader_until = asked_at + self.lease_ms / 1000
            if not was_leader:
                log.info("elected auditor", extra={"term": result.term})
                self.known.clear()  # start from what the registry says now
        else:
            self._leader_until = 0.0

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

    async def mark_ledgers_on(self, bookie_ids: set[str], reason: MarkReason) -> int:
        """Mark every ledger holding a fragment on `bookie_ids` under-replicated, naming
        those of them it holds; how many ledgers were marked."""
        marked = 0
        after: int | None = None
        while True:
            page = await self._meta.list_ledgers(after=after, limit=LEDGER_PAGE_SIZE)
            for metadata in page.ledgers:
                missing = bookies_to_mark(metadata, bookie_ids)
                if missing:
                    await self.mark(metadata.ledger_id, missing, reason)
                    marked += 1
            if page.next_after is None:
                return marked
            after = page.next_after

    async def mark(self, ledger_id: int, bookie_ids: list[str], reason: MarkReason) -> None:
        await self._meta.mark_underreplicated(ledger_id, bookie_ids)
        self.marks += 1
        log.info(
            "ledger marked under-replicated",
            extra={"ledger_id": ledger_id, "bookies": bookie_ids, "reason": reason.value},
        )
        self._rt.events.emit(
            "autorecovery.marked",
            ledger_id=ledger_id,
            bookie_id=bookie_ids[0],
            bookie_ids=bookie_ids,
            reason=reason.value,
        )

    async def trigger_audit(self, _: TriggerAuditCommand) -> dict[str, Any]:
        bookies = await self._meta.list_bookies()
        lost = {b.bookie_id for b in bookies if b.state is BookieState.LOST}
        return {"ledgers_marked": await self.mark_ledgers_on(lost, MarkReason.LOST_BOOKIE)}

    async def recover_bookie(self, command: RecoverBookieCommand) -> dict[str, Any]:
        marked = await self.mark_ledgers_on(set(command.bookie_ids()), MarkReason.MANUAL)
        return {"ledgers_marked": marked}

    async def decommission(self, command: DecommissionCommand) -> dict[str, Any]:
        for bookie in await self._meta.list_bookies():
            if bookie.bookie_id == command.bookie_src and bookie.state is not BookieState.LOST:
                raise QuireError(
                    ApiCodes.INVALID_ARGUMENT,
                    f"bookie {command.bookie_src} is registered {bookie.state.value}: "
                    "stop it before decommissioning it",
                )
        marked = await self.mark_ledgers_on({command.bookie_src}, MarkReason.DECOMMISSION)
        return {"ledgers_marked": marked}

    def command_handler(
        self, model: type[BaseModel], run: Callable[[Any], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[None]]:
        """One operator command: only the leader acts; a bad body is INVALID_ARGUMENT."""

        async def handle(request: Request) -> None:
            reply: dict[str, Any]
            if not self.is_leader:
                reply = error_reply(ApiCodes.UNAVAILABLE, f"{self.candidate_id} is not the leader")
            else:
                try:
                    command = model.model_validate_json(request.data or b"{}")
                    reply = await run(command)
                    self.commands += 1
                except ValidationError as exc:
                    reply = error_reply(ApiCodes.INVALID_ARGUMENT, str(exc))
                except QuireError as exc:
                    reply = error_reply(exc.api, exc.detail)
                except MetadataError as exc:
                    reply = error_reply(ApiCodes.UNAVAILABLE, f"metadata: {exc}")
            await request.respond(json.dumps(reply).encode())

        return handle

    async def elect_loop(self) -> None:
        while True:
            try:
                await self.keep_leadership()
            except MetadataError as exc:
                log.warning("election skipped: metadata unavailable", extra={"err": str(exc)})
            await asyncio.sleep(self.lease_ms / 3000)

    async def run(self) -> None:
        while True:
            if self.is_leader:
                try:
                    await self.audit_once()
                except MetadataError as exc:
                    log.warning("audit skipped: metadata unavailable", extra={"err": str(exc)})
            await asyncio.sleep(AUDIT_INTERVAL_S)

    async def resign(self) -> None:
        """At shutdown: give the lease back so that another auditor takes over now."""
        if self.is_leader:
            self._leader_until = 0.0
            try:
                await self._meta.resign_auditor(self.candidate_id)
            except MetadataError as exc:
                log.warning("resign failed; the lease will lapse", extra={"err": str(exc)})

    async def status(self, request: Request) -> None:
        held = self.leadership
        await request.respond(
            json.dumps(
                {
                    "leader": self.is_leader,
                    "candidate_id": self.candidate_id,
                    "leader_id": held.leader_id if held else None,
                    "term": held.term if held else None,
                    "audits": self.audits,
                    "bookies": {k: v.value for k, v in self.known.items()},
                }
            ).encode()
        )


async def main(rt: ServiceRuntime) -> None:
    auditor = Auditor(rt)
    rt.auditor = auditor  # type: ignore[attr-defined]  # for tests
    await rt.add_endpoint("status", rt.subjects.service("auditor", "status"), auditor.status)
    commands = (
        (TRIGGER_AUDIT, TriggerAuditCommand, auditor.trigger_audit),
        (RECOVER_BOOKIE, RecoverBookieCommand, auditor.recover_bookie),
        (DECOMMISSION, DecommissionCommand, auditor.decommission),
    )
    for op, model, run in commands:
        await rt.add_endpoint(
            op,
            rt.subjects.auditor_command(auditor.candidate_id, op),
            auditor.command_handler(model, run),
            max_in_flight=4,
        )
    rt.on_shutdown(auditor.resign)
    rt.spawn(auditor.elect_loop(), "auditor-election")
    rt.spawn(auditor.run(), "audit-loop")
