"""The simulated clients: gateways running the real protocol cores (writer, recovery, tailing
reader) of one ledger each, turning their commands into simulated requests and the answers
and timeouts into their events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quire.sim.bookie import ReadLac
from shared.autorecovery_worker import Action, ClaimFacts, grace_remaining_ms, plan_claim
from shared.digest import DigestManager, LedgerKeys
from shared.protocol.messages import (
    AddSendFailed,
    CloseDone,
    CloseFailed,
    CompleteAdds,
    EnsembleChanged,
    EntryRead,
    EntryReadFailed,
    FailAdds,
    FenceSendFailed,
    FragmentReplicated,
    ListWritableBookies,
    ReadSendFailed,
    RecoveryDone,
    RecoveryFailed,
    ReplicaCorrupt,
    ReplicationDone,
    ReplicationFailed,
    SendAdds,
    SendFence,
    SendReads,
    SendWriteLac,
    UpdateLedger,
)
from shared.protocol.reader import LedgerReader, ReadSettings, lac_from_replies
from shared.protocol.recovery import LedgerRecovery
from shared.protocol.replication import LedgerReplication, ReplicationSettings, open_fragment_on
from shared.status import BookieStatus, QuireError

if TYPE_CHECKING:
    from quire.sim.ledger import SimLedger
    from quire.sim.model import World


class Client:
    """A gateway running one core for one ledger: it turns the core's commands into
    simulated requests and the answers (or timeouts) into the core's events. Its name
    carries the ledger's prefix when the world holds several ledgers."""

    def __init__(self, world: World, ledger: SimLedger, name: str) -> None:
        self.world = world
        self.ledger = ledger
        self.name = ledger.prefix + name
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

    def carry(self, command: Any) -> bool:
        """Carry out a command that the recovery and replication cores' clients handle
        alike (requests to the bookies and the metadata store, what is logged or checked);
        False: the command is the client's own to handle."""
        match command:
            case SendFence() | SendReads() | SendAdds():
                self.send(command.bookie_id, command)
            case UpdateLedger() | ListWritableBookies():
                self.meta(command)
            case EnsembleChanged():
                self.world.log(f"{self.name} ensemble changed at {command.first_entry_id}")
            case ReplicaCorrupt():
                self.world.check(False, f"corrupt replica {command}")
            case _:
                return False
        return True


class WriterClient(Client):
    """The application writing the ledger, and, once fenced, the zombie that goes on."""

    def __init__(self, world: World, ledger: SimLedger) -> None:
        super().__init__(world, ledger, "writer")
        config = world.config
        metadata = ledger.metadata.ledger
        self.core = config.writer_class(
            metadata,
            ledger.master_key,
            DigestManager(metadata.digest, ledger.password),
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
        # Payloads name their ledger, so an entry read from the wrong ledger never matches.
        prefix = self.ledger.prefix.encode()
        payloads = [b"%sentry-%d" % (prefix, self.added + i) for i in range(count)]
        try:
            first, last = self.core.add(payloads, self.world.now_ms)
        except QuireError as exc:
            self.world.log(f"{self.name} add refused: {exc.api.code}")
            return
        for offset, entry_id in enumerate(range(first, last + 1)):
            self.written[entry_id] = payloads[offset]
        self.added += count
        self.world.log(f"{self.name} add {first}..{last}")
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
                not self.core.take_commands(),
                f"{self.name}: a writer's tick before its deadline does nothing",
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
            f"{self.name}: a writer's tick at its deadline does what is due",
        )
        self.run()

    def run(self) -> None:
        for command in self.core.take_commands():
            match command:
                case SendAdds() | SendWriteLac():
                    self.send(command.bookie_id, command)
                case CompleteAdds():
                    self.ledger.on_acked(command)
                case FailAdds():
                    self.world.log(
                        f"{self.name} FAIL {command.first_entry_id}..{command.last_entry_id} "
                        f"{command.api.code}"
                    )
                case UpdateLedger() | ListWritableBookies():
                    self.meta(command)
                case EnsembleChanged():
                    self.world.log(f"{self.name} ensemble changed at {command.first_entry_id}")
                case CloseDone():
                    self.world.log(f"{self.name} closed at {command.metadata.last_entry_id}")
                    self.world.check(
                        command.metadata.last_entry_id == self.core.lac,
                        f"{self.name}: a writer's close is at its LAC",
                    )
                case CloseFailed():
                    self.world.log(f"{self.name} close failed: {command.api.code}")
        self._schedule_deadline()


class RecoveryClient(Client):
    """Another client opening the ledger with recovery (fence and close); it tries again
    when a recovery fails, as an application would."""

    def __init__(self, world: World, ledger: SimLedger, name: str, attempts: int = 20) -> None:
        super().__init__(world, ledger, name)
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
        metadata = self.ledger.metadata.ledger
        self.core = self.world.config.recovery_class(
            metadata,
            self.ledger.master_key,
            DigestManager(metadata.digest, self.ledger.password),
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
            if self.carry(command):
                continue
            match command:
                case RecoveryDone():
                    self.active = False
                    self.result = command.metadata.last_entry_id
                    self.ledger.on_recovered(self, command.metadata)
                case RecoveryFailed():
                    self.active = False
                    self.world.log(f"{self.name} recovery failed: {command.api.code}")
                    self.world.at(self.world.rng.randint(20, 200), self.start)


class ReaderClient(Client):
    """A tailing reader on another gateway: the LAC from the bookies, then the entries up
    to it, each checked against what the writer wrote."""

    def __init__(self, world: World, ledger: SimLedger, name: str) -> None:
        super().__init__(world, ledger, name)
        self.next_entry = 0
        self.lac_replies: list[tuple[BookieStatus, int]] = []
        self.lac_waiting = 0
        self.core: LedgerReader | None = None
        self.lac = -1

    def poll(self) -> None:
        if self.lac_waiting or self.core is not None:
            return
        self.lac_replies = []
        bookies = self.ledger.metadata.ledger.segments[-1].bookies
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
        self.ledger.check_reader_lac(self.name, lac)
        self.lac = max(self.lac, lac)
        if self.lac < self.next_entry:
            return
        metadata = self.ledger.metadata.ledger
        settings = ReadSettings(
            read_entry_timeout_ms=self.world.config.request_timeout_ms * 2,
            speculative_read_timeout_ms=self.world.config.speculative_read_timeout_ms,
        )
        self.core = LedgerReader(
            metadata, DigestManager(metadata.digest, self.ledger.password), settings
        )
        last = min(self.lac, self.next_entry + 9)
        self.core.read(self.next_entry, last, self.world.now_ms)
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
                    self.ledger.check_read(self.name, command, self.lac)
                    if command.entry_id == self.next_entry:
                        self.next_entry += 1
                case EntryReadFailed():
                    self.world.log(f"{self.name} read {command.entry_id} failed {command.api.code}")
                case ReplicaCorrupt():
                    self.world.check(False, f"corrupt replica {command}")
        if self.core.done:
            self.core = None


class ReplicatorClient(Client):
    """The replication worker of a ledger the auditor marked (BookKeeper's ReplicationWorker):
    the closed fragments on the lost bookies are copied while the writer writes; an open last
    segment on them waits `open_ledger_grace_ms` from the mark, then the ledger is fenced
    and recovered first (its writer is fenced off), then copied. A failure is released and
    tried again after a pause, as the worker's claim would be."""

    def __init__(self, world: World, ledger: SimLedger, attempts: int = 40) -> None:
        super().__init__(world, ledger, "replicator")
        self.attempts = attempts
        self.core: LedgerRecovery | LedgerReplication | None = None
        self.marked_at_ms: int | None = None
        self.retry_scheduled = False
        self.replicated = 0  # fragments this worker stored

    @property
    def busy(self) -> bool:
        return self.core is not None and not self.core.done

    def mark(self) -> None:
        """The auditor marked the ledger under-replicated (again: a no-op while at it)."""
        if self.marked_at_ms is None:
            self.marked_at_ms = self.world.now_ms
        if not self.busy and not self.retry_scheduled:
            self.start()

    @property
    def repaired(self) -> bool:
        lost = self.world.lost
        return not any(lost & set(s.bookies) for s in self.ledger.metadata.ledger.segments)

    def start(self) -> None:
        self.retry_scheduled = False
        if self.repaired or self.attempts <= 0:
            return
        self.attempts -= 1
        self.pending.clear()  # answers to an earlier attempt go nowhere
        world, config = self.world, self.world.config
        metadata = self.ledger.metadata.ledger
        assert self.marked_at_ms is not None
        keys = LedgerKeys.from_password(self.ledger.password)
        # The replicator service's own decision (`shared.autorecovery_worker`).
        facts = ClaimFacts(
            missing_bookies=tuple(sorted(world.lost)),
            marked_at_ms=self.marked_at_ms,
            ledger_exists=True,
            has_keys=True,
            open_fragment_on_marked=open_fragment_on(metadata, world.lost),
        )
        plan = plan_claim(facts, world.now_ms, config.open_ledger_grace_ms)
        if plan.action is Action.RECOVER_AND_REPLICATE:
            self.core = config.recovery_class(
                metadata,
                keys.master_key,
                DigestManager.for_keys(metadata.digest, keys),
                world.now_ms,
                rng=world.rng,
                retry_interval_ms=20,
                recovery_timeout_ms=3_000,
                add_entry_timeout_ms=config.add_entry_timeout_ms,
                read_batch_size=config.recovery_read_batch_size,
            )
            world.log(f"{self.name} fence and recover at v{metadata.version}")
        else:
            # The other actions are for a deleted ledger, a ledger without keys or an empty
            # mark: none of them happens here.
            assert plan.action is Action.REPLICATE, plan
            settings = ReplicationSettings(
                rereplication_entry_batch_size=config.rereplication_entry_batch_size,
                rereplication_batches_in_flight=2,
                read=ReadSettings(
                    read_entry_timeout_ms=config.request_timeout_ms * 2,
                    speculative_read_timeout_ms=config.speculative_read_timeout_ms,
                ),
            )
            self.core = config.replication_class(
                metadata, world.lost, keys, world.now_ms, settings=settings, rng=world.rng
            )
            world.log(f"{self.name} replicate at v{metadata.version}")
        self.run()

    def deliver(self, event: Any) -> None:
        if event is None or not self.busy:
            return
        assert self.core is not None
        self.core.step(event, self.world.now_ms)
        self.run()

    def tick(self) -> None:
        if self.busy:
            assert self.core is not None
            self.core.tick(self.world.now_ms)
            self.run()

    def _again(self, delay_ms: int) -> None:
        if not self.retry_scheduled:
            self.retry_scheduled = True
            self.world.at(delay_ms, self.start)

    def run(self) -> None:
        assert self.core is not None
        for command in self.core.take_commands():
            if self.carry(command):
                continue
            match command:
                case RecoveryDone():
                    self.ledger.on_recovered(self, command.metadata)
                    self._again(0)
                case FragmentReplicated():
                    self.replicated += 1
                    fragment = command.fragment
                    self.world.log(
                        f"{self.name} REPLICATED {fragment.first_entry_id}.."
                        f"{fragment.last_entry_id} {fragment.bookie_id} -> "
                        f"{command.new_bookie_id} ({command.entries} entries)"
                    )
                case ReplicationDone():
                    if not self.repaired:  # an open segment waits for its grace period
                        assert self.marked_at_ms is not None
                        wait_ms = grace_remaining_ms(
                            self.marked_at_ms,
                            self.world.now_ms,
                            self.world.config.open_ledger_grace_ms,
                        )
                        self._again(max(wait_ms, 20))
                case RecoveryFailed() | ReplicationFailed():
                    self.world.log(f"{self.name} failed: {command.api.code}: {command.detail}")
                    self._again(self.world.rng.randint(20, 200))
