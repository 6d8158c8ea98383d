"""The bookie's garbage collector (BookKeeper's GarbageCollectorThread): a task of the
ledgerstore service that, every `gc_wait_time_ms` or when forced (`gc` endpoint):

1. ledger GC (ScanAndCompareGarbageCollector): catches up with the journal, takes the
   bookie's ledger ids, lists metadata's `ledger.ranges` and, with `verify_metadata_on_gc`,
   confirms each candidate with `ledger.get` (`shared.bookie.gc.RangeScan`: nothing at all
   when the listing fails part way); asks its journal to forget the confirmed ledgers
   (`journal.delete`, DELETED records), applies them (`store.apply_through`) and
   checkpoints, which drops their index rows and entry-log usage;
2. entry-log GC: deletes the sealed entry logs that hold no live ledger;
3. compaction: the major or minor compaction the schedule says
   (`shared.bookie.gc.compaction_kind`), one log at a time, lowest usage first, until
   the kind's max time passes, the kind is suspended, or the service stops.

Decisions are the pure `shared.bookie.gc`; this module does the IO and keeps the
counters, events and details. A run that fails is logged and counted, and the next
wait retries: errors never end the task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shared import clock
from shared.aio import wait_event
from shared.bookie.cookie import NO_INSTANCE
from shared.bookie.entrylog_format import EntryLogFormatError
from shared.bookie.gc import (
    JOURNAL_DELETE_MAX_LEDGERS,
    MAJOR,
    MINOR,
    CompactionPolicy,
    CompactionResult,
    EntryLogMetadata,
    GcFlags,
    GcRun,
    RangeScan,
    compaction_kind,
    confirmed_deleted,
    effective_flags,
    explain,
    logs_to_compact,
    next_compaction_ms,
    reclaimed_ledgers,
    suspended,
    time_up,
    usage_buckets,
)
from shared.bookie.journal_dir import parse_journal_position
from shared.bookie.journal_format import JournalFormatError, JournalPosition
from shared.bookie.rules import disk_read_only
from shared.config import LedgerstoreSettings
from shared.metaclient import MetadataError
from shared.metrics import SLOW_BOUNDS_MS, OpStats
from shared.models import LedgerRangesReply
from shared.telemetry import background_span, internal_span

log = logging.getLogger(__name__)

RANGES_PAGE_SIZE = 10_000  # ledger ids a `ledger.ranges` page covers at most
VERIFY_CONCURRENCY = 32  # `ledger.get` verifications in flight at once


class GcStore(Protocol):
    """The ledgerstore API the collector drives (services/ledgerstore/store.py)."""

    ledgers: dict[int, Any]

    async def catch_up(self) -> bool: ...
    async def apply_through(self, positions: JournalPositions) -> bool: ...
    def entry_logs(self) -> list[EntryLogMetadata]: ...
    def current_entry_logs(self) -> list[tuple[int, int, int]]: ...
    async def delete_dead_entry_logs(self) -> list[EntryLogMetadata]: ...
    async def compact_entry_log(
        self, dir: int, log_id: int, should_stop: Callable[[], bool]
    ) -> CompactionResult: ...


class GcMetadata(Protocol):
    """What the collector asks metadata (shared.metaclient.MetadataClient)."""

    async def ledger_ranges(
        self, after: int | None = None, limit: int = ...
    ) -> LedgerRangesReply: ...

    async def get_ledger(self, ledger_id: int) -> Any: ...

    async def instance_id(self) -> str: ...


# Journal index (of its directory) -> a position in that journal.
JournalPositions = dict[int, JournalPosition]
JournalDelete = Callable[[list[int]], Awaitable[JournalPositions]]
Emit = Callable[..., None]
DiskUsage = Callable[[Path], tuple[int, int]]  # a directory -> (used, total) bytes


def os_disk_usage(path: Path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return usage.total - usage.free, usage.total


def wall_ms() -> int:
    return clock.wall_ms()


class GcError(Exception):
    """A step of a run failed (the journal refused, an IO error): the run ends, the next
    one retries."""


@dataclass(slots=True)
class GcStats:
    """BookKeeper's garbage-collector metrics (GarbageCollectorStats), snake case; served
    by `services.ledgerstore.metrics` at scrape time."""

    gc_runs: int = 0
    gc_failures: int = 0  # runs that ended in an error (retried at the next wait)
    deleted_ledger_count: int = 0
    deleted_entry_log_count: int = 0
    reclaimed_deletion_space_bytes: int = 0
    reclaimed_compaction_space_bytes: int = 0
    major_compaction_count: int = 0
    minor_compaction_count: int = 0
    compacted_entry_log_count: int = 0
    # COMPACT_RUNTIME: per entry log compacted.
    compact_runtime: OpStats = field(default_factory=lambda: OpStats(SLOW_BOUNDS_MS))
    active_entry_log_count: int = 0  # sealed logs, as of the last run
    active_entry_log_space_bytes: int = 0  # their live bytes
    entry_log_usage_buckets: list[int] = field(default_factory=lambda: usage_buckets([]))


def policy_of(settings: LedgerstoreSettings) -> CompactionPolicy:
    return CompactionPolicy(
        minor_threshold=settings.minor_compaction_threshold,
        minor_interval_ms=settings.minor_compaction_interval_ms,
        minor_max_time_ms=settings.minor_compaction_max_time_ms,
        major_threshold=settings.major_compaction_threshold,
        major_interval_ms=settings.major_compaction_interval_ms,
        major_max_time_ms=settings.major_compaction_max_time_ms,
        force_gc_allow_when_no_space=settings.is_force_gc_allow_when_no_space,
    )


class GarbageCollector:
    def __init__(
        self,
        store: GcStore,
        settings: LedgerstoreSettings,
        *,
        bookie_id: str,
        ledger_dirs: list[Path],
        metadata: GcMetadata,
        journal_delete: JournalDelete,
        checkpoint: Callable[[], Awaitable[None]],
        emit: Emit,
        disk_usage: DiskUsage = os_disk_usage,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.store = store
        self.settings = settings
        self.policy = policy_of(settings)
        self.bookie_id = bookie_id
        self.ledger_dirs = ledger_dirs
        self.metadata = metadata
        self.journal_delete = journal_delete
        self.checkpoint = checkpoint
        self.emit = emit
        self.disk_usage = disk_usage
        self.clock_ms = clock_ms
        self.stats = GcStats()
        self.suspend_major = False
        self.suspend_minor = False
        self.disk_full = False  # read-only for a full ledger disk (diskUsageThreshold)
        self.closing = False
        self.running = False
        # The cluster instance the bookie's cookie names (set once the cookie is read;
        # NO_INSTANCE: a cookie from before instance ids, not checked).
        self.instance_id = NO_INSTANCE
        self.compacting = ""  # MAJOR or MINOR while that kind runs
        self.forced = False  # the run under way was forced
        # The compaction clocks start with the collector, as BookKeeper's do: the first
        # periodic compaction comes an interval after the bookie starts.
        started_ms = clock_ms()
        self.major_clock_ms = started_ms
        self.minor_clock_ms = started_ms
        self.last_major_ms = 0  # when a compaction of that kind last ran (0: never)
        self.last_minor_ms = 0
        self.last_gc_ms = 0
        self.last_skipped = ""
        self._wake = asyncio.Event()
        self._force_major = False
        self._force_minor = False
        self._forced = False
        self._waiters: list[asyncio.Future[GcRun]] = []

    # -- triggering -----------------------------------------------------------------------

    def trigger(self, force_major: bool = False, force_minor: bool = False) -> asyncio.Future:
        """Ask for a run now (BookKeeper's forceGC); the future completes with that run
        (a run already under way does not count: the next one starts once it ends)."""
        self._forced = True
        self._force_major |= force_major
        self._force_minor |= force_minor
        future: asyncio.Future[GcRun] = asyncio.get_running_loop().create_future()
        if self.closing:
            future.set_exception(GcError("the bookie is stopping"))
            return future
        self._waiters.append(future)
        self._wake.set()
        return future

    def set_suspended(self, major: bool | None = None, minor: bool | None = None) -> None:
        """suspendMajorGC/suspendMinorGC and their resume; a compaction of a kind
        suspended meanwhile stops after the log it is on (unless that run was forced)."""
        if major is not None and major != self.suspend_major:
            self.suspend_major = major
            log.info("major compaction " + ("suspended" if major else "resumed"))
        if minor is not None and minor != self.suspend_minor:
            self.suspend_minor = minor
            log.info("minor compaction " + ("suspended" if minor else "resumed"))

    async def close(self) -> None:
        """The service stops: a compaction under way abandons at its next batch, and
        whoever waits for a run is told it will not come."""
        self.closing = True
        _fail(self._waiters, GcError("the bookie is stopping"))

    async def run_forever(self) -> None:
        wait_s = self.settings.gc_wait_time_ms / 1000
        while not self.closing:
            await wait_event(self._wake, wait_s)
            self._wake.clear()
            forced, force_major, force_minor = self._forced, self._force_major, self._force_minor
            waiters = self._waiters
            self._force_major = self._force_minor = self._forced = False
            self._waiters = []
            try:
                run = await self.run_once(forced, force_major, force_minor)
            except asyncio.CancelledError:  # the service stops
                _fail(waiters, GcError("the bookie is stopping"))
                raise
            except Exception as exc:  # never fatal: the next wait retries
                self.stats.gc_failures += 1
                log.exception("garbage collection run failed")
                _fail(waiters, GcError(repr(exc)))
                continue
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(run)

    # -- one run --------------------------------------------------------------------------

    def flags(self, force_major: bool = False, force_minor: bool = False) -> GcFlags:
        return GcFlags(
            force_major, force_minor, self.suspend_major, self.suspend_minor, self.disk_full
        )

    def run_flags(self, forced: bool, force_major: bool, force_minor: bool) -> GcFlags:
        """A forced run compacts only the kinds it was asked to (BookKeeper's
        enableForceGC(forceMajor, forceMinor) suspends the others for that run); a
        periodic run follows the schedule."""
        flags = self.flags(force_major, force_minor)
        if not forced:
            return flags
        return GcFlags(
            force_major,
            force_minor,
            flags.suspend_major or not force_major,
            flags.suspend_minor or not force_minor,
            flags.disk_full,
        )

    async def run_once(
        self, forced: bool = False, force_major: bool = False, force_minor: bool = False
    ) -> GcRun:
        """One run (GarbageCollectorThread.runWithFlags): ledgers, entry logs, compaction."""
        run = GcRun(started_ms=self.clock_ms())
        attributes = {"quire.bookie_id": self.bookie_id, "quire.gc.forced": forced}
        with background_span("gc.run", attributes=attributes) as span:
            self.running, self.forced = True, forced
            try:
                await self.check_disks()
                flags = self.run_flags(forced, force_major, force_minor)
                await self._gc_ledgers(run)
                await self._gc_entry_logs(run)
                kind = compaction_kind(
                    self.policy, flags, self.clock_ms(), self.major_clock_ms, self.minor_clock_ms
                )
                if kind:
                    await self._compact(kind, flags, run)
                self._measure_logs()
            finally:
                self.running = self.forced = False
                run.duration_ms = self.clock_ms() - run.started_ms
                self.last_gc_ms = run.started_ms
                self.last_skipped = run.skipped
                self.stats.gc_runs += 1
            if span is not None:
                span.set_attributes({f"quire.gc.{k}": v for k, v in run.to_json().items()})
        log.info("garbage collection run", extra={"run": run.to_json(), "forced": forced})
        return run

    async def check_disks(self) -> None:
        """The bookie's "read-only because a disk is full" state, from the ledger
        directories' usage by the same rule the journal registers (disk_read_only)."""
        try:
            fractions = await asyncio.to_thread(self._disk_fractions)
        except OSError as exc:
            log.warning("gc disk check failed", extra={"err": repr(exc)})
            return
        full = disk_read_only(
            self.disk_full,
            max(fractions, default=0.0),
            self.settings.disk_usage_threshold,
            self.settings.disk_usage_lwm_threshold,
        )
        if full != self.disk_full:
            log.warning("gc: ledger disk " + ("full" if full else "has room again"))
        self.disk_full = full

    def _disk_fractions(self) -> list[float]:
        fractions = []
        for directory in self.ledger_dirs:
            used, total = self.disk_usage(directory)
            fractions.append(used / total if total else 0.0)
        return fractions

    # -- 1. ledgers -----------------------------------------------------------------------

    async def _gc_ledgers(self, run: GcRun) -> None:
        if not await self._same_cluster(run):
            return
        await self.store.catch_up()
        # Taken before the listing starts (see RangeScan for why this order is safe).
        scan = RangeScan(self.store.ledgers)
        with internal_span("gc.list_ledgers"):
            while not scan.done and not scan.failed:
                try:
                    page = await self.metadata.ledger_ranges(scan.after, RANGES_PAGE_SIZE)
                except Exception as exc:  # unreachable, slow, refused: the listing is partial
                    scan.fail(f"metadata listing failed: {exc}")
                    break
                scan.page(page.ranges, page.next_after)
        if scan.failed:
            run.skipped = scan.failed
            log.warning("gc: no ledger deleted", extra={"reason": scan.failed})
            return
        candidates = scan.candidates()
        if self.settings.verify_metadata_on_gc and candidates:
            with internal_span("gc.verify_ledgers", attributes={"quire.ledgers": len(candidates)}):
                candidates, unsure = await self._verify(candidates)
            if unsure:
                run.skipped = f"metadata did not confirm {unsure} deletions: kept"
        if not candidates:
            return
        with internal_span("gc.delete_ledgers", attributes={"quire.ledgers": len(candidates)}):
            await self._delete_ledgers(candidates, run)
        log.info("gc: ledgers deleted", extra={"ledgers": len(candidates)})
        # Their index rows and entry-log usage go with this checkpoint's transaction.
        await self.checkpoint()

    async def _delete_ledgers(self, candidates: list[int], run: GcRun) -> None:
        for start in range(0, len(candidates), JOURNAL_DELETE_MAX_LEDGERS):
            batch = candidates[start : start + JOURNAL_DELETE_MAX_LEDGERS]
            positions = await self.journal_delete(batch)
            # The journal has forgotten them durably: they are deleted, whatever follows.
            run.ledgers_deleted += len(batch)
            self.stats.deleted_ledger_count += len(batch)
            for ledger_id in batch:
                self.emit("gc.ledger_deleted", ledger_id=ledger_id, bookie_id=self.bookie_id)
            if not await self.store.apply_through(positions):
                raise GcError(f"ledgerstore could not apply the journal up to {positions}")

    async def _same_cluster(self, run: GcRun) -> bool:
        """Whether metadata is the cluster instance the bookie's cookie names. A metadata
        store of another instance (a new, empty database, the wrong URL) would list no
        ledger and confirm every one as gone: this bookie would delete everything."""
        if self.instance_id == NO_INSTANCE:
            return True
        try:
            found = await self.metadata.instance_id()
        except Exception as exc:
            run.skipped = f"metadata instance check failed: {exc}"
            log.warning("gc: no ledger deleted", extra={"reason": run.skipped})
            return False
        if found != self.instance_id:
            run.skipped = (
                f"metadata is cluster instance {found!r}, this bookie's cookie names "
                f"{self.instance_id!r}: nothing deleted"
            )
            log.error("gc: no ledger deleted", extra={"reason": run.skipped})
            return False
        return True

    async def _verify(self, candidates: list[int]) -> tuple[list[int], int]:
        """verifyMetadataOnGc: (the candidates metadata says NO_SUCH_LEDGER of, how many
        it did not confirm: found again, or any error)."""
        confirmed: list[int] = []
        unsure = 0

        async def check(ledger_id: int) -> bool:
            try:
                await self.metadata.get_ledger(ledger_id)
            except MetadataError as exc:
                return confirmed_deleted(exc.code.value)
            except Exception as exc:
                log.info(
                    "gc: verification failed", extra={"ledger_id": ledger_id, "err": repr(exc)}
                )
                return False
            return False  # the ledger exists: created since the listing, never delete it

        for start in range(0, len(candidates), VERIFY_CONCURRENCY):
            batch = candidates[start : start + VERIFY_CONCURRENCY]
            for ledger_id, deleted in zip(
                batch, await asyncio.gather(*(check(i) for i in batch)), strict=True
            ):
                if deleted:
                    confirmed.append(ledger_id)
                else:
                    unsure += 1
        return confirmed, unsure

    # -- 2. entry logs --------------------------------------------------------------------

    async def _gc_entry_logs(self, run: GcRun) -> None:
        with internal_span("gc.delete_entry_logs"):
            deleted = await self.store.delete_dead_entry_logs()
        for meta in deleted:
            run.entry_logs_deleted += 1
            run.reclaimed_by_deletion_bytes += meta.size_bytes
            self.stats.deleted_entry_log_count += 1
            self.stats.reclaimed_deletion_space_bytes += meta.size_bytes
            self._entry_log_deleted(meta, "no_live_ledger", meta.deleted)

    def _entry_log_deleted(
        self, meta: EntryLogMetadata, reason: str, deleted: dict[int, int]
    ) -> None:
        ledgers, truncated = reclaimed_ledgers(deleted)
        self.emit(
            "gc.entrylog_deleted",
            bookie_id=self.bookie_id,
            dir=meta.dir,
            log_id=meta.log_id,
            bytes=meta.size_bytes,
            reason=reason,
            ledgers=ledgers,
            ledgers_truncated=truncated,
        )

    # -- 3. compaction --------------------------------------------------------------------

    async def _compact(self, kind: str, flags: GcFlags, run: GcRun) -> None:
        max_time_ms = self.policy.max_time_ms(kind)
        started_ms = self.clock_ms()
        forced = flags.force_major if kind == MAJOR else flags.force_minor

        def should_stop() -> bool:
            now_flags = self.flags(forced and kind == MAJOR, forced and kind == MINOR)
            return (
                self.closing
                or time_up(started_ms, self.clock_ms(), max_time_ms)
                or suspended(kind, effective_flags(now_flags, self.policy))
            )

        self.compacting = kind
        if kind == MAJOR:
            run.major = True
        else:
            run.minor = True
        log.info("gc: compaction starts", extra={"kind": kind, "forced": forced})
        try:
            for meta in logs_to_compact(self.store.entry_logs(), self.policy.threshold(kind)):
                if should_stop():
                    break
                began_ms = self.clock_ms()
                attributes = {
                    "quire.compaction.kind": kind,
                    "quire.dir": meta.dir,
                    "quire.log_id": meta.log_id,
                    "quire.usage": meta.usage,
                    "quire.bytes": meta.size_bytes,
                }
                with internal_span("compaction.run", attributes=attributes) as span:
                    try:
                        result = await self.store.compact_entry_log(
                            meta.dir, meta.log_id, should_stop
                        )
                    except EntryLogFormatError as exc:
                        # Damaged at rest: kept whole (its entries still read, each frame
                        # verified); the other logs are compacted all the same.
                        log.error("gc: entry log not compacted", extra={"err": str(exc)})
                        continue
                    if span is not None:
                        span.set_attributes(
                            {
                                "quire.entries": result.entries,
                                "quire.compaction.bytes_reclaimed": result.bytes_reclaimed,
                                "quire.compaction.aborted": result.aborted,
                            }
                        )
                if result.aborted:
                    break
                self._compacted(kind, meta, result, self.clock_ms() - began_ms, run)
        finally:
            self.compacting = ""
            now_ms = self.clock_ms()
            if kind == MAJOR:
                # A major compaction covers what a minor one would do: both clocks move.
                self.major_clock_ms = self.minor_clock_ms = now_ms
                self.last_major_ms = now_ms
                self.stats.major_compaction_count += 1
            else:
                self.minor_clock_ms = now_ms
                self.last_minor_ms = now_ms
                self.stats.minor_compaction_count += 1

    def _compacted(
        self,
        kind: str,
        meta: EntryLogMetadata,
        result: CompactionResult,
        duration_ms: int,
        run: GcRun,
    ) -> None:
        run.entry_logs_compacted += 1
        run.reclaimed_by_compaction_bytes += result.bytes_reclaimed
        stats = self.stats
        stats.compacted_entry_log_count += 1
        stats.reclaimed_compaction_space_bytes += result.bytes_reclaimed
        stats.compact_runtime.record(duration_ms)
        ledgers, truncated = reclaimed_ledgers(result.deleted_ledgers)
        self.emit(
            "gc.compacted",
            bookie_id=self.bookie_id,
            dir=meta.dir,
            log_id=meta.log_id,
            new_log_id=result.new_log_id,
            kind=kind,
            usage=round(meta.usage, 4),
            entries=result.entries,
            bytes_copied=result.bytes_copied,
            bytes_reclaimed=result.bytes_reclaimed,
            duration_ms=duration_ms,
            ledgers=ledgers,
            ledgers_truncated=truncated,
        )
        # The compaction's event above lists the deleted ledgers it reclaimed: listed again
        # here, they would be counted twice by whoever sums the bytes.
        self._entry_log_deleted(meta, "compacted", {})

    def _measure_logs(self) -> None:
        logs = self.store.entry_logs()
        self.stats.active_entry_log_count = len(logs)
        self.stats.active_entry_log_space_bytes = sum(m.live_bytes for m in logs)
        self.stats.entry_log_usage_buckets = usage_buckets(logs)

    # -- what the endpoints answer --------------------------------------------------------

    def details(self) -> dict:
        """BookKeeper's GarbageCollectionStatus keys, then Quire's."""
        logs = self.store.entry_logs()
        return {
            "forceCompacting": self.running and self.forced and bool(self.compacting),
            "majorCompacting": self.compacting == MAJOR,
            "minorCompacting": self.compacting == MINOR,
            "lastMajorCompactionTime": self.last_major_ms,
            "lastMinorCompactionTime": self.last_minor_ms,
            "majorCompactionCounter": self.stats.major_compaction_count,
            "minorCompactionCounter": self.stats.minor_compaction_count,
            "gcRunning": self.running,
            "lastGcTime": self.last_gc_ms,
            "gcRuns": self.stats.gc_runs,
            "suspendMajor": self.suspend_major,
            "suspendMinor": self.suspend_minor,
            "entryLogs": len(logs),
            "entryLogBytes": sum(m.size_bytes for m in logs),
            "liveBytes": sum(m.live_bytes for m in logs),
            "deletedLedgers": self.stats.deleted_ledger_count,
            "reclaimedByDeletionBytes": self.stats.reclaimed_deletion_space_bytes,
            "reclaimedByCompactionBytes": self.stats.reclaimed_compaction_space_bytes,
            "lastSkipped": self.last_skipped,
        }

    def explain(self) -> dict:
        """Every entry log on disk, what pins it, and what the next minor and major
        compactions do with it (`gc.explain`)."""
        flags = self.flags()
        rows: list[tuple[EntryLogMetadata, bool]] = [(m, False) for m in self.store.entry_logs()]
        rows += [
            (EntryLogMetadata(d, log_id, size), True)
            for d, log_id, size in self.store.current_entry_logs()
        ]
        rows.sort(key=lambda row: (row[0].dir, row[0].log_id))
        logs = []
        for meta, current in rows:
            pinned = sorted(meta.ledgers.items(), key=lambda item: (-item[1], item[0]))
            subject = None if current else meta
            logs.append(
                {
                    "dir": meta.dir,
                    "log_id": meta.log_id,
                    "size_bytes": meta.size_bytes,
                    "live_bytes": meta.live_bytes,
                    "usage": round(meta.usage, 4),
                    "current": current,
                    "ledgers": [{"ledger_id": i, "bytes": b} for i, b in pinned],
                    "next_minor": explain(self.policy, flags, MINOR, subject),
                    "next_major": explain(self.policy, flags, MAJOR, subject),
                }
            )
        return {
            "logs": logs,
            "minor_threshold": self.policy.minor_threshold,
            "major_threshold": self.policy.major_threshold,
            "next_minor_ms": next_compaction_ms(self.policy, MINOR, self.minor_clock_ms),
            "next_major_ms": next_compaction_ms(self.policy, MAJOR, self.major_clock_ms),
            "suspendMajor": self.suspend_major,
            "suspendMinor": self.suspend_minor,
        }


def _fail(waiters: list[asyncio.Future[GcRun]], error: GcError) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(error)


def decode_delete_reply(data: bytes, journals: int) -> JournalPositions:
    """The journal's answer to `journal.delete`: the position after the records in each
    journal that took some."""
    reply = json.loads(data)
    if not reply.get("ok"):
        raise GcError(f"journal refused journal.delete: {reply}")
    try:
        return dict(parse_journal_position(raw, journals) for raw in reply["positions"])
    except (KeyError, TypeError, JournalFormatError) as exc:
        raise GcError(f"bad journal.delete reply {reply}: {exc}") from exc
