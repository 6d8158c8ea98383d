"""DbLedgerStorage's two caches: the write cache (entries applied from the journal, not
yet in an entry log) and the read cache (entries read from entry logs, with read-ahead).
Both are bounded in bytes; neither does IO."""

from __future__ import annotations

from collections import OrderedDict

Key = tuple[int, int]  # (ledger id, entry id)


class WriteCache:
    """Entries waiting for the next flush. The store keeps two (BookKeeper's double
    buffer): applies go into the active one while the other is being flushed.

    Kept per ledger, in arrival order: a ledger's entries come from the journal nearly
    always in ascending order, so a flush sorts the ledgers and only the rare ledger whose
    entries came out of order (a recovery re-write, say), instead of every entry."""

    def __init__(self) -> None:
        self._ledgers: dict[int, dict[int, bytes]] = {}
        self._out_of_order: set[int] = set()
        self._count = 0
        self.size_bytes = 0

    def __len__(self) -> int:
        return self._count

    def put(self, ledger_id: int, entry_id: int, frame: bytes) -> None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = {}
        old = entries.get(entry_id)
        if old is not None:
            self.size_bytes -= len(old)
            self._count -= 1
        elif entries and entry_id < next(reversed(entries)):
            self._out_of_order.add(ledger_id)
        entries[entry_id] = frame
        self._count += 1
        self.size_bytes += len(frame)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self._ledgers.get(ledger_id)
        return entries.get(entry_id) if entries is not None else None

    def forget(self, ledger_id: int) -> None:
        """Drop a deleted ledger's entries."""
        entries = self._ledgers.pop(ledger_id, None)
        if entries is not None:
            self._count -= len(entries)
            self.size_bytes -= sum(len(frame) for frame in entries.values())
            self._out_of_order.discard(ledger_id)

    def sorted_entries(self) -> list[tuple[int, int, bytes]]:
        """Sorted by ledger, then entry: a ledger's entries land next to each other in the
        entry log, so a read-ahead reads them with one IO."""
        out: list[tuple[int, int, bytes]] = []
        for ledger_id in sorted(self._ledgers):
            entries = self._ledgers[ledger_id]
            ids = sorted(entries) if ledger_id in self._out_of_order else entries
            out.extend((ledger_id, entry_id, entries[entry_id]) for entry_id in ids)
        return out


class ReadCache:
    """Least recently used entries read from the entry logs, at most `max_size_bytes`.

    Read-ahead frames come in unverified: their checks cost the reader nothing unless it
    asks for them (the store verifies a frame when it first serves it, `verified`)."""

    def __init__(self, max_size_bytes: int) -> None:
        self.max_size_bytes = max_size_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[Key, bytes] = OrderedDict()
        self._unverified: set[Key] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        frame = self._entries.get((ledger_id, entry_id))
        if frame is not None:
            self._entries.move_to_end((ledger_id, entry_id))
        return frame

    def is_verified(self, ledger_id: int, entry_id: int) -> bool:
        return (ledger_id, entry_id) not in self._unverified

    def mark_verified(self, ledger_id: int, entry_id: int) -> None:
        self._unverified.discard((ledger_id, entry_id))

    def put(self, ledger_id: int, entry_id: int, frame: bytes, *, verified: bool = True) -> None:
        if len(frame) > self.max_size_bytes:
            return
        key = (ledger_id, entry_id)
        old = self._entries.pop(key, None)
        if old is not None:
            self.size_bytes -= len(old)
        self._entries[key] = frame
        self.size_bytes += len(frame)
        if verified:
            self._unverified.discard(key)
        else:
            self._unverified.add(key)
        while self.size_bytes > self.max_size_bytes:
            evicted_key, evicted = self._entries.popitem(last=False)
            self._unverified.discard(evicted_key)
            self.size_bytes -= len(evicted)

    def remove_ledgers(self, ledger_ids: set[int]) -> None:
        """Forget every entry of these (deleted) ledgers: one pass over the cache."""
        for key in [key for key in self._entries if key[0] in ledger_ids]:
            self.remove(*key)

    def remove(self, ledger_id: int, entry_id: int) -> None:
        """Forget an entry (its frame failed its check when served)."""
        key = (ledger_id, entry_id)
        old = self._entries.pop(key, None)
        if old is not None:
            self.size_bytes -= len(old)
        self._unverified.discard(key)
