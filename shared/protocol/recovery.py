"""Fencing and recovery (BookKeeper's LedgerRecoveryOp, ReadLastConfirmedOp with the fence
flag, and the recovery reads) as a sans-IO state machine, in the rules of the package
(`shared.protocol`): no IO, no clock, no randomness; `step(event, now_ms)`, `tick(now_ms)`,
`take_commands()`. Its phases (`RecoveryPhase`) change only as `_TRANSITIONS` allows.

The protocol, in order:
1. mark: CAS the metadata to IN_RECOVERY (a CLOSED ledger is done at once: its last entry).
2. fence: ask every bookie of the last segment to fence the ledger; each answer carries the
   bookie's durable LAC. Done when every write set has Qw - Qa + 1 answers: from then on
   no write set can gather Qa acks for the old writer, so nothing new is acknowledged.
3. read: from max(LAC) + 1, read each entry from its whole write set (of the fenced
   ensemble). Any good copy is re-written to the full write set (recovery adds pass the
   fence); the first entry that Qw - Qa + 1 bookies say they do not have (NO_ENTRY or
   NO_LEDGER: UNKNOWN never counts) is past the end. An acknowledged entry reached Qa
   bookies, so at most Qw - Qa of its write set can lack it: it is never past the end.
   As BookKeeper's recoveryReadBatchSize, a window of `read_batch_size` entries is read
   at once (one SendReads per bookie for all of them); entries are re-written strictly in
   order, and nothing at or past the first absent entry is re-written, whatever was found.
4. close: once the re-writes reached their ack quorum, CAS CLOSED at the last entry found.
   A recovery that finds the ledger CLOSED by another recovery adopts that close, so that
   concurrent recoveries all return the same last entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from shared.digest import DigestManager, DigestMismatch, EntryFrame
from shared.models import LedgerMetadata, LedgerState, UpdateLedgerRequest
from shared.protocol.ensemble import RandomLike
from shared.protocol.flow import DEFAULT_MAX_SEND_BYTES
from shared.protocol.messages import (
    ABSENT,
    AddSendFailed,
    BookieAddReply,
    BookieReadReply,
    CloseDone,
    CloseFailed,
    CompleteAdds,
    FailAdds,
    FenceReply,
    FenceSendFailed,
    LedgerUpdated,
    LedgerUpdateFailed,
    ReadSendFailed,
    RecoveryCommand,
    RecoveryDone,
    RecoveryEvent,
    RecoveryFailed,
    ReplicaCorrupt,
    SendFence,
    SendReads,
    SendWriteLac,
    UpdateLedger,
    WritableBookies,
)
from shared.protocol.placement import PlacementPolicy
from shared.protocol.writer import LedgerWriter
from shared.quorum import write_set
from shared.status import ApiCode, ApiCodes, BookieStatus, QuireError
from shared.wire import ReadItem, ReadResult


class RecoveryPhase(Enum):
    MARK = "mark"  # the CAS to IN_RECOVERY is in flight
    MARK_RETRY = "mark-retry"  # its outcome was unknown: marked again after a pause
    FENCE = "fence"
    READ = "read"  # reading forward and re-writing
    CLOSE = "close"  # the writer closes at the last entry found
    DONE = "done"
    FAILED = "failed"


# Every phase change a recovery may make, and no other (h11's `_state.py`): `_enter` raises
# on a change this table does not list. A timeout or a refused key fails any live phase.
_TRANSITIONS: dict[RecoveryPhase, frozenset[RecoveryPhase]] = {
    RecoveryPhase.MARK: frozenset(
        {RecoveryPhase.FENCE, RecoveryPhase.MARK_RETRY, RecoveryPhase.DONE, RecoveryPhase.FAILED}
    ),
    RecoveryPhase.MARK_RETRY: frozenset({RecoveryPhase.MARK, RecoveryPhase.FAILED}),
    RecoveryPhase.FENCE: frozenset({RecoveryPhase.READ, RecoveryPhase.FAILED}),
    RecoveryPhase.READ: frozenset({RecoveryPhase.CLOSE, RecoveryPhase.FAILED}),
    RecoveryPhase.CLOSE: frozenset({RecoveryPhase.DONE, RecoveryPhase.FAILED}),
    RecoveryPhase.DONE: frozenset(),
    RecoveryPhase.FAILED: frozenset(),
}
_FINAL = frozenset({RecoveryPhase.DONE, RecoveryPhase.FAILED})
_MARKING = frozenset({RecoveryPhase.MARK, RecoveryPhase.MARK_RETRY})
# A fence answer still counts while reading: a late "fenced" makes that bookie's "no" count.
_FENCING = frozenset({RecoveryPhase.FENCE, RecoveryPhase.READ})


@dataclass(slots=True)
class _EntryProbe:
    """The answers about one entry from the bookies of its write set."""

    entry_id: int
    replicas: tuple[str, ...]
    outstanding: set[str] = field(default_factory=set)
    absent: set[str] = field(default_factory=set)
    unsure: set[str] = field(default_factory=set)  # errors, UNKNOWN, corrupt, no answer
    found: EntryFrame | None = None  # a verified good copy
    missing: bool = False  # Qw - Qa + 1 bookies of its write set do not have it

    @property
    def decided(self) -> bool:
        return self.found is not None or self.missing


class LedgerRecovery:
    """Recover one ledger: fence, find its true last entry, re-replicate the tail, close."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        master_key: bytes,
        digest: DigestManager,
        now_ms: int,
        *,
        rng: RandomLike | None = None,
        retry_interval_ms: int = 200,
        recovery_timeout_ms: int = 30_000,
        add_entry_timeout_ms: int = 10_000,
        max_send_bytes: int = DEFAULT_MAX_SEND_BYTES,
        read_batch_size: int = 64,
        placement: PlacementPolicy | None = None,
    ) -> None:
        assert read_batch_size >= 1
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.quorum = metadata.quorum
        self.master_key = master_key
        self._digest = digest
        self._rng = rng
        self._placement = placement
        self.retry_interval_ms = retry_interval_ms
        self.recovery_timeout_ms = recovery_timeout_ms
        self.add_entry_timeout_ms = add_entry_timeout_ms
        self.max_send_bytes = max_send_bytes
        self.read_batch_size = read_batch_size
        # Re-writes not yet acknowledged beyond which no new entry is read (back-pressure).
        self.max_pending_rewrites = 2 * read_batch_size
        self.phase = RecoveryPhase.MARK
        self.result: LedgerMetadata | None = None
        self.error: QuireError | None = None
        self.max_lac = -1
        self._started_ms = now_ms
        self._now_ms = now_ms
        self._retry_at_ms = 0
        self._commands: list[RecoveryCommand] = []
        self._fence_lacs: dict[int, int] = {}  # ensemble index -> the LAC its fence answered
        self._fence_outstanding: set[int] = set()
        self._fenced_ids: set[str] = set()  # the bookies that answered the fence OK
        self._fenced: LedgerMetadata | None = None  # the metadata whose ensemble was fenced
        # The read window: entries being read, or read and waiting for their turn to be
        # re-written (in entry order). At most read_batch_size, from _next_rewrite on.
        self._probes: dict[int, _EntryProbe] = {}
        self._next_probe = 0  # the next entry to start reading
        self._next_rewrite = 0  # the lowest entry not yet handed to the writer
        self._end: int | None = None  # the lowest entry found missing: past the end
        self._outbox: dict[str, list[int]] = {}  # bookie -> entries to ask it, in order
        self._length = 0
        self.writer: LedgerWriter | None = None
        self.recovered_entries = 0
        self._start()

    @property
    def done(self) -> bool:
        return self.phase in _FINAL

    @property
    def fenced(self) -> bool:
        """This recovery fenced the ledger: it did not find it closed already."""
        return self._fenced is not None

    def _enter(self, phase: RecoveryPhase) -> None:
        """The one place the phase changes: a change `_TRANSITIONS` does not allow is a bug."""
        if phase not in _TRANSITIONS[self.phase]:
            raise AssertionError(f"recovery phase {self.phase.value} -> {phase.value} not allowed")
        self.phase = phase

    # -- 1. mark IN_RECOVERY ------------------------------------------------------------------

    def _start(self) -> None:
        match self.metadata.state:
            case LedgerState.CLOSED:
                self._finish(self.metadata)
            case LedgerState.IN_RECOVERY:
                self._start_fence()
            case LedgerState.OPEN:
                self._commands.append(
                    UpdateLedger(
                        UpdateLedgerRequest(
                            ledger_id=self.ledger_id,
                            expected_version=self.metadata.version,
                            state=LedgerState.IN_RECOVERY,
                        )
                    )
                )

    def _on_marked(self, event: LedgerUpdated | LedgerUpdateFailed) -> None:
        if isinstance(event, LedgerUpdated):
            self.metadata = event.metadata
            self._start_fence()
            return
        if event.current is None:
            self._retry_at_ms = self._now_ms + self.retry_interval_ms
            self._enter(RecoveryPhase.MARK_RETRY)
            return
        self.metadata = event.current  # lost the race (a writer's ensemble change, a recovery)
        self._start()

    # -- 2. fence -----------------------------------------------------------------------------

    def _start_fence(self) -> None:
        self._enter(RecoveryPhase.FENCE)
        self._fenced = self.metadata
        self._send_fences()

    def _send_fences(self) -> None:
        assert self._fenced is not None
        for index, bookie_id in enumerate(self._fenced.segments[-1].bookies):
            if index not in self._fence_lacs and index not in self._fence_outstanding:
                self._fence_outstanding.add(index)
                self._commands.append(SendFence(bookie_id))

    def _on_fence(self, event: FenceReply | FenceSendFailed) -> None:
        assert self._fenced is not None
        bookies = self._fenced.segments[-1].bookies
        if event.bookie_id not in bookies:
            return
        index = bookies.index(event.bookie_id)
        self._fence_outstanding.discard(index)
        if isinstance(event, FenceReply):
            if event.status is BookieStatus.OK:
                self._fence_lacs[index] = event.lac
                self._fenced_ids.add(event.bookie_id)
            elif event.status is BookieStatus.UNAUTHORIZED:
                self._fail(ApiCodes.UNAUTHORIZED, f"bookie {event.bookie_id} refused the key")
                return
        if self.phase is not RecoveryPhase.FENCE:
            return  # a late fence (reading already): it only makes that bookie's "no" count
        if self._covered(set(self._fence_lacs)):
            segment_start = self._fenced.segments[-1].first_entry_id
            # Every entry before the last segment was confirmed before it was created.
            self.max_lac = max([*self._fence_lacs.values(), segment_start - 1])
            self._start_read()
        elif not self._fence_outstanding:
            self._retry_at_ms = self._now_ms + self.retry_interval_ms

    def _covered(self, indexes: set[int]) -> bool:
        """Every write set of the fenced ensemble has Qw - Qa + 1 of `indexes`."""
        needed = self.quorum.write_quorum - self.quorum.ack_quorum + 1
        return all(
            len(indexes.intersection(write_set(first, self.quorum))) >= needed
            for first in range(self.quorum.ensemble_size)
        )

    # -- 3. read forward and re-write -----------------------------------------------------------

    def _start_read(self) -> None:
        self._enter(RecoveryPhase.READ)
        if self.max_lac >= 0:
            # The entry at the LAC is read first only for the ledger length (needed when
            # nothing follows it); the writer starts once it is decided.
            self._next_probe = self._next_rewrite = self.max_lac
        else:
            self._start_writer()
            self._next_probe = self._next_rewrite = 0
        self._fill_window()

    def _start_writer(self) -> None:
        assert self._fenced is not None
        self.writer = LedgerWriter(
            self.metadata,
            self.master_key,
            self._digest,
            lac=self.max_lac,
            last_entry_id=self.max_lac,
            length=self._length,
            add_entry_timeout_ms=self.add_entry_timeout_ms,
            max_send_bytes=self.max_send_bytes,
            rng=self._rng,
            placement=self._placement,
            recovery=True,
            now_ms=self._now_ms,
        )

    def _fill_window(self) -> None:
        """Start reading entries up to read_batch_size past the next one to re-write,
        never past the end once known, and not while too many re-writes are unanswered."""
        if self.phase is not RecoveryPhase.READ:
            return
        limit = self._next_rewrite + self.read_batch_size
        if self._end is not None:
            limit = min(limit, self._end)
        writer = self.writer
        while self._next_probe < limit and (
            writer is None or writer.pending_count < self.max_pending_rewrites
        ):
            self._probe_entry(self._next_probe)
            self._next_probe += 1

    def _probe_entry(self, entry_id: int) -> None:
        assert self._fenced is not None
        bookies = self._fenced.segment_for(entry_id).bookies
        replicas = tuple(bookies[i] for i in write_set(entry_id, self.quorum))
        probe = _EntryProbe(entry_id, replicas)
        self._probes[entry_id] = probe
        self._ask(probe, replicas)

    def _ask(self, probe: _EntryProbe, bookie_ids: tuple[str, ...]) -> None:
        for bookie_id in bookie_ids:
            probe.outstanding.add(bookie_id)
            probe.unsure.discard(bookie_id)
            self._outbox.setdefault(bookie_id, []).append(probe.entry_id)

    def _on_read(self, event: BookieReadReply | ReadSendFailed) -> None:
        bookie_id = event.bookie_id
        if isinstance(event, ReadSendFailed) or event.status is not BookieStatus.OK:
            for entry_id in event.entry_ids:
                self._on_answer(entry_id, bookie_id, None)
        else:
            asked = set(event.entry_ids)
            answered = {
                r.entry_id: r
                for r in event.results
                if r.ledger_id == self.ledger_id and r.entry_id in asked
            }
            for entry_id in event.entry_ids:
                result = answered.get(entry_id)
                if result is None and answered:
                    self._ask_again(entry_id, bookie_id)
                else:
                    self._on_answer(entry_id, bookie_id, result)
        self._advance()

    def _ask_again(self, entry_id: int, bookie_id: str) -> None:
        """A partial answer (the reply had to fit one message): ask that bookie again."""
        probe = self._probes.get(entry_id)
        if probe is not None and not probe.decided and bookie_id in probe.outstanding:
            self._outbox.setdefault(bookie_id, []).append(entry_id)

    def _on_answer(self, entry_id: int, bookie_id: str, result: ReadResult | None) -> None:
        """One bookie's answer about one entry; None: no usable answer."""
        probe = self._probes.get(entry_id)
        if probe is None or probe.decided or bookie_id not in probe.outstanding:
            return  # a late answer about an entry already decided, or past the end
        probe.outstanding.discard(bookie_id)
        if result is not None and result.status is BookieStatus.OK:
            try:
                probe.found = self._digest.verify(result.frame, self.ledger_id, entry_id)
                return
            except DigestMismatch as exc:
                self._commands.append(ReplicaCorrupt(bookie_id, entry_id, str(exc)))
                probe.unsure.add(bookie_id)
        elif self._counts_as_absent(entry_id, bookie_id, result):
            probe.absent.add(bookie_id)
        else:
            # UNKNOWN_LEDGER_STATE, IO_ERROR: never "absent"; nor an unfenced bookie's "no".
            probe.unsure.add(bookie_id)
        needed = self.quorum.write_quorum - self.quorum.ack_quorum + 1
        if len(probe.absent) >= needed:
            self._on_missing(probe)
        elif not probe.outstanding and not self._retry_at_ms:
            self._retry_at_ms = self._now_ms + self.retry_interval_ms

    def _counts_as_absent(self, entry_id: int, bookie_id: str, result: ReadResult | None) -> bool:
        """The bookie says it does not have the entry (it answered, and knows), and it is
        fenced, so it never will: an unfenced one may still take the old writer's add (one
        resent after an ensemble change the writer made before the fence). BookKeeper gets
        the same from its recovery reads, which fence the bookies they read from."""
        if result is None or result.status not in ABSENT:
            return False
        return entry_id == self.max_lac or bookie_id in self._fenced_ids

    def _on_missing(self, probe: _EntryProbe) -> None:
        probe.missing = True
        if probe.entry_id == self.max_lac:
            # The entry at the fenced LAC was confirmed: it cannot be missing on this many
            # bookies unless storage lost it. Go on, the length stays unknown (0).
            return
        if self._end is None or probe.entry_id < self._end:
            self._end = probe.entry_id
            # Past the end: whatever is found there was never acknowledged; not re-written.
            for entry_id in [e for e in self._probes if e > probe.entry_id]:
                del self._probes[entry_id]

    def _advance(self) -> None:
        """Hand the decided entries at the head of the window to the writer, in order;
        close once every entry below the end was handed over."""
        if self.phase is not RecoveryPhase.READ:
            return
        while True:
            if self._end is not None and self.writer is not None:
                if self._next_rewrite >= self._end:
                    self._start_close()
                    return
            probe = self._probes.get(self._next_rewrite)
            if probe is None or not probe.decided:
                break
            del self._probes[probe.entry_id]
            self._next_rewrite += 1
            if self.writer is None:  # the entry at the fenced LAC: only its length
                self._length = probe.found.length if probe.found is not None else 0
                self._start_writer()
                continue
            assert probe.found is not None, "a missing entry below the end"
            entry = probe.found
            self.writer.add_recovered(entry.entry_id, entry.payload, entry.length, self._now_ms)
            self.recovered_entries += 1
        self._fill_window()

    def _start_close(self) -> None:
        self._enter(RecoveryPhase.CLOSE)
        self._probes.clear()
        self._outbox.clear()
        assert self.writer is not None
        self.writer.start_close()

    # -- events, time, outputs ----------------------------------------------------------------

    def step(self, event: RecoveryEvent, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        if self.done:
            return
        match event:
            case LedgerUpdated() | LedgerUpdateFailed() if self.phase in _MARKING:
                self._on_marked(event)
            case FenceReply() | FenceSendFailed():
                if self.phase in _FENCING:
                    self._on_fence(event)
            case BookieReadReply() | ReadSendFailed():
                if self.phase is RecoveryPhase.READ:
                    self._on_read(event)
            case (
                BookieAddReply()
                | AddSendFailed()
                | LedgerUpdated()
                | LedgerUpdateFailed()
                | WritableBookies()
            ):
                if self.writer is not None:
                    self.writer.step(event, self._now_ms)
                    self._fill_window()  # acknowledged re-writes make room
            case _:
                raise AssertionError(f"unknown event {event!r}")
        self._collect_writer()

    def tick(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        if self.done:
            return
        if now_ms - self._started_ms >= self.recovery_timeout_ms:
            self._fail(
                ApiCodes.TIMEOUT,
                f"recovery of ledger {self.ledger_id} did not finish within "
                f"{self.recovery_timeout_ms} ms (phase {self.phase.value})",
            )
            return
        if self._retry_at_ms and now_ms >= self._retry_at_ms:
            self._retry_at_ms = 0
            self._retry()
        if self.writer is not None:
            self.writer.tick(now_ms)
        self._collect_writer()

    def _retry(self) -> None:
        if self.phase is RecoveryPhase.MARK_RETRY:
            self._enter(RecoveryPhase.MARK)
            self._start()
        elif self.phase is RecoveryPhase.FENCE:
            self._send_fences()
        elif self.phase is RecoveryPhase.READ:
            stalled = [p for p in self._probes.values() if not p.decided and not p.outstanding]
            for probe in stalled:
                self._ask(probe, tuple(b for b in probe.replicas if b not in probe.absent))
            if stalled:
                self._send_fences()  # the bookies not fenced yet: their "no" may count then

    def _collect_writer(self) -> None:
        writer = self.writer
        if writer is None:
            return
        for command in writer.take_commands():
            match command:
                case CompleteAdds() | FailAdds() | SendWriteLac():
                    pass  # internal to the recovery: a failure shows as writer.broken
                case CloseDone():
                    self._finish(command.metadata)
                case CloseFailed():
                    self._fail(command.api, command.detail)
                case _:
                    self._commands.append(command)
        if writer.broken is not None and not self.done and writer.closed is None:
            self._fail(writer.broken.api, f"recovery of {self.ledger_id}: {writer.broken.detail}")

    def _finish(self, metadata: LedgerMetadata) -> None:
        self._enter(RecoveryPhase.DONE)
        self._outbox.clear()
        self.result = metadata
        self.metadata = metadata
        self._commands.append(RecoveryDone(metadata))

    def _fail(self, api: ApiCode, detail: str) -> None:
        if self.done:
            return
        self._enter(RecoveryPhase.FAILED)
        self._outbox.clear()
        self.error = QuireError(api, detail)
        if self.writer is not None:
            self.writer.abort(api, detail)
            self.writer.take_commands()
        self._commands.append(RecoveryFailed(api, detail))

    def _still_asking(self, entry_id: int, bookie_id: str) -> bool:
        """Not decided (nor dropped past the end) since it was put in the outbox."""
        probe = self._probes.get(entry_id)
        return probe is not None and not probe.decided and bookie_id in probe.outstanding

    def take_commands(self) -> list[RecoveryCommand]:
        sends: list[RecoveryCommand] = []
        for bookie_id, asked in self._outbox.items():
            entry_ids = [e for e in asked if self._still_asking(e, bookie_id)]
            for start in range(0, len(entry_ids), self.read_batch_size):
                chunk = entry_ids[start : start + self.read_batch_size]
                items = tuple(ReadItem(self.ledger_id, e) for e in chunk)
                sends.append(SendReads(bookie_id, items))
        self._outbox.clear()
        commands, self._commands = self._commands, []
        return [*sends, *commands]
