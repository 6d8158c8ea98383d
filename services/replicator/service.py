"""The replicator: `num_workers` replication workers (BookKeeper's ReplicationWorker) that
claim under-replicated ledgers from the metadata queue (`urq.*`) and copy their fragments
off the marked bookies with the protocol library (`ProtocolClient.replicate`).

One worker's turn (its decisions are `shared/autorecovery_worker.py`'s):

1. Claim (`urq.claim`, lease `underreplicated_lease_ms`, worker id
   `<instance>-<pid>-<n>`). Nothing to claim, or autorecovery disabled (the queue then
   hands out nothing): wait `claim_poll_interval_ms`. The queue or the metadata service
   failing: wait `rw_rereplicate_backoff_ms`.
2. Read the ledger. Deleted meanwhile: `urq.replicated`. No stored keys (a ledger made
   before they were stored) or a mark that names no bookie: deferred as a failure. A
   marked bookie that is registered alive, is not in the open last segment and reads
   back every entry it stores of the ledger intact is not replaced (a mark that outlived
   a registration lapsed for a moment: `bookies_to_replace`); none left: done.
3. Closed ledger, or open with no marked bookie in its open last segment: copy the closed
   fragments on the marked bookies. Open with a marked bookie in its last segment: past
   `open_ledger_rereplication_grace_period_ms` since the mark, fence and recover it
   (`ProtocolClient.recover`) and copy; inside it, copy the closed fragments and defer the
   claim until the grace period ends (the writer may replace the bookie by itself
   meanwhile); the worker that claims it then recovers it.
4. Done (nothing of the ledger left on the marked bookies): `urq.replicated` with the mark
   version claimed; a newer mark keeps the ledger queued. Failed: deferred for the failed
   ledger's backoff.

While it works the worker renews its claim every third of the lease; when a renewal says
the claim is no longer its own, or it cannot renew before the lease runs out, it stops
the copy (a copy not yet in the metadata changes nothing). A deferred claim is held with
one renewal whose lease is the wait (`shared/autorecovery_worker.py` says why), then left
to lapse.

Every step is an event: `autorecovery.claimed`, `autorecovery.fragment_replicated`,
`autorecovery.replicated`, `autorecovery.released`. `<prefix>.replicator.status` answers
the counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from nats.micro.request import Request
from pydantic import ValidationError

from services.replicator.metrics import replicator_metrics
from shared import wire
from shared.autorecovery import PlacementProblem, placement_violations, plan_replicas_check
from shared.autorecovery_worker import (
    Action,
    ClaimFacts,
    ClaimLease,
    FailedLedgers,
    Outcome,
    Reason,
    after_replication,
    bookies_to_replace,
    grace_remaining_ms,
    hold_lease_ms,
    plan_claim,
)
from shared.bookie_client import BookieClient, BookieUnreachable
from shared.config import ReplicatorSettings
from shared.digest import DigestManager, DigestMismatch, LedgerKeys
from shared.events import EventPublisher
from shared.metaclient import MetadataClient, MetadataError
from shared.metrics import SLOW_BOUNDS_MS, OpStats, serve_metrics
from shared.models import (
    BookieInfo,
    BookieState,
    LedgerMetadata,
    LedgerState,
    MetaErrorCode,
    UnderreplicatedLedger,
)
from shared.protocol.driver import ProtocolClient, monotonic_ms, wall_clock_ms
from shared.protocol.messages import FragmentReplicated
from shared.protocol.placement import PlacementPolicy
from shared.protocol.replication import ReplicationSettings, fragments_on, open_fragment_on
from shared.service import ServiceRuntime
from shared.status import BookieStatus, QuireError
from shared.telemetry import background_span

log = logging.getLogger(__name__)

# What the replicator moves for the placement check's marks even when intact: the bookies
# whose move makes a segment adhere to the policy.
_MOVED_BY_PLACEMENT = frozenset({PlacementProblem.NOT_ADHERING})


@dataclass
class ReplicatorStats:
    """The process's counters, over all its workers (`replicator.status`, and the metrics:
    `services.replicator.metrics`)."""

    claimed: int = 0  # claims obtained
    replicated: int = 0  # ledgers found whole at the end of a claim (`urq.replicated` done)
    failed: int = 0  # claims that ended in a failure backoff
    deferred: int = 0  # claims of open ledgers held until their grace period ends
    released: int = 0  # claims given up otherwise (lost, a newer mark)
    recovered: int = 0  # open ledgers fenced and recovered
    fragments: int = 0  # fragments copied
    entries: int = 0  # entries copied
    bytes: int = 0  # entry bytes copied
    claim_errors: int = 0  # claims the queue failed to hand out (unavailable, malformed)
    idle_polls: int = 0  # claims answered with nothing to do (or autorecovery disabled)
    placement_fallbacks: int = 0  # fragments copied to a target that breaks the policy
    # worker id -> (ledger id, when it was claimed, monotonic ms)
    in_progress: dict[str, tuple[int, int]] = field(default_factory=dict)
    # BookKeeper's rereplicate: each claim from its start to its end (success: replicated).
    rereplicate: OpStats = field(default_factory=lambda: OpStats(SLOW_BOUNDS_MS))


@dataclass(frozen=True)
class Verdict:
    """How a claim ended, as `ReplicationWorker._rereplicate` found."""

    outcome: Outcome | None  # None: the ledger was deleted (mark it replicated)
    reason: Reason | None = None
    wait_ms: int = 0  # DEFER_*: how long the claim is held
    error: str = ""
    recovered: bool = False


class ReplicationWorker:
    """One worker: claims a ledger at a time and works on it until it is done or deferred."""

    def __init__(
        self,
        worker_id: str,
        meta: MetadataClient,
        client: ProtocolClient,
        events: EventPublisher,
        settings: ReplicatorSettings,
        stats: ReplicatorStats,
    ) -> None:
        self.worker_id = worker_id
        self._meta = meta
        self._client = client
        self._events = events
        self._settings = settings
        self._stats = stats
        self.failed_ledgers = FailedLedgers()
        self.current: UnderreplicatedLedger | None = None  # the claim being worked on
        self._fragment_started_ms = 0
        self._replication = ReplicationSettings(
            rereplication_entry_batch_size=settings.rereplication_entry_batch_size,
            replication_rate_by_bytes=settings.replication_rate_by_bytes,
            read=client.read_settings(),
        )

    async def run(self) -> None:
        """Claim and work until cancelled; nothing a ledger or the queue does stops it."""
        settings = self._settings
        while True:
            asked_ms = monotonic_ms()
            try:
                claim = await self._meta.claim_underreplicated(
                    self.worker_id, settings.underreplicated_lease_ms
                )
            except Exception as exc:  # unavailable, or an answer that does not parse
                self._stats.claim_errors += 1
                log.warning(
                    "claim failed; backing off",
                    extra={"worker": self.worker_id, "err": repr(exc)},
                )
                await asyncio.sleep(settings.rw_rereplicate_backoff_ms / 1000)
                continue
            if claim is None:
                self._stats.idle_polls += 1
                await asyncio.sleep(settings.claim_poll_interval_ms / 1000)
                continue
            await self.work_on(claim, asked_ms)

    async def work_on(self, claim: UnderreplicatedLedger, asked_ms: int) -> None:
        """Work on one claimed ledger (claimed at `asked_ms`, monotonic), keeping the claim
        meanwhile, and end the claim."""
        started_ms = monotonic_ms()
        ledger_id = claim.ledger_id
        stats = self._stats
        stats.claimed += 1
        stats.in_progress[self.worker_id] = (ledger_id, started_ms)
        self._events.emit(
            "autorecovery.claimed",
            ledger_id=ledger_id,
            worker_id=self.worker_id,
            missing_bookies=claim.missing_bookies,
            mark_version=claim.mark_version,
            marked_at=claim.marked_at,
            since_mark_ms=max(0, wall_clock_ms() - claim.marked_at),
        )
        log.info(
            "claimed under-replicated ledger",
            extra={
                "worker": self.worker_id,
                "ledger_id": ledger_id,
                "bookies": claim.missing_bookies,
            },
        )
        self.current = claim
        try:
            verdict = await self._while_claimed(claim, asked_ms)
            self.current = None
            await self._end_claim(claim, verdict, started_ms)
        finally:
            del stats.in_progress[self.worker_id]

    async def _while_claimed(self, claim: UnderreplicatedLedger, asked_ms: int) -> Verdict:
        """`_rereplicate` while the claim is renewed; a lost claim stops it."""
        lease = ClaimLease(self._settings.underreplicated_lease_ms, asked_ms)
        job = asyncio.ensure_future(self._rereplicate(claim))
        keeper = asyncio.ensure_future(self._keep_claim(claim.ledger_id, lease))
        try:
            await asyncio.wait({job, keeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            keeper.cancel()
            if not job.done():
                job.cancel()
            await asyncio.gather(job, keeper, return_exceptions=True)
        if job.cancelled():
            return Verdict(Outcome.DEFER_FAILED, Reason.CLAIM_LOST, error="claim lost")
        return job.result()

    async def _keep_claim(self, ledger_id: int, lease: ClaimLease) -> None:
        """Renew every third of the lease; return once the claim is no longer ours."""
        while True:
            await asyncio.sleep(lease.renew_interval_ms / 1000)
            asked_ms = monotonic_ms()
            try:
                still_ours = await self._meta.renew_underreplicated(
                    ledger_id, self.worker_id, lease.lease_ms
                )
            except Exception as exc:  # unavailable, or an answer that does not parse
                if lease.held(monotonic_ms()):
                    log.warning(
                        "claim renewal failed; retrying",
                        extra={"ledger_id": ledger_id, "err": repr(exc)},
                    )
                    continue
                still_ours = False
            if not still_ours:
                log.warning(
                    "claim lost; stopping", extra={"worker": self.worker_id, "ledger_id": ledger_id}
                )
                return
            lease.renewed(asked_ms)

    async def _rereplicate(self, claim: UnderreplicatedLedger) -> Verdict:
        """BookKeeper's `rereplicate(ledgerId)`: what became of the claimed ledger. Errors
        of the copy are failures of this ledger (backoff), never of the worker. Traced as
        background work: the recovery and the copy (`ledger.rereplicate`) are its children."""
        try:
            attributes = {
                "quire.ledger_id": claim.ledger_id,
                "quire.bad_bookies": claim.missing_bookies,
            }
            with background_span("replicator.rereplicate", attributes=attributes):
                return await self._replicate_ledger(claim)
        # ValidationError: an answer of the metadata service that does not parse.
        except (QuireError, MetadataError, ValidationError) as exc:
            return Verdict(Outcome.DEFER_FAILED, Reason.FAILED, error=str(exc))
        except Exception as exc:  # a bug: loud in the log, but one ledger must not stop the worker
            log.exception("replication of ledger %d failed", claim.ledger_id)
            return Verdict(Outcome.DEFER_FAILED, Reason.FAILED, error=repr(exc))

    async def _replicate_ledger(self, claim: UnderreplicatedLedger) -> Verdict:
        bad = list(claim.missing_bookies)
        metadata = await self._get_ledger(claim.ledger_id)
        keys = LedgerKeys.of(metadata) if metadata is not None else None
        if bad and metadata is not None and keys is not None:
            bad = await self._to_replace(metadata, keys, bad)
            if not bad:
                log.info(
                    "the marked bookies are back with the ledger's entries intact",
                    extra={"ledger_id": claim.ledger_id, "bookies": claim.missing_bookies},
                )
                return Verdict(Outcome.DONE)
        facts = ClaimFacts(
            missing_bookies=tuple(bad),
            marked_at_ms=claim.marked_at,
            ledger_exists=metadata is not None,
            has_keys=keys is not None,
            open_fragment_on_marked=metadata is not None and open_fragment_on(metadata, bad),
        )
        plan = plan_claim(
            facts, wall_clock_ms(), self._settings.open_ledger_rereplication_grace_period_ms
        )
        if plan.action is Action.MARK_REPLICATED:
            return Verdict(None, plan.reason)
        if plan.action is Action.DEFER_FAILED:
            return Verdict(
                Outcome.DEFER_FAILED, plan.reason, error=_odd_claim_error(plan.reason, claim)
            )
        assert metadata is not None and keys is not None
        recovered = plan.action is Action.RECOVER_AND_REPLICATE
        if recovered:
            log.warning(
                "open ledger's last segment has a marked bookie and its grace period is over: "
                "fencing and recovering it",
                extra={"ledger_id": claim.ledger_id, "bookies": bad},
            )
            started_ts_ms, started_ms = wall_clock_ms(), monotonic_ms()
            recovery = await self._client.recover(metadata, keys)
            assert recovery.result is not None
            metadata = recovery.result
            self._stats.recovered += 1
            # Its last segment is closed now: a live bookie there can be checked too.
            bad = await self._to_replace(metadata, keys, bad)
            # As the gateway's recoveries: the SLA jobs time every fence to its close.
            if recovery.fenced:
                self._events.emit(
                    "ledger.recovered",
                    ledger_id=claim.ledger_id,
                    last_entry_id=metadata.last_entry_id,
                    recovered_entries=recovery.recovered_entries,
                    started_ts_ms=started_ts_ms,
                    duration_ms=monotonic_ms() - started_ms,
                    worker_id=self.worker_id,
                )
        self._fragment_started_ms = monotonic_ms()
        result = await self._client.replicate(
            metadata, bad, settings=self._replication, on_fragment=self._on_fragment
        )
        after = result.metadata
        outcome = after_replication(len(fragments_on(after, bad)), open_fragment_on(after, bad))
        if outcome is Outcome.DEFER_OPEN:
            wait_ms = grace_remaining_ms(
                claim.marked_at,
                wall_clock_ms(),
                self._settings.open_ledger_rereplication_grace_period_ms,
            )
            return Verdict(outcome, Reason.OPEN_GRACE, wait_ms=wait_ms, recovered=recovered)
        if outcome is Outcome.DEFER_FAILED:
            return Verdict(
                outcome,
                Reason.NOT_REPLICATED,
                error="fragments left on the marked bookies",
                recovered=recovered,
            )
        return Verdict(outcome, recovered=recovered)

    async def _to_replace(
        self, metadata: LedgerMetadata, keys: LedgerKeys, marked: list[str]
    ) -> list[str]:
        """`bookies_to_replace` with what the registry and the marked bookies say now."""
        bookies = await self._meta.list_bookies()
        alive = {b.bookie_id for b in bookies if b.state is not BookieState.LOST}
        misplaced = self._misplaced(metadata, bookies, marked)
        closed = metadata.state is LedgerState.CLOSED
        open_segment = set() if closed else set(metadata.segments[-1].bookies)
        digest = DigestManager.for_keys(metadata.digest, keys)
        intact = {
            bookie_id
            for bookie_id in marked
            if bookie_id in alive
            and bookie_id not in open_segment
            and await self._reads_intact(metadata, digest, bookie_id)
        }
        return list(bookies_to_replace(marked, alive, open_segment, intact, misplaced))

    def _misplaced(
        self, metadata: LedgerMetadata, bookies: list[BookieInfo], marked: list[str]
    ) -> set[str]:
        """The marked bookies the placement check would name now (the auditor's placement
        repair, by the same policy): moved even though their replicas are intact."""
        now_ms = wall_clock_ms()
        registered = {b.bookie_id: b.location for b in bookies}
        writable = {
            b.bookie_id: b.location
            for b in bookies
            if b.state is BookieState.WRITABLE and b.lease_expires_at > now_ms
        }
        found = placement_violations(metadata, registered, self._client.placement, writable)
        named = {b for v in found if v.problem in _MOVED_BY_PLACEMENT for b in v.bookie_ids}
        return named & set(marked)

    async def _reads_intact(
        self, metadata: LedgerMetadata, digest: DigestManager, bookie_id: str
    ) -> bool:
        """The bookie answers every entry it stores of the ledger's closed segments, each
        frame the one written (the auditor's replicas check, for one bookie)."""
        batch = self._replication.read.read_batch_entries
        entry_ids = [
            entry_id
            for check in plan_replicas_check(metadata)
            if check.fragment.bookie_id == bookie_id
            for entry_id in check.entry_ids
        ]
        for start in range(0, len(entry_ids), batch):
            items = [wire.ReadItem(metadata.ledger_id, e) for e in entry_ids[start : start + batch]]
            try:
                status, results = await self._client.bookies.read(bookie_id, items)
            except BookieUnreachable:
                return False
            if status is not BookieStatus.OK or len(results) != len(items):
                return False
            for item, result in zip(items, results, strict=True):
                if result.status is not BookieStatus.OK or result.entry_id != item.entry_id:
                    return False
                try:
                    digest.verify(result.frame, metadata.ledger_id, item.entry_id)
                except DigestMismatch:
                    return False
        return True

    async def _get_ledger(self, ledger_id: int) -> LedgerMetadata | None:
        try:
            return await self._meta.get_ledger(ledger_id)
        except MetadataError as exc:
            if exc.code is MetaErrorCode.NO_SUCH_LEDGER:
                return None
            raise

    def _on_fragment(self, copied: FragmentReplicated) -> None:
        """A fragment's copy is stored (its new bookie named in the metadata): count it and
        announce it, whatever becomes of the rest of the ledger."""
        fragment = copied.fragment
        stats = self._stats
        stats.fragments += 1
        stats.entries += copied.entries
        stats.bytes += copied.bytes
        if copied.placement_fallback:
            stats.placement_fallbacks += 1
            log.warning(
                "re-replication target placed at random: the placement policy cannot be met",
                extra={
                    "ledger_id": copied.metadata.ledger_id,
                    "reason": copied.placement_fallback,
                },
            )
        # Fragments are copied one after the other: this one took since the last one.
        started_ms = self._fragment_started_ms
        now_ms = monotonic_ms()
        self._fragment_started_ms = now_ms
        self._events.emit(
            "autorecovery.fragment_replicated",
            ledger_id=copied.metadata.ledger_id,
            worker_id=self.worker_id,
            first_entry_id=fragment.first_entry_id,
            last_entry_id=fragment.last_entry_id,
            ensemble_index=fragment.ensemble_index,
            bookie_src=fragment.bookie_id,
            bookie_dest=copied.new_bookie_id,
            entries=copied.entries,
            bytes=copied.bytes,
            duration_ms=now_ms - started_ms,
        )

    async def _end_claim(
        self, claim: UnderreplicatedLedger, verdict: Verdict, started_ms: int
    ) -> None:
        """Tell the queue how the claim ended, count it and announce it."""
        ledger_id = claim.ledger_id
        stats = self._stats
        duration_ms = monotonic_ms() - started_ms
        common = {
            "worker_id": self.worker_id,
            "missing_bookies": claim.missing_bookies,
            "mark_version": claim.mark_version,
            "duration_ms": duration_ms,
            "recovered": verdict.recovered,
        }
        if verdict.outcome is None or verdict.outcome is Outcome.DONE:
            deleted = verdict.outcome is None
            done = await self._queue_op(self._meta.mark_replicated, ledger_id, claim.mark_version)
            # A deleted ledger's mark went with it (nothing can mark it again), done or not.
            if done or deleted:
                stats.replicated += 1
                stats.rereplicate.record(duration_ms, success=True)
                self.failed_ledgers.forget(ledger_id)
                log.info(
                    "ledger replicated",
                    extra={"worker": self.worker_id, "ledger_id": ledger_id, "deleted": deleted},
                )
                self._events.emit(
                    "autorecovery.replicated",
                    ledger_id=ledger_id,
                    ledger_deleted=deleted,
                    since_mark_ms=max(0, wall_clock_ms() - claim.marked_at),
                    **common,
                )
                return
            stats.released += 1
            stats.rereplicate.record(duration_ms, success=False)
            self._released(ledger_id, Reason.STILL_MARKED, 0, common)
            return
        if verdict.reason is Reason.CLAIM_LOST:
            stats.released += 1
            stats.rereplicate.record(duration_ms, success=False)
            self._released(ledger_id, Reason.CLAIM_LOST, 0, common)
            return
        stats.rereplicate.record(duration_ms, success=False)
        if verdict.outcome is Outcome.DEFER_OPEN:
            stats.deferred += 1
            wait_ms = verdict.wait_ms
        else:
            stats.failed += 1
            wait_ms = self.failed_ledgers.record_failure(
                ledger_id, self._settings.lock_release_of_failed_ledger_grace_period_ms
            )
            log.warning(
                "replication of ledger failed; deferring it",
                extra={
                    "worker": self.worker_id,
                    "ledger_id": ledger_id,
                    "reason": verdict.reason,
                    "err": verdict.error,
                    "failures": self.failed_ledgers.failures(ledger_id),
                    "claimable_in_ms": wait_ms,
                },
            )
            common["failures"] = self.failed_ledgers.failures(ledger_id)
            common["error"] = verdict.error
        # Held for the wait by one renewal with the wait as its lease, then left to lapse.
        held = await self._queue_op(
            self._meta.renew_underreplicated, ledger_id, hold_lease_ms(wait_ms)
        )
        assert verdict.reason is not None
        # Not held (lost meanwhile, or the queue failed): claimable when its lease lapses.
        self._released(ledger_id, verdict.reason, wait_ms if held else 0, common)

    def _released(
        self, ledger_id: int, reason: Reason, claimable_in_ms: int, common: dict[str, Any]
    ) -> None:
        self._events.emit(
            "autorecovery.released",
            ledger_id=ledger_id,
            reason=reason.value,
            claimable_in_ms=claimable_in_ms,
            **common,
        )

    async def _queue_op(self, op: Any, ledger_id: int, arg: int) -> bool:
        """One of the claim's last queue operations; False if it failed (the claim's lease
        then lapses by itself)."""
        try:
            return bool(await op(ledger_id, self.worker_id, arg))
        except Exception as exc:  # unavailable, or an answer that does not parse
            log.warning(
                "queue operation failed; the claim will lapse",
                extra={"ledger_id": ledger_id, "op": op.__name__, "err": repr(exc)},
            )
            return False

    async def release_current(self) -> None:
        """At shutdown: give back the claim being worked on, so that another worker takes
        it at once rather than when its lease lapses."""
        claim = self.current
        if claim is None:
            return
        self.current = None
        try:
            await self._meta.release_underreplicated(claim.ledger_id, self.worker_id)
        except Exception as exc:  # shutting down goes on; the lease lapses instead
            log.warning("release at shutdown failed", extra={"err": repr(exc)})
            return
        self._events.emit(
            "autorecovery.released",
            ledger_id=claim.ledger_id,
            reason=Reason.SHUTDOWN.value,
            claimable_in_ms=0,
            worker_id=self.worker_id,
            missing_bookies=claim.missing_bookies,
            mark_version=claim.mark_version,
        )


def _odd_claim_error(reason: Reason | None, claim: UnderreplicatedLedger) -> str:
    if reason is Reason.NO_KEYS:
        return (
            f"ledger {claim.ledger_id} has no stored keys (created before they were kept in "
            "its metadata): it cannot be re-replicated"
        )
    return f"odd mark of ledger {claim.ledger_id}: missing bookies {claim.missing_bookies!r}"


class Replicator:
    """The process: its workers, their shared counters and the status endpoint."""

    def __init__(self, rt: ServiceRuntime) -> None:
        settings = rt.settings
        self._rt = rt
        self.settings = settings.replicator
        self._meta = MetadataClient(rt.nc, rt.subjects, settings.request_timeout_ms / 1000)
        bookies = BookieClient(
            rt.nc,
            rt.subjects,
            add_timeout_ms=settings.gateway.add_bookie_timeout_ms,
            read_timeout_ms=settings.gateway.read_entry_timeout_ms,
        )
        self.client = ProtocolClient(
            bookies,
            self._meta,
            settings.gateway,
            placement=PlacementPolicy(settings.placement.rules()),
        )
        self.stats = ReplicatorStats()
        self.workers = [
            ReplicationWorker(
                f"{rt.instance}-{os.getpid()}-{n}",
                self._meta,
                self.client,
                rt.events,
                self.settings,
                self.stats,
            )
            for n in range(1, self.settings.num_workers + 1)
        ]

    async def autorecovery_enabled(self) -> bool | None:
        """The cluster's switch as the metadata service has it now (None: unknown, the
        service unavailable or its answer malformed)."""
        try:
            return (await self._meta.get_cluster_settings()).autorecovery_enabled
        except Exception as exc:  # the status answers all the same
            log.warning("cluster settings unknown", extra={"err": repr(exc)})
            return None

    async def status(self, request: Request) -> None:
        enabled = await self.autorecovery_enabled()
        stats = self.stats
        now_ms = monotonic_ms()
        body = {
            "instance": self._rt.instance,
            "workers": [w.worker_id for w in self.workers],
            # Off: the queue hands out no claim, so these workers claim nothing.
            "autorecovery_enabled": enabled,
            "claimed": stats.claimed,
            "replicated": stats.replicated,
            "failed": stats.failed,
            "deferred": stats.deferred,
            "released": stats.released,
            "recovered": stats.recovered,
            "fragments": stats.fragments,
            "entries": stats.entries,
            "bytes": stats.bytes,
            "claim_errors": stats.claim_errors,
            "idle_polls": stats.idle_polls,
            "in_progress": [
                {"worker_id": worker, "ledger_id": ledger_id, "for_ms": now_ms - since_ms}
                for worker, (ledger_id, since_ms) in sorted(stats.in_progress.items())
            ],
            "failed_ledgers": sum(len(w.failed_ledgers) for w in self.workers),
        }
        await request.respond(json.dumps(body).encode())

    async def release_claims(self) -> None:
        """At shutdown (the workers already stopped): their claims back to the queue, and
        the client's senders stopped."""
        await asyncio.gather(*(w.release_current() for w in self.workers))
        self.client.close()


async def main(rt: ServiceRuntime) -> None:
    replicator = Replicator(rt)
    rt.replicator = replicator  # type: ignore[attr-defined]  # for tests
    serve_metrics(rt, replicator_metrics(replicator.stats))
    await rt.add_endpoint("status", rt.subjects.service("replicator", "status"), replicator.status)
    rt.on_shutdown(replicator.release_claims)
    for worker in replicator.workers:
        rt.spawn(worker.run(), f"replication-worker-{worker.worker_id}")
