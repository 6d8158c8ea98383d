"""The auditor (BookKeeper's Auditor): finds ledgers with a lost, missing, damaged or
unknown replica and marks them under-replicated (metadata `urq.mark`, which publishes
`ledger.underreplicated`), each mark also an `autorecovery.marked` event with its reason.
The replicators repair what it marks. Its decisions are `shared.autorecovery`'s; this
module reads the registry and acts; `marking.py` marks and walks the ledgers (a page at a
time), `periodic.py` runs the periodic checks, `checks.py` reads the bookies for them.

What the elected auditor does:
- Lost bookies. Every `auditor_bookie_registry_poll_interval_ms` it looks at the bookie
  registry: a bookie whose lease lapsed (or that unregistered) is lost; after
  lostBookieRecoveryDelay (the stored cluster setting) every ledger whose segments name it
  is marked, naming it (reason lost_bookie). It also reports lost, read-only and returning
  bookies (`bookie.*` events).
- Periodic checks, each on its own interval (AuditorSettings; 0: off): the bookie check
  (ledgers naming bookies not registered alive; also once on election), check-all-ledgers
  (first and last entry of each fragment, plus a share of the others), the replicas check
  (every entry of every replica, digest checked) and the placement check (reported, marked
  only with repaired_placement_policy_not_adhering_bookie_enable). Each check's last run,
  duration and findings are in `auditor.status`.
- `entry.corrupt` events (a ledgerstore found a stored entry failing its digest), read from
  JetStream by a durable consumer: the ledger is marked naming that bookie.
- Limbo: a bookie registered with `limbo: true` (its disk was wiped) has every ledger with a
  fragment on it marked (reason limbo); once no under-replicated ledger names it, the
  auditor asks its journal to `clear_limbo`.
- Operator commands (shared.auditor_client): trigger_audit runs every audit now;
  recover_bookie and decommission mark every ledger whose segments name the bookies (reasons
  manual, decommission), then remove their cookies and registrations once no ledger names
  them any more (with delete_cookie, and always for decommission; a bookie registered alive
  keeps its registration). Those pending removals are
  held by the leader in memory: if leadership changes before they are done they are not
  carried over; the operator repeats the command (it is idempotent: marks merge, and the
  removal waits again) and the status lists what is pending.

Several auditors may run; only the elected one acts (BookKeeper's AuditorElector). It holds
a lease in the metadata store and renews it every third of its length; it counts itself
leader only until the lease it last obtained runs out by its own clock, measured from
before it asked, so it stops acting no later than the store lets another win. Every mark,
cookie or registration removal and limbo clearing checks leadership just before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.micro.request import Request
from pydantic import BaseModel, ValidationError

from services.auditor.checks import LedgerChecker
from services.auditor.core import bookie_transitions
from services.auditor.marking import Marker
from services.auditor.metrics import auditor_metrics
from services.auditor.periodic import CheckStatus, PeriodicChecks
from shared import clock
from shared.auditor_client import (
    DECOMMISSION,
    RECOVER_BOOKIE,
    TRIGGER_AUDIT,
    DecommissionCommand,
    RecoverBookieCommand,
    TriggerAuditCommand,
    error_reply,
)
from shared.autorecovery import LostBookieAudit, MarkReason, corrupt_entry_mark
from shared.bookie_client import BookieClient
from shared.metaclient import MetadataClient, MetadataError
from shared.metrics import serve_metrics
from shared.models import BookieInfo, BookieState, Leadership, MetaErrorCode
from shared.protocol.placement import PlacementPolicy
from shared.service import ServiceRuntime
from shared.status import ApiCodes, QuireError
from shared.telemetry import nats_consumer_span

log = logging.getLogger(__name__)

EVENT_KINDS = {
    BookieState.LOST: "bookie.lost",
    BookieState.READONLY: "bookie.readonly",
    BookieState.WRITABLE: "bookie.available",
}
CORRUPT_CONSUMER = "auditor-entry-corrupt"
CORRUPT_FETCH_BATCH = 64


class NotLeader(QuireError):
    def __init__(self, candidate_id: str) -> None:
        super().__init__(ApiCodes.UNAVAILABLE, f"{candidate_id} is not the elected auditor")


class Auditor:
    def __init__(self, rt: ServiceRuntime) -> None:
        self._rt = rt
        self.settings = rt.settings.auditor
        self._meta = MetadataClient(rt.nc, rt.subjects, rt.settings.request_timeout_ms / 1000)
        self.candidate_id = f"{rt.instance}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lease_ms = rt.settings.metadata.auditor_lease_ms
        self._leader_until = 0.0  # time.monotonic() until which we lead
        self.leadership: Leadership | None = None
        self.known: dict[str, BookieState] = {}
        self.lost = LostBookieAudit()
        self.alive: set[str] = set()
        self.marker = Marker(self._meta, rt.events, self._require_leader)
        checker = LedgerChecker(
            BookieClient(
                rt.nc,
                rt.subjects,
                add_timeout_ms=self.settings.auditor_read_timeout_ms,
                read_timeout_ms=self.settings.auditor_read_timeout_ms,
            ),
            self.settings.auditor_read_batch_entries,
        )
        self.periodic = PeriodicChecks(
            self.settings,
            self._meta,
            self.marker,
            checker,
            rt.events,
            waiting=lambda: self.lost.waiting,
            enabled=lambda: self.autorecovery_enabled,
            placement=PlacementPolicy(rt.settings.placement.rules()),
        )
        self.limbo_marked: set[str] = set()  # limbo bookies whose ledgers were all marked
        self.pending_cookie_removals: set[str] = set()
        self._repair_look_due = 0.0  # monotonic: next look at limbo and cookie removals
        self.last_lost_bookie_audit: dict[str, Any] | None = None
        self.audits = 0
        self.autorecovery_enabled = True  # the stored switch, as last read
        self.commands = 0  # operator commands this auditor carried out
        self.election_attempts = 0  # BookKeeper's ELECTION_ATTEMPTS (renewals not counted)
        self.corrupt_events = 0  # entry.corrupt events consumed
        self.malformed_events = 0

    # -- leadership -----------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._leader_until

    async def keep_leadership(self) -> None:
        """Renew the lease if we lead, else stand for election."""
        asked_at = time.monotonic()
        if self.is_leader:
            result = await self._meta.renew_auditor(self.candidate_id, self.lease_ms)
        else:
            self.election_attempts += 1
            result = await self._meta.elect_auditor(self.candidate_id, self.lease_ms)
        was_leader = self.is_leader
        self.leadership = result
        if result.is_leader:
            self._leader_until = asked_at + self.lease_ms / 1000
            if not was_leader:
                log.info("elected auditor", extra={"term": result.term})
                self._start_afresh(asked_at)
        else:
            self._leader_until = 0.0

    def _start_afresh(self, now: float) -> None:
        """A new term: nothing carried over from an earlier one (the registry, the delays
        and the limbo marks are looked at again); the bookie check runs at once, the others
        after their interval."""
        self.known.clear()
        self.lost.reset()
        self.limbo_marked.clear()
        self.pending_cookie_removals.clear()
        self._repair_look_due = now
        self.periodic.schedule_for_new_term(now)

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeader(self.candidate_id)

    @property
    def marks(self) -> int:
        return self.marker.marks

    @property
    def marks_by_reason(self) -> dict[str, int]:
        return self.marker.marks_by_reason

    @property
    def checks(self) -> dict[str, CheckStatus]:
        return self.periodic.status

    async def elect_loop(self) -> None:
        while True:
            try:
                await self.keep_leadership()
            except MetadataError as exc:
                log.warning("election skipped: metadata unavailable", extra={"err": str(exc)})
            await asyncio.sleep(self.lease_ms / 3000)

    async def resign(self) -> None:
        """At shutdown: give the lease back so that another auditor takes over now."""
        if self.is_leader:
            self._leader_until = 0.0
            try:
                await self._meta.resign_auditor(self.candidate_id)
            except MetadataError as exc:
                log.warning("resign failed; the lease will lapse", extra={"err": str(exc)})

    # -- the registry: lost bookies and limbo ---------------------------------------------

    async def audit_once(self) -> None:
        """One look at the registry: report changes, audit lost bookies when due, handle
        bookies in limbo, remove the cookies of recovered bookies.

        While auto-recovery is disabled only the changes are reported: as BookKeeper's
        auditor waits (waitIfLedgerReplicationDisabled), the registry is compared again
        once it is enabled, so a bookie lost meanwhile then starts its delay, and an audit
        that fell due meanwhile runs then."""
        bookies = await self._meta.list_bookies()
        self._report_transitions(bookies)
        cluster = await self._meta.get_cluster_settings()
        self.autorecovery_enabled = cluster.autorecovery_enabled
        if not cluster.autorecovery_enabled:
            self.audits += 1
            return
        self.alive = {b.bookie_id for b in bookies if b.state is not BookieState.LOST}
        registered_lost = {b.bookie_id for b in bookies if b.state is BookieState.LOST}
        delay_s = cluster.lost_bookie_recovery_delay_s
        due = self.lost.observe(time.monotonic(), self.alive, registered_lost, delay_s)
        if due:
            await self.audit_lost_bookies(due)
        now = time.monotonic()
        await self._mark_limbo(bookies)
        if now >= self._repair_look_due:
            self._repair_look_due = now + self.settings.auditor_repair_wait_check_interval_ms / 1000
            await self._clear_repaired_limbo()
            await self._remove_cookies()
        self.audits += 1

    async def audit_lost_bookies(self, bookie_ids: frozenset[str]) -> int:
        log.warning("auditing lost bookies", extra={"bookies": sorted(bookie_ids)})
        started_at, started = clock.wall_ms(), time.monotonic()
        marked = await self.marker.mark_ledgers_on(set(bookie_ids), MarkReason.LOST_BOOKIE)
        self.last_lost_bookie_audit = {
            "started_at": started_at,
            "duration_ms": round((time.monotonic() - started) * 1000, 3),
            "bookies": sorted(bookie_ids),
            "ledgers_marked": marked,
        }
        return marked

    def _report_transitions(self, bookies: list[BookieInfo]) -> None:
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

    async def _mark_limbo(self, bookies: list[BookieInfo]) -> None:
        in_limbo = {
            b.bookie_id
            for b in bookies
            if b.state is not BookieState.LOST and b.info.get("limbo") is True
        }
        self.limbo_marked &= in_limbo
        for bookie_id in sorted(in_limbo - self.limbo_marked):
            log.warning("bookie in limbo: marking its ledgers", extra={"bookie": bookie_id})
            await self.marker.mark_ledgers_on({bookie_id}, MarkReason.LIMBO)
            self.limbo_marked.add(bookie_id)

    async def _clear_repaired_limbo(self) -> None:
        for bookie_id in sorted(self.limbo_marked):
            if not await self._named_under_replicated(bookie_id):
                await self._clear_limbo(bookie_id)

    async def _named_under_replicated(self, bookie_id: str) -> bool:
        after: int | None = None
        while True:
            page = await self._meta.list_underreplicated(after=after, limit=1000)
            if any(bookie_id in u.missing_bookies for u in page.ledgers):
                return True
            if page.next_after is None:
                return False
            after = page.next_after

    async def _clear_limbo(self, bookie_id: str) -> None:
        self._require_leader()
        subject = self._rt.subjects.bookie(bookie_id, "clear_limbo")
        try:
            await self._rt.nc.request(subject, b"", self._rt.settings.request_timeout_ms / 1000)
        except Exception as exc:  # the bookie is away: asked again at the next look
            log.warning("clear_limbo not delivered", extra={"bookie": bookie_id, "err": repr(exc)})
            return
        self.limbo_marked.discard(bookie_id)
        log.warning("bookie limbo cleared", extra={"bookie": bookie_id})
        self._rt.events.emit("bookie.limbo_cleared", bookie_id=bookie_id)

    async def _remove_cookies(self) -> None:
        """Decommissioned (or recovered with delete_cookie) bookies no ledger needs any
        more lose their cookie, then their registration (BookKeeper's decommissionBookie
        removes both: a bookie that comes back with that id is then a new one, and until
        then no listing shows it). The store publishes `bookie.removed`. A removal that
        fails stays pending and is tried again at the next look."""
        for bookie_id in sorted(self.pending_cookie_removals):
            if await self.marker.needed(bookie_id):
                continue
            self._require_leader()
            cookie = await self._meta.get_cookie(bookie_id)
            if cookie.data is not None:
                await self._meta.delete_cookie(bookie_id, cookie.version)
                log.warning("bookie cookie removed", extra={"bookie": bookie_id})
                self._rt.events.emit("bookie.cookie_deleted", bookie_id=bookie_id)
            await self._remove_registration(bookie_id)
            self.pending_cookie_removals.discard(bookie_id)

    async def _remove_registration(self, bookie_id: str) -> None:
        self._require_leader()
        try:
            await self._meta.remove_bookie(bookie_id)
        except MetadataError as exc:
            if exc.code is not MetaErrorCode.BOOKIE_ALIVE:
                raise
            # recover_bookie does not ask that the bookie be stopped: a running one keeps
            # its registration (its next heartbeat would write it again anyway).
            log.warning("bookie still alive: registration kept", extra={"bookie": bookie_id})
            return
        # Gone from the registry is not a loss: nothing of it is to be reported or audited.
        self.known.pop(bookie_id, None)
        self.lost.forget(bookie_id)
        log.warning("bookie registration removed", extra={"bookie": bookie_id})

    async def run(self) -> None:
        poll_s = self.settings.auditor_bookie_registry_poll_interval_ms / 1000
        while True:
            if self.is_leader:
                try:
                    await self.audit_once()
                except (MetadataError, NotLeader) as exc:
                    log.warning("audit skipped", extra={"err": str(exc)})
                self.periodic.start_due(time.monotonic(), self._rt.spawn)
            await asyncio.sleep(poll_s)

    # -- entry.corrupt events -------------------------------------------------------------

    async def consume_corrupt_entries(self) -> None:
        """Mark the ledgers of `entry.corrupt` events (a durable JetStream consumer, so
        none is missed while no auditor runs). Only the leader fetches; an event is acked
        once marked (or found malformed: logged and dropped), otherwise redelivered."""
        js = self._rt.nc.jetstream()
        subject = self._rt.subjects.event("entry.corrupt")
        sub = await js.pull_subscribe(
            subject,
            durable=CORRUPT_CONSUMER,
            stream=self._rt.subjects.event_stream,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=30.0,
            ),
        )
        try:
            await self._fetch_corrupt_entries(sub)
        finally:
            # A pending pull would hold the connection's drain at shutdown for its timeout.
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _fetch_corrupt_entries(self, sub: Any) -> None:
        poll_s = self.settings.auditor_bookie_registry_poll_interval_ms / 1000
        while True:
            if not self.is_leader:
                await asyncio.sleep(poll_s)
                continue
            try:
                msgs = await sub.fetch(CORRUPT_FETCH_BATCH, timeout=poll_s)
                for msg in msgs:
                    with nats_consumer_span(msg.subject, msg.headers):
                        await self._on_corrupt_event(msg)
            except TimeoutError:
                continue  # nothing to fetch
            except NatsError as exc:  # NATS reconnecting: unacked events come again
                log.warning("entry.corrupt fetch failed", extra={"err": repr(exc)})
                await asyncio.sleep(poll_s)

    async def _on_corrupt_event(self, msg: Any) -> None:
        try:
            event = json.loads(msg.data)
        except ValueError:
            event = None
        decision = corrupt_entry_mark(event)
        if decision is None:
            self.malformed_events += 1
            log.warning("malformed entry.corrupt event dropped", extra={"data": msg.data[:200]})
            await msg.term()
            return
        try:
            await self.marker.mark(decision)
        except (MetadataError, NotLeader) as exc:
            log.warning("entry.corrupt not marked yet", extra={"err": str(exc)})
            await msg.nak(delay=1.0)
            return
        self.corrupt_events += 1
        await msg.ack()

    # -- operator commands ----------------------------------------------------------------

    async def trigger_audit(self, _: TriggerAuditCommand) -> dict[str, Any]:
        """Every audit now (BookKeeper's triggerAudit cuts lostBookieRecoveryDelay short):
        lost bookies, then each check, whatever its interval. With auto-recovery disabled
        nothing runs (each check answers that it was skipped)."""
        self._require_leader()
        cluster = await self._meta.get_cluster_settings()
        self.autorecovery_enabled = cluster.autorecovery_enabled
        now_due = self.lost.run_now() if self.autorecovery_enabled else frozenset()
        marked = await self.audit_lost_bookies(now_due) if now_due else 0
        reply: dict[str, Any] = {}
        for name in self.checks:
            reply[name] = await self.periodic.run(name)
            marked += reply[name].get("ledgers_marked", 0)
        reply["ledgers_marked"] = marked
        return reply

    async def recover_bookie(self, command: RecoverBookieCommand) -> dict[str, Any]:
        marked = await self.marker.mark_ledgers_on(set(command.bookie_ids()), MarkReason.MANUAL)
        if command.delete_cookie:
            self.pending_cookie_removals.update(command.bookie_ids())
        return {"ledgers_marked": marked}

    async def decommission(self, command: DecommissionCommand) -> dict[str, Any]:
        for bookie in await self._meta.list_bookies():
            if bookie.bookie_id == command.bookie_src and bookie.state is not BookieState.LOST:
                raise QuireError(
                    ApiCodes.INVALID_ARGUMENT,
                    f"bookie {command.bookie_src} is registered {bookie.state.value}: "
                    "stop it before decommissioning it",
                )
        marked = await self.marker.mark_ledgers_on({command.bookie_src}, MarkReason.DECOMMISSION)
        self.pending_cookie_removals.add(command.bookie_src)
        return {"ledgers_marked": marked}

    def command_handler(
        self, model: type[BaseModel], run: Callable[[Any], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[None]]:
        """One operator command: only the leader acts; a bad body is INVALID_ARGUMENT."""

        async def handle(request: Request) -> None:
            reply: dict[str, Any]
            try:
                self._require_leader()
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

    # -- status ---------------------------------------------------------------------------

    async def status(self, request: Request) -> None:
        held = self.leadership
        await request.respond(
            json.dumps(
                {
                    "leader": self.is_leader,
                    "autorecovery_enabled": self.autorecovery_enabled,
                    "candidate_id": self.candidate_id,
                    "leader_id": held.leader_id if held else None,
                    "term": held.term if held else None,
                    "audits": self.audits,
                    "bookies": {k: v.value for k, v in self.known.items()},
                    "lost_bookies_waiting": sorted(self.lost.waiting),
                    "last_lost_bookie_audit": self.last_lost_bookie_audit,
                    "lost_bookie_audit_due_in_s": (
                        None
                        if self.lost.due_at_s is None
                        else round(max(0.0, self.lost.due_at_s - time.monotonic()), 3)
                    ),
                    "ledgers_marked": self.marks,
                    "ledgers_marked_by_reason": self.marks_by_reason,
                    "commands": self.commands,
                    "entry_corrupt_events": self.corrupt_events,
                    "malformed_events": self.malformed_events,
                    "limbo_bookies": sorted(self.limbo_marked),
                    "pending_cookie_removals": sorted(self.pending_cookie_removals),
                    "checks": {name: asdict(check) for name, check in self.checks.items()},
                }
            ).encode()
        )


async def main(rt: ServiceRuntime) -> None:
    auditor = Auditor(rt)
    rt.auditor = auditor  # type: ignore[attr-defined]  # for tests
    serve_metrics(rt, auditor_metrics(auditor))
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
    rt.spawn(auditor.consume_corrupt_entries(), "audit-entry-corrupt")
