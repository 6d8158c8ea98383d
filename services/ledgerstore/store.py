"""The ledgerstore: a projection of the bookie's journal into entry logs and an index.

It applies journal records in order from its own position (`apply`/`catch_up`), keeps
new index entries in a memtable until a checkpoint (BookKeeper's SortedLedgerStorage),
and checkpoints: fsync the entry logs, then commit the index, the ledger facts and the
applied journal position in one SQLite transaction. After a restart it resumes from that
position; re-applying records after it is idempotent (the entry logs are truncated back
to the checkpoint and the same entries are written again).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from services.journal.core import JOURNAL_START, EntryRecord, JournalPosition, ScannedRecord
from services.ledgerstore.core import (
    EntryLocation,
    LedgerInfo,
    absent_status,
    apply_to_ledgers,
    frame_matches,
)
from services.ledgerstore.storage import (
    EntryIndex,
    EntryLogger,
    JournalTailer,
    TailStatus,
)
from shared import wire
from shared.config import LedgerstoreSettings
from shared.disk import fail_stop
from shared.status import BookieStatus

log = logging.getLogger(__name__)

# Bound on one catch-up: reads of the journal before giving the event loop back.
CATCH_UP_MAX_READS = 10_000


def die(reason: str) -> None:
    fail_stop("ledgerstore", reason)


@dataclass
class LedgerstoreStats:
    ledgerstore_add_entry: int = 0
    ledgerstore_read_entry: int = 0
    ledgerstore_read_entry_absent: int = 0
    ledgerstore_read_entry_corrupt: int = 0
    ledgerstore_read_lac: int = 0
    ledgerstore_catch_up: int = 0
    ledgerstore_checkpoints: int = 0
    ledgerstore_memtable_entries: int = 0


class LedgerStore:
    def __init__(self, bookie_dir: Path, settings: LedgerstoreSettings, fatal=die) -> None:
        self.settings = settings
        self.logger = EntryLogger(bookie_dir / "ledgers", settings.log_size_limit_bytes)
        self.index = EntryIndex(bookie_dir / "ledgers" / "index.sqlite")
        self.tailer = JournalTailer(bookie_dir / "journal", JOURNAL_START)
        self.stats = LedgerstoreStats()
        self.ledgers: dict[int, LedgerInfo] = {}
        self.applied = JOURNAL_START
        self.checkpointed: JournalPosition | None = None
        # Set for good when journal records we need are gone or bad: from then on an
        # absent entry is UNKNOWN_LEDGER_STATE, never NO_ENTRY.
        self.damaged: str | None = None
        self._fatal = fatal
        self._memtable: dict[tuple[int, int], EntryLocation] = {}
        self._flushing: dict[tuple[int, int], EntryLocation] = {}
        self._dirty_ledgers: set[int] = set()
        self._apply_lock = asyncio.Lock()
        self._checkpoint_lock = asyncio.Lock()
        self._stalled_reason = ""

    async def open(self) -> None:
        state = await asyncio.to_thread(self.index.open)
        await asyncio.to_thread(self.logger.open, state.log_end)
        self.ledgers = state.ledgers
        self.applied = self.checkpointed = state.position or JOURNAL_START
        self.tailer.advance(self.applied)
        log.info(
            "ledgerstore opened",
            extra={
                "applied": self.applied.to_json(),
                "ledgers": len(self.ledgers),
                "entry_log": self.logger.log_id,
            },
        )

    async def close(self) -> None:
        await self.checkpoint()
        async with self._apply_lock:
            await asyncio.to_thread(self.logger.close)
            self.index.close()
            self.tailer.close()

    # -- applying the journal -------------------------------------------------------------

    def journal_durable(self, position: JournalPosition) -> None:
        """The journal says everything before `position` is fsynced."""
        hint = self.tailer.durable_hint
        if hint is None or position > hint:
            self.tailer.durable_hint = position

    async def catch_up(self) -> bool:
        """Apply the journal up to where its newest file ends now. True if everything
        there was applied; False if damaged or stalled on a bad record (then an absent
        entry must not be reported as absent)."""
        # Shielded: a cancelled caller must not leave an append half-recorded.
        return await asyncio.shield(self._catch_up())

    async def _catch_up(self) -> bool:
        async with self._apply_lock:
            if self.damaged:
                return False
            target = await asyncio.to_thread(self.tailer.end_position)
            self.stats.ledgerstore_catch_up += 1
            for _ in range(CATCH_UP_MAX_READS):
                try:
                    tail = await asyncio.to_thread(self.tailer.read)
                except OSError as exc:
                    self._note_stall(f"reading the journal: {exc!r}")
                    return False
                if tail.records:
                    await self._apply(tail.records)
                self.applied = tail.position
                self.tailer.advance(tail.position)
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
                if target is not None and self.applied >= target:
                    return True
            return False

    def _note_stall(self, reason: str) -> None:
        if reason != self._stalled_reason:
            log.error("ledgerstore cannot read past a journal record", extra={"reason": reason})
        self._stalled_reason = reason

    async def _apply(self, records: list[ScannedRecord]) -> None:
        entries = [
            (s.record.ledger_id, s.record.entry_id, s.record.frame)
            for s in records
            if isinstance(s.record, EntryRecord)
        ]
        if entries:
            try:
                locations = await asyncio.to_thread(self.logger.append, entries)
            except OSError as exc:
                self._fatal(f"entry log write: {exc!r}")
                raise
            for (ledger_id, entry_id, _), location in zip(entries, locations, strict=True):
                self._memtable[(ledger_id, entry_id)] = location
            self.stats.ledgerstore_add_entry += len(entries)
            self.stats.ledgerstore_memtable_entries = len(self._memtable)
        for scanned in records:
            touched = apply_to_ledgers(self.ledgers, scanned.record)
            if touched is not None:
                self._dirty_ledgers.add(touched)

    # -- checkpoint -----------------------------------------------------------------------

    async def checkpoint(self) -> JournalPosition | None:
        """Make everything applied durable; the position to hand to the journal as its
        LastLogMark, or None if nothing changed since the last checkpoint."""
        # Shielded: a cancelled caller must not leave the memtables half-swapped.
        return await asyncio.shield(self._checkpoint())

    async def _checkpoint(self) -> JournalPosition | None:
        async with self._checkpoint_lock:
            async with self._apply_lock:
                if (
                    self.applied == self.checkpointed
                    and not self._memtable
                    and not self._dirty_ledgers
                ):
                    return None
                self._flushing, self._memtable = self._memtable, {}
                ledgers = {i: replace(self.ledgers[i]) for i in self._dirty_ledgers}
                self._dirty_ledgers = set()
                position = self.applied
                try:
                    log_end = await asyncio.to_thread(self.logger.sync)
                except OSError as exc:
                    self._fatal(f"entry log fsync: {exc!r}")
                    raise
            try:
                await asyncio.to_thread(
                    self.index.commit, self._flushing, ledgers, position, log_end
                )
            except Exception as exc:
                self._fatal(f"index commit: {exc!r}")
                raise
            self._flushing = {}
            self.checkpointed = position
            self.stats.ledgerstore_checkpoints += 1
            self.stats.ledgerstore_memtable_entries = len(self._memtable)
            return position

    # -- reads ----------------------------------------------------------------------------

    def _lookup(self, ledger_id: int, entry_id: int) -> EntryLocation | None:
        key = (ledger_id, entry_id)
        location = self._memtable.get(key) or self._flushing.get(key)
        return location or self.index.lookup(ledger_id, entry_id)

    async def read(self, items: list[wire.ReadItem]) -> list[wire.ReadResult]:
        locations = [self._lookup(i.ledger_id, i.entry_id) for i in items]
        caught_up = True
        if any(loc is None for loc in locations):
            # The authority rule: look at everything the journal has before saying "no".
            caught_up = await self.catch_up()
            locations = [
                loc or self._lookup(i.ledger_id, i.entry_id)
                for i, loc in zip(items, locations, strict=True)
            ]
        frames = await asyncio.to_thread(self._read_frames, locations)
        results = []
        for item, location, frame in zip(items, locations, frames, strict=True):
            results.append(self._result(item, location, frame, caught_up))
        return results

    def _read_frames(self, locations: list[EntryLocation | None]) -> list[bytes | OSError | None]:
        frames: list[bytes | OSError | None] = []
        for location in locations:
            if location is None:
                frames.append(None)
                continue
            try:
                frames.append(self.logger.read(location))
            except OSError as exc:
                frames.append(exc)
        return frames

    def _result(
        self,
        item: wire.ReadItem,
        location: EntryLocation | None,
        frame: bytes | OSError | None,
        caught_up: bool,
    ) -> wire.ReadResult:
        ledger_id, entry_id = item.ledger_id, item.entry_id
        self.stats.ledgerstore_read_entry += 1
        if location is None:
            self.stats.ledgerstore_read_entry_absent += 1
            status = absent_status(ledger_id in self.ledgers, caught_up)
            return wire.ReadResult(ledger_id, entry_id, status)
        if isinstance(frame, OSError):
            log.error(
                "entry read failed",
                extra={"ledger_id": ledger_id, "entry_id": entry_id, "err": repr(frame)},
            )
            return wire.ReadResult(ledger_id, entry_id, BookieStatus.IO_ERROR)
        assert frame is not None
        if not frame_matches(frame, ledger_id, entry_id):
            self.stats.ledgerstore_read_entry_corrupt += 1
            log.error(
                "stored frame is not the entry asked for",
                extra={"ledger_id": ledger_id, "entry_id": entry_id, "location": str(location)},
            )
            return wire.ReadResult(ledger_id, entry_id, BookieStatus.CORRUPT)
        return wire.ReadResult(ledger_id, entry_id, BookieStatus.OK, frame)

    async def read_lac(self, ledger_id: int) -> wire.LacReply:
        self.stats.ledgerstore_read_lac += 1
        caught_up = await self.catch_up()
        info = self.ledgers.get(ledger_id)
        if info is None:
            return wire.LacReply(absent_status(False, caught_up))
        return wire.LacReply(BookieStatus.OK, info.lac, info.last_entry_id)
