"""The bookie's garbage collector and compactor, pure: which ledgers to delete, which entry
logs to delete or compact, and when (BookKeeper's GarbageCollectorThread,
ScanAndCompareGarbageCollector, EntryLogMetadata). No IO, no clock.

The ledgerstore keeps an `EntryLogMetadata` for every sealed entry log (persisted in its
index, see `shared.bookie.index_schema`) and runs the decisions made here.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class EntryLogMetadata:
    """One sealed entry log: its size and the live ledgers it holds with their bytes
    (each entry counted with its 20-byte head, as it lies in the file)."""

    dir: int  # index of the ledger directory holding the log
    log_id: int
    size_bytes: int  # the file's bytes after its header
    ledgers: dict[int, int] = field(default_factory=dict)  # live ledger id -> bytes
    # Deleted ledger id -> bytes the file still holds for it: what deleting or compacting
    # the log reclaims for each (the gc events list them). Kept in memory only (the index
    # drops a deleted ledger's rows): a restart forgets the ledgers deleted before it.
    deleted: dict[int, int] = field(default_factory=dict)

    @property
    def live_bytes(self) -> int:
        return sum(self.ledgers.values())

    @property
    def usage(self) -> float:
        """The fraction of the log's bytes that is live (0.0 for an empty log)."""
        return min(1.0, self.live_bytes / self.size_bytes) if self.size_bytes > 0 else 0.0

    def is_empty(self) -> bool:
        """No live ledger: the log can be deleted whole."""
        return not self.ledgers

    def copy(self) -> EntryLogMetadata:
        return EntryLogMetadata(
            self.dir, self.log_id, self.size_bytes, dict(self.ledgers), dict(self.deleted)
        )

    def forget(self, ledger_ids: Iterable[int]) -> None:
        """The ledgers were deleted: their bytes are no longer live, but still in the file."""
        for ledger_id in ledger_ids:
            size = self.ledgers.pop(ledger_id, None)
            if size is not None:
                self.deleted[ledger_id] = self.deleted.get(ledger_id, 0) + size


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What compacting one entry log did (`LedgerStore.compact_entry_log`)."""

    dir: int
    log_id: int  # the log compacted (deleted unless aborted)
    new_log_id: int | None  # the log its live entries went to (None: nothing was live)
    entries: int  # live entries copied
    bytes_copied: int  # their bytes in the new log (heads included)
    bytes_reclaimed: int  # the old log's file size minus bytes_copied (0 if aborted)
    aborted: bool = False  # stopped before the switch (time limit, suspension): no change
    # The deleted ledgers whose bytes the old log held (EntryLogMetadata.deleted at the switch).
    deleted_ledgers: dict[int, int] = field(default_factory=dict)


RECLAIMED_LEDGERS_MAX = 10_000  # deleted ledgers a gc event lists at most


def reclaimed_ledgers(
    deleted: dict[int, int], limit: int = RECLAIMED_LEDGERS_MAX
) -> tuple[dict[str, int], bool]:
    """A gc event's `ledgers` (JSON keys: ledger ids as strings -> bytes reclaimed, the
    largest first, then by ledger id) and `ledgers_truncated` (more than `limit` ledgers:
    the smallest left out, so that an event stays well under a NATS message's size)."""
    ordered = sorted(deleted.items(), key=lambda item: (-item[1], item[0]))
    return {str(ledger_id): size for ledger_id, size in ordered[:limit]}, len(ordered) > limit


# -- requests ------------------------------------------------------------------------------

JOURNAL_DELETE_MAX_LEDGERS = 10_000  # ledger ids in one journal.delete request
MAX_LEDGER_ID = 2**64 - 1


class BadRequest(ValueError):
    """A GC request that is not of its form: answered BAD_REQUEST, nothing changed."""


def parse_object(data: bytes) -> dict:
    """A request body: a JSON object (an empty body is an empty object)."""
    if not data.strip():
        return {}
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise BadRequest(f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def parse_flags(data: bytes, names: Sequence[str]) -> dict[str, bool]:
    """A body of optional booleans (default false); any other key or value is refused."""
    body = parse_object(data)
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise BadRequest(f"unknown fields: {', '.join(unknown)}")
    flags = {}
    for name in names:
        value = body.get(name, False)
        if not isinstance(value, bool):
            raise BadRequest(f"{name} must be true or false")
        flags[name] = value
    return flags


def parse_journal_delete(data: bytes) -> list[int]:
    """`journal.delete`'s `{"ledgers": [id, ...]}`: 1 to JOURNAL_DELETE_MAX_LEDGERS u64
    ids, duplicates dropped, in the order given."""
    body = parse_object(data)
    ledgers = body.get("ledgers")
    if set(body) != {"ledgers"} or not isinstance(ledgers, list):
        raise BadRequest('the body must be {"ledgers": [id, ...]}')
    if not 1 <= len(ledgers) <= JOURNAL_DELETE_MAX_LEDGERS:
        raise BadRequest(f"1 to {JOURNAL_DELETE_MAX_LEDGERS} ledger ids, not {len(ledgers)}")
    for ledger_id in ledgers:
        if type(ledger_id) is not int or not 0 <= ledger_id <= MAX_LEDGER_ID:
            raise BadRequest(f"not a ledger id: {ledger_id!r}")
    return list(dict.fromkeys(ledgers))


# -- ledger GC: scan and compare (ScanAndCompareGarbageCollector) --------------------------


class RangeScan:
    """Compares the bookie's ledgers with the metadata's `ledger.ranges` pages, one page at
    a time, and names the ledgers gone from metadata.

    The bookie's ids are taken BEFORE the listing starts: a ledger is created in metadata
    before any bookie holds it, so every id the bookie holds was in metadata when the
    listing began, and one missing from the listing was deleted since. The safety rule:
    `candidates()` is empty unless every page arrived and made sense; a failed, timed out
    or malformed page (`fail`) voids the whole scan (never a partial answer).
    """

    def __init__(self, bookie_ledgers: Iterable[int]) -> None:
        self._bookie = sorted(set(bookie_ledgers))
        self._candidates: list[int] = []
        self._after = -1  # every id <= this is compared
        self.done = False
        self.failed = ""  # why the scan is void ("" while it is not)

    @property
    def after(self) -> int | None:
        """The `after` cursor to ask the next page for (None: from the start)."""
        return None if self._after < 0 else self._after

    def page(self, ranges: Sequence[tuple[int, int]], next_after: int | None) -> None:
        """One `ledger.ranges` page: runs of existing ids above `after`, ascending, and
        the last id it covers (None: this was the last page)."""
        if self.done or self.failed:
            raise ValueError("the scan is over")
        span_end = next_after
        previous = self._after
        for first, last in ranges:
            if not previous < first <= last or (span_end is not None and last > span_end):
                self.fail(f"malformed ledger.ranges page: run {first}..{last} after {previous}")
                return
            previous = last
        if span_end is not None and span_end <= self._after:
            self.fail(f"ledger.ranges cursor did not advance: {span_end} <= {self._after}")
            return
        lo = bisect.bisect_right(self._bookie, self._after)
        hi = len(self._bookie) if span_end is None else bisect.bisect_right(self._bookie, span_end)
        runs = iter(ranges)
        run = next(runs, None)
        for ledger_id in self._bookie[lo:hi]:
            while run is not None and run[1] < ledger_id:
                run = next(runs, None)
            if run is None or ledger_id < run[0]:
                self._candidates.append(ledger_id)
        if span_end is None:
            self.done = True
        else:
            self._after = span_end

    def fail(self, reason: str) -> None:
        """The listing failed part way: nothing is deleted in this run."""
        self.failed = reason or "listing failed"
        self._candidates = []

    def candidates(self) -> list[int]:
        """The bookie's ledgers absent from a complete listing, ascending; [] otherwise."""
        if not self.done or self.failed:
            return []
        return list(self._candidates)


NO_SUCH_LEDGER = "NO_SUCH_LEDGER"


def confirmed_deleted(error_code: str | None) -> bool:
    """verifyMetadataOnGc: a candidate is deleted only when `ledger.get` answers exactly
    NO_SUCH_LEDGER. The ledger found (`error_code` None), any other error, an unreachable
    or slow metadata service: the ledger is kept."""
    return error_code == NO_SUCH_LEDGER


# -- compaction schedule (GarbageCollectorThread.runWithFlags) -----------------------------

MAJOR = "major"
MINOR = "minor"
ENTRY_LOG_USAGE_BUCKETS = 10  # BookKeeper's ENTRY_LOG_USAGE_SEGMENT_COUNT: tenths of usage


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """BookKeeper's compaction settings (LedgerstoreSettings' names)."""

    minor_threshold: float
    minor_interval_ms: int
    minor_max_time_ms: int
    major_threshold: float
    major_interval_ms: int
    major_max_time_ms: int
    force_gc_allow_when_no_space: bool = False

    def threshold(self, kind: str) -> float:
        return self.major_threshold if kind == MAJOR else self.minor_threshold

    def interval_ms(self, kind: str) -> int:
        return self.major_interval_ms if kind == MAJOR else self.minor_interval_ms

    def max_time_ms(self, kind: str) -> int:
        return self.major_max_time_ms if kind == MAJOR else self.minor_max_time_ms

    def periodic(self, kind: str) -> bool:
        """enableMajorCompaction / enableMinorCompaction: a threshold and an interval."""
        return self.threshold(kind) > 0 and self.interval_ms(kind) > 0

    def forceable(self, kind: str) -> bool:
        """A forced run compacts even with interval 0 (isForceAllowCompaction); a threshold
        of 0 compacts nothing, so it disables the kind altogether."""
        return self.threshold(kind) > 0


@dataclass(frozen=True, slots=True)
class GcFlags:
    """What one run was asked for and the suspensions in force when it started."""

    force_major: bool = False
    force_minor: bool = False
    suspend_major: bool = False  # by the operator (gc.suspend)
    suspend_minor: bool = False
    disk_full: bool = False  # the bookie is read-only because a disk is full


def effective_flags(flags: GcFlags, policy: CompactionPolicy) -> GcFlags:
    """A full disk suspends both kinds (compaction writes before it frees), unless
    is_force_gc_allow_when_no_space: then it forces both, to free space and become
    writable again (BookKeeper's LedgerDirsListener on diskFull). Unlike BookKeeper, an
    operator's force does not override the full disk: a compaction that runs out of space
    part way stops the bookie (a failed write is fail-stop), so that takes the setting."""
    if not flags.disk_full:
        return flags
    if policy.force_gc_allow_when_no_space:
        return GcFlags(True, True, flags.suspend_major, flags.suspend_minor, True)
    return GcFlags(False, False, True, True, True)


def suspended(kind: str, flags: GcFlags) -> bool:
    """Whether `kind` is held off: a forced kind runs even when suspended (forceGC), as
    BookKeeper's forceMajor/forceMinor do."""
    forced = flags.force_major if kind == MAJOR else flags.force_minor
    held = flags.suspend_major if kind == MAJOR else flags.suspend_minor
    return held and not forced


def compaction_kind(
    policy: CompactionPolicy,
    flags: GcFlags,
    now_ms: int,
    last_major_ms: int,
    last_minor_ms: int,
) -> str:
    """The compaction this run does: MAJOR, MINOR or "" (none). At most one kind a run,
    major first: a major run compacts every log a minor one would (its threshold is
    higher) and moves both clocks. `last_*_ms` are when that kind last ran (or when the
    collector started)."""
    flags = effective_flags(flags, policy)
    for kind, forced, last_ms in (
        (MAJOR, flags.force_major, last_major_ms),
        (MINOR, flags.force_minor, last_minor_ms),
    ):
        if suspended(kind, flags):
            continue
        if forced and policy.forceable(kind):
            return kind
        if policy.periodic(kind) and now_ms - last_ms > policy.interval_ms(kind):
            return kind
    return ""


def logs_to_compact(logs: Iterable[EntryLogMetadata], threshold: float) -> list[EntryLogMetadata]:
    """The sealed logs with live data and usage below `threshold`, lowest usage first (the
    most space back for the least copying). Empty logs are deleted, not compacted."""
    chosen = [m for m in logs if not m.is_empty() and m.usage < threshold]
    chosen.sort(key=lambda m: (m.usage, m.dir, m.log_id))
    return chosen


def time_up(started_ms: int, now_ms: int, max_time_ms: int) -> bool:
    """*_compaction_max_time_ms: stop starting (and abandon) compactions past it; <= 0 is
    no limit."""
    return max_time_ms > 0 and now_ms - started_ms >= max_time_ms


def usage_bucket(usage: float) -> int:
    """The tenth of usage a log falls in (1.0 in the last bucket)."""
    if usage >= 1.0:
        return ENTRY_LOG_USAGE_BUCKETS - 1
    return max(0, int(usage * ENTRY_LOG_USAGE_BUCKETS))


def usage_buckets(logs: Iterable[EntryLogMetadata]) -> list[int]:
    """entry_log_usage_buckets: counts of sealed logs by usage in tenths."""
    buckets = [0] * ENTRY_LOG_USAGE_BUCKETS
    for meta in logs:
        buckets[usage_bucket(meta.usage)] += 1
    return buckets


def next_compaction_ms(policy: CompactionPolicy, kind: str, last_ms: int) -> int:
    """When the next periodic compaction of `kind` is due (the first GC run after it
    compacts); 0 when that kind never runs by itself."""
    return last_ms + policy.interval_ms(kind) if policy.periodic(kind) else 0


def explain(
    policy: CompactionPolicy, flags: GcFlags, kind: str, meta: EntryLogMetadata | None
) -> str:
    """In words, what the next `kind` compaction does with a log (`meta` None: the
    directory's current log, which is never compacted)."""
    if meta is None:
        return "current log: never compacted"
    if meta.is_empty():
        return "delete: no live ledger"
    if not policy.forceable(kind):
        return "disabled"
    if suspended(kind, effective_flags(flags, policy)):
        return "suspended"
    threshold = policy.threshold(kind)
    if meta.usage < threshold:
        return f"compact: usage {meta.usage:.2f} < {threshold:g}"
    return f"keep: usage {meta.usage:.2f} >= {threshold:g}"


@dataclass(slots=True)
class GcRun:
    """What one GC run did (the `gc` endpoint's `run`)."""

    started_ms: int
    duration_ms: int = 0
    ledgers_deleted: int = 0
    entry_logs_deleted: int = 0
    entry_logs_compacted: int = 0
    reclaimed_by_deletion_bytes: int = 0
    reclaimed_by_compaction_bytes: int = 0
    major: bool = False
    minor: bool = False
    skipped: str = ""  # why no ledger was deleted although it may have been due

    def to_json(self) -> dict:
        return asdict(self)
