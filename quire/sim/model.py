"""The simulated world: a network, bookies, a metadata store and clients, all driven by one
seeded random generator and one simulated clock, around the REAL protocol code.

What is real here: the client protocol's LedgerWriter (with its flow control per
bookie), LedgerRecovery and LedgerReader (`shared.protocol`) and the bookie's rules
(`shared.bookie.rules`: add admission, the fence and write_lac records, the read answer
for an absent entry) over BookieLedgerState and the journal's record types. What is
simulated: the network (drop, delay and so reorder, duplicate, partition), the bookies'
disks (a crash loses what was not yet synced; a restarted bookie's ledgerstore lags
behind the journal for a while, and the real authority rule decides from the two
positions what it may answer), the metadata store (CAS on a version, with injected
foreign writes and lost answers) and the clock.

Pure (it is checked like the cores): no IO, no clock, no `random` import; the caller
passes a seeded generator. The same seed gives the same event log, byte for byte.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.bookie.journal_format import (
    JOURNAL_START,
    EntryRecord,
    FenceRecord,
    JournalPosition,
    LacRecord,
    Record,
)
from shared.bookie.rules import (
    BookieLedgerState,
    absent_status,
    admit_adds,
    has_authority,
    meta_records,
)
from shared.digest import DigestManager, DigestType, master_key
from shared.models import LedgerMetadata, LedgerState, Segment, UpdateLedgerRequest
from shared.protocol.flow import DEFAULT_MAX_ADD_REQUESTS_PER_BOOKIE
from shared.protocol.messages import (
    AddSendFailed,
    BookieAddReply,
    BookieReadReply,
    CloseDone,
    CloseFailed,
    CompleteAdds,
    EnsembleChanged,
    EntryRead,
    EntryReadFailed,
    FailAdds,
    FenceReply,
    FenceSendFailed,
    LedgerUpdated,
    LedgerUpdateFailed,
    ListWritableBookies,
    ReadSendFailed,
    RecoveryDone,
    RecoveryFailed,
    ReplicaCorrupt,
    SendAdds,
    SendFence,
    SendReads,
    SendWriteLac,
    UpdateLedger,
    WritableBookies,
)
from shared.protocol.reader import LedgerReader, lac_from_replies
from shared.protocol.recovery import LedgerRecovery
from shared.protocol.writer import LedgerWriter
from shared.quorum import write_set
from shared.status import BookieStatus, QuireError
from shared.wire import ReadResult

LEDGER_ID = 1
PASSWORD = b"sim-password"
MASTER_KEY = master_key(PASSWORD)
# A bookie's ledgerstore has checkpointed the journal up to this long before a crash: the
# entries synced after that are not applied again until it has caught up.
CHECKPOINT_LAG_MS = 200


class Rng(Protocol):
    def random(self) -> float: ...
    def randint(self, a: int, b: int) -> int: ...
    def choice(self, seq: Any) -> Any: ...
    def sample(self, population: Any, k: int) -> list[Any]: ...


class InvariantViolation(AssertionError):
    """A rule of the protocol was broken: the seed that shows it is the bug report."""


@dataclass
class Faults:
    """Probabilities and ranges of the faults a run injects."""

    drop: float = 0.02
    duplicate: float = 0.02
    delay_ms: tuple[int, int] = (1, 8)
    slow_ms: tuple[int, int] = (20, 200)  # an occasional slow message
    slow: float = 0.03
    partition_every_ms: int = 400  # on average, one partition starts this often
    partition_ms: tuple[int, int] = (50, 400)
    crash_every_ms: int = 500
    down_ms: tuple[int, int] = (30, 600)
    restart_unsure_ms: tuple[int, int] = (20, 200)
    sync_ms: tuple[int, int] = (1, 4)
    # A bookie answers only a prefix of a batched read (its reply must fit one message).
    partial_read: float = 0.0
    meta_conflict: float = 0.1  # a foreign CAS lands just before ours
    meta_answer_lost: float = 0.05  # ours lands, its answer is lost (re-read)
    no_responders: float = 0.5  # a request to a down bookie fails at once (else times out)


@dataclass
class SimConfig:
    seed: int
    bookies: int = 5
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    entries: int = 40
    duration_ms: int = 1_500
    settle_ms: int = 1_500
    recoveries: int = 2  # recovery clients that start at random times
    close: bool = False  # the writer closes at some point
    readers: int = 1
    request_timeout_ms: int = 60
    add_entry_timeout_ms: int = 2_000
    explicit_lac_interval_ms: int = 50
    speculative_read_timeout_ms: int = 10
    tick_ms: int = 10
    faults: Faults = field(default_factory=Faults)
    # Scripted actions (time_ms, action, argument): scenarios use these instead of chance.
    script: tuple[tuple[int, str, Any], ...] = ()
    random_faults: bool = True
    writer_class: type[LedgerWriter] = LedgerWriter
    recovery_class: type[LedgerRecovery] = LedgerRecovery
    bookie_state_class: type[BookieLedgerState] = BookieLedgerState
    recovery_read_batch_size: int = 64  # entries a recovery reads at once
    max_add_requests_per_bookie: int = DEFAULT_MAX_ADD_REQUESTS_PER_BOOKIE  # the writer's
    max_events: int = 200_000


# -- the bookie ---------------------------------------------------------------------------


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
    durable end."""

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

    def handle(self, client: str, rid: int, command: Any) -> None:
        match command:
            case SendAdds():
                self._add(client, rid, command)
            case SendFence():
                self._meta_record(client, rid, FenceRecord(LEDGER_ID), fence=True)
            case SendWriteLac():
                self._meta_record(client, rid, LacRecord(LEDGER_ID, command.lac), fence=False)
            case SendReads():
                self.world.reply(client, rid, self.bookie_id, self._read(command))
            case ReadLac():
                self.world.reply(client, rid, self.bookie_id, self._read_lac())
            case _:
                raise AssertionError(f"unknown bookie request {command!r}")

    def _add(self, client: str, rid: int, command: SendAdds) -> None:
        admission = admit_adds(self.live, command.items)
        self.unsynced.extend(admission.records)
        results = tuple(admission.results)
        reply = BookieAddReply(self.bookie_id, command.entry_ids, BookieStatus.OK, results)
        self._after_sync(client, rid, lambda: reply, len(admission.records))

    def _meta_record(
        self, client: str, rid: int, record: FenceRecord | LacRecord, fence: bool
    ) -> None:
        status, records = meta_records(self.live, LEDGER_ID, MASTER_KEY, record)
        if status is not BookieStatus.OK:
            refused = FenceReply(self.bookie_id, status) if fence else None
            self.world.reply(client, rid, self.bookie_id, refused)
            return
        for r in records:
            self.live.apply(r)
            self.unsynced.append(r)

        def answer() -> Any:
            facts = self.durable.get(LEDGER_ID)
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

    def _read(self, command: SendReads) -> BookieReadReply:
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

    def _read_lac(self) -> tuple[BookieStatus, int]:
        facts = self.durable.get(LEDGER_ID)
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


# -- the metadata store -------------------------------------------------------------------


class SimMetadata:
    """The metadata service's ledger row: CAS on the version, checked on every write."""

    def __init__(self, world: World, metadata: LedgerMetadata) -> None:
        self.world = world
        self.ledger = metadata
        self.foreign_writes = 0

    def write(self, new: LedgerMetadata, who: str) -> None:
        old = self.ledger
        self.world.check(new.version == old.version + 1, "metadata versions increase by one")
        if old.state is LedgerState.CLOSED:
            self.world.check(
                (new.state, new.last_entry_id, new.length, new.segments)
                == (old.state, old.last_entry_id, old.length, old.segments),
                f"a CLOSED ledger changed: {who} wrote {new.state} last={new.last_entry_id}",
            )
        if new.state is LedgerState.OPEN:
            self.world.check(old.state is LedgerState.OPEN, "a ledger never reopens")
        self.ledger = new
        self.world.log(
            f"meta v{new.version} {new.state.value} last={new.last_entry_id} "
            f"segments={[(s.first_entry_id, s.bookies) for s in new.segments]} by {who}"
        )

    def update(self, request: UpdateLedgerRequest, who: str) -> LedgerUpdated | LedgerUpdateFailed:
        faults = self.world.faults
        if (
            self.world.random_faults
            and self.ledger.state is not LedgerState.CLOSED
            and self.world.rng.random() < faults.meta_conflict
        ):
            # Someone else's harmless CAS (re-replication of the metadata, custom fields).
            self.foreign_writes += 1
            bumped = dict(self.ledger.metadata, foreign=str(self.foreign_writes))
            self.write(
                self.ledger.model_copy(
                    update={"version": self.ledger.version + 1, "metadata": bumped}
                ),
                "foreign",
            )
        if request.expected_version != self.ledger.version:
            return LedgerUpdateFailed(self.ledger, "BAD_VERSION")
        changes = {
            name: getattr(request, name)
            for name in ("state", "last_entry_id", "length", "segments")
            if getattr(request, name) is not None
        }
        self.write(
            self.ledger.model_copy(update={**changes, "version": self.ledger.version + 1}), who
        )
        if self.world.random_faults and self.world.rng.random() < faults.meta_answer_lost:
            return LedgerUpdateFailed(self.ledger, "UNAVAILABLE (answer lost, re-read)")
        return LedgerUpdated(self.ledger)


# -- clients ------------------------------------------------------------------------------


class Client:
    """A gateway running one core: it turns the core's commands into simulated requests
    and the answers (or timeouts) into the core's events."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.pending: dict[int, Any] = {}  # rid -> the command waiting for an answer
        self.active = True

    def send(self, bookie_id: str, command: Any) -> None:
        rid = self.world.request(self.name, bookie_id, command)
        self.pending[rid] = command

    def on_answer(self, rid: int, bookie_id: str, answer: Any) -> None:
        command = self.pending.pop(rid, None)
        if command is None:
            return  # a duplicate answer, or one after the timeout: a NATS request takes one
        self.deliver(answer)

    def on_timeout(self, rid: int, bookie_id: str, reason: str) -> None:
        command = self.pending.pop(rid, None)
        if command is None:
            return
        self.deliver(self.failure_for(bookie_id, command, reason))

    @staticmethod
    def failure_for(bookie_id: str, command: Any, reason: str) -> Any:
        match command:
            case SendAdds():
                return AddSendFailed(bookie_id, command.entry_ids, reason)
            case SendReads():
                return ReadSendFailed(bookie_id, command.entry_ids, reason)
            case SendFence():
                return FenceSendFailed(bookie_id, reason)
        return None

    def deliver(self, event: Any) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        raise NotImplementedError

    def meta(self, command: Any) -> None:
        self.world.meta_request(self, command)


class WriterClient(Client):
    """The application writing the ledger, and, once fenced, the zombie that goes on."""

    def __init__(self, world: World, metadata: LedgerMetadata) -> None:
        super().__init__(world, "writer")
        config = world.config
        self.core = config.writer_class(
            metadata,
            MASTER_KEY,
            DigestManager(metadata.digest, PASSWORD),
            add_entry_timeout_ms=config.add_entry_timeout_ms,
            rng=world.rng,
            explicit_lac_interval_ms=config.explicit_lac_interval_ms,
            ensemble_change_retry_ms=100,
            ensemble_change_delay_ms=config.tick_ms,
            max_add_requests_per_bookie=config.max_add_requests_per_bookie,
            now_ms=world.now_ms,
        )
        self._tick_at: int | None = None  # the deadline a tick is scheduled for
        self.written: dict[int, bytes] = {}
        self.acked = -1  # the last entry acknowledged to the application
        self.added = 0

    def add(self, count: int) -> None:
        payloads = [b"entry-%d" % (self.added + i) for i in range(count)]
        try:
            first, last = self.core.add(payloads, self.world.now_ms)
        except QuireError as exc:
            self.world.log(f"writer add refused: {exc.api.code}")
            return
        for offset, entry_id in enumerate(range(first, last + 1)):
            self.written[entry_id] = payloads[offset]
        self.added += count
        self.world.log(f"writer add {first}..{last}")
        self.run()

    def deliver(self, event: Any) -> None:
        if event is None:
            return
        self.core.step(event, self.world.now_ms)
        self.run()

    def tick(self) -> None:
        """The world's regular tick: the writer is ticked at its deadlines instead
        (`_on_deadline`); here a tick before the deadline must do nothing."""
        now = self.world.now_ms
        deadline = self.core.next_deadline_ms()
        if deadline is None or now < deadline:
            self.core.tick(now)
            self.world.check(
                not self.core.take_commands(), "a writer's tick before its deadline does nothing"
            )
        self._schedule_deadline()

    def _schedule_deadline(self) -> None:
        """One tick at the core's next deadline, moved when the deadline comes earlier;
        time stops for the writer with the world's ticks (`World.tick_until_ms`)."""
        deadline = self.core.next_deadline_ms()
        if deadline is None or (self._tick_at is not None and self._tick_at <= deadline):
            return
        at = max(deadline, self.world.now_ms)
        if at > self.world.tick_until_ms:
            return
        self._tick_at = at
        self.world.at(at - self.world.now_ms, self._on_deadline, at)

    def _on_deadline(self, at: int) -> None:
        if at != self._tick_at:
            return  # superseded by an earlier deadline
        self._tick_at = None
        self.core.tick(self.world.now_ms)
        deadline = self.core.next_deadline_ms()
        self.world.check(
            deadline is None or deadline > self.world.now_ms,
            "a writer's tick at its deadline does what is due",
        )
        self.run()

    def run(self) -> None:
        for command in self.core.take_commands():
            match command:
                case SendAdds() | SendWriteLac():
                    self.send(command.bookie_id, command)
                case CompleteAdds():
                    self.world.on_acked(command)
                case FailAdds():
                    self.world.log(
                        f"writer FAIL {command.first_entry_id}..{command.last_entry_id} "
                        f"{command.api.code}"
                    )
                case UpdateLedger() | ListWritableBookies():
                    self.meta(command)
                case EnsembleChanged():
                    self.world.log(f"writer ensemble changed at {command.first_entry_id}")
                case CloseDone():
                    self.world.log(f"writer closed at {command.metadata.last_entry_id}")
                    self.world.check(
                        command.metadata.last_entry_id == self.core.lac,
                        "a writer's close is at its LAC",
                    )
                case CloseFailed():
                    self.world.log(f"writer close failed: {command.api.code}")
        self._schedule_deadline()


class RecoveryClient(Client):
    """Another client opening the ledger with recovery (fence and close); it tries again
    when a recovery fails, as an application would."""

    def __init__(self, world: World, name: str, attempts: int = 20) -> None:
        super().__init__(world, name)
        self.attempts = attempts
        self.core: LedgerRecovery | None = None
        self.result: int | None = None
        self.active = False

    def start(self) -> None:
        if self.result is not None or self.attempts <= 0:
            return
        self.attempts -= 1
        self.active = True
        self.pending.clear()  # answers to an earlier attempt go nowhere
        metadata = self.world.metadata.ledger
        self.core = self.world.config.recovery_class(
            metadata,
            MASTER_KEY,
            DigestManager(metadata.digest, PASSWORD),
            self.world.now_ms,
            rng=self.world.rng,
            retry_interval_ms=20,
            recovery_timeout_ms=3_000,
            add_entry_timeout_ms=self.world.config.add_entry_timeout_ms,
            read_batch_size=self.world.config.recovery_read_batch_size,
        )
        self.world.log(f"{self.name} start recovery at v{metadata.version}")
        self.run()

    def deliver(self, event: Any) -> None:
        if event is None or self.core is None or self.core.done:
            return
        self.core.step(event, self.world.now_ms)
        self.run()

    def tick(self) -> None:
        if self.core is not None and not self.core.done:
            self.core.tick(self.world.now_ms)
            self.run()

    def run(self) -> None:
        assert self.core is not None
        for command in self.core.take_commands():
            match command:
                case SendFence() | SendReads() | SendAdds():
                    self.send(command.bookie_id, command)
                case UpdateLedger() | ListWritableBookies():
                    self.meta(command)
                case EnsembleChanged():
                    self.world.log(f"{self.name} ensemble changed at {command.first_entry_id}")
                case ReplicaCorrupt():
                    self.world.check(False, f"corrupt replica {command}")
                case RecoveryDone():
                    self.active = False
                    self.result = command.metadata.last_entry_id
                    self.world.on_recovered(self, command.metadata)
                case RecoveryFailed():
                    self.active = False
                    self.world.log(f"{self.name} recovery failed: {command.api.code}")
                    self.world.at(self.world.rng.randint(20, 200), self.start)


class ReaderClient(Client):
    """A tailing reader on another gateway: the LAC from the bookies, then the entries up
    to it, each checked against what the writer wrote."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__(world, name)
        self.next_entry = 0
        self.lac_replies: list[tuple[BookieStatus, int]] = []
        self.lac_waiting = 0
        self.core: LedgerReader | None = None
        self.lac = -1

    def poll(self) -> None:
        if self.lac_waiting or self.core is not None:
            return
        self.lac_replies = []
        bookies = self.world.metadata.ledger.segments[-1].bookies
        self.lac_waiting = len(bookies)
        for bookie_id in bookies:
            self.send(bookie_id, ReadLac())

    def deliver(self, event: Any) -> None:
        if event is None:
            return
        if isinstance(event, tuple):  # a read_lac answer, or its failure
            self.lac_replies.append(event)
            self.lac_waiting -= 1
            if self.lac_waiting == 0:
                self._read_to_lac()
            return
        if self.core is not None:
            self.core.step(event, self.world.now_ms)
            self.run()

    def on_timeout(self, rid: int, bookie_id: str, reason: str) -> None:
        command = self.pending.get(rid)
        if isinstance(command, ReadLac):
            self.pending.pop(rid)
            self.deliver((BookieStatus.IO_ERROR, -1))
            return
        super().on_timeout(rid, bookie_id, reason)

    def _read_to_lac(self) -> None:
        lac = lac_from_replies(self.lac_replies)
        if lac is None:
            return
        self.world.check_reader_lac(self.name, lac)
        self.lac = max(self.lac, lac)
        if self.lac < self.next_entry:
            return
        metadata = self.world.metadata.ledger
        self.core = LedgerReader(
            metadata,
            DigestManager(metadata.digest, PASSWORD),
            read_entry_timeout_ms=self.world.config.request_timeout_ms * 2,
            speculative_read_timeout_ms=self.world.config.speculative_read_timeout_ms,
        )
        last = min(self.lac, self.next_entry + 9)
        self.core.read(range(self.next_entry, last + 1), self.world.now_ms)
        self.run()

    def tick(self) -> None:
        if self.core is not None:
            self.core.tick(self.world.now_ms)
            self.run()

    def run(self) -> None:
        assert self.core is not None
        for command in self.core.take_commands():
            match command:
                case SendReads():
                    self.send(command.bookie_id, command)
                case EntryRead():
                    self.world.check_read(self.name, command, self.lac)
                    if command.entry_id == self.next_entry:
                        self.next_entry += 1
                case EntryReadFailed():
                    self.world.log(f"{self.name} read {command.entry_id} failed {command.api.code}")
                case ReplicaCorrupt():
                    self.world.check(False, f"corrupt replica {command}")
        if self.core.done:
            self.core = None


# -- the world ----------------------------------------------------------------------------


class World:
    """The event loop of one simulated run. `step()` runs the next event and checks the
    invariants; the log is the run's transcript."""

    def __init__(self, config: SimConfig, rng: Rng) -> None:
        self.config = config
        self.faults = config.faults
        self.random_faults = config.random_faults
        self.rng = rng
        self.now_ms = 0
        self.lines: list[str] = []
        self._queue: list[tuple[int, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self._rid = 0
        self.partitions: dict[tuple[str, str], int] = {}  # (client, bookie) -> until ms
        self.bookies = {f"b{i}": SimBookie(self, f"b{i}") for i in range(config.bookies)}
        ensemble = rng.sample(sorted(self.bookies), config.ensemble_size)
        self.metadata = SimMetadata(
            self,
            LedgerMetadata(
                ledger_id=LEDGER_ID,
                state=LedgerState.OPEN,
                ensemble_size=config.ensemble_size,
                write_quorum=config.write_quorum,
                ack_quorum=config.ack_quorum,
                digest=DigestType.CRC32C,
                segments=[Segment(first_entry_id=0, bookies=ensemble)],
            ),
        )
        self.log(
            f"seed {config.seed} E={config.ensemble_size} Qw={config.write_quorum} "
            f"Qa={config.ack_quorum} bookies={config.bookies} ensemble={ensemble}"
        )
        self.writer = WriterClient(self, self.metadata.ledger)
        self.recoveries = [RecoveryClient(self, f"recovery{i}") for i in range(config.recoveries)]
        self.readers = [ReaderClient(self, f"reader{i}") for i in range(config.readers)]
        self.clients: dict[str, Client] = {c.name: c for c in [self.writer, *self.recoveries]}
        self.clients.update({r.name: r for r in self.readers})
        self.acked: dict[int, bytes] = {}
        self.max_confirmed = -1
        self.closed: LedgerMetadata | None = None
        self.recovered: list[int] = []
        self.events = 0
        self.healed = False
        self.max_reader_lac = -1
        self.tick_until_ms = config.duration_ms + config.settle_ms

    # -- scheduling

    def at(self, delay_ms: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now_ms + delay_ms, self._seq, fn, args))

    def log(self, line: str) -> None:
        self.lines.append(f"{self.now_ms:6d} {line}")

    def check(self, condition: bool, what: str) -> None:
        if not condition:
            self.log(f"VIOLATION {what}")
            raise InvariantViolation(what)

    # -- network

    def _cut(self, client: str, bookie_id: str) -> bool:
        return self.partitions.get((client, bookie_id), -1) > self.now_ms

    def _delay(self) -> int:
        if self.random_faults and self.rng.random() < self.faults.slow:
            return self.rng.randint(*self.faults.slow_ms)
        return self.rng.randint(*self.faults.delay_ms)

    def _lost(self) -> bool:
        return self.random_faults and self.rng.random() < self.faults.drop

    def request(self, client: str, bookie_id: str, command: Any) -> int:
        self._rid += 1
        rid = self._rid
        self.at(self.config.request_timeout_ms, self._timeout, client, rid, bookie_id, "timeout")
        bookie = self.bookies[bookie_id]
        if not bookie.up and self.rng.random() < self.faults.no_responders:
            self.at(1, self._timeout, client, rid, bookie_id, "no responders")
            return rid
        if self._cut(client, bookie_id) or self._lost():
            return rid
        copies = 2 if self.random_faults and self.rng.random() < self.faults.duplicate else 1
        for _ in range(copies):
            self.at(self._delay(), self._arrive, client, rid, bookie_id, command)
        return rid

    def _arrive(self, client: str, rid: int, bookie_id: str, command: Any) -> None:
        bookie = self.bookies[bookie_id]
        if not bookie.up:
            return
        self.log(f"{bookie_id} <- {client} {_describe(command)}")
        bookie.handle(client, rid, command)

    def reply(self, client: str, rid: int, bookie_id: str, answer: Any) -> None:
        if answer is None or self._cut(client, bookie_id) or self._lost():
            return
        self.at(self._delay(), self._answer, client, rid, bookie_id, answer)

    def _answer(self, client: str, rid: int, bookie_id: str, answer: Any) -> None:
        self.log(f"{client} <- {bookie_id} {_describe(answer)}")
        self.clients[client].on_answer(rid, bookie_id, answer)

    def _timeout(self, client: str, rid: int, bookie_id: str, reason: str) -> None:
        owner = self.clients[client]
        if rid in owner.pending:
            self.log(f"{client} {reason} from {bookie_id}")
            owner.on_timeout(rid, bookie_id, reason)

    # -- metadata

    def meta_request(self, client: Client, command: Any) -> None:
        self.at(self._delay(), self._meta_arrive, client, command)

    def _meta_arrive(self, client: Client, command: Any) -> None:
        if isinstance(command, UpdateLedger):
            answer: Any = self.metadata.update(command.request, client.name)
        else:
            # The registry: bookies that are up, plus a down one whose lease has not expired.
            writable = [b for b, bookie in self.bookies.items() if bookie.up]
            down = [b for b, bookie in self.bookies.items() if not bookie.up]
            if down and self.random_faults and self.rng.random() < 0.3:
                writable.append(self.rng.choice(down))
            answer = WritableBookies(tuple(sorted(writable)))
        self.at(self._delay(), self._meta_answer, client, answer)

    def _meta_answer(self, client: Client, answer: Any) -> None:
        self.log(f"{client.name} <- meta {_describe(answer)}")
        client.deliver(answer)

    # -- invariants

    def on_acked(self, command: CompleteAdds) -> None:
        self.check(
            command.first_entry_id == self.writer.acked + 1,
            f"acks in order, each once: got {command.first_entry_id}, last {self.writer.acked}",
        )
        self.check(command.lac == command.last_entry_id, "the LAC is the last acknowledged")
        metadata = self.writer.core.metadata
        quorum = metadata.quorum
        for entry_id in range(command.first_entry_id, command.last_entry_id + 1):
            self.acked[entry_id] = self.writer.written[entry_id]
            # Acknowledged means durable on Qa bookies of its write set, as the metadata says.
            bookies = metadata.segment_for(entry_id).bookies
            copies = sum(
                (LEDGER_ID, entry_id) in self.bookies[bookies[i]].entries
                for i in write_set(entry_id, quorum)
            )
            self.check(
                copies >= quorum.ack_quorum,
                f"entry {entry_id} acknowledged with {copies} durable copies "
                f"(Qa {quorum.ack_quorum})",
            )
        self.writer.acked = command.last_entry_id
        self.max_confirmed = max(self.max_confirmed, command.lac)
        self.log(f"writer ACK {command.first_entry_id}..{command.last_entry_id}")

    def on_recovered(self, client: RecoveryClient, metadata: LedgerMetadata) -> None:
        last = metadata.last_entry_id
        assert last is not None
        self.log(f"{client.name} RECOVERED last={last}")
        if self.recovered:
            self.check(last == self.recovered[0], f"recoveries disagree: {self.recovered} {last}")
        self.recovered.append(last)
        self.max_confirmed = max(self.max_confirmed, last)

    def check_reader_lac(self, name: str, lac: int) -> None:
        """A LAC a reader learns from the bookies was confirmed by a writer or a recovery,
        and (checked at the end) ends up inside the closed ledger."""
        self.check(
            lac <= self.max_confirmed,
            f"{name} saw LAC {lac} beyond every confirmation ({self.max_confirmed})",
        )
        self.max_reader_lac = max(self.max_reader_lac, lac)

    def check_read(self, name: str, entry: EntryRead, lac: int) -> None:
        self.check(entry.entry_id <= lac, f"{name} read {entry.entry_id} beyond its LAC {lac}")
        written = self.writer.written.get(entry.entry_id)
        self.check(
            written == entry.payload,
            f"{name} read entry {entry.entry_id} = {entry.payload!r}, written {written!r}",
        )

    def check_invariants(self) -> None:
        ledger = self.metadata.ledger
        if ledger.state is LedgerState.CLOSED:
            if self.closed is None:
                self.closed = ledger
            last = ledger.last_entry_id
            assert last is not None
            self.check(
                self.writer.acked <= last,
                f"entry {self.writer.acked} was acknowledged but the ledger closed at {last}",
            )

    # -- running

    def schedule_activity(self) -> None:
        config = self.config
        rng = self.rng
        # Adds spread over the whole run, so that recoveries race a writer still writing.
        added = 0
        while added < config.entries:
            count = rng.randint(1, 3)
            self.at(rng.randint(1, config.duration_ms), self.writer.add, count)
            added += count
        for recovery in self.recoveries:
            self.at(rng.randint(config.duration_ms // 4, config.duration_ms), recovery.start)
        if config.close:
            self.at(rng.randint(config.duration_ms // 3, config.duration_ms), self._close)
        for reader in self.readers:
            for t in range(20, config.duration_ms + config.settle_ms, 60):
                self.at(t, reader.poll)
        self.at(0, self._tick)
        if config.random_faults:
            self._schedule_random_faults()
        for t, action, argument in config.script:
            self.at(t, self._scripted, action, argument)
        self.at(config.duration_ms, self._heal)

    def _schedule_random_faults(self) -> None:
        config, faults, rng = self.config, self.faults, self.rng
        t = 0
        while faults.crash_every_ms and t < config.duration_ms:
            t += rng.randint(faults.crash_every_ms // 2, faults.crash_every_ms * 3 // 2)
            bookie_id = rng.choice(sorted(self.bookies))
            self.at(t, self._crash, bookie_id, rng.randint(*faults.down_ms))
        t = 0
        while faults.partition_every_ms and t < config.duration_ms:
            t += rng.randint(faults.partition_every_ms // 2, faults.partition_every_ms * 3 // 2)
            client = rng.choice(sorted(self.clients))
            bookie_id = rng.choice(sorted(self.bookies))
            self.at(t, self._partition, client, bookie_id, rng.randint(*faults.partition_ms))

    def _scripted(self, action: str, argument: Any) -> None:
        match action:
            case "crash":
                bookie_id, down_ms = argument
                self._crash(self._bookie(bookie_id), down_ms)
            case "partition":
                client, bookie_id, ms = argument
                self._partition(client, self._bookie(bookie_id), ms)
            case "recover":
                self.recoveries[argument].start()
            case "close":
                self._close()
            case _:
                raise AssertionError(f"unknown scripted action {action}")

    def _bookie(self, name: str) -> str:
        """`ensemble:I` is the I-th bookie of the first segment (the seed picks it)."""
        if name.startswith("ensemble:"):
            return self.metadata.ledger.segments[0].bookies[int(name.split(":")[1])]
        return name

    def _crash(self, bookie_id: str, down_ms: int) -> None:
        bookie = self.bookies[bookie_id]
        if not bookie.up:
            return
        bookie.crash()
        if down_ms >= 0:
            self.at(down_ms, self._restart, bookie_id)

    def _restart(self, bookie_id: str) -> None:
        if not self.bookies[bookie_id].up:
            self.bookies[bookie_id].restart()

    def _partition(self, client: str, bookie_id: str, ms: int) -> None:
        if self.healed:
            return
        self.partitions[(client, bookie_id)] = self.now_ms + ms
        self.log(f"partition {client} | {bookie_id} for {ms} ms")

    def _close(self) -> None:
        self.log("writer close")
        self.writer.core.start_close()
        self.writer.run()

    def _tick(self) -> None:
        for client in self.clients.values():
            client.tick()
        if self.now_ms < self.tick_until_ms:
            self.at(self.config.tick_ms, self._tick)

    def _heal(self) -> None:
        """The end of the faults: every bookie back, no partition, no more chance faults."""
        self.log("heal")
        self.healed = True
        self.random_faults = False
        self.partitions.clear()
        for bookie_id in sorted(self.bookies):
            self._restart(bookie_id)

    def step(self) -> bool:
        if not self._queue:
            return False
        when, _, fn, args = heapq.heappop(self._queue)
        self.now_ms = when
        fn(*args)
        self.events += 1
        self.check_invariants()
        self.check(self.events < self.config.max_events, "the run does not settle")
        return True

    def run(self) -> None:
        self.schedule_activity()
        while self.step():
            pass
        self.finish()

    def finish(self) -> None:
        """After the faults: recover (if nobody closed the ledger), then every acknowledged
        entry must be there, in a ledger that is closed for good, readable by anyone."""
        if self.metadata.ledger.state is not LedgerState.CLOSED:
            final = RecoveryClient(self, "final")
            self.clients[final.name] = final
            self.recoveries.append(final)
            self.tick_until_ms = self.now_ms + 60_000
            self.at(0, self._tick)
            final.start()
            while self.step() and final.result is None:
                pass
        ledger = self.metadata.ledger
        self.check(ledger.state is LedgerState.CLOSED, f"the ledger is closed ({ledger.state})")
        self.check_invariants()
        last = ledger.last_entry_id
        assert last is not None
        for result in self.recovered:
            self.check(result == last, f"a recovery returned {result}, the ledger closed at {last}")
        self.check(
            self.max_reader_lac <= last,
            f"a reader saw LAC {self.max_reader_lac}, the ledger closed at {last}",
        )
        got = self.read_back(ledger)
        self.check(len(got) == last + 1, f"read {len(got)} of {last + 1} entries back")
        for entry_id, payload in got.items():
            self.check(
                payload == self.writer.written.get(entry_id),
                f"closed entry {entry_id} is {payload!r}",
            )
        for entry_id, payload in self.acked.items():
            self.check(got.get(entry_id) == payload, f"acknowledged entry {entry_id} lost")
        self.log(
            f"done: closed at {last}, {len(self.acked)} acknowledged, "
            f"{self.writer.core.ensemble_changes} ensemble changes, "
            f"recoveries {self.recovered}"
        )

    def read_back(self, ledger: LedgerMetadata) -> dict[int, bytes]:
        """Read the closed ledger with the real reader, every bookie answering at once."""
        for bookie in self.bookies.values():
            bookie.unsure_until_ms = -1  # the ledgerstores have caught up by now
        reader = LedgerReader(ledger, DigestManager(ledger.digest, PASSWORD))
        assert ledger.last_entry_id is not None
        reader.read(range(ledger.last_entry_id + 1), self.now_ms)
        got: dict[int, bytes] = {}
        while not reader.done:
            for command in reader.take_commands():
                if isinstance(command, SendReads):
                    reader.step(self.bookies[command.bookie_id]._read(command), self.now_ms)
                elif isinstance(command, EntryRead):
                    got[command.entry_id] = command.payload
                else:
                    self.check(False, f"reading the closed ledger back: {command}")
        for command in reader.take_commands():
            if isinstance(command, EntryRead):
                got[command.entry_id] = command.payload
        return got


def _describe(message: Any) -> str:
    """A short, deterministic description of a message for the log."""
    match message:
        case SendAdds():
            flags = "R" if message.items and message.items[0].flags & 1 else ""
            return f"add{flags} {list(message.entry_ids)}"
        case BookieAddReply():
            return f"added {[(r.entry_id, r.status.name) for r in message.results]}"
        case SendReads():
            return f"read {list(message.entry_ids)}"
        case BookieReadReply():
            return f"read-reply {[(r.entry_id, r.status.name) for r in message.results]}"
        case SendFence():
            return "fence"
        case FenceReply():
            return f"fenced {message.status.name} lac={message.lac}"
        case SendWriteLac():
            return f"write_lac {message.lac}"
        case ReadLac():
            return "read_lac"
        case tuple():
            return f"lac {message[0].name} {message[1]}"
        case LedgerUpdated():
            return f"updated v{message.metadata.version}"
        case LedgerUpdateFailed():
            current = message.current
            state = f"v{current.version} {current.state.value}" if current else "unknown"
            return f"update failed ({message.reason}) now {state}"
        case WritableBookies():
            return f"writable {list(message.bookie_ids)}"
    return type(message).__name__
