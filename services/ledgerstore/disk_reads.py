"""The blocking half of a ledgerstore read: what a request needs from the index and the
entry logs, run on one of the store's read threads (`LedgerStore._read_disk_now` plans it
on the event loop and puts what it brings into the read cache)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from services.ledgerstore.cache import Key
from services.ledgerstore.core import EntryLocation, id_ranges, plan_spans, verify_stored
from services.ledgerstore.storage import EntryIndex, EntryLogger
from shared import wire
from shared.status import BookieStatus

log = logging.getLogger(__name__)

# Lookups of an entry whose entry log keeps vanishing under the read (each compaction or
# deletion moves it once): past this, IO_ERROR.
RELOOKUPS_MAX = 4


@dataclass
class DiskRead:
    """What one request needs from disk, per ledger (planned on the event loop)."""

    asked: dict[int, list[int]]  # ledger -> entry ids asked, ascending
    ahead: dict[int, list[int]]  # ledger -> entry ids to read ahead (not cached yet)
    digest_codes: dict[int, int]  # ledger -> digest code, to check the frames asked


@dataclass
class DiskBatch:
    """What a read thread found for a `DiskRead`."""

    found: dict[Key, wire.ReadResult] = field(default_factory=dict)  # asked and in the index
    ahead: list[tuple[Key, bytes]] = field(default_factory=list)  # read ahead, unchecked
    corrupt: list[tuple[Key, str, str]] = field(default_factory=list)  # key, where, why
    entry_log_reads: int = 0
    entry_log_read_bytes: int = 0


class DiskReader:
    """Reads for requests from the index and entry logs (blocking; one per store, called
    from several read threads: it keeps no state of its own)."""

    def __init__(self, index: EntryIndex, loggers: list[EntryLogger]) -> None:
        self.index = index
        self.loggers = loggers

    def read(self, plan: DiskRead) -> DiskBatch:
        """On a read thread: one index range query per run of the ledger's entry ids, one
        pread per run of frames near each other in an entry log, the frames asked checked
        (read-ahead frames are checked when served). An entry log deleted between the
        lookup and the read (compacted, or dead) means its entries moved: looked up again."""
        batch = DiskBatch()
        asked_keys = {(ledger_id, e) for ledger_id, asked in plan.asked.items() for e in asked}
        wanted = {
            ledger_id: sorted({*asked, *plan.ahead[ledger_id]})
            for ledger_id, asked in plan.asked.items()
        }
        for _ in range(RELOOKUPS_MAX):
            moved: dict[int, list[int]] = {}
            for span in plan_spans(self._locate(wanted)):
                if not self._read_span(span, asked_keys, plan.digest_codes, batch):
                    for (ledger_id, entry_id), _ in span:
                        moved.setdefault(ledger_id, []).append(entry_id)
            if not moved:
                return batch
            wanted = {ledger_id: sorted(ids) for ledger_id, ids in moved.items()}
        for ledger_id, ids in wanted.items():
            for entry_id in ids:
                if (ledger_id, entry_id) in asked_keys:
                    batch.found[(ledger_id, entry_id)] = wire.ReadResult(
                        ledger_id, entry_id, BookieStatus.IO_ERROR
                    )
        return batch

    def _locate(self, wanted: dict[int, list[int]]) -> list[tuple[Key, EntryLocation]]:
        located: list[tuple[Key, EntryLocation]] = []
        for ledger_id, ids in wanted.items():
            keep = set(ids)
            for first, last in id_ranges(ids):
                for entry_id, location in self.index.lookup_range(ledger_id, first, last):
                    if entry_id in keep:
                        located.append(((ledger_id, entry_id), location))
        return located

    def _read_span(
        self,
        span: list[tuple[Key, EntryLocation]],
        asked_keys: set[Key],
        digest_codes: dict[int, int],
        batch: DiskBatch,
    ) -> bool:
        """False: the entry log is gone (deleted after the lookup): look the span up again."""
        first, last = span[0][1], span[-1][1]
        size = last.frame_offset + last.size - first.offset
        logger = self.loggers[first.dir]
        try:
            data = logger.read_span(first.log_id, first.offset, size)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.error("entry log read failed", extra={"location": str(first), "err": repr(exc)})
            for key, _ in span:
                if key in asked_keys:
                    batch.found[key] = wire.ReadResult(*key, BookieStatus.IO_ERROR)
            return True
        batch.entry_log_reads += 1
        batch.entry_log_read_bytes += size
        read_ahead = False
        for key, location in span:
            start = location.frame_offset - first.offset
            frame = data[start : start + location.size]
            if key not in asked_keys:
                batch.ahead.append((key, frame))
                read_ahead = True
                continue
            problem = verify_stored(frame, key[0], key[1], digest_codes[key[0]])
            if problem is None:
                batch.found[key] = wire.ReadResult(*key, BookieStatus.OK, frame)
            else:
                batch.corrupt.append((key, str(location), problem))
                batch.found[key] = wire.ReadResult(*key, BookieStatus.CORRUPT)
        if read_ahead:
            # The reader's next block likely follows (a flush writes a ledger's entries
            # in order): the kernel starts reading it while this answer goes out.
            try:
                logger.will_need(first.log_id, first.offset + size, size)
            except FileNotFoundError:
                pass  # compacted or deleted since the read: a hint for nothing
        return True
