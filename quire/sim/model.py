"""The simulated world: a network, bookies, a metadata store and clients of several ledgers
at once, all driven by one seeded random generator and one simulated clock, around the REAL
protocol code.

What is real here: the client protocol's LedgerWriter (with its flow control per
bookie), LedgerRecovery and LedgerReader (`shared.protocol`) and the bookie's rules
(`shared.bookie.rules`: add admission, the fence and write_lac records, the read answer
for an absent entry) over BookieLedgerState and the journal's record types. What is
simulated: the network (drop, delay and so reorder, duplicate, partition), the bookies'
disks (a crash loses what was not yet synced; a restarted bookie's ledgerstore lags
behind the journal for a while, and the real authority rule decides from the two
positions what it may answer), the metadata store (CAS on a version, with injected
foreign writes and lost answers) and the clock.

The parts live in their own modules: the bookie (`quire.sim.bookie`), the metadata row of
a ledger (`quire.sim.metadata`), the clients running the cores (`quire.sim.clients`) and
a ledger with its clients and its invariants (`quire.sim.ledger`). `SimConfig.ledgers`
ledgers share the bookies, the network, the metadata store and the clock, so their
per-ledger bookie state and their writers' deadlines interleave; faults hit whatever they
hit, across ledgers.

Pure (it is checked like the cores): no IO, no clock, no `random` import; the caller
passes a seeded generator. The same seed gives the same event log, byte for byte.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from quire.sim.bookie import ReadLac, SimBookie
from quire.sim.clients import Client
from quire.sim.ledger import SimLedger
from shared.autorecovery import bookies_to_mark
from shared.bookie.rules import BookieLedgerState
from shared.protocol.flow import DEFAULT_MAX_ADD_REQUESTS_PER_BOOKIE
from shared.protocol.messages import (
    BookieAddReply,
    BookieReadReply,
    FenceReply,
    LedgerUpdated,
    LedgerUpdateFailed,
    SendAdds,
    SendFence,
    SendReads,
    SendWriteLac,
    UpdateLedger,
    WritableBookies,
)
from shared.protocol.recovery import LedgerRecovery
from shared.protocol.replication import LedgerReplication
from shared.protocol.writer import LedgerWriter


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
    ledgers: int = 1  # written, fenced, recovered and read at once over the same bookies
    bookies: int = 5
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    entries: int = 40
    duration_ms: int = 1_500
    settle_ms: int = 1_500
    recoveries: int = 2  # recovery clients that start at random times
    close: bool = False  # each writer closes at some point
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
    # AutoRecovery: a bookie of the first ledger's ensemble is lost for good while the
    # writers run (when a spare bookie exists and Qa >= 2, so that no acknowledged entry
    # had its only copy there); the auditor marks every ledger with a segment on it after
    # lost_bookie_recovery_delay_ms, and each ledger's replicator repairs it.
    lose_bookie: bool = False
    lost_bookie_recovery_delay_ms: int = 20
    open_ledger_grace_ms: int = 300  # BookKeeper's openLedgerRereplicationGracePeriod
    rereplication_entry_batch_size: int = 4
    replication_class: type[LedgerReplication] = LedgerReplication


# -- the world ----------------------------------------------------------------------------


class World:
    """The event loop of one simulated run. `step()` runs the next event and checks the
    invariants of every ledger; the log is the run's transcript."""

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
        self.loses_bookie = (
            config.lose_bookie and config.bookies > config.ensemble_size and config.ack_quorum >= 2
        )
        self.lost: set[str] = set()  # bookies gone for good
        self.ledgers: dict[int, SimLedger] = {}
        for ledger_id in range(1, config.ledgers + 1):
            ensemble = rng.sample(sorted(self.bookies), config.ensemble_size)
            self.ledgers[ledger_id] = SimLedger(self, ledger_id, ensemble)
        ensembles = " ".join(
            f"{ledger.tag}ensemble={ledger.metadata.ledger.segments[0].bookies}"
            for ledger in self.ledgers.values()
        )
        self.log(
            f"seed {config.seed} E={config.ensemble_size} Qw={config.write_quorum} "
            f"Qa={config.ack_quorum} bookies={config.bookies} {ensembles}"
        )
        self.clients: dict[str, Client] = {
            client.name: client for ledger in self.ledgers.values() for client in ledger.clients()
        }
        self.events = 0
        self.healed = False
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
        # The request names the client's ledger and carries its master key, as the
        # gateway's do; an add's frames and a read's items name their ledger themselves.
        ledger = self.clients[client].ledger
        if isinstance(command, SendReads):
            self.check(
                all(item.ledger_id == ledger.ledger_id for item in command.items),
                f"{client} sent another ledger's entries: {command.items}",
            )
        bookie.handle(client, rid, ledger.ledger_id, ledger.master_key, command)

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
            ledger_id = command.request.ledger_id
            self.check(
                ledger_id == client.ledger.ledger_id,
                f"{client.name} updated ledger {ledger_id}, not its own",
            )
            ledger = self.ledgers[ledger_id]
            answer: Any = ledger.metadata.update(command.request, client.name)
            ledger.check_acked_within_close()
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

    # -- running

    def schedule_activity(self) -> None:
        config = self.config
        for ledger in self.ledgers.values():
            ledger.schedule_activity()
        self.at(0, self._tick)
        if config.random_faults:
            self._schedule_random_faults()
        for t, action, argument in config.script:
            self.at(t, self._scripted, action, argument)
        if self.loses_bookie:
            lose_at = self.rng.randint(config.duration_ms // 4, config.duration_ms * 3 // 4)
            self.at(lose_at, self._lose)
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
                self._scripted_ledger().recoveries[argument].start()
            case "close":
                self._scripted_ledger().close()
            case _:
                raise AssertionError(f"unknown scripted action {action}")

    def _scripted_ledger(self) -> SimLedger:
        """Scripts drive the first ledger (the scenarios run one)."""
        return self.ledgers[1]

    def _bookie(self, name: str) -> str:
        """`ensemble:I` is the I-th bookie of the first segment (the seed picks it)."""
        if name.startswith("ensemble:"):
            segments = self._scripted_ledger().metadata.ledger.segments
            return segments[0].bookies[int(name.split(":")[1])]
        return name

    def _crash(self, bookie_id: str, down_ms: int) -> None:
        bookie = self.bookies[bookie_id]
        if not bookie.up:
            return
        bookie.crash()
        if down_ms >= 0:
            self.at(down_ms, self._restart, bookie_id)

    def _restart(self, bookie_id: str) -> None:
        if not self.bookies[bookie_id].up and bookie_id not in self.lost:
            self.bookies[bookie_id].restart()

    def _lose(self) -> None:
        """A bookie of the first ledger's ensemble dies for good (its disk with it)."""
        first = self.ledgers[1].metadata.ledger.segments[0].bookies
        bookie_id = self.rng.choice(sorted(first))
        self.lost.add(bookie_id)
        self.log(f"{bookie_id} LOST for good")
        self._crash(bookie_id, -1)
        self.at(self.config.lost_bookie_recovery_delay_ms, self._audit)

    def _audit(self) -> None:
        """The auditor's decision on a lost bookie (the auditor service's
        `bookies_to_mark`, BookKeeper's Auditor.handleLostBookies): mark every ledger with
        a segment that names it."""
        for ledger in self.ledgers.values():
            if bookies_to_mark(ledger.metadata.ledger, self.lost):
                self.log(f"auditor marks {ledger.tag}ledger {ledger.ledger_id}")
                assert ledger.replicator is not None
                ledger.replicator.mark()

    def _partition(self, client: str, bookie_id: str, ms: int) -> None:
        if self.healed:
            return
        self.partitions[(client, bookie_id)] = self.now_ms + ms
        self.log(f"partition {client} | {bookie_id} for {ms} ms")

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
        self.check(self.events < self.config.max_events, "the run does not settle")
        return True

    def run(self) -> None:
        self.schedule_activity()
        while self.step():
            pass
        self.finish()

    def finish(self) -> None:
        """After the faults: recover every ledger nobody closed, then each must hold every
        entry it acknowledged, closed for good, readable by anyone."""
        finals = [f for ledger in self.ledgers.values() if (f := ledger.final_recovery())]
        if finals:
            self.clients.update({final.name: final for final in finals})
            self.tick_until_ms = self.now_ms + 60_000
            self.at(0, self._tick)
            for final in finals:
                final.start()
            while self.step() and any(final.result is None for final in finals):
                pass
        if self.lost:
            self._repair_all()
        for ledger in self.ledgers.values():
            ledger.check_end()

    def _repair_all(self) -> None:
        """After the faults, audit again (a writer may have put the lost bookie in a new
        segment while its lease ran) and let the replicators finish."""
        replicators = [ledger.replicator for ledger in self.ledgers.values()]
        self.tick_until_ms = self.now_ms + 60_000
        self.at(0, self._tick)
        self._audit()
        while self.step() and any(
            r is not None and (r.busy or r.retry_scheduled) for r in replicators
        ):
            pass


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
