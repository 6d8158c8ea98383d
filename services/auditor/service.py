"""The auditor (BookKeeper's Auditor): finds ledgers with a lost, missing, damaged or
unknown replica and marks them under-replicated (metadata `urq.mark`, which publishes
`ledger.underreplicated`), each mark also an `autorecovery.marked` event with its reason.
The replicators repair what it marks. Its decisions are `shared.autorecovery`'s; this
module reads the registry, the ledgers (a page at a time) and the bookies, and acts.

What the elected auditor does:
- Lost bookies. Every `auditor_bookie_registry_poll_interval_ms` it looks at the bookie
  registry: a bookie whose lease lapsed (or that unregistered) is lost; after
  lostBookieRecoveryDelay (the stored cluster setting) every ledger holding a fragment on it
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
  recover_bookie and decommission mark every ledger with a fragment on the bookies (reasons
  manual, decommission), then remove their cookies once no ledger holds a fragment on them
  any more (with delete_cookie, and always for decommission). Those pending removals are
  held by the leader in memory: if leadership changes before they are done they are not
  carried over; the operator repeats the command (it is idempotent: marks merge, and the
  removal waits again) and the status lists what is pending.

Several auditors may run; only the elected one acts (BookKeeper's AuditorElector). It holds
a lease in the metadata store and renews it every third of its length; it counts itself
leader only until the lease it last obtained runs out by its own clock, measured from
before it asked, so it stops acting no later than the store lets another win. Every mark,
cookie removal and limbo clearing checks leadership just before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.micro.request import Request
from pydantic import BaseModel, ValidationError

from services.auditor.checks import LedgerChecker
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
from shared.autorecovery import (
    FragmentCheck,
    LostBookieAudit,
    MarkDecision,
    MarkReason,
    ReadOutcome,
    bookies_to_mark,
    corrupt_entry_mark,
    mark_decisions,
    missing_bookies,
    placement_violations,
    plan_check_all,
    plan_replicas_check,
)
from shared.bookie_client import BookieClient
from shared.metaclient import MetadataClient, MetadataError
from shared.models import BookieInfo, BookieState, Leadership, LedgerMetadata, MetaErrorCode
from shared.service import ServiceRuntime
from shared.status import ApiCodes, QuireError

log = logging.getLogger(__name__)

LEDGER_PAGE_SIZE = 100
EVENT_KINDS = {
    BookieState.LOST: "bookie.lost",
    BookieState.READONLY: "bookie.readonly",
    BookieState.WRITABLE: "bookie.available",
}
# The periodic checks, by the name the status and trigger_audit report them under.
BOOKIE_CHECK = "bookie_check"
CHECK_ALL = "check_all_ledgers"
REPLICAS_CHECK = "replicas_check"
PLACEMENT_CHECK = "placement_policy_check"
CORRUPT_CONSUMER = "auditor-entry-corrupt"
CORRUPT_FETCH_BATCH = 64


class NotLeader(QuireError):
    def __init__(self, candidate_id: str) -> None:
        super().__init__(ApiCodes.UNAVAILABLE, f"{candidate_id} is not the elected auditor")


@dataclass
class CheckStatus:
    """What `auditor.status` says of one periodic check."""

    interval_s: int
    runs: int = 0
    running: bool = False
    last_started_at: int | None = None  # ms since the epoch
    last_duration_ms: float | None = None
    last_findings: dict[str, Any] = field(default_factory=dict)
    last_error: str | None = None


class Auditor:
    def __init__(self, rt: ServiceRuntime) -> None:
        self._rt = rt
        self.settings = rt.settings.auditor
        self._meta = MetadataClient(rt.nc, rt.subjects, rt.settings.request_timeout_ms / 1000)
        self._checker = LedgerChecker(
            BookieClient(
                rt.nc,
                rt.subjects,
                add_timeout_ms=self.settings.auditor_read_timeout_ms,
                read_timeout_ms=self.settings.auditor_read_timeout_ms,
            ),
            self.settings.auditor_read_batch_entries,
        )
        self._ledger_slots = asyncio.Semaphore(
            self.settings.auditor_max_number_of_concurrent_open_ledger_operations
        )
        self.candidate_id = f"{rt.instance}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lease_ms = rt.settings.metadata.auditor_lease_ms
        self._leader_until = 0.0  # time.monotonic() until which we lead
        self.leadership: Leadership | None = None
        self.known: dict[str, BookieState] = {}
        self.lost = LostBookieAudit()
        self.alive: set[str] = set()
        self.checks = {
            BOOKIE_CHECK: CheckStatus(self.settings.auditor_periodic_bookie_check_interval_s),
            CHECK_ALL: CheckStatus(self.settings.auditor_periodic_check_interval_s),
            REPLICAS_CHECK: CheckStatus(self.settings.auditor_periodic_replicas_check_interval_s),
            PLACEMENT_CHECK: CheckStatus(
                self.settings.auditor_periodic_placement_policy_check_interval_s
            ),
        }
        self._check_due: dict[str, float | None] = {}  # monotonic; None: off
        self.limbo_marked: set[str] = set()  # limbo bookies whose ledgers were all marked
        self.pending_cookie_removals: set[str] = set()
        self._repair_look_due = 0.0  # monotonic: next look at limbo and cookie removals
        self.last_lost_bookie_audit: dict[str, Any] | None = None
        self.audits = 0
        self.marks = 0  # ledgers this auditor marked
        self.marks_by_reason: dict[str, int] = {}
        self.commands = 0  # operator commands this auditor carried out
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
        for name, check in self.checks.items():
            if name == BOOKIE_CHECK:
                self._check_due[name] = now
            else:
                self._check_due[name] = now + check.interval_s if check.interval_s > 0 else None

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeader(self.candidate_id)

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

    # -- marking --------------------------------------------------------------------------

    async def mark(self, decision: MarkDecision) -> bool:
        """Mark one ledger; False if it no longer exists."""
        self._require_leader()
        bookie_ids = list(decision.bookie_ids)
        try:
            await self._meta.mark_underreplicated(decision.ledger_id, bookie_ids)
        except MetadataError as exc:
            if exc.code is MetaErrorCode.NO_SUCH_LEDGER:
                return False
            raise
        self.marks += 1
        reason = decision.reason.value
        self.marks_by_reason[reason] = self.marks_by_reason.get(reason, 0) + 1
        log.info(
            "ledger marked under-replicated",
            extra={"ledger_id": decision.ledger_id, "bookies": bookie_ids, "reason": reason},
        )
        self._rt.events.emit(
            "autorecovery.marked",
            ledger_id=decision.ledger_id,
            bookie_id=bookie_ids[0],
            bookie_ids=bookie_ids,
            reason=reason,
        )
        return True

    async def ledgers(self) -> AsyncIterator[list[LedgerMetadata]]:
        """Every ledger, a page at a time."""
        after: int | None = None
        while True:
            page = await self._meta.list_ledgers(after=after, limit=LEDGER_PAGE_SIZE)
            yield page.ledgers
            if page.next_after is None:
                return
            after = page.next_after

    async def mark_ledgers_on(self, bookie_ids: set[str], reason: MarkReason) -> int:
        """Mark every ledger holding a fragment on `bookie_ids`, naming those of them it
        holds; how many ledgers were marked."""
        marked = 0
        if not bookie_ids:
            return marked
        async for page in self.ledgers():
            for metadata in page:
                named = bookies_to_mark(metadata, bookie_ids)
                if named and await self.mark(
                    MarkDecision(metadata.ledger_id, tuple(named), reason)
                ):
                    marked += 1
        return marked

    async def needed(self, bookie_id: str) -> bool:
        """Whether any ledger still holds a fragment on `bookie_id`."""
        async for page in self.ledgers():
            if any(bookies_to_mark(metadata, {bookie_id}) for metadata in page):
                return True
        return False

    # -- the registry: lost bookies and limbo ---------------------------------------------

    async def audit_once(self) -> None:
        """One look at the registry: report changes, audit lost bookies when due, handle
        bookies in limbo, remove the cookies of recovered bookies."""
        bookies = await self._meta.list_bookies()
        self._report_transitions(bookies)
        self.alive = {b.bookie_id for b in bookies if b.state is not BookieState.LOST}
        registered_lost = {b.bookie_id for b in bookies if b.state is BookieState.LOST}
        delay_s = (await self._meta.get_cluster_settings()).lost_bookie_recovery_delay_s
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
        started_at, started = int(time.time() * 1000), time.monotonic()
        marked = await self.mark_ledgers_on(set(bookie_ids), MarkReason.LOST_BOOKIE)
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
            await self.mark_ledgers_on({bookie_id}, MarkReason.LIMBO)
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
        more lose their cookie (BookKeeper's decommissionBookie: a bookie that comes back
        with that id is then a new one)."""
        for bookie_id in sorted(self.pending_cookie_removals):
            if await self.needed(bookie_id):
                continue
            self._require_leader()
            cookie = await self._meta.get_cookie(bookie_id)
            if cookie.data is not None:
                await self._meta.delete_cookie(bookie_id, cookie.version)
            self.pending_cookie_removals.discard(bookie_id)
            log.warning("bookie cookie removed", extra={"bookie": bookie_id})
            self._rt.events.emit("bookie.cookie_deleted", bookie_id=bookie_id)

    # -- periodic checks ------------------------------------------------------------------

    async def bookie_check(self) -> dict[str, Any]:
        """Mark every ledger naming a bookie not registered alive (not those still
        within their lostBookieRecoveryDelay)."""
        bookies = await self._meta.list_bookies()
        alive = {b.bookie_id for b in bookies if b.state is not BookieState.LOST}
        marked = 0
        async for page in self.ledgers():
            for metadata in page:
                named = [b for b in missing_bookies(metadata, alive) if b not in self.lost.waiting]
                if named and await self.mark(
                    MarkDecision(metadata.ledger_id, tuple(named), MarkReason.LOST_BOOKIE)
                ):
                    marked += 1
        return {"ledgers_marked": marked}

    async def check_all_ledgers(self) -> dict[str, Any]:
        percentage = self.settings.auditor_ledger_verification_percentage
        return await self._read_check(
            lambda metadata: plan_check_all(metadata, percentage), MarkReason.CHECK_ALL
        )

    async def replicas_check(self) -> dict[str, Any]:
        return await self._read_check(plan_replicas_check, MarkReason.REPLICAS_CHECK)

    async def _read_check(
        self, plan: Callable[[LedgerMetadata], list[FragmentCheck]], reason: MarkReason
    ) -> dict[str, Any]:
        """Read what `plan` says of every ledger from its bookies, at most
        auditor_max_number_of_concurrent_open_ledger_operations ledgers at once."""
        alive = {
            b.bookie_id for b in await self._meta.list_bookies() if b.state is not BookieState.LOST
        }
        findings = {
            "ledgers_checked": 0,
            "entries_read": 0,
            "ledgers_marked": 0,
            "unreachable": 0,
            "digest_unverified_ledgers": 0,
        }

        async def check_one(metadata: LedgerMetadata) -> None:
            async with self._ledger_slots:
                result = await self._checker.check(metadata, plan(metadata), alive)
            findings["ledgers_checked"] += 1
            findings["entries_read"] += result.entries_read
            findings["unreachable"] += sum(
                1 for _, outcome in result.outcomes if outcome is ReadOutcome.UNREACHABLE
            )
            findings["digest_unverified_ledgers"] += not result.digest_verified
            for decision in mark_decisions(metadata.ledger_id, result.outcomes, reason):
                if await self.mark(decision):
                    findings["ledgers_marked"] += 1

        async for page in self.ledgers():
            self._require_leader()
            # Every ledger of the page finishes (or fails) before the check goes on or fails.
            results = await asyncio.gather(
                *(check_one(metadata) for metadata in page), return_exceptions=True
            )
            for failure in results:
                if isinstance(failure, BaseException):
                    raise failure
        return findings

    async def placement_check(self) -> dict[str, Any]:
        registered = {b.bookie_id for b in await self._meta.list_bookies()}
        violations = 0
        ledgers = 0
        repair = self.settings.repaired_placement_policy_not_adhering_bookie_enable
        async for page in self.ledgers():
            for metadata in page:
                found = placement_violations(metadata, registered)
                if not found:
                    continue
                ledgers += 1
                violations += len(found)
                self._rt.events.emit(
                    "autorecovery.placement_policy_not_adhering",
                    ledger_id=metadata.ledger_id,
                    segments=sorted({v.segment_index for v in found}),
                    problems=sorted({v.problem.value for v in found}),
                )
                named = tuple(sorted({b for v in found for b in v.bookie_ids}))
                if repair and named:
                    await self.mark(MarkDecision(metadata.ledger_id, named, MarkReason.PLACEMENT))
        return {
            "ledgers_not_adhering": ledgers,
            "segments_not_adhering": violations,
            "marked": repair,
        }

    def _check_runners(self) -> dict[str, Callable[[], Awaitable[dict[str, Any]]]]:
        return {
            BOOKIE_CHECK: self.bookie_check,
            CHECK_ALL: self.check_all_ledgers,
            REPLICAS_CHECK: self.replicas_check,
            PLACEMENT_CHECK: self.placement_check,
        }

    async def run_check(self, name: str) -> dict[str, Any]:
        """Run one check now and record it in the status; its findings."""
        status = self.checks[name]
        status.running = True
        status.last_started_at = int(time.time() * 1000)
        started = time.monotonic()
        try:
            findings = await self._check_runners()[name]()
        except (MetadataError, QuireError) as exc:
            status.last_error = str(exc)
            raise
        finally:
            status.running = False
            status.runs += 1
            status.last_duration_ms = round((time.monotonic() - started) * 1000, 3)
        status.last_findings = findings
        status.last_error = None
        log.info("audit check done", extra={"check": name, **findings})
        return findings

    async def _periodic(self, name: str) -> None:
        try:
            await self.run_check(name)
        except (MetadataError, QuireError) as exc:
            log.warning("audit check failed", extra={"check": name, "err": str(exc)})

    def start_due_checks(self, now: float) -> None:
        for name, due in self._check_due.items():
            if due is None or now < due or self.checks[name].running:
                continue
            interval = self.checks[name].interval_s
            self._check_due[name] = now + interval if interval > 0 else None
            self._rt.spawn(self._periodic(name), f"audit-{name}")

    async def run(self) -> None:
        poll_s = self.settings.auditor_bookie_registry_poll_interval_ms / 1000
        while True:
            if self.is_leader:
                try:
                    await self.audit_once()
                except (MetadataError, NotLeader) as exc:
                    log.warning("audit skipped", extra={"err": str(exc)})
                self.start_due_checks(time.monotonic())
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
            await self.mark(decision)
        except (MetadataError, NotLeader) as exc:
            log.warning("entry.corrupt not marked yet", extra={"err": str(exc)})
            await msg.nak(delay=1.0)
            return
        self.corrupt_events += 1
        await msg.ack()

    # -- operator commands ----------------------------------------------------------------

    async def trigger_audit(self, _: TriggerAuditCommand) -> dict[str, Any]:
        """Every audit now (BookKeeper's triggerAudit cuts lostBookieRecoveryDelay short):
        lost bookies, then each check, whatever its interval."""
        self._require_leader()
        now_due = self.lost.run_now()
        marked = await self.audit_lost_bookies(now_due) if now_due else 0
        reply: dict[str, Any] = {}
        for name in self.checks:
            reply[name] = await self.run_check(name)
            marked += reply[name].get("ledgers_marked", 0)
        reply["ledgers_marked"] = marked
        return reply

    async def recover_bookie(self, command: RecoverBookieCommand) -> dict[str, Any]:
        marked = await self.mark_ledgers_on(set(command.bookie_ids()), MarkReason.MANUAL)
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
        marked = await self.mark_ledgers_on({command.bookie_src}, MarkReason.DECOMMISSION)
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
