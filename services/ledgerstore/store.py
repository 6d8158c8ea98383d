"""The ledgerstore: a projection of the bookie's journal, in the shape of BookKeeper's
DbLedgerStorage.

It applies journal records in order from its own position (`catch_up`) into a write
cache (entries in memory, two buffers). A flush (`checkpoint`) swaps the buffers, writes
the full one to the entry logs sorted by ledger and entry, fsyncs them, then commits the
index, the ledger facts, the entry logs' ends and the applied journal position in one
SQLite transaction; only then may the journal move its LastLogMark. After a crash at any
point of that, the index names a consistent state: the entry logs are cut back to the
ends it recorded and the journal is replayed from its position (idempotent: the same
entries are written again). Reads look in the write cache, the read cache, then the
entry logs (through the index, reading ahead); every frame read from disk is verified
(a read-ahead frame when it is first served).

The read path and the write path do not share a queue that one could fill for the
other. Reads run their blocking work (index range queries, entry log preads) on the
store's read threads (`num_read_worker_threads` of them, each index query on its own
thread's SQLite connection); journal reads, entry log appends and fsyncs and index commits
run on its two write threads (one catch-up, under the apply lock, and one flush, under the
checkpoint lock, at a time). A read of an entry that is cached or indexed takes neither
lock; only an entry found nowhere waits for a catch-up (the authority rule).

Garbage collection (issue 15): a DELETED journal record forgets a ledger in journal order
(its index rows go at the next checkpoint, deletes before inserts); every entry log's
usage (ledger -> bytes) is kept in the index in the same transactions, and the garbage
collector deletes dead logs (`delete_dead_entry_logs`) and compacts the rest
(`compact_entry_log`, `services/ledgerstore/compaction.py`). docs/storage.md says what a
crash at each step leaves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from services.ledgerstore.cache import Key, ReadCache, WriteCache
from services.ledgerstore.compaction import Compaction
from services.ledgerstore.core import (
    EntryLocation,
    LedgerInfo,
    apply_to_ledgers,
    ledger_dir_index,
    read_ahead_ids,
    verify_stored,
)
from services.ledgerstore.disk_reads import DiskBatch, DiskRead, DiskReader
from services.ledgerstore.storage import (
    EntryIndex,
    EntryLogger,
    JournalTailer,
    LogEnds,
    TailRead,
    TailStatus,
    Usage,
)
from shared import wire
from shared.bookie.entrylog_format import ENTRY_HEAD_SIZE, ENTRYLOG_HEADER_SIZE
from shared.bookie.files import OS_FILES, FileLayer
from shared.bookie.gc import CompactionResult, EntryLogMetadata
from shared.bookie.handoff import Decision, DurableBatch, HandoffQueue, decide
from shared.bookie.index_schema import INDEX_FILE, USAGE_FACT
from shared.bookie.journal_format import (
    JOURNAL_START,
    EntryRecord,
    JournalPosition,
    LedgerDeletedRecord,
    Record,
)
from shared.bookie.rules import absent_entry_status, absent_status, has_authority
from shared.config import LedgerstoreSettings
from shared.disk import fail_stop
from shared.metrics import OpStats
from shared.status import BookieStatus

log = logging.getLogger(__name__)

# Bound on one catch-up: reads of the journal before giving the event loop back.
CATCH_UP_MAX_READS = 10_000
UNSURE_FACT = "unsure"  # index fact: why absent entries answer UNKNOWN_LEDGER_STATE
# The write path's threads: one journal read (catch-up) and one flush at a time.
WRITE_THREADS = 2

CorruptListener = Callable[[int, int, str], None]
T = TypeVar("T")


def die(reason: str) -> None:
    fail_stop("ledgerstore", reason)


@dataclass
class LedgerstoreStats:
    """Counters under DbLedgerStorage's metric names (bookie_ prefix dropped), served by
    `services.ledgerstore.metrics` at scrape time."""

    ledgerstore_add_entry: int = 0
    ledgerstore_read_entry: int = 0
    ledgerstore_read_entry_absent: int = 0
    ledgerstore_read_entry_corrupt: int = 0
    ledgerstore_read_lac: int = 0
    ledgerstore_catch_up: int = 0
    ledgerstore_checkpoints: int = 0
    write_cache_size_bytes: int = 0
    write_cache_count: int = 0
    write_cache_hits: int = 0
    read_cache_size_bytes: int = 0
    read_cache_count: int = 0
    read_cache_hits: int = 0
    read_cache_misses: int = 0
    readahead_batch_count: int = 0
    readahead_batch_size: int = 0
    index_lookups: int = 0
    flush: int = 0
    flush_size_bytes: int = 0
    flush_entries: int = 0
    # DbLedgerStorage's flush: the write cache to the entry logs and index.
    flush_latency: OpStats = field(default_factory=OpStats)
    # Catch-ups that had to flush first because the write cache was full (back-pressure).
    throttled_write_requests: int = 0
    # preads of entry logs by reads (one per run of frames) and the bytes they read.
    entry_log_reads: int = 0
    entry_log_read_bytes: int = 0
    # Co-hosted (`services.bookie`): group commits handed over by the journal in process,
    # the records applied from them, those dropped (the queue was full) and the gaps that
    # had the file tailer take over.
    handoff_batches: int = 0
    handoff_records: int = 0
    handoff_dropped: int = 0
    handoff_gaps: int = 0
    handoff_queue_size: int = 0


class LedgerStore:
    def __init__(
        self,
        bookie_dir: Path,
        settings: LedgerstoreSettings,
        fatal: Callable[[str], None] = die,
        *,
        ledger_dirs: list[Path] | None = None,
        journal_dirs: list[Path] | None = None,
        files: FileLayer = OS_FILES,
        on_corrupt: CorruptListener | None = None,
        skip_invalid_journal_records: bool = False,
        limbo: bool = False,
    ) -> None:
        self.settings = settings
        self.ledger_dirs = ledger_dirs or [bookie_dir / "ledgers"]
        self.loggers = [
            EntryLogger(directory, settings.log_size_limit_bytes, files, index)
            for index, directory in enumerate(self.ledger_dirs)
        ]
        journal_dirs = journal_dirs or [bookie_dir / "journal"]
        self.index = EntryIndex(self.ledger_dirs[0] / INDEX_FILE, files, len(journal_dirs))
        # One tailer per journal directory (a journal each), applied each in its own order:
        # every record of a ledger is in one journal, so its order is kept.
        self.tailers = [
            JournalTailer(directory, JOURNAL_START, skip_invalid=skip_invalid_journal_records)
            for directory in journal_dirs
        ]
        self.stats = LedgerstoreStats()
        self.ledgers: dict[int, LedgerInfo] = {}
        # Per journal, in the order of the directories: what is applied, and checkpointed.
        self.applied: tuple[JournalPosition, ...] = (JOURNAL_START,) * len(journal_dirs)
        self.checkpointed: tuple[JournalPosition, ...] | None = None
        # Set for good when journal records we need are gone or bad: from then on an
        # absent entry is UNKNOWN_LEDGER_STATE, never NO_ENTRY, and applying stops.
        self.damaged: str | None = None
        # Set when records were skipped (the operator allowed it): applying goes on, but
        # absence is never claimed again (persisted in the index).
        self.unsure: str | None = None
        # The bookie's disk was wiped (its cookie says so): see `limbo_absent_status`.
        self.limbo = limbo
        self._fatal = fatal
        self._on_corrupt = on_corrupt
        self._write_cache = WriteCache()
        self._flushing = WriteCache()
        self._read_cache = ReadCache(settings.read_ahead_cache_max_size_bytes)
        self._dirty_ledgers: set[int] = set()
        # Ledgers deleted (a DELETED record applied) whose index rows the next checkpoint
        # deletes, and those the running checkpoint is deleting: reads of them look in
        # nothing older than the deletion (see `_masked`).
        self._deleted_pending: set[int] = set()
        self._deleting: set[int] = set()
        self._deletions = 0  # DELETED records applied: a disk read spanning one caches nothing
        # Every entry log of every directory (sealed and current): usage as of the last
        # checkpoint (`entry_logs`).
        self._logs: dict[tuple[int, int], EntryLogMetadata] = {}
        self._compaction_lock = asyncio.Lock()
        self._compactions: set[asyncio.Future[CompactionResult]] = set()
        self._closing = False  # read by a compaction's should_stop on its thread
        self._compacting: tuple[int, int] | None = None  # (dir, log_id) being compacted
        self._compaction_thread = ThreadPoolExecutor(1, thread_name_prefix="ledgerstore-compact")
        self._files = files
        self._apply_lock = asyncio.Lock()
        self._checkpoint_lock = asyncio.Lock()
        self._stalled_reason = ""
        # Entries a read thread is bringing in now -> done when they are in the read cache.
        self._reading: dict[Key, asyncio.Future[None]] = {}
        self._disk = DiskReader(self.index, self.loggers)
        self._read_threads = ThreadPoolExecutor(
            settings.num_read_worker_threads, thread_name_prefix="ledgerstore-read"
        )
        self._write_threads = ThreadPoolExecutor(
            WRITE_THREADS, thread_name_prefix="ledgerstore-write"
        )
        # Co-hosted with the journal (`accept_handoff`): its durable group commits, and per
        # journal the end of the last one it handed (queued or dropped).
        self.handoff: HandoffQueue | None = None
        self._handed_end: list[JournalPosition | None] = [None] * len(journal_dirs)
        # Group commits the journal handed or reported (`offer`, `journal_durable`): the
        # read queue pauses reads while this moves (`read_share_while_writing`).
        self.durable_notes = 0

    async def _on_write_thread(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._write_threads, fn, *args)

    @property
    def unflushed_bytes(self) -> int:
        """Entry bytes applied and not yet being flushed (the active write cache)."""
        return self._write_cache.size_bytes

    @property
    def logger(self) -> EntryLogger:
        """The first ledger directory's entry logger."""
        return self.loggers[0]

    async def open(self) -> None:
        state = await self._on_write_thread(self.index.open)
        for index, logger in enumerate(self.loggers):
            referenced = frozenset(log_id for d, log_id in state.usage if d == index)
            await self._on_write_thread(logger.open, state.log_ends.get(index), referenced)
        usage = state.usage
        if USAGE_FACT not in state.facts:
            # An index from before usage was kept (or its rows lost): count the logs.
            usage = await self._on_write_thread(self._rebuild_usage, set(state.ledgers))
        self._logs = await self._on_write_thread(self._load_logs, usage)
        self.ledgers = state.ledgers
        self.unsure = state.facts.get(UNSURE_FACT)
        self.applied = state.positions or self.applied
        self.checkpointed = state.positions
        for tailer, position in zip(self.tailers, self.applied, strict=True):
            tailer.advance(position)
        log.info(
            "ledgerstore opened",
            extra={
                "applied": [position.to_json() for position in self.applied],
                "ledgers": len(self.ledgers),
                "entry_logs": [logger.log_id for logger in self.loggers],
                "unsure": self.unsure,
            },
        )

    async def close(self) -> None:
        self._closing = True
        if self._compactions:
            await asyncio.gather(*self._compactions, return_exceptions=True)
        await self.checkpoint()
        async with self._apply_lock:
            for logger in self.loggers:
                await self._on_write_thread(logger.close)
            self.index.close()
            for tailer in self.tailers:
                tailer.close()
        self._read_threads.shutdown()
        self._write_threads.shutdown()
        self._compaction_thread.shutdown()

    def _rebuild_usage(self, ledgers: set[int]) -> Usage:
        """Usage from the entry logs' entry heads (blocking), counting only the ledgers
        the index still has; persisted with the fact that marks it complete."""
        usage: Usage = {}
        for index, logger in enumerate(self.loggers):
            for log_id in logger.log_ids():
                per_ledger: dict[int, int] = {}
                for ledger_id, _, _, length in logger.scan(log_id):
                    if ledger_id in ledgers:
                        size = ENTRY_HEAD_SIZE + length
                        per_ledger[ledger_id] = per_ledger.get(ledger_id, 0) + size
                if per_ledger:
                    usage[(index, log_id)] = per_ledger
        self.index.rebuild_usage(usage)
        log.info("rebuilt entry log usage from the logs", extra={"logs": len(usage)})
        return usage

    def _load_logs(self, usage: Usage) -> dict[tuple[int, int], EntryLogMetadata]:
        """Metadata of every entry log on disk: its size from the file, its ledgers from
        the usage rows (none: nothing live)."""
        logs: dict[tuple[int, int], EntryLogMetadata] = {}
        for index, logger in enumerate(self.loggers):
            for log_id in logger.log_ids():
                size = logger.path(log_id).stat().st_size - ENTRYLOG_HEADER_SIZE
                ledgers = dict(usage.get((index, log_id), {}))
                logs[(index, log_id)] = EntryLogMetadata(index, log_id, max(size, 0), ledgers)
        return logs

    # -- entry logs and their usage (the garbage collector's view) ----------------------

    def _is_current(self, dir_index: int, log_id: int) -> bool:
        return self.loggers[dir_index].log_id == log_id

    def entry_logs(self) -> list[EntryLogMetadata]:
        """A copy of each sealed entry log's metadata (never a directory's current log),
        usage as of the last checkpoint."""
        return [
            meta.copy()
            for (d, log_id), meta in sorted(self._logs.items())
            if not self._is_current(d, log_id)
        ]

    def current_entry_logs(self) -> list[tuple[int, int, int]]:
        """(dir, log_id, size_bytes) of each directory's current (open) log."""
        return [
            (index, logger.log_id, logger.size - ENTRYLOG_HEADER_SIZE)
            for index, logger in enumerate(self.loggers)
        ]

    async def delete_dead_entry_logs(self) -> list[EntryLogMetadata]:
        """Delete the sealed logs that hold no live ledger (as of the last checkpoint);
        what was deleted. Under the checkpoint lock: no flush is between writing a log and
        committing its index rows, so a log with no usage row really holds nothing."""
        async with self._checkpoint_lock:
            dead = [
                meta
                for meta in self.entry_logs()
                if meta.is_empty() and (meta.dir, meta.log_id) != self._compacting
            ]
            by_dir: dict[int, list[int]] = {}
            for meta in dead:
                by_dir.setdefault(meta.dir, []).append(meta.log_id)
            for index, log_ids in by_dir.items():
                await self._on_write_thread(self.loggers[index].delete, log_ids)
            for meta in dead:
                del self._logs[(meta.dir, meta.log_id)]
            return dead

    async def compact_entry_log(
        self, dir_index: int, log_id: int, should_stop: Callable[[], bool]
    ) -> CompactionResult:
        """Copy a sealed log's live entries to a new log, switch their index rows to it,
        delete it (BookKeeper's TransactionalEntryLogCompactor; the steps and what a crash
        at each leaves: `services.ledgerstore.compaction`). One at a time.

        It runs as its own task: a caller cancelled (the service stopping) must not leave
        the copy going on its thread, or the switch on a write thread, while `close` shuts
        the index under them. `close` stops it at its next batch and waits for it."""
        task = asyncio.ensure_future(
            self._compact_entry_log(dir_index, log_id, lambda: self._closing or should_stop())
        )
        self._compactions.add(task)
        task.add_done_callback(self._compactions.discard)
        return await asyncio.shield(task)

    async def _compact_entry_log(
        self, dir_index: int, log_id: int, should_stop: Callable[[], bool]
    ) -> CompactionResult:
        async with self._compaction_lock:
            meta = self._logs.get((dir_index, log_id))
            if meta is None or self._is_current(dir_index, log_id):
                raise ValueError(f"entry log {log_id} of directory {dir_index} is not sealed")
            compaction = Compaction(
                self.loggers[dir_index], self.index, self.settings, self._files, meta.copy()
            )
            # Not deleted as dead under the copy (it may become empty meanwhile).
            self._compacting = (dir_index, log_id)
            try:
                loop = asyncio.get_running_loop()
                thread = self._compaction_thread
                try:
                    copied = await loop.run_in_executor(thread, compaction.copy, should_stop)
                except Exception:
                    # An IO error (a full disk, say): nothing switched, the copy goes.
                    await loop.run_in_executor(thread, compaction.abandon)
                    raise
                if not copied:
                    await loop.run_in_executor(thread, compaction.abandon)
                    return compaction.result(aborted=True)
                async with self._checkpoint_lock:
                    moved = await self._on_write_thread(compaction.switch)
                    old = self._logs.pop((dir_index, log_id))
                    new_log = compaction.new_log_id
                    if new_log is not None:
                        # Nothing moved (all deleted or rewritten meanwhile): no usage
                        # row, so the next delete_dead_entry_logs removes it.
                        self._logs[(dir_index, new_log)] = EntryLogMetadata(
                            dir_index, new_log, compaction.bytes_copied, moved
                        )
                    await self._on_write_thread(compaction.delete_old)
                # The ledgers deleted up to the switch (the copy skipped their entries).
                return replace(compaction.result(aborted=False), deleted_ledgers=old.deleted)
            finally:
                self._compacting = None

    async def apply_through(self, positions: Mapping[int, JournalPosition]) -> bool:
        """Catch up until everything before `positions[i]` in journal i is applied (the
        journal said it is durable); False if a journal is damaged or stalled before it."""
        for index, position in positions.items():
            self.journal_durable(index, position)
        while any(self.applied[index] < position for index, position in positions.items()):
            before = self.applied
            if not await self.catch_up():
                return False
            if self.applied == before:
                return False
        return True

    # -- applying the journal -------------------------------------------------------------

    def journal_durable(self, index: int, position: JournalPosition) -> None:
        """Journal `index` says everything before `position` is fsynced."""
        self.durable_notes += 1
        tailer = self.tailers[index]
        hint = tailer.durable_hint
        if hint is None or position > hint:
            tailer.durable_hint = position

    async def catch_up(self) -> bool:
        """Apply every journal up to where its newest file ends now. True if everything
        there was applied; False if one is damaged or stalled on a bad record (then an
        absent entry must not be reported as absent)."""
        # Shielded: a cancelled caller must not leave an append half-recorded.
        return await asyncio.shield(self._catch_up())

    async def _catch_up(self) -> bool:
        self.stats.ledgerstore_catch_up += 1
        if self.handoff is not None and self.handoff:
            await self._apply_handed()
        caught_up = True
        # Each journal on its own: one stalled on a bad record holds back only its own.
        for index in range(len(self.tailers)):
            if self._handed_through(index):
                continue  # everything it made durable was handed and applied: no file read
            caught_up = await self._tail(index) and caught_up
        return caught_up

    async def _tail(self, index: int) -> bool:
        """Catch up with journal `index` by reading its files."""
        while (done := await self._catch_up_some(index)) is None:
            # The write cache is full: flush it before taking more (back-pressure).
            self.stats.throttled_write_requests += 1
            await self._checkpoint()
        return done

    # -- the in-process handoff (co-hosted with the journal: services.bookie) -------------

    def accept_handoff(self, max_batches: int) -> None:
        """From now on the journal hands its durable group commits over (`offer`)."""
        self.handoff = HandoffQueue(max_batches)

    def offer(self, batch: DurableBatch) -> bool:
        """The journal made `batch` durable (synchronous, in commit order: it must not
        block). Queued for the next catch-up; False if the queue was full (dropped: the
        file tailer reads it instead)."""
        assert self.handoff is not None, "accept_handoff first"
        self.durable_notes += 1
        self._handed_end[batch.journal] = batch.end
        queued = self.handoff.offer(batch)
        if not queued:
            self.stats.handoff_dropped += 1
        self.stats.handoff_queue_size = len(self.handoff)
        return queued

    def _handed_through(self, index: int) -> bool:
        """Whether journal `index` handed its durable group commits over and every one
        is applied (none was dropped past the applied position): a read of its files
        would find nothing durable that is not applied."""
        end = self._handed_end[index]
        return end is not None and self.applied[index] >= end and not self.damaged

    async def _apply_handed(self) -> None:
        """Apply the handed batches in order: each that continues the applied position of
        its journal (`shared.bookie.handoff.decide`), none already applied; at a gap, the
        file tailer reads the journal up to past it first."""
        assert self.handoff is not None
        batches = self.handoff.take()
        self.stats.handoff_queue_size = 0
        at = 0
        while at < len(batches):
            gap = None
            async with self._apply_lock:
                if self.damaged:
                    return
                while at < len(batches):
                    batch = batches[at]
                    j = batch.journal
                    decision = decide(self.applied[j], batch)
                    if decision is Decision.GAP:
                        gap = batch
                        break
                    at += 1
                    self.journal_durable(j, batch.end)
                    self.stats.handoff_batches += 1
                    if decision is Decision.APPLY:
                        self._apply(batch.records)
                        self.stats.handoff_records += len(batch.records)
                        applied = list(self.applied)
                        applied[j] = batch.end
                        self.applied = tuple(applied)
                        self.tailers[j].advance(batch.end)
            if gap is not None:
                self.stats.handoff_gaps += 1
                self.journal_durable(gap.journal, gap.end)
                await self._tail(gap.journal)
                if decide(self.applied[gap.journal], gap) is Decision.GAP:
                    # The file tailer stopped short of it (damaged or stalled): the file
                    # is the truth; leave this journal's batches to it.
                    batches = [b for b in batches[at:] if b.journal != gap.journal]
                    at = 0
            if self._write_cache.size_bytes >= self.settings.write_cache_max_size_bytes:
                self.stats.throttled_write_requests += 1
                await self._checkpoint()

    async def _catch_up_some(self, index: int) -> bool | None:
        """True/False as `catch_up`, for journal `index`; None when the write cache must be
        flushed first."""
        tailer = self.tailers[index]
        async with self._apply_lock:
            if self.damaged:
                return False
            target: JournalPosition | None = None
            for reads in range(CATCH_UP_MAX_READS):
                # Bounded: at most one journal read (tailer chunk) beyond the limit.
                if self._write_cache.size_bytes >= self.settings.write_cache_max_size_bytes:
                    return None
                try:
                    if reads == 0:
                        # One thread hop for the usual catch-up: where the journal ends
                        # now (taken first: the goal), then the records up to there.
                        target, tail = await self._on_write_thread(_end_and_read, tailer)
                    else:
                        tail = await self._on_write_thread(tailer.read)
                except OSError as exc:
                    self._note_stall(f"reading the journal: {exc!r}")
                    return False
                if tail.records:
                    self._apply([scanned.record for scanned in tail.records])
                applied = list(self.applied)
                applied[index] = tail.position
                self.applied = tuple(applied)
                tailer.advance(tail.position)
                if tail.status is TailStatus.SKIPPED:
                    self.unsure = tail.reason
                    log.error(
                        "skipped damaged journal records: absent entries will be answered "
                        "UNKNOWN_LEDGER_STATE",
                        extra={"reason": tail.reason},
                    )
                if self._write_cache.size_bytes >= self.settings.write_cache_max_size_bytes:
                    return None
                if tail.status is TailStatus.SKIPPED:
                    continue
                if tail.status is TailStatus.DAMAGED:
                    self.damaged = tail.reason
                    log.error(
                        "journal damaged below the ledgerstore: absent entries will be "
                        "answered UNKNOWN_LEDGER_STATE",
                        extra={"reason": tail.reason},
                    )
                    return False
                if tail.status is TailStatus.STALLED:
                    self._note_stall(tail.reason)
                    return False
                if tail.status is TailStatus.CAUGHT_UP:
                    self._stalled_reason = ""
                    return True
                if target is not None and has_authority(tail.position, target):
                    return True
            return False

    def _note_stall(self, reason: str) -> None:
        if reason != self._stalled_reason:
            log.error("ledgerstore cannot read past a journal record", extra={"reason": reason})
        self._stalled_reason = reason

    def _apply(self, records: list[Record]) -> None:
        cache, ledgers, dirty = self._write_cache, self.ledgers, self._dirty_ledgers
        entries = 0
        for record in records:
            if type(record) is EntryRecord:
                cache.put(record.ledger_id, record.entry_id, record.frame)
                entries += 1
            elif type(record) is LedgerDeletedRecord:
                self._delete(record.ledger_id)
                continue
            touched = apply_to_ledgers(ledgers, record)
            if touched is not None:
                dirty.add(touched)
        self.stats.ledgerstore_add_entry += entries
        self.stats.write_cache_size_bytes = self._write_cache.size_bytes
        self.stats.write_cache_count = len(self._write_cache)

    def _delete(self, ledger_id: int) -> None:
        """Forget a ledger (a DELETED record): its facts and unflushed entries now, its
        index rows at the next checkpoint. A ledger re-created after this (a zombie
        writer's entries) starts afresh."""
        self.ledgers.pop(ledger_id, None)
        self._dirty_ledgers.discard(ledger_id)
        self._write_cache.forget(ledger_id)
        self._deleted_pending.add(ledger_id)
        self._deletions += 1

    def _masked(self, ledger_id: int) -> bool:
        """Deleted, and its index rows (and the read cache's copies) not yet gone: only
        the active write cache holds entries of it that count (written after the
        deletion)."""
        return ledger_id in self._deleted_pending or ledger_id in self._deleting

    # -- checkpoint (flush) ---------------------------------------------------------------

    async def checkpoint(self) -> tuple[JournalPosition, ...] | None:
        """Make everything applied durable; the position in each journal to hand to it as
        its LastLogMark, or None if nothing changed since the last checkpoint."""
        # Shielded: a cancelled caller must not leave the buffers half-swapped.
        return await asyncio.shield(self._checkpoint())

    async def _checkpoint(self) -> tuple[JournalPosition, ...] | None:
        async with self._checkpoint_lock:
            async with self._apply_lock:
                if (
                    self.applied == self.checkpointed
                    and not self._write_cache
                    and not self._dirty_ledgers
                ):
                    return None
                # Swap the buffers: applies go on into the empty one while this flushes.
                self._flushing, self._write_cache = self._write_cache, WriteCache()
                ledgers = {i: replace(self.ledgers[i]) for i in self._dirty_ledgers}
                self._dirty_ledgers = set()
                deleted, self._deleted_pending = self._deleted_pending, set()
                self._deleting |= deleted
                position = self.applied
                facts = {UNSURE_FACT: self.unsure} if self.unsure else {}
            started = time.perf_counter()
            flushing = self._flushing
            try:
                locations, log_ends = await self._on_write_thread(self._write_entry_logs, flushing)
            except OSError as exc:
                self._fatal(f"entry log write or fsync: {exc!r}")
                raise
            facts[USAGE_FACT] = "1"
            try:
                added = await self._on_write_thread(
                    self.index.commit, locations, ledgers, position, log_ends, facts, deleted
                )
            except Exception as exc:
                self._fatal(f"index commit: {exc!r}")
                raise
            self._committed_usage(deleted, added, locations)
            self._flushing = WriteCache()
            self.checkpointed = position
            self._flushed(flushing, (time.perf_counter() - started) * 1000)
            return position

    def _committed_usage(
        self,
        deleted: set[int],
        added: Usage,
        locations: dict[tuple[int, int], EntryLocation],
    ) -> None:
        """After a checkpoint's commit: the logs' metadata as the index now has it
        (deleted ledgers first, as in the transaction), and the read cache without the
        deleted ledgers."""
        if deleted:
            for meta in self._logs.values():
                meta.forget(deleted.intersection(meta.ledgers))
            self._read_cache.remove_ledgers(deleted)
            self._deleting -= deleted
        for location in locations.values():
            key = (location.dir, location.log_id)
            meta = self._logs.get(key)
            if meta is None:
                meta = self._logs[key] = EntryLogMetadata(location.dir, location.log_id, 0)
            end = location.frame_offset + location.size - ENTRYLOG_HEADER_SIZE
            if end > meta.size_bytes:
                meta.size_bytes = end
        for key, per_ledger in added.items():
            ledgers = self._logs[key].ledgers
            for ledger_id, size in per_ledger.items():
                ledgers[ledger_id] = ledgers.get(ledger_id, 0) + size

    def _write_entry_logs(
        self, flushing: WriteCache
    ) -> tuple[dict[tuple[int, int], EntryLocation], LogEnds]:
        """Append the flushed entries to their directories' entry logs, sorted, then fsync
        every log (blocking)."""
        by_dir: dict[int, list[tuple[int, int, bytes]]] = {}
        for ledger_id, entry_id, frame in flushing.sorted_entries():
            index = ledger_dir_index(ledger_id, len(self.loggers))
            by_dir.setdefault(index, []).append((ledger_id, entry_id, frame))
        locations: dict[tuple[int, int], EntryLocation] = {}
        for index, entries in by_dir.items():
            placed = self.loggers[index].append(entries)
            for (ledger_id, entry_id, _), location in zip(entries, placed, strict=True):
                locations[(ledger_id, entry_id)] = location
        drop = self.settings.remove_pages_from_cache
        log_ends = {index: logger.sync(drop) for index, logger in enumerate(self.loggers)}
        return locations, log_ends

    def _flushed(self, flushing: WriteCache, latency_ms: float) -> None:
        stats = self.stats
        stats.ledgerstore_checkpoints += 1
        stats.flush += 1
        stats.flush_entries += len(flushing)
        stats.flush_size_bytes += flushing.size_bytes
        stats.flush_latency.record(latency_ms)
        stats.write_cache_size_bytes = self._write_cache.size_bytes
        stats.write_cache_count = len(self._write_cache)

    # -- reads ----------------------------------------------------------------------------

    async def read(self, items: list[wire.ReadItem]) -> list[wire.ReadResult]:
        """The entries asked, in order. An entry in a cache or in the index is served
        without waiting for anything of the write path (no lock of the journal catch-up or
        of the flush, none of their threads); only entries found nowhere wait for a
        catch-up (the authority rule: look at everything the journal has before saying
        "no") and are looked for again."""
        found = await self._read_present(items)
        authority = True
        absent = [n for n, result in enumerate(found) if result is None]
        if absent:
            authority = await self.catch_up() and self.unsure is None
            again = await self._read_present([items[n] for n in absent])
            for n, result in zip(absent, again, strict=True):
                found[n] = result
        results = []
        for item, result in zip(items, found, strict=True):
            if result is None:
                self.stats.ledgerstore_read_entry_absent += 1
                status = self._absent(item, authority)
                result = wire.ReadResult(item.ledger_id, item.entry_id, status)
            results.append(result)
        self.stats.ledgerstore_read_entry += len(items)
        self.stats.read_cache_size_bytes = self._read_cache.size_bytes
        self.stats.read_cache_count = len(self._read_cache)
        return results

    async def _read_present(self, items: list[wire.ReadItem]) -> list[wire.ReadResult | None]:
        """Each item from a cache, else from the entry logs (None: not in the index).
        Whatever a request needs from disk takes one hop to a read thread; an entry that
        another request's disk read (its read-ahead, say) is bringing in is waited for,
        not read twice (a reader keeps several requests of consecutive blocks in flight)."""
        found = [self._from_cache(item) for item in items]
        misses = [
            n
            for n, result in enumerate(found)
            if result is None and not self._masked(items[n].ledger_id)
        ]
        if not misses:
            return found
        reading = self._reading
        waiting = [n for n in misses if _key(items[n]) in reading]
        coming = {reading[_key(items[n])] for n in waiting}
        own = [n for n in misses if _key(items[n]) not in reading]
        if own:
            batch = await self._read_disk_now([items[n] for n in own])
            for n in own:
                found[n] = batch.found.get(_key(items[n]))
        if waiting:
            await asyncio.gather(*coming)
            for n in waiting:
                found[n] = self._from_cache(items[n])
            # Not brought in after all (not in the index, corrupt, evicted): look here.
            rest = [n for n in waiting if found[n] is None]
            if rest:
                batch = await self._read_disk_now([items[n] for n in rest])
                for n in rest:
                    found[n] = batch.found.get(_key(items[n]))
        return found

    async def _read_disk_now(self, items: list[wire.ReadItem]) -> DiskBatch:
        """One hop to a read thread for `items` and their read-ahead; what it brings in
        is in the read cache before the requests waiting for it (`_reading`) go on."""
        plan = self._plan_disk_read(items)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = [(ledger_id, e) for ledger_id, ids in plan.asked.items() for e in ids]
        keys += [(ledger_id, e) for ledger_id, ids in plan.ahead.items() for e in ids]
        for key in keys:
            self._reading.setdefault(key, done)
        deletions = self._deletions
        try:
            loop = asyncio.get_running_loop()
            batch = await loop.run_in_executor(self._read_threads, self._disk.read, plan)
            # A ledger deleted meanwhile: its frames must not outlive it in the read cache.
            self._took(batch, cache=deletions == self._deletions)
            return batch
        finally:
            for key in keys:
                if self._reading.get(key) is done:
                    del self._reading[key]
            done.set_result(None)

    def _from_cache(self, item: wire.ReadItem) -> wire.ReadResult | None:
        ledger_id, entry_id = item.ledger_id, item.entry_id
        frame = self._write_cache.get(ledger_id, entry_id)
        if frame is None and ledger_id not in self._deleted_pending:
            frame = self._flushing.get(ledger_id, entry_id)
        if frame is not None:
            self.stats.write_cache_hits += 1
            return wire.ReadResult(ledger_id, entry_id, BookieStatus.OK, frame)
        if self._masked(ledger_id):
            return None
        frame = self._read_cache.get(ledger_id, entry_id)
        if frame is None:
            return None
        self.stats.read_cache_hits += 1
        if not self._read_cache.is_verified(ledger_id, entry_id):
            # Read ahead, not checked yet: checked now, when it is first served.
            problem = verify_stored(frame, ledger_id, entry_id, self._digest_code(ledger_id))
            if problem is not None:
                self._read_cache.remove(ledger_id, entry_id)
                self._corrupt(ledger_id, entry_id, "read-ahead", problem)
                return wire.ReadResult(ledger_id, entry_id, BookieStatus.CORRUPT)
            self._read_cache.mark_verified(ledger_id, entry_id)
        return wire.ReadResult(ledger_id, entry_id, BookieStatus.OK, frame)

    def _digest_code(self, ledger_id: int) -> int:
        info = self.ledgers.get(ledger_id)
        return info.digest_code if info is not None else 0

    def _plan_disk_read(self, items: list[wire.ReadItem]) -> DiskRead:
        """Per ledger: the entries asked and the ones to read ahead with them (what the
        reader asks next, `read_ahead_ids`, unless cached or on their way already)."""
        asked: dict[int, set[int]] = {}
        for item in items:
            asked.setdefault(item.ledger_id, set()).add(item.entry_id)
        plan = DiskRead({}, {}, {})
        limit = self.settings.read_ahead_cache_batch_size
        for ledger_id, ids in asked.items():
            ordered = sorted(ids)
            plan.asked[ledger_id] = ordered
            plan.ahead[ledger_id] = [
                e
                for e in read_ahead_ids(ordered, limit)
                if (ledger_id, e) not in self._reading and not self._is_cached(ledger_id, e)
            ]
            plan.digest_codes[ledger_id] = self._digest_code(ledger_id)
        return plan

    def _is_cached(self, ledger_id: int, entry_id: int) -> bool:
        return (
            self._read_cache.get(ledger_id, entry_id) is not None
            or self._write_cache.get(ledger_id, entry_id) is not None
            or self._flushing.get(ledger_id, entry_id) is not None
        )

    def _took(self, batch: DiskBatch, cache: bool = True) -> None:
        """Back on the event loop: read-ahead into the read cache, the frames asked too
        (another replica's reader or a speculative read may ask again), counters."""
        if cache:
            for (ledger_id, entry_id), frame in batch.ahead:
                self._read_cache.put(ledger_id, entry_id, frame, verified=False)
            for (ledger_id, entry_id), result in batch.found.items():
                if result.status is BookieStatus.OK:
                    self._read_cache.put(ledger_id, entry_id, result.frame)
        for (ledger_id, entry_id), where, problem in batch.corrupt:
            self._corrupt(ledger_id, entry_id, where, problem)
        stats = self.stats
        stats.read_cache_misses += len(batch.found)
        if batch.ahead:
            stats.readahead_batch_count += 1
            stats.readahead_batch_size += len(batch.ahead)
        stats.index_lookups = self.index.lookups
        stats.entry_log_reads += batch.entry_log_reads
        stats.entry_log_read_bytes += batch.entry_log_read_bytes

    def _absent(self, item: wire.ReadItem, authority: bool) -> BookieStatus:
        info = self.ledgers.get(item.ledger_id)
        first_entry_id = info.first_entry_id if info is not None else None
        return absent_entry_status(item.entry_id, first_entry_id, authority, self.limbo)

    def _corrupt(self, ledger_id: int, entry_id: int, where: str, why: str) -> None:
        self.stats.ledgerstore_read_entry_corrupt += 1
        log.error(
            "stored entry is corrupt",
            extra={"ledger_id": ledger_id, "entry_id": entry_id, "location": where, "reason": why},
        )
        if self._on_corrupt is not None:
            self._on_corrupt(ledger_id, entry_id, why)

    async def read_lac(self, ledger_id: int) -> wire.LacReply:
        self.stats.ledgerstore_read_lac += 1
        caught_up = await self.catch_up() and self.unsure is None
        info = self.ledgers.get(ledger_id)
        if info is None:
            if self.limbo:
                return wire.LacReply(BookieStatus.UNKNOWN_LEDGER_STATE)
            return wire.LacReply(absent_status(False, caught_up))
        return wire.LacReply(BookieStatus.OK, info.lac, info.last_entry_id)


def _key(item: wire.ReadItem) -> Key:
    return item.ledger_id, item.entry_id


def _end_and_read(tailer: JournalTailer) -> tuple[JournalPosition | None, TailRead]:
    """Where the journal ends now (taken first: the goal), then the records up to there."""
    return tailer.end_position(), tailer.read()
