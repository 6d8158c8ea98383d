"""Fencing and recovery (BookKeeper's LedgerRecoveryOp, ReadLastConfirmedOp with the fence
flag, and the recovery reads) as a sans-IO state machine, in the rules of `core.py`: no IO,
no clock, no randomness; `step(event, now_ms)`, `tick(now_ms)`, `take_commands()`.

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
4. close: once the re-writes reached their ack quorum, CAS CLOSED at the last entry found.
   A recovery that finds the ledger CLOSED by another recovery adopts that close, so that
   concurrent recoveries all return the same last entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.gateway.core import (
    AddSendFailed,
    BookieAddReply,
    BookieReadReply,
    CloseDone,
    CloseFailed,
    CompleteAdds,
    EnsembleChanged,
    FailAdds,
    LedgerUpdated,
    LedgerUpdateFailed,
    LedgerWriter,
    ListWritableBookies,
    RandomLike,
    ReadSendFailed,
    ReplicaCorrupt,
    SendAdds,
    SendReads,
    SendWriteLac,
    UpdateLedger,
    WritableBookies,
)
from shared.digest import DigestManager, DigestMismatch
from shared.models import LedgerMetadata, LedgerState, UpdateLedgerRequest
from shared.quorum import write_set
from shared.status import ApiCode, ApiCodes, BookieStatus, QuireError
from shared.wire import ReadItem, ReadResult

_ABSENT = frozenset({BookieStatus.NO_ENTRY, BookieStatus.NO_LEDGER})


@dataclass(frozen=True, slots=True)
class SendFence:
    """Fence the ledger on one bookie (the journal's "fence": durable before it answers)."""

    bookie_id: str


@dataclass(frozen=True, slots=True)
class FenceReply:
    bookie_id: str
    status: BookieStatus
    lac: int = -1


@dataclass(frozen=True, slots=True)
class FenceSendFailed:
    bookie_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveryDone:
    """The ledger is CLOSED; `metadata.last_entry_id` is its last entry, for good."""

    metadata: LedgerMetadata


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    """Nothing was closed; the ledger may be left IN_RECOVERY (a later recovery ends it)."""

    api: ApiCode
    detail: str


RecoveryCommand = (
    UpdateLedger
    | SendFence
    | SendReads
    | SendAdds
    | ListWritableBookies
    | EnsembleChanged
    | ReplicaCorrupt
    | RecoveryDone
    | RecoveryFailed
)
RecoveryEvent = (
    FenceReply
    | FenceSendFailed
    | BookieReadReply
    | ReadSendFailed
    | BookieAddReply
    | AddSendFailed
    | LedgerUpdated
    | LedgerUpdateFailed
    | WritableBookies
)


@dataclass(slots=True)
class _EntryProbe:
    """The answers about one entry from the bookies of its write set."""

    entry_id: int
    replicas: tuple[str, ...]
    outstanding: set[str] = field(default_factory=set)
    absent: set[str] = field(default_factory=set)
    unsure: set[str] = field(default_factory=set)  # errors, UNKNOWN, corrupt, no answer


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
        max_send_bytes: int = 1024 * 1024,
    ) -> None:
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.quorum = metadata.quorum
        self.master_key = master_key
        self._digest = digest
        self._rng = rng
        self.retry_interval_ms = retry_interval_ms
        self.recovery_timeout_ms = recovery_timeout_ms
        self.add_entry_timeout_ms = add_entry_timeout_ms
        self.max_send_bytes = max_send_bytes
        self.phase = "mark"
        self.result: LedgerMetadata | None = None
        self.error: QuireError | None = None
        self.max_lac = -1
        self._started_ms = now_ms
        self._now_ms = now_ms
        self._retry_at_ms = 0
        self._commands: list[RecoveryCommand] = []
        self._fence_lacs: dict[int, int] = {}  # ensemble index -> the LAC its fence answered
        self._fence_outstanding: set[int] = set()
        self._fenced: LedgerMetadata | None = None  # the metadata whose ensemble was fenced
        self._probe: _EntryProbe | None = None
        self._length_probe = False  # the current probe only learns the ledger length
        self._length = 0
        self.writer: LedgerWriter | None = None
        self.recovered_entries = 0
        self._start()

    @property
    def done(self) -> bool:
        return self.phase in ("done", "failed")

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
            self.phase = "mark-retry"
            return
        self.metadata = event.current  # lost the race (a writer's ensemble change, a recovery)
        self._start()

    # -- 2. fence -----------------------------------------------------------------------------

    def _start_fence(self) -> None:
        self.phase = "fence"
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
            elif event.status is BookieStatus.UNAUTHORIZED:
                self._fail(ApiCodes.UNAUTHORIZED, f"bookie {event.bookie_id} refused the key")
                return
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
        self.phase = "read"
        if self.max_lac >= 0:
            self._length_probe = True
            self._probe_entry(self.max_lac)
        else:
            self._start_writer()
            self._probe_entry(0)

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
            recovery=True,
            now_ms=self._now_ms,
        )

    def _probe_entry(self, entry_id: int) -> None:
        assert self._fenced is not None
        bookies = self._fenced.segment_for(entry_id).bookies
        replicas = tuple(bookies[i] for i in write_set(entry_id, self.quorum))
        self._probe = _EntryProbe(entry_id, replicas)
        self._ask(self._probe, replicas)

    def _ask(self, probe: _EntryProbe, bookie_ids: tuple[str, ...]) -> None:
        for bookie_id in bookie_ids:
            probe.outstanding.add(bookie_id)
            probe.unsure.discard(bookie_id)
            self._commands.append(SendReads(bookie_id, (ReadItem(self.ledger_id, probe.entry_id),)))

    def _on_read(self, event: BookieReadReply | ReadSendFailed) -> None:
        probe = self._probe
        if probe is None or probe.entry_id not in event.entry_ids:
            return  # a late answer about an entry already decided
        bookie_id = event.bookie_id
        if bookie_id not in probe.outstanding:
            return
        probe.outstanding.discard(bookie_id)
        result = None
        if isinstance(event, BookieReadReply) and event.status is BookieStatus.OK:
            result = next(
                (
                    r
                    for r in event.results
                    if r.ledger_id == self.ledger_id and r.entry_id == probe.entry_id
                ),
                None,
            )
        if result is None:
            probe.unsure.add(bookie_id)
        elif result.status is BookieStatus.OK:
            if self._on_found(probe, bookie_id, result):
                return
        elif result.status in _ABSENT:
            probe.absent.add(bookie_id)
        else:
            probe.unsure.add(bookie_id)  # UNKNOWN_LEDGER_STATE, IO_ERROR: never "absent"
        needed = self.quorum.write_quorum - self.quorum.ack_quorum + 1
        if len(probe.absent) >= needed:
            self._on_absent(probe)
        elif not probe.outstanding:
            self._retry_at_ms = self._now_ms + self.retry_interval_ms

    def _on_found(self, probe: _EntryProbe, bookie_id: str, result: ReadResult) -> bool:
        try:
            entry = self._digest.verify(result.frame, self.ledger_id, probe.entry_id)
        except DigestMismatch as exc:
            self._commands.append(ReplicaCorrupt(bookie_id, probe.entry_id, str(exc)))
            probe.unsure.add(bookie_id)
            return False
        if self._length_probe:
            self._length_probe = False
            self._length = entry.length
            self._start_writer()
            self._probe_entry(probe.entry_id + 1)
            return True
        assert self.writer is not None
        self.writer.add_recovered(entry.entry_id, entry.payload, entry.length, self._now_ms)
        self.recovered_entries += 1
        self._probe_entry(probe.entry_id + 1)
        return True

    def _on_absent(self, probe: _EntryProbe) -> None:
        self._probe = None
        if self._length_probe:
            # The entry at the fenced LAC was confirmed: it cannot be missing on this many
            # bookies unless storage lost it. Go on, the length stays unknown (0).
            self._length_probe = False
            self._start_writer()
            self._probe_entry(probe.entry_id + 1)
            return
        self.phase = "close"
        assert self.writer is not None
        self.writer.start_close()

    # -- events, time, outputs ----------------------------------------------------------------

    def step(self, event: RecoveryEvent, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        if self.done:
            return
        match event:
            case LedgerUpdated() | LedgerUpdateFailed() if self.phase in ("mark", "mark-retry"):
                self._on_marked(event)
            case FenceReply() | FenceSendFailed():
                if self.phase == "fence":
                    self._on_fence(event)
            case BookieReadReply() | ReadSendFailed():
                if self.phase == "read":
                    self._on_read(event)
            case (
                BookieAddReply()
                | AddSendFailed()
                | LedgerUpdated()
                | LedgerUpdateFailed()
                | WritableBookies()
            ):
                if self.writer is not None:
                    self.writer.step(event)
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
                f"{self.recovery_timeout_ms} ms (phase {self.phase})",
            )
            return
        if self._retry_at_ms and now_ms >= self._retry_at_ms:
            self._retry_at_ms = 0
            self._retry()
        if self.writer is not None:
            self.writer.tick(now_ms)
        self._collect_writer()

    def _retry(self) -> None:
        if self.phase == "mark-retry":
            self.phase = "mark"
            self._start()
        elif self.phase == "fence":
            self._send_fences()
        elif self.phase == "read" and self._probe is not None and not self._probe.outstanding:
            again = tuple(b for b in self._probe.replicas if b not in self._probe.absent)
            self._ask(self._probe, again)

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
        self.phase = "done"
        self.result = metadata
        self.metadata = metadata
        self._commands.append(RecoveryDone(metadata))

    def _fail(self, api: ApiCode, detail: str) -> None:
        if self.done:
            return
        self.phase = "failed"
        self.error = QuireError(api, detail)
        if self.writer is not None:
            self.writer.abort(api, detail)
            self.writer.take_commands()
        self._commands.append(RecoveryFailed(api, detail))

    def take_commands(self) -> list[RecoveryCommand]:
        commands, self._commands = self._commands, []
        return commands
