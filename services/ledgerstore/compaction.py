"""Compacting one sealed entry log (BookKeeper's TransactionalEntryLogCompactor): its live
entries are copied to a new log, their index rows switched to it in one transaction, then
the old log is deleted. `LedgerStore.compact_entry_log` runs the steps; the blocking ones
here run on the store's compaction thread (copy) and write thread (switch, delete).

The steps, and what a crash at each leaves (every crash loses nothing: until the switch
commits the index points at the old log, which is deleted only after it):

1. scan the old log's entry heads; keep the entries whose index row still points at
   them (one range query per ledger of the log);
2. write them, sorted by ledger and entry, to `entrylog-NNNNNN.log.compacting` (a fresh
   id from the directory's logger), throttled by `compaction_rate_by_entries` (or
   `compaction_rate_by_bytes` with `is_throttle_by_bytes`), polling `should_stop`
   between batches (stopped: the file is removed, nothing changed). A crash leaves the
   `.compacting` file: removed when the store next opens;
3. fsync it, rename it to `entrylog-NNNNNN.log`, fsync the directory. A crash leaves a
   log with no usage row: removed at open if its id is past the checkpoint's log end,
   else by the next `delete_dead_entry_logs` (it holds nothing live);
4. one index transaction: each entry's row moves to the new log only where it still
   points at the old copy (a newer copy or a deletion meanwhile wins), the new log gets
   usage rows for what moved, the old log's usage rows go. A crash after it leaves the
   old log with no usage row: deleted as dead by the next run;
5. unlink the old log, fsync the directory (a read that looked the old location up
   looks again, `DiskReader`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from services.ledgerstore.core import EntryLocation
from services.ledgerstore.storage import EntryIndex, EntryLogger
from shared.bookie.entrylog_format import (
    COMPACTING_SUFFIX,
    ENTRY_HEAD_SIZE,
    encode_entry_log_header,
)
from shared.bookie.files import FileLayer
from shared.bookie.gc import CompactionResult, EntryLogMetadata
from shared.config import LedgerstoreSettings
from shared.rate_limit import ByteRateLimiter

log = logging.getLogger(__name__)

BATCH_ENTRIES = 256  # entries copied between two polls of should_stop (one write each)
BATCH_BYTES = 4 * 1024 * 1024


class Compaction:
    """One compaction of one sealed log. `copy` (compaction thread), then `switch` and
    `delete_old` (write thread, under the store's checkpoint lock), or `abandon`."""

    def __init__(
        self,
        logger: EntryLogger,
        index: EntryIndex,
        settings: LedgerstoreSettings,
        files: FileLayer,
        meta: EntryLogMetadata,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.logger = logger
        self.index = index
        self.files = files
        self.meta = meta
        self.new_log_id: int | None = None
        self.entries = 0
        self.bytes_copied = 0
        # (ledger, entry, old offset, new offset, frame length) of each entry copied
        self.moves: list[tuple[int, int, int, int, int]] = []
        by_bytes = settings.is_throttle_by_bytes
        rate = (
            settings.compaction_rate_by_bytes if by_bytes else settings.compaction_rate_by_entries
        )
        self._by_bytes = by_bytes
        self._clock, self._sleep = clock, sleep
        self._limiter = ByteRateLimiter(rate, self._now_ms())
        self._tmp_fd = -1

    def live_entries(self) -> list[tuple[int, int, int, int]]:
        """(ledger, entry, offset, frame length) of the old log's entries that the index
        still locates there, sorted by ledger and entry."""
        log_id, dir_index = self.meta.log_id, self.meta.dir
        by_ledger: dict[int, list[tuple[int, int, int]]] = {}
        # Strict: the old log is deleted after, so an entry its scan cannot see would be lost.
        for ledger_id, entry_id, offset, length in self.logger.scan(log_id, strict=True):
            if ledger_id in self.meta.ledgers:
                by_ledger.setdefault(ledger_id, []).append((entry_id, offset, length))
        live: list[tuple[int, int, int, int]] = []
        for ledger_id in sorted(by_ledger):
            found = by_ledger[ledger_id]
            first = min(e for e, _, _ in found)
            last = max(e for e, _, _ in found)
            rows = dict(self.index.lookup_range(ledger_id, first, last))
            for entry_id, offset, length in found:
                row = rows.get(entry_id)
                if row == EntryLocation(log_id, offset, length, dir_index):
                    live.append((ledger_id, entry_id, offset, length))
        live.sort()
        return live

    def copy(self, should_stop: Callable[[], bool]) -> bool:
        """Steps 1-3 (blocking). False: stopped (`abandon` then)."""
        self.files.point("compaction.scan")
        live = self.live_entries()
        if not live:
            return True
        new_log = self.new_log_id = self.logger.allocate_log_id()
        path = self.logger.path(new_log)
        tmp = path.with_name(path.name + COMPACTING_SUFFIX)
        self._tmp_fd = self.files.create(tmp, encode_entry_log_header(new_log))
        offset = len(encode_entry_log_header(new_log))
        at = 0
        while at < len(live):
            if should_stop():
                return False
            runs: list[tuple[int, int]] = []  # (old offset, bytes): one pread each
            count = size = 0
            while at < len(live) and count < BATCH_ENTRIES and size < BATCH_BYTES:
                ledger_id, entry_id, old_offset, length = live[at]
                self._throttle(ENTRY_HEAD_SIZE + length)
                self.moves.append((ledger_id, entry_id, old_offset, offset + size, length))
                if runs and sum(runs[-1]) == old_offset:
                    runs[-1] = (runs[-1][0], runs[-1][1] + ENTRY_HEAD_SIZE + length)
                else:
                    runs.append((old_offset, ENTRY_HEAD_SIZE + length))
                size += ENTRY_HEAD_SIZE + length
                count += 1
                at += 1
            data = b"".join(self.logger.read_span(self.meta.log_id, o, n) for o, n in runs)
            self.files.write(self._tmp_fd, data)
            offset += size
            self.entries += count
            self.bytes_copied += size
        self.files.fsync(self._tmp_fd)
        self.files.close(self._tmp_fd)
        self._tmp_fd = -1
        self.files.rename(tmp, path)
        self.files.fsync_dir(path.parent)
        return True

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _throttle(self, size: int) -> None:
        """On the compaction thread: wait for the token bucket, then spend one entry (or
        its bytes)."""
        wait_ms = self._limiter.wait_ms(self._now_ms())
        if wait_ms > 0:
            self._sleep(wait_ms / 1000)
        self._limiter.spend(size if self._by_bytes else 1, self._now_ms())

    def abandon(self) -> None:
        """Stopped (or failed) before the switch: remove the new log, under whichever
        name it has (nothing else changed)."""
        if self._tmp_fd >= 0:
            self.files.close(self._tmp_fd)
            self._tmp_fd = -1
        if self.new_log_id is not None:
            path = self.logger.path(self.new_log_id)
            self.files.unlink(path.with_name(path.name + COMPACTING_SUFFIX))
            self.files.unlink(path)
            self.new_log_id = None

    def switch(self) -> dict[int, int]:
        """Step 4 (blocking): the index transaction. The moved bytes per ledger."""
        self.files.point("compaction.switch")
        # With nothing copied (no new log) this only drops the old log's usage rows.
        moved = self.index.switch(self.meta.dir, self.meta.log_id, self.new_log_id or 0, self.moves)
        self.files.point("compaction.switched")
        return moved

    def delete_old(self) -> None:
        """Step 5 (blocking)."""
        self.logger.delete([self.meta.log_id])

    def result(self, aborted: bool) -> CompactionResult:
        if aborted:
            return CompactionResult(self.meta.dir, self.meta.log_id, None, 0, 0, 0, aborted=True)
        return CompactionResult(
            self.meta.dir,
            self.meta.log_id,
            self.new_log_id,
            self.entries,
            self.bytes_copied,
            max(0, self.meta.size_bytes - self.bytes_copied),
        )
