"""The bookie's garbage collector and compactor, pure: which ledgers to delete, which entry
logs to delete or compact, and when (BookKeeper's GarbageCollectorThread,
ScanAndCompareGarbageCollector, EntryLogMetadata). No IO, no clock.

The ledgerstore keeps an `EntryLogMetadata` for every sealed entry log (persisted in its
index, see `shared.bookie.index_schema`) and runs the decisions made here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class EntryLogMetadata:
    """One sealed entry log: its size and the live ledgers it holds with their bytes
    (each entry counted with its 20-byte head, as it lies in the file)."""

    dir: int  # index of the ledger directory holding the log
    log_id: int
    size_bytes: int  # the file's bytes after its header
    ledgers: dict[int, int] = field(default_factory=dict)  # live ledger id -> bytes

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
        return EntryLogMetadata(self.dir, self.log_id, self.size_bytes, dict(self.ledgers))


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
