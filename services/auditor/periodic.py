"""The auditor's periodic checks (BookKeeper's Auditor: the bookie check, checkAllLedgers,
the replicas check and the placement policy check), each on its own interval, each run
recorded for `auditor.status`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.auditor.checks import LedgerChecker
from services.auditor.marking import Marker
from shared import clock
from shared.autorecovery import (
    FragmentCheck,
    MarkDecision,
    MarkReason,
    PlacementProblem,
    ReadOutcome,
    mark_decisions,
    missing_bookies,
    placement_violations,
    plan_check_all,
    plan_replicas_check,
)
from shared.config import AuditorSettings
from shared.events import EventPublisher
from shared.metaclient import MetadataClient, MetadataError
from shared.metrics import SLOW_BOUNDS_MS, OpStats
from shared.models import BookieState, LedgerMetadata
from shared.protocol.placement import PlacementPolicy
from shared.status import QuireError

log = logging.getLogger(__name__)

# The checks, by the name the status and trigger_audit report them under.
BOOKIE_CHECK = "bookie_check"
CHECK_ALL = "check_all_ledgers"
REPLICAS_CHECK = "replicas_check"
PLACEMENT_CHECK = "placement_policy_check"


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


class PeriodicChecks:
    def __init__(
        self,
        settings: AuditorSettings,
        meta: MetadataClient,
        marker: Marker,
        checker: LedgerChecker,
        events: EventPublisher,
        *,
        waiting: Callable[[], set[str]],
        enabled: Callable[[], bool],
        placement: PlacementPolicy | None = None,
    ) -> None:
        """`waiting`: the lost bookies still within their lostBookieRecoveryDelay (the
        bookie check leaves them to the lost-bookie audit). `enabled`: the stored
        auto-recovery switch; while it is off every check is skipped, as BookKeeper's
        ("Ledger replication disabled, skipping ...").
        `placement`: the policy the placement check holds segments to (QUIRE_PLACEMENT__*)."""
        self.settings = settings
        self.placement = placement or PlacementPolicy()
        self._meta = meta
        self._marker = marker
        self._checker = checker
        self._events = events
        self._waiting = waiting
        self._enabled = enabled
        self._ledger_slots = asyncio.Semaphore(
            settings.auditor_max_number_of_concurrent_open_ledger_operations
        )
        self.status = {
            BOOKIE_CHECK: CheckStatus(settings.auditor_periodic_bookie_check_interval_s),
            CHECK_ALL: CheckStatus(settings.auditor_periodic_check_interval_s),
            REPLICAS_CHECK: CheckStatus(settings.auditor_periodic_replicas_check_interval_s),
            PLACEMENT_CHECK: CheckStatus(
                settings.auditor_periodic_placement_policy_check_interval_s
            ),
        }
        self._due: dict[str, float | None] = {}  # monotonic; None: off
        # Metrics (services.auditor.metrics): each check's run times, and the ledgers the
        # read checks read, over every run.
        self.durations = {name: OpStats(SLOW_BOUNDS_MS) for name in self.status}
        self.ledgers_checked = 0
        # As of the last placement check (BookKeeper's gauges of the same meaning).
        self.ledgers_not_adhering = 0
        self.ledgers_softly_adhering = 0

    def schedule_for_new_term(self, now: float) -> None:
        """The bookie check runs at once (as BookKeeper's on election), the others after
        their interval (0: never)."""
        for name, check in self.status.items():
            if name == BOOKIE_CHECK:
                self._due[name] = now
            else:
                self._due[name] = now + check.interval_s if check.interval_s > 0 else None

    def start_due(self, now: float, spawn: Callable[[Awaitable[Any], str], Any]) -> None:
        for name, due in self._due.items():
            if due is None or now < due or self.status[name].running:
                continue
            interval = self.status[name].interval_s
            self._due[name] = now + interval if interval > 0 else None
            spawn(self._periodic(name), f"audit-{name}")

    async def _periodic(self, name: str) -> None:
        try:
            await self.run(name)
        except (MetadataError, QuireError) as exc:
            log.warning("audit check failed", extra={"check": name, "err": str(exc)})

    async def run(self, name: str) -> dict[str, Any]:
        """Run one check now and record it in the status; its findings."""
        runners: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
            BOOKIE_CHECK: self.bookie_check,
            CHECK_ALL: self.check_all_ledgers,
            REPLICAS_CHECK: self.replicas_check,
            PLACEMENT_CHECK: self.placement_check,
        }
        status = self.status[name]
        if not self._enabled():
            status.last_findings = {"skipped": "autorecovery disabled"}
            log.info("audit check skipped: autorecovery disabled", extra={"check": name})
            return status.last_findings
        status.running = True
        status.last_started_at = clock.wall_ms()
        started = time.monotonic()
        succeeded = False
        try:
            findings = await runners[name]()
            succeeded = True
        except (MetadataError, QuireError) as exc:
            status.last_error = str(exc)
            raise
        finally:
            status.running = False
            status.runs += 1
            duration_ms = (time.monotonic() - started) * 1000
            status.last_duration_ms = round(duration_ms, 3)
            self.durations[name].record(duration_ms, succeeded)
        status.last_findings = findings
        status.last_error = None
        log.info("audit check done", extra={"check": name, **findings})
        return findings

    async def _alive(self) -> set[str]:
        bookies = await self._meta.list_bookies()
        return {b.bookie_id for b in bookies if b.state is not BookieState.LOST}

    async def bookie_check(self) -> dict[str, Any]:
        """Mark every ledger naming a bookie not registered alive (not those still
        within their lostBookieRecoveryDelay)."""
        alive = await self._alive()
        marked = 0
        async for page in self._marker.ledgers():
            for metadata in page:
                waiting = self._waiting()
                named = [b for b in missing_bookies(metadata, alive) if b not in waiting]
                if named and await self._marker.mark(
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
        alive = await self._alive()
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
            self.ledgers_checked += 1
            findings["entries_read"] += result.entries_read
            findings["unreachable"] += sum(
                1 for _, outcome in result.outcomes if outcome is ReadOutcome.UNREACHABLE
            )
            findings["digest_unverified_ledgers"] += not result.digest_verified
            for decision in mark_decisions(metadata.ledger_id, result.outcomes, reason):
                if await self._marker.mark(decision):
                    findings["ledgers_marked"] += 1

        async for page in self._marker.ledgers():
            self._marker.require_leader()
            # Every ledger of the page finishes (or fails) before the check goes on or fails.
            results = await asyncio.gather(
                *(check_one(metadata) for metadata in page), return_exceptions=True
            )
            for failure in results:
                if isinstance(failure, BaseException):
                    raise failure
        return findings

    async def placement_check(self) -> dict[str, Any]:
        """Each segment against the placement rules and the policy. A failing segment's
        bookies to move are the fewest whose replacement by writable bookies makes it
        adhere (none: reported only); marked when repair is on, so that the replicator,
        which places by the same policy, moves them. Softly adhering segments (zoneaware
        below the desired zones) are counted, never marked."""
        bookies = await self._meta.list_bookies()
        now_ms = clock.wall_ms()
        registered = {b.bookie_id: b.location for b in bookies}
        writable = {
            b.bookie_id: b.location
            for b in bookies
            if b.state is BookieState.WRITABLE and b.lease_expires_at > now_ms
        }
        violations = 0
        ledgers = 0
        soft = 0
        repair = self.settings.repaired_placement_policy_not_adhering_bookie_enable
        async for page in self._marker.ledgers():
            for metadata in page:
                found = placement_violations(metadata, registered, self.placement, writable)
                if not found:
                    continue
                failing = [v for v in found if v.problem is not PlacementProblem.SOFTLY_ADHERING]
                if failing:
                    ledgers += 1
                    violations += len(failing)
                else:
                    soft += 1
                self._events.emit(
                    "autorecovery.placement_policy_not_adhering",
                    ledger_id=metadata.ledger_id,
                    segments=sorted({v.segment_index for v in found}),
                    problems=sorted({v.problem.value for v in found}),
                )
                named = tuple(sorted({b for v in found for b in v.bookie_ids}))
                if repair and named:
                    await self._marker.mark(
                        MarkDecision(metadata.ledger_id, named, MarkReason.PLACEMENT)
                    )
        self.ledgers_not_adhering = ledgers
        self.ledgers_softly_adhering = soft
        return {
            "ledgers_not_adhering": ledgers,
            "ledgers_softly_adhering": soft,
            "segments_not_adhering": violations,
            "marked": repair,
        }
