"""The journal service's pure core: group-commit planning and the high-priority-writes
rule. No IO, no clock, no asyncio: the service drives it. (The disk-full rule is
`shared.bookie.rules.disk_read_only`: the ledgerstore evaluates it too.)

The journal's file format is `shared.bookie.journal_format`; the per-ledger rules it
checks adds, fences and LAC writes against are `shared.bookie.rules`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupCommitPolicy:
    max_group_wait_ms: float
    buffered_writes_threshold_bytes: int
    buffered_entries_threshold: int
    # BookKeeper's journalFlushWhenQueueEmpty: once the writer has taken everything that
    # is pending, commit at once instead of waiting for more. Batches still form under
    # load (adds pile up while the previous fsync runs) and a lone add is not delayed.
    flush_when_queue_empty: bool = True


@dataclass(frozen=True, slots=True)
class FlushPlan:
    flush_now: bool
    wait_ms: float | None = None  # when not flushing: how long to wait at most (None: any)


def plan_group_commit(
    policy: GroupCommitPolicy,
    pending_records: int,
    pending_bytes: int,
    oldest_enqueued_ms: float,
    now_ms: float,
) -> FlushPlan:
    """What the idle journal writer does now with what is pending."""
    if pending_records == 0:
        return FlushPlan(False, None)
    if policy.flush_when_queue_empty:
        return FlushPlan(True)
    if pending_bytes >= policy.buffered_writes_threshold_bytes:
        return FlushPlan(True)
    if pending_records >= policy.buffered_entries_threshold:
        return FlushPlan(True)
    waited_ms = now_ms - oldest_enqueued_ms
    if waited_ms >= policy.max_group_wait_ms:
        return FlushPlan(True)
    return FlushPlan(False, policy.max_group_wait_ms - waited_ms)


def batch_length(policy: GroupCommitPolicy, record_sizes: Sequence[int]) -> int:
    """How many of the pending records (oldest first) go into one write: all of them up to
    the byte and entry thresholds, and at least one (a record larger than the byte
    threshold is written alone)."""
    total = 0
    for count, size in enumerate(record_sizes):
        if count >= policy.buffered_entries_threshold:
            return count
        if count > 0 and total + size > policy.buffered_writes_threshold_bytes:
            return count
        total += size
    return len(record_sizes)


def high_priority_writes_allowed(free_bytes: int, min_usable_bytes: int) -> bool:
    """Whether a read-only bookie still takes recovery adds (BookKeeper's
    isAvailableForHighPriorityWrites): its fullest disk still has `min_usable_bytes` free."""
    return free_bytes >= min_usable_bytes
