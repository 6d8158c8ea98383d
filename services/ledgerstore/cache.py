"""DbLedgerStorage's two caches: the write cache (entries applied from the journal, not
yet in an entry log) and the read cache (entries read from entry logs, with read-ahead).
Both are bounded in bytes; neither does IO."""

from __future__ import annotations

from collections import OrderedDict

Key = tuple[int, int]  # (ledger id, entry id)


class WriteCache:
    """Entries waiting for the next flush. The store keeps two (BookKeeper's double
    buffer): applies go into the active one while the other is being flushed."""

    def __init__(self) -> None:
        self._entries: dict[Key, bytes] = {}
        self.size_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ledger_id: int, entry_id: int, frame: bytes) -> None:
        old = self._entries.get((ledger_id, entry_id))
        if old is not None:
            self.size_bytes -= len(old)
        self._entries[(ledger_id, entry_id)] = frame
        self.size_bytes += len(frame)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._entries.get((ledger_id, entry_id))

    def sorted_entries(self) -> list[tuple[int, int, bytes]]:
        """Sorted by ledger, then entry: a ledger's entries land next to each other in the
        entry log, so a read-ahead reads them with one IO."""
        return [(ledger, entry, frame) for (ledger, entry), frame in sorted(self._entries.items())]


class ReadCache:
    """Least recently used entries read from the entry logs, at most `max_size_bytes`."""

    def __init__(self, max_size_bytes: int) -> None:
        self.max_size_bytes = max_size_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[Key, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        frame = self._entries.get((ledger_id, entry_id))
        if frame is not None:
            self._entries.move_to_end((ledger_id, entry_id))
        return frame

    def put(self, ledger_id: int, entry_id: int, frame: bytes) -> None:
        if len(frame) > self.max_size_bytes:
            return
        key = (ledger_id, entry_id)
        old = self._entries.pop(key, None)
        if old is not None:
            self.size_bytes -= len(old)
        self._entries[key] = frame
        self.size_bytes += len(frame)
        while self.size_bytes > self.max_size_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.size_bytes -= len(evicted)
