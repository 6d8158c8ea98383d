"""The simulated bookie: the journal's and the ledgerstore's behaviour over a simulated disk,
running the real bookie rules (`shared.bookie.rules`) over BookieLedgerState for every
ledger the world's clients write, fence and read at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.bookie.journal_format import (
    JOURNAL_START,
    EntryRecord,
    FenceRecord,
    JournalPosition,
    LacRecord,
    Record,
)
from shared.bookie.rules import absent_status, admit_adds, has_authority, meta_records
from shared.protocol.messages import (
    BookieAddReply,
    BookieReadReply,
    FenceReply,
    SendAdds,
    SendFence,
    SendReads,
    SendWriteLac,
)
from shared.status import BookieStatus
from shared.wire import ReadResult

if TYPE_CHECKING:
    from quire.sim.model import World

# A bookie's ledgerstore has checkpointed the journal up to this long before a crash: the
# entries synced after that are not applied again until it has caught up.
CHECKPOINT_LAG_MS = 200


@dataclass
class _Waiting:
    """A request whose answer waits for the group commit of its records."""

    client: str
    rid: int
    reply: Callable[[], Any]
    records: int


class SimBookie:
    """A bookie as the journal and ledgerstore services behave, over a simulated disk.

    `live` is the journal's in-memory BookieLedgerState (checked before an add is queued);
    `durable` is what the synced journal holds (the fence answer's LAC comes from it). The
    synced records are numbered as journal positions (one offset per record): reads come
    from the entries the ledgerstore has applied, which is everything synced, except after
    a restart: then, until `unsure_until_ms`, it has applied only up to its last checkpoint
    (`restart_position`), and the real authority rule compares that with the journal's
    durable end.

    Every request names its ledger and carries that ledger's master key, as the gateway's
    requests do; the per-ledger state (admission, fence, LAC, master key) is the real
    BookieLedgerState's, keyed by ledger id."""

    def __init__(self, world: World, bookie_id: str) -> None:
        self.world = world
        self.bookie_id = bookie_id
        self.up = True
        state_class = world.config.bookie_state_class
        self.live = state_class()
        self.durable = state_class()
        self.entries: dict[tuple[int, int], bytes] = {}
        self.synced_end = JOURNAL_START  # the journal's durable end
        self.positions: dict[tuple[int, int], JournalPosition] = {}  # after each entry
        # (time, durable end) of the recent syncs: where a crash leaves the ledgerstore.
        self.sync_ends: list[tuple[int, JournalPosition]] = []
        self.restart_position = JOURNAL_START
        self.unsynced: list[Record] = []
        self.waiting: list[_Waiting] = []
        self.sync_scheduled = False
        self.unsure_until_ms = -1  # after a restart: the ledgerstore has not caught up
        self.epoch = 0  # bumps on a crash: requests of an older life get no answer

    # -- requests

    def handle(
        self, client: str, rid: int, ledger_id: int, master_key: bytes, command: Any
    ) -> None:
        match command:
            case SendAdds():
                self._add(client, rid, command)
            case SendFence():
                record: FenceRecord | LacRecord = FenceRecord(ledger_id)
                self._meta_record(client, rid, master_key, record, fence=True)
            case SendWriteLac():
                record = LacRecord(ledger_id, command.lac)
                self._meta_record(client, rid, master_key, record, fence=False)
            case SendReads():
                self.world.reply(client, rid, self.bookie_id, self.read(command))
            case ReadLac():
                self.world.reply(client, rid, self.bookie_id, self._read_lac(ledger_id))
            case _:
                raise AssertionError(f"unknown bookie request {command!r}")

    def _add(self, client: str, rid: int, command: SendAdds) -> None:
        admission = admit_adds(self.live, command.items)
        self.unsynced.extend(admission.records)
        results = tuple(admission.results)
        reply = BookieAddReply(self.bookie_id, command.entry_ids, BookieStatus.OK, results)
        self._after_sync(client, rid, lambda: reply, len(admission.records))

    def _meta_record(
        self,
        client: str,
        rid: int,
        master_key: bytes,
        record: FenceRecord | LacRecord,
        fence: bool,
    ) -> None:
        status, records = meta_records(self.live, record.ledger_id, master_key, record)
        if status is not BookieStatus.OK:
            refused = FenceReply(self.bookie_id, status) if fence else None
            self.world.reply(client, rid, self.bookie_id, refused)
            return
        for r in records:
            self.live.apply(r)
            self.unsynced.append(r)

        def answer() -> Any:
            facts = self.durable.get(record.ledger_id)
            assert facts is not None
            if fence:
                assert facts.fenced, "a fence is durable before it is answered"
                return FenceReply(self.bookie_id, BookieStatus.OK, facts.lac)
            return None  # write_lac: the writer does not wait for it

        self._after_sync(client, rid, answer, len(records))

    def _after_sync(self, client: str, rid: int, reply: Callable[[], Any], records: int) -> None:
        if records == 0:
            self.world.reply(client, rid, self.bookie_id, reply())
            return
        self.waiting.append(_Waiting(client, rid, reply, len(self.unsynced)))
        if not self.sync_scheduled:
            self.sync_scheduled = True
            self.world.at(
                self.world.rng.randint(*self.world.faults.sync_ms), self._sync, self.epoch
            )

    def _sync(self, epoch: int) -> None:
        """The group commit: everything queued is durable, then its adds are answered."""
        if epoch != self.epoch or not self.up:
            return
        self.sync_scheduled = False
        end = self.synced_end
        for record in self.unsynced:
            self.durable.apply(record)
            end = JournalPosition(end.file_id, end.offset + 1)
            if isinstance(record, EntryRecord):
                key = (record.ledger_id, record.entry_id)
                self.entries[key] = record.frame
                self.positions[key] = end
        self.synced_end = end
        self._note_sync_end()
        self.world.log(f"{self.bookie_id} sync {len(self.unsynced)} records")
        self.unsynced = []
        waiting, self.waiting = self.waiting, []
        for w in waiting:
            self.world.reply(w.client, w.rid, self.bookie_id, w.reply())

    def _note_sync_end(self) -> None:
        now_ms = self.world.now_ms
        self.sync_ends.append((now_ms, self.synced_end))
        # Keep the last end older than the checkpoint lag and every end after it.
        while len(self.sync_ends) > 1 and self.sync_ends[1][0] < now_ms - CHECKPOINT_LAG_MS:
            self.sync_ends.pop(0)

    def _applied(self) -> JournalPosition:
        """How far the ledgerstore has applied the journal (it catches up on demand, as
        the real one does, except while it restarts)."""
        if self.world.now_ms < self.unsure_until_ms:
            return self.restart_position
        return self.synced_end

    def read(self, command: SendReads) -> BookieReadReply:
        results = []
        items = command.items
        partial = self.world.faults.partial_read
        if partial and len(items) > 1 and self.world.rng.random() < partial:
            items = items[: self.world.rng.randint(1, len(items) - 1)]
        applied = self._applied()
        authority = has_authority(applied, self.synced_end)
        for item in items:
            key = (item.ledger_id, item.entry_id)
            frame = self.entries.get(key)
            if frame is not None and self.positions[key] <= applied:
                results.append(ReadResult(item.ledger_id, item.entry_id, BookieStatus.OK, frame))
                continue
            status = absent_status(item.ledger_id in self.durable, authority)
            results.append(ReadResult(item.ledger_id, item.entry_id, status))
        return BookieReadReply(self.bookie_id, command.entry_ids, BookieStatus.OK, tuple(results))

    def _read_lac(self, ledger_id: int) -> tuple[BookieStatus, int]:
        facts = self.durable.get(ledger_id)
        if facts is None:
            return (absent_status(False, has_authority(self._applied(), self.synced_end)), -1)
        return (BookieStatus.OK, facts.lac)

    # -- faults

    def crash(self) -> None:
        """kill -9: what was not synced is gone, nobody waiting gets an answer; the
        ledgerstore restarts from its checkpoint, CHECKPOINT_LAG_MS behind the journal."""
        lost = len(self.unsynced)
        self.up = False
        self.epoch += 1
        self.unsynced = []
        self.waiting = []
        self.sync_scheduled = False
        self.live = self.durable.copy()
        cutoff_ms = self.world.now_ms - CHECKPOINT_LAG_MS
        self.restart_position = JOURNAL_START
        for synced_ms, end in self.sync_ends:
            if synced_ms < cutoff_ms:
                self.restart_position = end
        self.world.log(f"{self.bookie_id} CRASH (lost {lost} unsynced records)")

    def restart(self) -> None:
        self.up = True
        lo, hi = self.world.faults.restart_unsure_ms
        self.unsure_until_ms = self.world.now_ms + self.world.rng.randint(lo, hi)
        self.world.log(f"{self.bookie_id} restart (unsure until {self.unsure_until_ms})")


@dataclass(frozen=True, slots=True)
class ReadLac:
    """A read_lac request (the ledgerstore's)."""
