"""The journal's IO: files, replay, the group-commit writer, LastLogMark checkpoints.

The decisions are elsewhere: the record and file format in `shared.bookie.journal_format`,
when to commit in `core`, the ledger rules in `shared.bookie.rules`; this module only
moves bytes and wakes tasks. A bookie runs one journal per journal directory
(journal.journal_directories; the default is `<bookie_dir>/journal/`), each with its own
writer thread, group commit and fsync, and these files:

    journal-NNNNNN.log   the write-ahead log
    lastMark             {"file": n, "offset": m}: the ledgerstore has checkpointed up to
                         here; journal files wholly before file n are deleted
    ledgers.snapshot     the durable ledger facts (key, fenced, LAC, last entry) as of a
                         position, written just before each LastLogMark move, so that
                         replay still knows every fence and key (replay = snapshot +
                         records after it; nothing before it is read); each time it gets a
                         segment with the ledgers changed since the last, and is rewritten
                         whole once it holds more than SNAPSHOT_ROWS_PER_LEDGER_MAX rows a
                         ledger

Durability: a batch is written and made durable (one pwritev with RWF_DSYNC, or a write
then fdatasync: `FileLayer.write_and_sync`) before any add of it is answered. A write or
fsync error is fatal: the process exits at once (fail-stop; after a failed fsync the page
cache state is unknown, so never retry).

Traces: a group commit serves many requests at once, so it is no request's child. A
commit that serves traced requests (a `submit` given the request's recording span) is a
root span `journal.commit`, linked to each of them, with a child `journal.fdatasync` timed
in the writer thread; each of those request spans is linked back to it before its answer
goes. A commit that serves none costs nothing more than a counter check.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, set_span_in_context

from services.journal.core import GroupCommitPolicy, batch_length, plan_group_commit
from shared.aio import wait_event
from shared.bookie.files import OS_FILES, FileLayer
from shared.bookie.handoff import DurableBatch
from shared.bookie.journal_dir import journal_files
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    JOURNAL_START,
    LAST_MARK,
    SHORT_JOURNAL,
    SNAPSHOT,
    EntryRecord,
    JournalFormatError,
    JournalPosition,
    Record,
    ScanResult,
    ScanStop,
    ShortJournal,
    Snapshot,
    check_file_header,
    decode_last_mark,
    decode_snapshot,
    encode_batch,
    encode_entry_record,
    encode_file_header,
    encode_last_mark,
    encode_record,
    encode_snapshot,
    encode_snapshot_segment,
    file_format_version,
    journal_file_name,
    journal_shorter_than_recorded,
    next_valid_record,
    scan_records,
)
from shared.bookie.rules import BookieLedgerState
from shared.config import MIB, JournalSettings
from shared.disk import fail_stop
from shared.metrics import OpStats
from shared.telemetry import tracer

log = logging.getLogger(__name__)

# remove_pages_from_cache keeps the file's last 4 MiB cached (the ledgerstore reads what
# was just committed) and drops the rest a MiB or more at a time.
PAGE_CACHE_KEEP_BYTES = 4 * MIB
PAGE_CACHE_DROP_STEP_BYTES = MIB
# The snapshot file is rewritten whole (one row a ledger) once its appended segments hold
# more rows than this many a ledger: a rewrite of N ledgers then comes after at least N
# rows of changes, so its cost is paid by data, not by the ledgers ever seen.
SNAPSHOT_ROWS_PER_LEDGER_MAX = 2


class JournalStartupError(RuntimeError):
    """The journal on disk cannot be trusted as it is: refuse to start, say why and where."""


class QueueFull(Exception):
    """More adds pending than journal.queue_size: the caller answers TOO_MANY_REQUESTS."""


def die(reason: str) -> None:
    fail_stop("journal", reason)


@dataclass
class JournalStats:
    """The journal's counters, plain numbers bumped without a lock; the journal service's
    metrics builder reads them at scrape time (docs/metrics.md: journal)."""

    journal_add_entry: int = 0
    add_requests: int = 0  # add requests answered
    # JOURNAL_ADD_ENTRY: from queueing to fsync done, per entry.
    add_entry_latency: OpStats = field(default_factory=OpStats)
    # ADD_ENTRY_REQUEST: from an add request's arrival to its reply, per entry (success:
    # admitted and durable; not: refused).
    add_entry_request: OpStats = field(default_factory=OpStats)
    journal_add_entry_rejected: dict[str, int] = field(default_factory=dict)
    journal_records: int = 0
    journal_sync: int = 0
    # JOURNAL_SYNC: writing one group commit and its fdatasync.
    sync_latency: OpStats = field(default_factory=OpStats)
    journal_flush_batch_records_sum: int = 0
    journal_flush_batch_records_max: int = 0
    journal_flush_batch_bytes_sum: int = 0
    journal_queue_size: int = 0
    journal_queue_max_size: int = 0
    journal_rolls: int = 0
    journal_checkpoints: int = 0
    journal_files_deleted: int = 0
    # Ledger-state rows (and bytes) written to the snapshot: per changed ledger, not per
    # ledger ever seen.
    journal_snapshot_rows: int = 0
    journal_snapshot_bytes: int = 0

    def rejected(self, status_name: str) -> None:
        self.journal_add_entry_rejected[status_name] = (
            self.journal_add_entry_rejected.get(status_name, 0) + 1
        )

    def added(self, latency_ms: float) -> None:
        self.add_entry_latency.record(latency_ms)

    def synced(self, records: int, size: int, latency_ms: float) -> None:
        self.journal_sync += 1
        self.journal_records += records
        self.sync_latency.record(latency_ms)
        self.journal_flush_batch_records_sum += records
        self.journal_flush_batch_records_max = max(self.journal_flush_batch_records_max, records)
        self.journal_flush_batch_bytes_sum += size


@dataclass
class Replayed:
    state: BookieLedgerState
    durable: JournalPosition  # end of the last valid record
    last_file_id: int  # highest journal file id seen (0 if none)
    mark: JournalPosition | None
    # Rows in the snapshot file, if the next snapshot may append to it (None: rewrite it).
    snapshot_rows: int | None = None


def _beyond_backups(ids: list[int], mark: JournalPosition, max_backups: int) -> list[int]:
    """Journal files wholly before the mark, except the newest `max_backups` of them."""
    older = [i for i in ids if i < mark.file_id]
    return older[: max(0, len(older) - max_backups)]


def replay(
    directory: Path,
    skip_invalid_records: bool = False,
    files: FileLayer = OS_FILES,
    max_backups: int = 0,
) -> Replayed:
    """Rebuild the ledger facts from the snapshot and the journal files (blocking).
    Truncates a torn tail of the last file; refuses damage anywhere else, unless
    `skip_invalid_records` (the operator's skipReplayJournalInvalidRecord) says to log it
    and resume at the next valid batch."""
    mark = _read_optional(directory / LAST_MARK, decode_last_mark)
    snapshot: Snapshot | None = _read_optional(directory / SNAPSHOT, decode_snapshot)
    ids = journal_files(directory)
    if mark is not None:
        for file_id in _beyond_backups(ids, mark, max_backups):
            # A checkpoint died between writing lastMark and deleting: finish the job.
            files.unlink(directory / journal_file_name(file_id))
            log.info("deleted journal file below lastMark", extra={"file_id": file_id})
        # Files before the mark's are backups (journalMaxBackups): kept, never replayed.
        ids = [i for i in ids if i >= mark.file_id]
    if ids and ids != list(range(ids[0], ids[-1] + 1)):
        missing = sorted(set(range(ids[0], ids[-1] + 1)) - set(ids))
        raise JournalStartupError(f"journal files missing in {directory}: ids {missing}")
    if snapshot is None and (ids[:1] != [1] if ids else mark is not None):
        raise JournalStartupError(
            f"journal files before {ids[:1]} were deleted but {directory / SNAPSHOT} is "
            "missing: the fenced flags and master keys they held are unknown"
        )
    state = BookieLedgerState(track_changes=True)
    start = JOURNAL_START
    if snapshot is not None:
        start = snapshot.position
        if ids and ids[0] > start.file_id:
            # Only when segments after a damaged one were dropped (`Snapshot.torn`).
            raise JournalStartupError(
                f"{directory / SNAPSHOT} ends at {start.to_json()} ({snapshot.torn or 'whole'})"
                f" but journal files before {ids[0]} were deleted: the fenced flags and "
                "master keys they held are unknown"
            )
        if snapshot.torn:
            log.warning(
                "ledger-state snapshot: ignoring a torn last segment",
                extra={"reason": snapshot.torn, "position": start.to_json()},
            )
        state.restore(snapshot.records)
    short = journal_shorter_than_recorded(
        {i: (directory / journal_file_name(i)).stat().st_size for i in ids},
        {LAST_MARK: mark, SNAPSHOT: snapshot.position if snapshot is not None else None},
    )
    if short is not None:
        message = short_journal_message(directory, short)
        log.error(
            message,
            extra={
                "file": str(directory / journal_file_name(short.position.file_id)),
                "size": short.size,
                "recorded_by": str(directory / short.recorded_by),
                "position": short.position.to_json(),
            },
        )
        raise JournalStartupError(message)
    durable = start
    for file_id in ids:
        if file_id < start.file_id:
            continue  # wholly before the snapshot: its facts are in it
        durable = _ReplayFile(
            directory / journal_file_name(file_id),
            file_id,
            last=file_id == ids[-1],
            start=start,
            mark=mark,
            skip_invalid=skip_invalid_records,
            files=files,
        ).run(state)
    seen = [*ids, mark.file_id if mark else 0, start.file_id if snapshot else 0]
    rows = len(snapshot.records) if snapshot is not None and snapshot.appendable else None
    return Replayed(state, durable, max(seen), mark, rows)


def short_journal_message(directory: Path, short: ShortJournal) -> str:
    """The refusal, for the operator: which file, its size, the recorded position, what to do."""
    path = directory / journal_file_name(short.position.file_id)
    size = "missing" if short.size is None else f"{short.size} bytes long"
    return (
        f"{SHORT_JOURNAL}: {path} is {size}, but {directory / short.recorded_by} records "
        f"{short.position.to_json()} as fsynced (offset {short.position.offset}"
        f"{', applied by the ledgerstore' if short.recorded_by == LAST_MARK else ''}): "
        "bytes this bookie acknowledged are gone (a disk that lied about fsync, or a "
        "truncation from outside); refusing to start, since writing on would reuse offsets "
        "the ledgerstore has already applied and lose entries silently. Do not edit lastMark "
        "or ledgers.snapshot. Either retire the bookie (`quire shell decommissionbookie "
        "--bookieid ID`, or `quire autorecovery decommission ID`: its ledgers are "
        "re-replicated elsewhere), or wipe all its directories (journal, ledger and bookie "
        "directories; there is no format command) and start it again with the same id and "
        "settings: it rejoins in limbo and the auditor has what it held re-replicated "
        '(docs/storage.md, "A journal shorter than its recorded position")'
    )


def _read_optional(path: Path, decode: Callable):
    if not path.exists():
        return None
    try:
        return decode(path.read_bytes())
    except JournalFormatError as exc:
        raise JournalStartupError(f"{path}: {exc}") from exc


@dataclass
class _ReplayFile:
    path: Path
    file_id: int
    last: bool
    start: JournalPosition
    mark: JournalPosition | None
    skip_invalid: bool
    files: FileLayer

    def run(self, state: BookieLedgerState) -> JournalPosition:
        # What is replayed is trusted from now on (applied, counted durable, read by the
        # ledgerstore): a batch whose fsync a crash cut short may be in the page cache
        # only, and a later power loss would tear it, in a file that is then not the last
        # (refused at the next start). Made durable first.
        self.files.sync_file(self.path)
        data = self.path.read_bytes()
        try:
            complete = check_file_header(data, self.file_id)
        except JournalFormatError as exc:
            # A damaged header on the last file with no valid record anywhere in it: its
            # creation was torn (the header never reached the disk intact).
            if not self.last or next_valid_record(data, 0) is not None:
                raise JournalStartupError(f"{self.path}: {exc}") from exc
            complete = False
        if not complete:
            if not self.last:
                raise JournalStartupError(
                    f"{self.path}: header cut short in a file that is not last"
                )
            log.warning("journal file header torn, rewriting it", extra={"file": str(self.path)})
            self.files.truncate(self.path, 0)
            fd = self.files.open_append(self.path)
            try:
                self.files.write(fd, encode_file_header(self.file_id))
                self.files.fsync(fd)
            finally:
                self.files.close(fd)
            return JournalPosition(self.file_id, FILE_HEADER_SIZE)
        batched = file_format_version(data) >= 2
        # What precedes the snapshot's position is never read again: its facts are in the
        # snapshot and its entries in the ledgerstore (the mark is not past the snapshot),
        # so a bit flipped there at rest cannot keep the bookie from starting.
        at = FILE_HEADER_SIZE
        if self.file_id == self.start.file_id:
            at = max(at, self.start.offset)
        while True:
            scan = scan_records(memoryview(data)[at:], at)
            for scanned in scan.records:
                if JournalPosition(self.file_id, scanned.end) > self.start:
                    state.apply(scanned.record)
            if scan.stop is ScanStop.END:
                return JournalPosition(self.file_id, scan.end)
            resume = self._damage_or_tear(data, scan, batched)
            if resume is None:
                return JournalPosition(self.file_id, scan.end)
            at = resume

    def _damage_or_tear(self, data: bytes, scan: ScanResult, batched: bool) -> int | None:
        """None after truncating a torn tail; else where to resume past skipped damage
        (only when the operator allows it); else raise."""
        where = f"{self.path} at offset {scan.end} ({scan.reason})"
        resume = next_valid_record(data, scan.end + 1, batch_only=batched)
        below_mark = (
            self.mark is not None
            and self.mark.file_id == self.file_id
            and self.mark.offset > scan.end
        )
        torn = self.last and resume is None and not below_mark
        if torn:
            log.warning(
                "truncating torn journal tail",
                extra={
                    "file": str(self.path),
                    "offset": scan.end,
                    "dropped_bytes": len(data) - scan.end,
                    "reason": scan.reason,
                },
            )
            self.files.truncate(self.path, scan.end)
            return None
        why = (
            "in a file that is not last"
            if not self.last
            else "below the LastLogMark (it was fsynced and checkpointed)"
            if below_mark
            else "followed by valid records of a later group commit"
        )
        if not self.skip_invalid:
            raise JournalStartupError(
                f"bad journal record in {where}, {why}: the journal is damaged before its "
                "tail; refusing to start (inspect it with `quire shell readjournal`, restore "
                "the file, or set QUIRE_JOURNAL__SKIP_REPLAY_JOURNAL_INVALID_RECORD=true to "
                "start without the damaged records)"
            )
        end = len(data) if resume is None else resume
        log.error(
            "skipping damaged journal records (skip_replay_journal_invalid_record is set)",
            extra={"file": str(self.path), "offset": scan.end, "skipped_bytes": end - scan.end},
        )
        return end if end < len(data) else None


@dataclass(slots=True)
class _Pending:
    data: bytes
    record: Record
    enqueued_ms: float
    # Only on the last record of a `submit`: commits are in queue order, so once it is
    # durable the whole submit is (one future per request, not one per record).
    future: asyncio.Future[JournalPosition] | None
    # The recording span of the request that submitted it (on the last record too).
    span: Span | None = None


# Told each durable position after a group commit; synchronous, must not block.
CommitListener = Callable[[JournalPosition], None]


class _WriterThread:
    """One dedicated thread that does the journal's blocking writes and fdatasyncs, fed by
    a queue. Measured against asyncio.to_thread per commit and aiofiles
    (`python -m services.journal.commit_bench`, docs/storage.md): 1.3-1.5x the adds/s at 1
    and 64 concurrent adders, because a commit costs one queue put and one
    call_soon_threadsafe instead of an executor submission and its future chaining."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)  # the thread finishes what is queued, then ends
            self._thread = None

    def run(self, fn: Callable[..., object], *args: object) -> asyncio.Future:
        """`fn(*args)` on the writer thread; its result (or exception) as a future."""
        assert self._thread is not None, "the writer thread is not running"
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, fn, args = job
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # handed to the awaiting task, which decides
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Journal:
    """One bookie's journal. `submit` is synchronous (checks and queueing happen in
    request arrival order); the writer task commits; `checkpoint` moves the LastLogMark."""

    def __init__(
        self,
        directory: Path,
        settings: JournalSettings,
        on_commit: CommitListener | None = None,
        fatal: Callable[[str], None] = die,
        files: FileLayer = OS_FILES,
        bookie_id: str = "",
        stats: JournalStats | None = None,
    ) -> None:
        self.directory = directory
        self.bookie_id = bookie_id
        self.settings = settings
        self.files = files
        self.policy = GroupCommitPolicy(
            max_group_wait_ms=settings.max_group_wait_ms,
            buffered_writes_threshold_bytes=settings.buffered_writes_threshold_bytes,
            buffered_entries_threshold=settings.buffered_entries_threshold,
            flush_when_queue_empty=settings.flush_when_queue_empty,
        )
        # Shared by the journals of one bookie (one per journal directory): the bookie's
        # totals. What is this journal's alone is below (`syncs`, `written_bytes`...).
        self.stats = stats or JournalStats()
        self.syncs = 0
        self.sync_seconds = 0.0
        self.written_bytes = 0
        # `live` includes what is queued (admission decisions); `durable` only what is
        # fsynced (fence replies, snapshots).
        self.live = BookieLedgerState()
        self.durable = BookieLedgerState(track_changes=True)
        self._snapshot_rows: int | None = None  # Replayed.snapshot_rows, then kept up
        self.durable_position = JOURNAL_START
        self.mark: JournalPosition | None = None
        self._on_commit = on_commit
        # Co-hosted with the ledgerstore (`services.bookie`): told each durable group
        # commit's records (`_hand_over`); None in a journal process of its own. `index`:
        # this journal's among the bookie's journal directories.
        self.on_durable: Callable[[DurableBatch], None] | None = None
        self.index = 0
        self._fatal = fatal
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pending_bytes = 0
        self._traced_pending = 0  # pending records that carry a span
        self._wakeup = asyncio.Event()
        self._fd = -1
        self._file_id = 0
        self._file_size = 0
        self._cache_dropped_to = 0  # page cache of the current file handed back up to here
        self._max_file_bytes = settings.max_size_mb * MIB
        self._io_lock = threading.Lock()  # a write in a thread vs. close at shutdown
        self._writer_thread = _WriterThread()
        self._checkpoint_lock = asyncio.Lock()

    # -- start and stop -------------------------------------------------------------------

    async def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        replayed = await asyncio.to_thread(
            replay,
            self.directory,
            self.settings.skip_replay_journal_invalid_record,
            self.files,
            self.settings.max_backups,
        )
        self.durable = replayed.state
        self.live = replayed.state.copy()
        self.durable_position = replayed.durable
        self.mark = replayed.mark
        self._snapshot_rows = replayed.snapshot_rows
        # Never append to a replayed file: a position the ledgerstore may have read past
        # (bytes lost to a crash) is never reused, and "file n+1 exists" means "file n is
        # complete".
        await asyncio.to_thread(self._create_file, replayed.last_file_id + 1)
        self._writer_thread.start()
        log.info(
            "journal replayed",
            extra={
                "ledgers": len(self.durable),
                "durable": self.durable_position.to_json(),
                "file_id": self._file_id,
                "mark": self.mark.to_json() if self.mark else None,
            },
        )

    async def close(self) -> None:
        self._writer_thread.stop()
        with self._io_lock:
            if self._fd >= 0:
                self.files.close(self._fd)
                self._fd = -1

    @property
    def queued(self) -> int:
        """Records queued, not yet committed."""
        return len(self._pending)

    # -- submitting -----------------------------------------------------------------------

    def room_for(self, count: int) -> bool:
        """Whether `count` more records fit in the queue. An empty queue takes any batch,
        so that a batch larger than the queue is not refused forever."""
        return not self._pending or len(self._pending) + count <= self.settings.queue_size

    def submit(
        self, records: list[Record], now_ms: float, span: Span | None = None
    ) -> asyncio.Future[JournalPosition]:
        """Queue records (already admitted against `live` by the caller, who applies them
        to it); the future completes with the durable position once all are fsynced.
        `span`: the recording span of the traced request they come from, if any (see the
        module docstring); it is linked to the commit before the future completes."""
        assert records, "submit needs at least one record"
        if not self.room_for(len(records)):
            raise QueueFull(f"{len(self._pending)} records pending")
        future: asyncio.Future[JournalPosition] = asyncio.get_running_loop().create_future()
        last = len(records) - 1
        entries = 0
        pending = self._pending
        size = 0
        for index, record in enumerate(records):
            if type(record) is EntryRecord:
                data = encode_entry_record(record)
                entries += 1
            else:
                data = encode_record(record)
            size += len(data)
            if index == last:
                pending.append(_Pending(data, record, now_ms, future, span))
            else:
                pending.append(_Pending(data, record, now_ms, None, None))
        self._pending_bytes += size
        self.stats.journal_add_entry += entries
        if span is not None:
            self._traced_pending += 1
        self.stats.journal_queue_size += len(records)
        self.stats.journal_queue_max_size = max(
            self.stats.journal_queue_max_size, self.stats.journal_queue_size
        )
        self._wakeup.set()
        return future

    # -- the writer -----------------------------------------------------------------------

    async def run_writer(self) -> None:
        """Take what is pending, write it, fsync it, then answer it: forever."""
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            plan = plan_group_commit(
                self.policy,
                len(self._pending),
                self._pending_bytes,
                self._pending[0].enqueued_ms,
                _now_ms(),
            )
            if not plan.flush_now:
                self._wakeup.clear()
                await wait_event(self._wakeup, (plan.wait_ms or 0) / 1000)
                continue
            sizes = [
                len(p.data)
                for p in islice(self._pending, self.policy.buffered_entries_threshold + 1)
            ]
            count = batch_length(self.policy, sizes)
            batch = [self._pending.popleft() for _ in range(count)]
            self._pending_bytes -= sum(sizes[:count])  # batch_length took them from sizes
            self.stats.journal_queue_size -= count
            await self._commit(batch)

    async def _commit(self, batch: list[_Pending]) -> None:
        data = encode_batch([p.data for p in batch])
        traced = self._traced_spans(batch) if self._traced_pending else []
        if (
            self._file_size > FILE_HEADER_SIZE
            and self._file_size + len(data) > self._max_file_bytes
        ):
            await self._writer_thread.run(self._create_file, self._file_id + 1)
        started = time.perf_counter()
        try:
            written = await self._writer_thread.run(self._write, data, self._file_size + len(data))
        except OSError as exc:
            self._fatal(f"journal write/fsync of {journal_file_name(self._file_id)}: {exc!r}")
            raise
        elapsed_s = time.perf_counter() - started
        self.stats.synced(len(batch), len(data), elapsed_s * 1000)
        self.syncs += 1
        self.sync_seconds += elapsed_s
        self.written_bytes += len(data)
        if traced:
            # Scheduled before the answers below, so it runs before the answered requests
            # end their spans (each is linked to the commit first); and not done here, so
            # that the writer starts its next write and fdatasync first: the span work then
            # runs while they are under way, off the path every add waits on (done here it
            # cost the journal a fifth of its throughput at a 1 % sampling ratio).
            asyncio.get_running_loop().call_soon(
                self._trace_commit, traced, len(batch), len(data), written
            )
        previous = self.durable_position
        start = JournalPosition(self._file_id, self._file_size)
        self._file_size += len(data)
        position = JournalPosition(self._file_id, self._file_size)
        self.durable_position = position
        now_ms = _now_ms()
        added = self.stats.add_entry_latency.record
        apply = self.durable.apply
        # The records of one submit share their enqueued_ms: one latency record for them.
        run_ms, run = batch[0].enqueued_ms, 0
        for pending in batch:
            if pending.enqueued_ms != run_ms:
                added(now_ms - run_ms, True, run)
                run_ms, run = pending.enqueued_ms, 0
            run += 1
            apply(pending.record)
            future = pending.future
            if future is not None and not future.done():
                future.set_result(position)
        added(now_ms - run_ms, True, run)
        if self.on_durable is not None:
            self._hand_over(previous, start, position, batch)
        if self._on_commit is not None:
            self._on_commit(position)

    def _hand_over(
        self,
        previous: JournalPosition,
        start: JournalPosition,
        end: JournalPosition,
        batch: list[_Pending],
    ) -> None:
        """Co-hosted (`services.bookie`): hand the records just made durable to the
        ledgerstore by reference, in commit order (called from `_commit`, one at a time)."""
        assert self.on_durable is not None
        self.on_durable(DurableBatch(self.index, previous, start, end, [p.record for p in batch]))

    def _traced_spans(self, batch: list[_Pending]) -> list[Span]:
        spans = [p.span for p in batch if p.span is not None]
        self._traced_pending -= len(spans)
        return spans

    def _trace_commit(
        self, traced: list[Span], records: int, size: int, written: tuple[int, int]
    ) -> None:
        """The group commit's spans, timed by the writer thread: `journal.commit` (a root
        linked to each traced request it served, sampled because they are), its child
        `journal.fdatasync`, and the link from each request's span back to the commit."""
        started_ns, ended_ns = written
        commit = tracer(__name__).start_span(
            "journal.commit",
            context=Context(),
            links=[Link(span.get_span_context()) for span in traced],
            start_time=started_ns,
            attributes={
                "quire.records": records,
                "quire.bytes": size,
                "quire.bookie_id": self.bookie_id,
            },
        )
        if not commit.is_recording():
            return
        if self.settings.sync_data:
            sync = tracer(__name__).start_span(
                "journal.fdatasync",
                context=set_span_in_context(commit),
                start_time=started_ns,
                attributes={"quire.bytes": size},
            )
            sync.end(end_time=ended_ns)
        context = commit.get_span_context()
        for span in traced:
            span.add_link(context)
        commit.end(end_time=ended_ns)

    def _write(self, data: bytes, end: int) -> tuple[int, int]:
        """Write a group commit that ends the file at `end`, fsync it (writer thread).
        When it started and ended (ns since the epoch, as spans are timed)."""
        started_ns = time.time_ns()
        with self._io_lock:
            if self.settings.sync_data:
                self.files.write_and_sync(self._fd, data)
                self._drop_cache(end)
            else:
                self.files.write(self._fd, data)
        return started_ns, time.time_ns()

    def _drop_cache(self, end: int) -> None:
        """Hand back the synced pages of the current file but its last
        PAGE_CACHE_KEEP_BYTES (the ledgerstore reads them next), a step at a time."""
        upto = end - PAGE_CACHE_KEEP_BYTES
        if not self.settings.remove_pages_from_cache or upto - self._cache_dropped_to < (
            PAGE_CACHE_DROP_STEP_BYTES
        ):
            return
        self.files.drop_cache(self._fd, self._cache_dropped_to, upto - self._cache_dropped_to)
        self._cache_dropped_to = upto

    def _create_file(self, file_id: int) -> None:
        """Start journal file `file_id` (blocking): header, fsync, directory fsync."""
        path = self.directory / journal_file_name(file_id)
        try:
            fd = self.files.create(path, encode_file_header(file_id))
        except OSError as exc:
            self._fatal(f"creating journal file {path}: {exc!r}")
            raise
        with self._io_lock:
            if self._fd >= 0:
                self.files.close(self._fd)
                self.stats.journal_rolls += 1
            self._fd, self._file_id, self._file_size = fd, file_id, FILE_HEADER_SIZE
            self._cache_dropped_to = 0

    # -- LastLogMark ----------------------------------------------------------------------

    async def checkpoint(self, requested: JournalPosition) -> tuple[JournalPosition, list[int]]:
        """The ledgerstore has made everything before `requested` durable: record the
        LastLogMark and delete journal files wholly before it. Returns (mark, deleted)."""
        async with self._checkpoint_lock:
            # Never past what is fsynced here: the ledgerstore may have read further.
            mark = min(requested, self.durable_position)
            if self.mark is not None and mark <= self.mark:
                return self.mark, []
            # Replay starts at the snapshot's position: the facts of everything before the
            # mark (fences, keys) must be in the snapshot before the mark moves. Written at
            # every move (a segment of the ledgers changed since the last), so replay never
            # reads what the ledgerstore has checkpointed: damage there is not fatal.
            # A failed write or fsync of the snapshot, the mark or a deletion is as fatal as
            # one of a group commit (the fsyncgate rule: nothing in the page cache can be
            # trusted after it); it was once only a failed checkpoint request, and the
            # bookie went on acknowledging adds on a disk that had just failed.
            try:
                await self._write_snapshot()
                await asyncio.to_thread(
                    self.files.write_atomic, self.directory / LAST_MARK, encode_last_mark(mark)
                )
                self.mark = mark
                doomed = _beyond_backups(
                    journal_files(self.directory), mark, self.settings.max_backups
                )
                if doomed:
                    await asyncio.to_thread(self._delete, doomed)
            except OSError as exc:
                self._fatal(f"journal checkpoint in {self.directory}: {exc!r}")
                raise
            self.stats.journal_checkpoints += 1
            self.stats.journal_files_deleted += len(doomed)
            return mark, doomed

    async def _write_snapshot(self) -> None:
        """Append the ledgers changed since the last snapshot, or rewrite the file whole
        when it would hold too many rows (or cannot be appended to). The rows and the
        position are captured in one synchronous step, so they agree."""
        changed = self.durable.take_changed()
        position = self.durable_position
        rows = self._snapshot_rows
        whole = rows is None or rows + len(changed) > SNAPSHOT_ROWS_PER_LEDGER_MAX * len(
            self.durable
        )
        records = self.durable.snapshot_records(None if whole else changed)
        path = self.directory / SNAPSHOT
        # A failed write may have left part of a segment: rewrite whole next time.
        self._snapshot_rows = None
        try:
            if whole:
                data = encode_snapshot(position, records)
                await asyncio.to_thread(self.files.write_atomic, path, data)
            else:
                data = encode_snapshot_segment(position, records)
                await asyncio.to_thread(self.files.append, path, data)
        except BaseException:
            self.durable.restore_changed(changed)
            raise
        self._snapshot_rows = len(records) if whole else (rows or 0) + len(records)
        self.stats.journal_snapshot_rows += len(records)
        self.stats.journal_snapshot_bytes += len(data)

    def _delete(self, file_ids: list[int]) -> None:
        for file_id in file_ids:
            self.files.unlink(self.directory / journal_file_name(file_id))
        self.files.fsync_dir(self.directory)


def _now_ms() -> float:
    return time.monotonic() * 1000
