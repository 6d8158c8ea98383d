"""The ledgerstore's files: entry logs, the SQLite index, and the journal tailer.

All methods here block; the store calls them on its own threads: the read path's
(index queries, entry log reads) apart from the write path's (journal reads, entry log
appends and fsyncs, index commits), see `LedgerStore`. The formats are in
`shared.bookie` (`entrylog_format`, `index_schema`, `journal_format`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from services.ledgerstore.core import (
    CursorAction,
    EntryLocation,
    LedgerInfo,
    locate,
    next_file,
)
from shared.bookie import index_schema as sql
from shared.bookie.entrylog_format import (
    COMPACTING_SUFFIX,
    ENTRY_HEAD_SIZE,
    ENTRYLOG_HEADER_SIZE,
    EntryLogFormatError,
    check_entry_log_header,
    decode_entry_head,
    encode_entry,
    encode_entry_log_header,
    entry_log_name,
    parse_entry_log_name,
)
from shared.bookie.files import OS_FILES, FileLayer
from shared.bookie.journal_dir import journal_files
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    JOURNAL_START,
    MAX_RECORD_SIZE,
    JournalFormatError,
    JournalPosition,
    ScannedRecord,
    ScanStop,
    check_file_header,
    file_format_version,
    journal_file_name,
    next_valid_record,
    scan_records,
)
from shared.digest import HEADER_SIZE, parse_header

log = logging.getLogger(__name__)

READ_FDS_MAX = 64  # open entry log files kept for reads
SCAN_CHUNK_BYTES = 4 * 1024 * 1024  # one pread of an entry log scanned for its entry heads

Usage = dict[tuple[int, int], dict[int, int]]  # (dir, log_id) -> ledger -> bytes (heads in)


# -- entry logs ---------------------------------------------------------------------------


class EntryLogger:
    """Interleaved entry logs: appends go to the current log, which rolls at
    `log_size_limit_bytes`. A rolled log is fsynced when it is closed; `sync` fsyncs the
    current one. Appends and syncs come from one caller at a time; reads from anywhere."""

    def __init__(
        self,
        directory: Path,
        log_size_limit_bytes: int,
        files: FileLayer = OS_FILES,
        dir_index: int = 0,
    ) -> None:
        self.directory = directory
        self.dir_index = dir_index
        self.limit_bytes = log_size_limit_bytes
        self.files = files
        self.log_id = 0
        self.size = 0
        self._fd = -1
        self._cache_dropped_to = 0  # page cache of the current log handed back up to here
        self._read_fds: OrderedDict[int, int] = OrderedDict()  # log id -> fd, LRU
        self._fd_users: dict[int, int] = {}  # fd -> reads using it now
        self._fds_to_close: set[int] = set()  # evicted while in use
        self._read_lock = threading.Lock()
        # Log ids come from one place: the writer's rolls and compaction's new logs.
        self._id_lock = threading.Lock()
        self._next_id = 1

    def log_ids(self) -> list[int]:
        ids = [parse_entry_log_name(p.name) for p in self.directory.iterdir()]
        return sorted(i for i in ids if i is not None)

    def allocate_log_id(self) -> int:
        """A log id never used in this directory since `open` (a roll's or a compaction's)."""
        with self._id_lock:
            log_id = self._next_id
            self._next_id += 1
            return log_id

    def open(self, end: tuple[int, int] | None, referenced: frozenset[int] = frozenset()) -> None:
        """Resume after the checkpoint that ended the logs at `end` (log_id, size): bytes
        written after it are not indexed and will be written again from the journal.
        `referenced`: logs the index has usage rows for, kept whatever their id (a
        compaction's output can have a higher id than the writer's current log)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob("*" + COMPACTING_SUFFIX):
            # A compaction that never finished: its entries still are in the old log.
            self.files.unlink(leftover)
            log.info("removed an unfinished compaction's log", extra={"file": leftover.name})
        ids = self.log_ids()
        self._next_id = max([*ids, end[0] if end else 0]) + 1
        if end is None:
            self._create(self.allocate_log_id())
            return
        log_id, size = end
        for later in (i for i in ids if i > log_id and i not in referenced):
            self.files.unlink(self.directory / entry_log_name(later))
            log.info("removed entry log written after the last checkpoint", extra={"log_id": later})
        path = self.directory / entry_log_name(log_id)
        if not path.exists():
            raise EntryLogFormatError(
                f"{path} is missing but the index's last checkpoint ends in it"
            )
        with open(path, "rb") as f:
            check_entry_log_header(f.read(ENTRYLOG_HEADER_SIZE), log_id)
        # Bytes after the checkpoint are not indexed: cut them, the journal rewrites them.
        self.files.truncate(path, size)
        self._fd = self.files.open_append(path)
        self.log_id, self.size = log_id, size
        self._cache_dropped_to = size

    def _create(self, log_id: int) -> None:
        path = self.directory / entry_log_name(log_id)
        if self._fd >= 0:
            # The rolled log must be durable before a checkpoint can name the new one.
            self.files.fsync(self._fd)
            self.files.close(self._fd)
            self._fd = -1
        fd = self.files.create(path, encode_entry_log_header(log_id))
        self._fd, self.log_id, self.size = fd, log_id, ENTRYLOG_HEADER_SIZE
        self._cache_dropped_to = 0

    def append(self, entries: Iterable[tuple[int, int, bytes]]) -> list[EntryLocation]:
        """Write (ledger, entry, frame)s; their locations, in order."""
        locations: list[EntryLocation] = []
        chunk: list[bytes] = []
        pending = 0  # bytes in `chunk`: kept as a running sum (a flush holds thousands)
        for ledger_id, entry_id, frame in entries:
            data = encode_entry(ledger_id, entry_id, frame)
            if (
                self.size + pending > ENTRYLOG_HEADER_SIZE
                and self.size + pending + len(data) > self.limit_bytes
            ):
                self._write(chunk)
                chunk = []
                self._create(self.allocate_log_id())
                pending = 0
            locations.append(
                EntryLocation(self.log_id, self.size + pending, len(frame), self.dir_index)
            )
            chunk.append(data)
            pending += len(data)
        self._write(chunk)
        return locations

    def _write(self, chunk: list[bytes]) -> None:
        data = b"".join(chunk)
        self.files.write(self._fd, data)
        self.size += len(data)

    def sync(self, drop_cache: bool = False) -> tuple[int, int]:
        """fsync the current log; the (log_id, size) now durable. `drop_cache`: then hand
        back the page cache of what was written since the last time (see
        FileLayer.drop_cache)."""
        self.files.fdatasync(self._fd)
        if drop_cache:
            self.files.drop_cache(
                self._fd, self._cache_dropped_to, self.size - self._cache_dropped_to
            )
            self._cache_dropped_to = self.size
        return self.log_id, self.size

    def read_span(self, log_id: int, offset: int, size: int) -> bytes:
        """`size` bytes of log `log_id` from `offset` (a run of entries in one read)."""
        with self._read_fd(log_id) as fd:
            data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"entry log {log_id} ends before offset {offset + size}")
        return data

    def will_need(self, log_id: int, offset: int, size: int) -> None:
        """Ask the kernel to start reading these bytes now (POSIX_FADV_WILLNEED): a
        reader's next request finds them in the page cache."""
        if hasattr(os, "posix_fadvise"):
            with self._read_fd(log_id) as fd:
                os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)

    def read(self, location: EntryLocation) -> bytes:
        with self._read_fd(location.log_id) as fd:
            frame = os.pread(fd, location.size, location.frame_offset)
        if len(frame) != location.size:
            raise OSError(f"entry log {location.log_id} ends before {location}")
        return frame

    @contextmanager
    def _read_fd(self, log_id: int) -> Iterator[int]:
        """An open descriptor of log `log_id`, kept open while the caller uses it: the
        store reads from several threads, and a descriptor closed (and its number reused
        by another open) under a pread would read another file."""
        with self._read_lock:
            fd = self._read_fds.get(log_id)
            if fd is not None:
                self._read_fds.move_to_end(log_id)
            else:
                fd = self._open_for_reads(log_id)
            self._fd_users[fd] = self._fd_users.get(fd, 0) + 1
        try:
            yield fd
        finally:
            with self._read_lock:
                self._fd_users[fd] -= 1
                if not self._fd_users[fd]:
                    del self._fd_users[fd]
                    if fd in self._fds_to_close:
                        self._fds_to_close.discard(fd)
                        os.close(fd)

    def _open_for_reads(self, log_id: int) -> int:
        fd = os.open(self.directory / entry_log_name(log_id), os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):
            # Reads of a log go forward (catch-up reads a ledger's entries in order,
            # stored in order by the sorted flush): a larger kernel read-ahead.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._read_fds[log_id] = fd
        if len(self._read_fds) > READ_FDS_MAX:
            _, old = self._read_fds.popitem(last=False)
            if old in self._fd_users:
                self._fds_to_close.add(old)  # closed by its last reader
            else:
                os.close(old)
        return fd

    def path(self, log_id: int) -> Path:
        return self.directory / entry_log_name(log_id)

    def scan(self, log_id: int, strict: bool = False) -> list[tuple[int, int, int, int]]:
        """(ledger, entry, offset, frame length) of every entry in a sealed log, in file
        order, from its entry heads read in large chunks (BookKeeper's
        extractEntryLogMetadataByScanning). A head cut short ends the scan. `strict`
        (compaction, which deletes the log after): raise EntryLogFormatError instead
        unless the heads chain exactly to the end of the log and each names the entry
        its frame's header names, since an entry behind a damaged head would be lost."""
        found: list[tuple[int, int, int, int]] = []
        with self._read_fd(log_id) as fd:
            size = os.fstat(fd).st_size
            offset = ENTRYLOG_HEADER_SIZE
            while offset + ENTRY_HEAD_SIZE <= size:
                chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, size - offset), offset)
                at = 0
                while at + ENTRY_HEAD_SIZE <= len(chunk):
                    head = chunk[at : at + ENTRY_HEAD_SIZE]
                    ledger_id, entry_id, length = decode_entry_head(head)
                    if length < 0 or offset + at + ENTRY_HEAD_SIZE + length > size:
                        return self._scan_ended(log_id, found, offset + at, size, strict)
                    if strict:
                        self._check_head(fd, log_id, chunk, at, offset, (ledger_id, entry_id))
                    found.append((ledger_id, entry_id, offset + at, length))
                    at += ENTRY_HEAD_SIZE + length
                if at == 0:
                    break
                offset += at
        return self._scan_ended(log_id, found, offset, size, strict)

    @staticmethod
    def _scan_ended(
        log_id: int, found: list[tuple[int, int, int, int]], end: int, size: int, strict: bool
    ) -> list[tuple[int, int, int, int]]:
        if strict and end != size:
            raise EntryLogFormatError(
                f"entry log {log_id}: no whole entry at offset {end} of {size} bytes (a "
                "damaged entry head)"
            )
        return found

    @staticmethod
    def _check_head(
        fd: int, log_id: int, chunk: bytes, at: int, offset: int, named: tuple[int, int]
    ) -> None:
        """The head at `chunk[at:]` names the entry its frame's header names."""
        start = at + ENTRY_HEAD_SIZE
        header = chunk[start : start + HEADER_SIZE]
        if len(header) < HEADER_SIZE:  # past this chunk
            header = os.pread(fd, HEADER_SIZE, offset + start)
        if len(header) < HEADER_SIZE or parse_header(header)[:2] != named:
            raise EntryLogFormatError(
                f"entry log {log_id}: the entry head at offset {offset + at} names "
                f"{named}, its frame another entry (a damaged head or frame)"
            )

    def forget(self, log_id: int) -> None:
        """Close the read descriptor of a log about to be unlinked (a read using it now
        finishes on it and closes it)."""
        with self._read_lock:
            fd = self._read_fds.pop(log_id, None)
            if fd is not None:
                if fd in self._fd_users:
                    self._fds_to_close.add(fd)
                else:
                    os.close(fd)

    def delete(self, log_ids: Iterable[int]) -> None:
        """Unlink sealed logs, then fsync the directory once."""
        for log_id in log_ids:
            assert log_id != self.log_id, "the current entry log is never deleted"
            self.forget(log_id)
            self.files.unlink(self.path(log_id))
        self.files.fsync_dir(self.directory)

    def close(self) -> None:
        if self._fd >= 0:
            self.files.fsync(self._fd)
            self.files.close(self._fd)
            self._fd = -1
        with self._read_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()


# -- the index ----------------------------------------------------------------------------


LogEnds = dict[int, tuple[int, int]]  # ledger dir index -> (log_id, size) as checkpointed


@dataclass
class IndexState:
    # The position in each journal the index reflects (one per journal directory, in
    # order); None: fresh.
    positions: tuple[JournalPosition, ...] | None
    log_ends: LogEnds  # entry logs as of that checkpoint
    ledgers: dict[int, LedgerInfo] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    usage: Usage = field(default_factory=dict)


class EntryIndex:
    """(ledger, entry) -> location, per-ledger facts, and the applied journal position, in
    SQLite (WAL; chosen by benchmark, see docs/storage.md). Everything of one checkpoint
    commits in one transaction.

    One writer connection (checkpoints) and one reader connection per thread that queries:
    in WAL mode readers never wait for the writer's transaction, nor for each other."""

    def __init__(self, path: Path, files: FileLayer = OS_FILES, journals: int = 1) -> None:
        self.path = path
        self.files = files
        self.journals = journals  # the bookie's journal directories
        self.lookups = 0  # queries (a range query counts one)
        self._writer: sqlite3.Connection | None = None
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._open = False

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # a commit is durable when it returns
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def open(self) -> IndexState:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = self._connect()
        self._writer.executescript(sql.SCHEMA)
        for table, column, definition in sql.ADDED_COLUMNS:
            names = {row[1] for row in self._writer.execute(f"PRAGMA table_info({table})")}
            if column not in names:
                self._writer.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        more: dict[int, JournalPosition] = {}
        if self.journals > 1:
            self._writer.executescript(sql.JOURNAL_POSITIONS_SCHEMA)
            for journal, file_id, offset in self._writer.execute(sql.SELECT_JOURNAL_POSITIONS):
                more[journal] = JournalPosition(file_id, offset)
        self._open = True
        row = self._writer.execute(sql.SELECT_CHECKPOINT).fetchone()
        state = IndexState(None, {})
        if row is not None:
            # Every checkpoint writes every journal's position: none is missing after one.
            state.positions = (
                JournalPosition(row[0], row[1]),
                *(more.get(i, JOURNAL_START) for i in range(1, self.journals)),
            )
            state.log_ends = {0: (row[2], row[3])}
            for dir_index, log_id, size in self._writer.execute(sql.SELECT_LOG_ENDS):
                state.log_ends[dir_index] = (log_id, size)
        for ledger_id, last, lac, digest, first in self._writer.execute(sql.SELECT_LEDGERS):
            state.ledgers[sql.from_sql_id(ledger_id)] = LedgerInfo(last, lac, digest, first)
        state.facts = dict(self._writer.execute(sql.SELECT_FACTS))
        for dir_index, log_id, ledger_id, size in self._writer.execute(sql.SELECT_USAGE):
            state.usage.setdefault((dir_index, log_id), {})[sql.from_sql_id(ledger_id)] = size
        return state

    def _reader(self) -> sqlite3.Connection:
        """This thread's reader connection."""
        assert self._open, "index is not open"
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _count(self) -> None:
        with self._readers_lock:  # queries come from several threads
            self.lookups += 1

    def lookup(self, ledger_id: int, entry_id: int) -> EntryLocation | None:
        self._count()
        row = (
            self._reader()
            .execute(sql.SELECT_ENTRY, (sql.to_sql_id(ledger_id), entry_id))
            .fetchone()
        )
        return EntryLocation(*row) if row else None

    def lookup_range(
        self, ledger_id: int, first: int, last: int
    ) -> list[tuple[int, EntryLocation]]:
        """(entry id, location) of the ledger's stored entries in [first, last], in order."""
        self._count()
        rows = (
            self._reader()
            .execute(sql.SELECT_ENTRY_RANGE, (sql.to_sql_id(ledger_id), first, last))
            .fetchall()
        )
        return [(row[0], EntryLocation(*row[1:])) for row in rows]

    def ledger_entries(self, ledger_id: int) -> list[tuple[int, EntryLocation]]:
        """Every stored entry of a ledger (`quire shell ledger`)."""
        return self.lookup_range(ledger_id, 0, sql.MAX_ENTRY_ID)

    def commit(
        self,
        entries: Mapping[tuple[int, int], EntryLocation],
        ledgers: Mapping[int, LedgerInfo],
        positions: Sequence[JournalPosition],
        log_ends: LogEnds,
        facts: Mapping[str, str] | None = None,
        deleted: Iterable[int] = (),
    ) -> Usage:
        """One checkpoint: the deleted ledgers' rows go first, then the flush's entries,
        their entry log usage, the ledger facts and the position in each journal. Returns
        the usage the entries added."""
        assert len(positions) == self.journals, positions
        conn = self._writer
        assert conn is not None
        added: Usage = {}
        for (ledger, _), loc in entries.items():
            per_log = added.setdefault((loc.dir, loc.log_id), {})
            per_log[ledger] = per_log.get(ledger, 0) + ENTRY_HEAD_SIZE + loc.size
        # A crash here (before the commit is durable) leaves the previous checkpoint.
        self.files.point("index.commit")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for ledger in deleted:
                key = (sql.to_sql_id(ledger),)
                conn.execute(sql.DELETE_LEDGER_ENTRIES, key)
                conn.execute(sql.DELETE_LEDGER, key)
                conn.execute(sql.DELETE_LEDGER_USAGE, key)
            conn.executemany(
                sql.INSERT_ENTRY,
                (
                    (sql.to_sql_id(ledger), e, loc.log_id, loc.offset, loc.size, loc.dir)
                    for (ledger, e), loc in entries.items()
                ),
            )
            conn.executemany(
                sql.INSERT_LEDGER,
                (
                    (
                        sql.to_sql_id(ledger),
                        info.last_entry_id,
                        info.lac,
                        info.digest_code,
                        info.first_entry_id,
                    )
                    for ledger, info in ledgers.items()
                ),
            )
            first = log_ends.get(0, (0, 0))
            first_journal = positions[0]
            conn.execute(
                sql.INSERT_CHECKPOINT, (first_journal.file_id, first_journal.offset, *first)
            )
            if self.journals > 1:
                conn.executemany(
                    sql.INSERT_JOURNAL_POSITION,
                    ((i, p.file_id, p.offset) for i, p in enumerate(positions) if i >= 1),
                )
            conn.executemany(
                sql.INSERT_LOG_END,
                ((d, log_id, size) for d, (log_id, size) in log_ends.items()),
            )
            conn.executemany(
                sql.ADD_USAGE,
                (
                    (d, log_id, sql.to_sql_id(ledger), size)
                    for (d, log_id), ledgers_bytes in added.items()
                    for ledger, size in ledgers_bytes.items()
                ),
            )
            conn.executemany(sql.INSERT_FACT, (facts or {}).items())
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.files.point("index.committed")
        return added

    def rebuild_usage(self, usage: Usage) -> None:
        """Replace every usage row (rebuilt from the entry logs) and mark the table
        complete, in one transaction."""
        conn = self._writer
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM entry_log_usage")
            conn.executemany(
                sql.ADD_USAGE,
                (
                    (d, log_id, sql.to_sql_id(ledger), size)
                    for (d, log_id), ledgers_bytes in usage.items()
                    for ledger, size in ledgers_bytes.items()
                ),
            )
            conn.execute(sql.INSERT_FACT, (sql.USAGE_FACT, "1"))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def switch(
        self,
        dir_index: int,
        old_log: int,
        new_log: int,
        moves: Iterable[tuple[int, int, int, int, int]],
    ) -> dict[int, int]:
        """Compaction's one transaction: each (ledger, entry, old offset, new offset,
        frame length)
        moves to `new_log` only where its row still points at the old copy; the new log's
        usage rows count what moved; the old log's usage rows go. Returns the moved bytes
        per ledger (heads in)."""
        conn = self._writer
        assert conn is not None
        moved: dict[int, int] = {}
        conn.execute("BEGIN IMMEDIATE")
        try:
            for ledger, entry, old_offset, new_offset, size in moves:
                cursor = conn.execute(
                    sql.MOVE_ENTRY,
                    (
                        new_log,
                        new_offset,
                        dir_index,
                        sql.to_sql_id(ledger),
                        entry,
                        dir_index,
                        old_log,
                        old_offset,
                    ),
                )
                if cursor.rowcount:
                    moved[ledger] = moved.get(ledger, 0) + ENTRY_HEAD_SIZE + size
            conn.execute(sql.DELETE_LOG_USAGE, (dir_index, old_log))
            conn.executemany(
                sql.ADD_USAGE,
                ((dir_index, new_log, sql.to_sql_id(ledger), b) for ledger, b in moved.items()),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return moved

    def close(self) -> None:
        self._open = False
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in [*readers, self._writer]:
            if conn is not None:
                conn.close()
        self._writer = None
        self._local = threading.local()


# -- following the journal ----------------------------------------------------------------


class TailStatus(Enum):
    MORE = "more"  # records (or a move to the next file) were returned: read again
    CAUGHT_UP = "caught_up"  # at the end of the newest journal file
    STALLED = "stalled"  # a bad record in the newest file: wait for the journal
    DAMAGED = "damaged"  # records are missing or bad for good: never claim absence
    SKIPPED = "skipped"  # bad records skipped (operator's choice): read on, never claim absence


@dataclass
class TailRead:
    records: list[ScannedRecord]
    position: JournalPosition  # after these records
    status: TailStatus
    reason: str = ""


class JournalTailer:
    """Reads the journal's files from a position, as the journal writes them. A record
    still being written reads as incomplete: stop there and come back later."""

    def __init__(
        self,
        directory: Path,
        position: JournalPosition,
        chunk_bytes: int = 4 * 1024 * 1024,
        skip_invalid: bool = False,
    ) -> None:
        self.directory = directory
        self.position = position
        self.chunk_bytes = chunk_bytes
        # skipReplayJournalInvalidRecord: the journal started past damage; follow it.
        self.skip_invalid = skip_invalid
        # The highest durable position the journal announced (notifications are lossy, so
        # this may lag): a record that stops us below it is damage, not a write going on.
        self.durable_hint: JournalPosition | None = None
        self._fd = -1
        self._fd_file = 0

    def end_position(self) -> JournalPosition | None:
        """Where the journal's newest file ends right now (None if there is none)."""
        ids = journal_files(self.directory) if self.directory.exists() else []
        if not ids:
            return None
        try:
            size = (self.directory / journal_file_name(ids[-1])).stat().st_size
        except FileNotFoundError:
            return None
        return JournalPosition(ids[-1], size)

    def read(self) -> TailRead:
        """The next records after `position` (blocking). Does not move `position`: the
        caller does, once it has applied them (`advance`)."""
        # List first: if file n+1 exists now, file n was complete before we read it.
        ids = journal_files(self.directory) if self.directory.exists() else []
        pos = self.position
        action = locate(pos, ids)
        if action is CursorAction.WAIT:
            return TailRead([], pos, TailStatus.CAUGHT_UP)
        if action is CursorAction.GAP:
            return TailRead(
                [],
                pos,
                TailStatus.DAMAGED,
                f"journal file {pos.file_id} is gone but later files exist",
            )
        fd = self._open(pos.file_id)
        finished = next_file(pos, ids)
        offset = pos.offset
        if offset < FILE_HEADER_SIZE:
            try:
                complete = check_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), pos.file_id)
            except JournalFormatError as exc:
                return TailRead([], pos, TailStatus.DAMAGED, f"journal file {pos.file_id}: {exc}")
            if not complete:
                if finished is not None:
                    return TailRead(
                        [], pos, TailStatus.DAMAGED, f"journal file {pos.file_id} has no header"
                    )
                return TailRead([], pos, TailStatus.CAUGHT_UP)
            offset = FILE_HEADER_SIZE
        scan = scan_records(os.pread(fd, self.chunk_bytes, offset), offset)
        if (
            not scan.records
            and scan.stop is ScanStop.INCOMPLETE
            and self.chunk_bytes < scan.needed_bytes <= MAX_RECORD_SIZE + 8
        ):
            scan = scan_records(os.pread(fd, scan.needed_bytes, offset), offset)
        if scan.records:
            return TailRead(scan.records, JournalPosition(pos.file_id, scan.end), TailStatus.MORE)
        at = f"journal file {pos.file_id} offset {scan.end}: {scan.reason}"
        if finished is not None and scan.stop is not ScanStop.END and self.skip_invalid:
            return self._skip(fd, pos.file_id, scan.end, finished, at)
        if scan.stop is ScanStop.BAD:
            status = TailStatus.DAMAGED if finished is not None else TailStatus.STALLED
            return TailRead([], JournalPosition(pos.file_id, offset), status, at)
        if finished is None:
            here = JournalPosition(pos.file_id, offset)
            if self.durable_hint is not None and self.durable_hint > here:
                # "Cut short" below what the journal says is durable: a damaged size
                # field, not a write in progress.
                return TailRead([], here, TailStatus.STALLED, at)
            return TailRead([], here, TailStatus.CAUGHT_UP)
        if scan.stop is ScanStop.INCOMPLETE:
            return TailRead([], pos, TailStatus.DAMAGED, f"complete {at}")
        # At (or, after a crash that lost unsynced bytes, past) the end of a complete
        # file: the journal never appends to it again.
        return TailRead([], finished, TailStatus.MORE)

    def _skip(
        self, fd: int, file_id: int, offset: int, finished: JournalPosition, at: str
    ) -> TailRead:
        """Past damage in a complete file, to the next valid group commit (as the journal's
        replay did when the operator allowed it)."""
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0)
        batched = file_format_version(data) >= 2
        resume = next_valid_record(data, offset + 1, batch_only=batched)
        target = finished if resume is None else JournalPosition(file_id, resume)
        return TailRead([], target, TailStatus.SKIPPED, at)

    def advance(self, position: JournalPosition) -> None:
        self.position = position

    def _open(self, file_id: int) -> int:
        if self._fd_file != file_id:
            self.close()
            self._fd = os.open(self.directory / journal_file_name(file_id), os.O_RDONLY)
            self._fd_file = file_id
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._fd_file = -1, 0
