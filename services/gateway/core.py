"""The client quorum protocol (BookKeeper's LedgerHandle and PendingReadOp) as sans-IO state
machines: everything that decides what the gateway sends to bookies, and when an add or a
read is done, lives here.

Rules of this file (h11's and raft's):
- No IO, no clock, no randomness: time comes in as `now_ms`, randomness as a `random.Random`
  the caller seeded. The driver (`services.gateway.ledgers`) does the sending.
- Input is `step(event)` (a bookie answered, a send failed) and `tick(now_ms)` (time passed);
  output is `take_commands()`: what the driver must now send, complete or fail, in order.
- A user error raises `QuireError` at once; a broken invariant raises `AssertionError`.

Issue 2 scope: one segment per ledger, no ensemble change. Without ensemble change a bookie
failure is tolerated while every pending entry can still reach its ack quorum (Qw > Qa);
once one cannot, the handle is broken and every pending and later add fails, as in
BookKeeper's `errorOutPendingAdds`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shared.digest import DigestManager, DigestMismatch
from shared.models import LedgerMetadata
from shared.quorum import AckSet, QuorumSpec, read_order, write_set
from shared.status import BOOKIE_STATUS_TO_API, ApiCode, ApiCodes, BookieStatus, QuireError
from shared.wire import AddItem, AddResult, ReadItem, ReadResult

# Bounds on what one SendAdds / SendReads carries (the driver also bounds bytes).
MAX_ITEMS_PER_SEND = 4096
DEFAULT_MAX_SEND_BYTES = 1024 * 1024
DEFAULT_READ_BATCH_ENTRIES = 64
# Fatal for a writer whatever the quorum: BookKeeper's unrecoverable add errors.
_UNRECOVERABLE_ADD = frozenset({BookieStatus.FENCED, BookieStatus.UNAUTHORIZED})
_ABSENT = frozenset({BookieStatus.NO_ENTRY, BookieStatus.NO_LEDGER})


class Signer(Protocol):
    def sign(
        self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes
    ) -> bytes: ...


def api_for_status(status: BookieStatus) -> ApiCode:
    """The one table (shared.status) decides what a bookie status means to the user."""
    return BOOKIE_STATUS_TO_API.get(status, ApiCodes.INTERNAL)


def choose_ensemble(writable_bookie_ids: Iterable[str], ensemble_size: int, rng) -> list[str]:
    """`ensemble_size` distinct bookies picked at random (BookKeeper's default placement);
    `rng` is a seeded `random.Random`. Sorted input makes a seed reproduce the choice."""
    candidates = sorted(set(writable_bookie_ids))
    if ensemble_size < 1:
        raise QuireError(ApiCodes.INVALID_ARGUMENT, "ensemble_size must be at least 1")
    if len(candidates) < ensemble_size:
        raise QuireError(
            ApiCodes.NOT_ENOUGH_BOOKIES,
            f"ensemble_size {ensemble_size} needs as many writable bookies; "
            f"{len(candidates)} are writable",
        )
    return rng.sample(candidates, ensemble_size)


# -- writer events and commands ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BookieAddReply:
    """A bookie answered one SendAdds: `status` is the batch status; when it is OK, `results`
    holds one status per entry (an entry sent but missing from them counts as IO_ERROR)."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    status: BookieStatus
    results: tuple[AddResult, ...] = ()


@dataclass(frozen=True, slots=True)
class AddSendFailed:
    """A SendAdds got no answer (timeout, no responder, undecodable reply)."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class SendAdds:
    bookie_id: str
    entry_ids: tuple[int, ...]
    items: tuple[AddItem, ...]


@dataclass(frozen=True, slots=True)
class CompleteAdds:
    """Entries first..last are acknowledged; `lac` is the new last add confirmed (== last)."""

    first_entry_id: int
    last_entry_id: int
    lac: int
    length: int


@dataclass(frozen=True, slots=True)
class FailAdds:
    first_entry_id: int
    last_entry_id: int
    api: ApiCode
    detail: str


@dataclass(slots=True)
class _PendingAdd:
    entry_id: int
    length: int
    frame: bytes
    added_at_ms: int
    acks: AckSet
    failed: set[int] = field(default_factory=set)


class LedgerWriter:
    """The writer handle of one ledger: assigns entry ids, replicates, confirms in order."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        master_key: bytes,
        signer: Signer,
        *,
        lac: int = -1,
        last_entry_id: int = -1,
        length: int = 0,
        add_entry_timeout_ms: int = 10_000,
        max_send_bytes: int = DEFAULT_MAX_SEND_BYTES,
    ) -> None:
        assert lac == last_entry_id, "a new writer starts with nothing pending"
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.quorum: QuorumSpec = metadata.quorum
        self.master_key = master_key
        self._signer = signer
        self.lac = lac
        self.last_entry_id = last_entry_id
        self.length = length  # of every entry added, confirmed or not
        self.confirmed_length = length  # of the entries up to the LAC
        self.add_entry_timeout_ms = add_entry_timeout_ms
        self.max_send_bytes = max_send_bytes
        self.broken: QuireError | None = None
        self.closing = False
        self._pending: dict[int, _PendingAdd] = {}
        self._outbox: dict[str, list[tuple[int, AddItem]]] = {}
        self._commands: list[SendAdds | CompleteAdds | FailAdds] = []

    # -- inputs -------------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def add(self, payloads: Sequence[bytes], now_ms: int) -> tuple[int, int]:
        """Queue `payloads` as the next entries; their (first, last) entry ids."""
        assert payloads, "add needs at least one payload"
        if self.broken is not None:
            raise QuireError(self.broken.api, self.broken.detail)
        if self.closing:
            raise QuireError(ApiCodes.LEDGER_CLOSED, f"ledger {self.ledger_id} is closing")
        first = self.last_entry_id + 1
        for payload in payloads:
            self._add_one(payload, now_ms)
        return first, self.last_entry_id

    def _add_one(self, payload: bytes, now_ms: int) -> None:
        entry_id = self.last_entry_id + 1
        self.last_entry_id = entry_id
        self.length += len(payload)
        # The LAC rides on every add: the LAC known when the entry is sent.
        frame = self._signer.sign(self.ledger_id, entry_id, self.lac, self.length, payload)
        self._pending[entry_id] = _PendingAdd(
            entry_id, self.length, frame, now_ms, AckSet(entry_id, self.quorum)
        )
        bookies = self.metadata.segment_for(entry_id).bookies
        item = AddItem(0, self.master_key, frame)
        for index in write_set(entry_id, self.quorum):
            self._outbox.setdefault(bookies[index], []).append((entry_id, item))

    def step(self, event: BookieAddReply | AddSendFailed) -> None:
        match event:
            case BookieAddReply():
                self._on_reply(event)
            case AddSendFailed():
                for entry_id in event.entry_ids:
                    self._on_bookie_failed(
                        entry_id, event.bookie_id, None, f"bookie {event.bookie_id}: {event.reason}"
                    )
            case _:
                raise AssertionError(f"unknown event {event!r}")
        self._confirm()

    def _on_reply(self, event: BookieAddReply) -> None:
        # An entry sent but missing from an OK answer counts as the bookie's IO_ERROR.
        missing = BookieStatus.IO_ERROR if event.status is BookieStatus.OK else event.status
        statuses: dict[int, BookieStatus] = {entry_id: missing for entry_id in event.entry_ids}
        if event.status is BookieStatus.OK:
            for result in event.results:
                if result.ledger_id == self.ledger_id and result.entry_id in statuses:
                    statuses[result.entry_id] = result.status
        for entry_id, status in statuses.items():
            if status is BookieStatus.OK:
                self._on_ack(entry_id, event.bookie_id)
            else:
                self._on_bookie_failed(
                    entry_id,
                    event.bookie_id,
                    status,
                    f"bookie {event.bookie_id} answered {status.name}",
                )

    def _index_of(self, entry_id: int, bookie_id: str) -> int | None:
        bookies = self.metadata.segment_for(entry_id).bookies
        index = bookies.index(bookie_id) if bookie_id in bookies else None
        return index if index in write_set(entry_id, self.quorum) else None

    def _on_ack(self, entry_id: int, bookie_id: str) -> None:
        pending = self._pending.get(entry_id)
        index = self._index_of(entry_id, bookie_id)
        if pending is None or index is None:
            return  # late, duplicate or stray: the entry is already decided
        pending.failed.discard(index)
        pending.acks.add(index)

    def _on_bookie_failed(
        self, entry_id: int, bookie_id: str, status: BookieStatus | None, detail: str
    ) -> None:
        """`status` None: the bookie did not answer."""
        pending = self._pending.get(entry_id)
        index = self._index_of(entry_id, bookie_id)
        if pending is None or index is None or index in pending.acks.acked:
            return
        if status in _UNRECOVERABLE_ADD:
            self._break(api_for_status(status), f"entry {entry_id}: {detail}")
            return
        pending.failed.add(index)
        if self.quorum.write_quorum - len(pending.failed) < self.quorum.ack_quorum:
            # Without ensemble change (issue 3) nothing can replace the failed bookies.
            api = ApiCodes.NOT_ENOUGH_BOOKIES if status is None else api_for_status(status)
            self._break(
                api,
                f"entry {entry_id} cannot reach its ack quorum {self.quorum.ack_quorum}: {detail}",
            )

    def tick(self, now_ms: int) -> None:
        """Fail the adds that waited past add_entry_timeout_ms (addEntryTimeoutSec)."""
        if self._pending and self.broken is None:
            oldest = self._pending[self.lac + 1]
            if now_ms - oldest.added_at_ms >= self.add_entry_timeout_ms:
                self._break(
                    ApiCodes.TIMEOUT,
                    f"entry {oldest.entry_id} not acknowledged by "
                    f"{self.quorum.ack_quorum} bookies within "
                    f"{self.add_entry_timeout_ms} ms",
                )

    def start_close(self) -> None:
        """No add is taken from now on; the driver closes once nothing is pending."""
        self.closing = True

    def abort(self, api: ApiCode, detail: str) -> None:
        """Fail everything pending and break the handle (ledger deleted, gateway stopping)."""
        if self.broken is None:
            self._break(api, detail)

    # -- state changes ------------------------------------------------------------------------

    def _break(self, api: ApiCode, detail: str) -> None:
        self.broken = QuireError(api, detail)
        if self._pending:
            self._commands.append(FailAdds(self.lac + 1, self.last_entry_id, api, detail))
        self._pending.clear()
        self._outbox.clear()

    def _confirm(self) -> None:
        """Advance the LAC over every leading entry that reached its ack quorum."""
        first = self.lac + 1
        while (pending := self._pending.get(self.lac + 1)) is not None and pending.acks.complete:
            del self._pending[pending.entry_id]
            self.lac = pending.entry_id
            self.confirmed_length = pending.length
        if self.lac >= first:
            self._commands.append(CompleteAdds(first, self.lac, self.lac, self.confirmed_length))

    # -- outputs ------------------------------------------------------------------------------

    def take_commands(self) -> list[SendAdds | CompleteAdds | FailAdds]:
        """What the driver must do now, in order: sends (batched per bookie), then
        completions and failures in entry order."""
        sends = [
            send
            for bookie_id, queued in self._outbox.items()
            for send in _chunk_adds(bookie_id, queued, self.max_send_bytes)
        ]
        self._outbox.clear()
        commands, self._commands = self._commands, []
        return [*sends, *commands]


def _chunk_adds(
    bookie_id: str, queued: list[tuple[int, AddItem]], max_send_bytes: int
) -> Iterable[SendAdds]:
    """Split one bookie's queue into sends under max_send_bytes (one oversized item alone)."""
    start, size = 0, 0
    for i, (_, item) in enumerate(queued):
        item_size = len(item.frame) + 32
        if i > start and (size + item_size > max_send_bytes or i - start >= MAX_ITEMS_PER_SEND):
            yield _send(bookie_id, queued[start:i])
            start, size = i, 0
        size += item_size
    if start < len(queued):
        yield _send(bookie_id, queued[start:])


def _send(bookie_id: str, queued: list[tuple[int, AddItem]]) -> SendAdds:
    return SendAdds(bookie_id, tuple(e for e, _ in queued), tuple(i for _, i in queued))


# -- reader events and commands ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BookieReadReply:
    """A bookie answered one SendReads. A bookie may answer a prefix of a batch (its reply
    must fit in one message): what it left out is asked again of the same bookie."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    status: BookieStatus
    results: tuple[ReadResult, ...] = ()


@dataclass(frozen=True, slots=True)
class ReadSendFailed:
    """A SendReads got no answer: it timed out (the bookie may be slow) or could not be
    delivered (no responder: the bookie is down)."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    reason: str
    timed_out: bool = True


@dataclass(frozen=True, slots=True)
class SendReads:
    bookie_id: str
    items: tuple[ReadItem, ...]

    @property
    def entry_ids(self) -> tuple[int, ...]:
        return tuple(item.entry_id for item in self.items)


@dataclass(frozen=True, slots=True)
class EntryRead:
    entry_id: int
    payload: bytes
    lac: int  # the LAC that rode on the entry
    length: int


@dataclass(frozen=True, slots=True)
class EntryReadFailed:
    entry_id: int
    api: ApiCode
    detail: str


@dataclass(frozen=True, slots=True)
class ReplicaCorrupt:
    """A bookie returned a frame that failed its digest: report it for repair."""

    bookie_id: str
    entry_id: int
    detail: str


@dataclass(slots=True)
class _PendingRead:
    entry_id: int
    replicas: tuple[str, ...]  # write set order: the order replicas are tried in
    attempt: int
    sent_at_ms: int
    # One (bookie, status name, detail) per replica that failed, in the order tried.
    failures: list[tuple[str, BookieStatus | None, str]] = field(default_factory=list)


class LedgerReader:
    """Reads entries of one ledger, each from its write set in order, verifying digests and
    moving to the next replica on error, timeout or digest mismatch."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        digest: DigestManager,
        *,
        read_entry_timeout_ms: int = 2_000,
        read_batch_entries: int = DEFAULT_READ_BATCH_ENTRIES,
    ) -> None:
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.quorum = metadata.quorum
        self._digest = digest
        self.read_entry_timeout_ms = read_entry_timeout_ms
        self.read_batch_entries = read_batch_entries
        self._pending: dict[int, _PendingRead] = {}
        self._outbox: dict[str, list[int]] = {}
        self._commands: list[SendReads | EntryRead | EntryReadFailed | ReplicaCorrupt] = []

    @property
    def done(self) -> bool:
        return not self._pending

    def read(self, entry_ids: Iterable[int], now_ms: int) -> None:
        for entry_id in entry_ids:
            assert entry_id >= 0 and entry_id not in self._pending
            bookies = self.metadata.segment_for(entry_id).bookies
            replicas = tuple(bookies[i] for i in read_order(entry_id, self.quorum))
            self._pending[entry_id] = _PendingRead(entry_id, replicas, 0, now_ms)
            self._outbox.setdefault(replicas[0], []).append(entry_id)

    def step(self, event: BookieReadReply | ReadSendFailed, now_ms: int) -> None:
        match event:
            case BookieReadReply():
                self._on_reply(event, now_ms)
            case ReadSendFailed():
                # None stands for "no answer in time"; an undeliverable request is as good
                # as the bookie's own IO_ERROR.
                status = None if event.timed_out else BookieStatus.IO_ERROR
                for entry_id in event.entry_ids:
                    self._on_replica_failed(entry_id, event.bookie_id, status, event.reason, now_ms)
            case _:
                raise AssertionError(f"unknown event {event!r}")

    def _on_reply(self, event: BookieReadReply, now_ms: int) -> None:
        if event.status is not BookieStatus.OK:
            for entry_id in event.entry_ids:
                self._on_replica_failed(
                    entry_id, event.bookie_id, event.status, f"answered {event.status.name}", now_ms
                )
            return
        answered = set()
        for result in event.results:
            if result.ledger_id != self.ledger_id or result.entry_id not in event.entry_ids:
                continue
            answered.add(result.entry_id)
            self._on_result(event.bookie_id, result, now_ms)
        missing = [e for e in event.entry_ids if e not in answered]
        if missing and answered:
            # A partial answer (the reply had to fit one message): ask that bookie again.
            for entry_id in missing:
                pending = self._pending.get(entry_id)
                if pending is not None and pending.replicas[pending.attempt] == event.bookie_id:
                    pending.sent_at_ms = now_ms
                    self._outbox.setdefault(event.bookie_id, []).append(entry_id)
        else:
            for entry_id in missing:
                self._on_replica_failed(
                    entry_id,
                    event.bookie_id,
                    BookieStatus.IO_ERROR,
                    "answered without this entry",
                    now_ms,
                )

    def _on_result(self, bookie_id: str, result: ReadResult, now_ms: int) -> None:
        pending = self._pending.get(result.entry_id)
        if pending is None or bookie_id not in pending.replicas:
            return
        if result.status is not BookieStatus.OK:
            self._on_replica_failed(
                result.entry_id, bookie_id, result.status, f"answered {result.status.name}", now_ms
            )
            return
        try:
            entry = self._digest.verify(result.frame, self.ledger_id, result.entry_id)
        except DigestMismatch as exc:
            self._commands.append(ReplicaCorrupt(bookie_id, result.entry_id, str(exc)))
            self._on_replica_failed(
                result.entry_id, bookie_id, BookieStatus.CORRUPT, str(exc), now_ms
            )
            return
        # Any replica's good answer will do, even a late one from a replica we gave up on.
        del self._pending[result.entry_id]
        self._commands.append(EntryRead(entry.entry_id, entry.payload, entry.lac, entry.length))

    def _on_replica_failed(
        self, entry_id: int, bookie_id: str, status: BookieStatus | None, detail: str, now_ms: int
    ) -> None:
        pending = self._pending.get(entry_id)
        if pending is None or pending.replicas[pending.attempt] != bookie_id:
            return  # decided already, or a late answer from a replica we moved past
        pending.failures.append((bookie_id, status, detail))
        pending.attempt += 1
        if pending.attempt < len(pending.replicas):
            pending.sent_at_ms = now_ms
            self._outbox.setdefault(pending.replicas[pending.attempt], []).append(entry_id)
            return
        del self._pending[entry_id]
        api, summary = _read_outcome(pending.failures)
        self._commands.append(EntryReadFailed(entry_id, api, f"entry {entry_id}: {summary}"))

    def tick(self, now_ms: int) -> None:
        """A replica that did not answer within read_entry_timeout_ms: try the next one."""
        expired = [
            p for p in self._pending.values() if now_ms - p.sent_at_ms >= self.read_entry_timeout_ms
        ]
        for pending in expired:
            self._on_replica_failed(
                pending.entry_id,
                pending.replicas[pending.attempt],
                None,
                f"no answer within {self.read_entry_timeout_ms} ms",
                now_ms,
            )

    def take_commands(self) -> list[SendReads | EntryRead | EntryReadFailed | ReplicaCorrupt]:
        sends = []
        for bookie_id, entry_ids in self._outbox.items():
            for start in range(0, len(entry_ids), self.read_batch_entries):
                chunk = entry_ids[start : start + self.read_batch_entries]
                sends.append(
                    SendReads(bookie_id, tuple(ReadItem(self.ledger_id, e) for e in chunk))
                )
        self._outbox.clear()
        commands, self._commands = self._commands, []
        return [*sends, *commands]


def _read_outcome(failures: list[tuple[str, BookieStatus | None, str]]) -> tuple[ApiCode, str]:
    """NO_ENTRY from every replica is a definite NO_SUCH_ENTRY; otherwise the first other
    failure decides (a replica that did not answer may hold the entry)."""
    summary = "; ".join(f"{bookie}: {detail}" for bookie, _, detail in failures)
    for _, status, _ in failures:
        if status is None:
            return ApiCodes.TIMEOUT, summary
        if status not in _ABSENT:
            return api_for_status(status), summary
    return ApiCodes.NO_SUCH_ENTRY, summary


def lac_from_replies(replies: Sequence[tuple[BookieStatus, int]]) -> int | None:
    """The LAC from the read_lac answers of a segment's bookies: the highest one (each
    bookie's LAC is a lower bound of the real one). -1 if every bookie knows nothing of the
    ledger; None if none answered usefully."""
    values = [lac for status, lac in replies if status is BookieStatus.OK]
    if values:
        return max(values)
    if replies and all(status in _ABSENT for status, _ in replies):
        return -1
    return None
