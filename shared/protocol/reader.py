"""Reading entries (BookKeeper's PendingReadOp) as a sans-IO state machine, in the rules of
the package (`shared.protocol`): `read(entry_ids, now_ms)`, `step(event, now_ms)`,
`tick(now_ms)`, `take_commands()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared.digest import DigestManager, DigestMismatch
from shared.models import LedgerMetadata
from shared.protocol.messages import (
    ABSENT,
    BookieReadReply,
    EntryRead,
    EntryReadFailed,
    ReaderCommand,
    ReadSendFailed,
    ReplicaCorrupt,
    SendReads,
    api_for_status,
)
from shared.quorum import read_order
from shared.status import ApiCode, ApiCodes, BookieStatus
from shared.wire import ReadItem, ReadResult

DEFAULT_READ_BATCH_ENTRIES = 64


@dataclass(slots=True)
class _PendingRead:
    entry_id: int
    replicas: tuple[str, ...]  # write set order: the order replicas are tried in
    asked: int  # replicas[:asked] were sent a read
    sent_at_ms: dict[str, int] = field(default_factory=dict)  # outstanding asks
    # One (bookie, status, detail) per replica that failed, in the order they failed.
    failures: list[tuple[str, BookieStatus | None, str]] = field(default_factory=list)
    last_sent_ms: int = 0


class LedgerReader:
    """Reads entries of one ledger (BookKeeper's PendingReadOp), each from its write set in
    order, verifying digests and moving to the next replica on error, timeout or digest
    mismatch. With `speculative_read_timeout_ms` a replica that is slow to answer gets
    company: the next replica is asked too, and the first good answer wins."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        digest: DigestManager,
        *,
        read_entry_timeout_ms: int = 2_000,
        read_batch_entries: int = DEFAULT_READ_BATCH_ENTRIES,
        speculative_read_timeout_ms: int = 0,
    ) -> None:
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.quorum = metadata.quorum
        self._digest = digest
        self.read_entry_timeout_ms = read_entry_timeout_ms
        self.read_batch_entries = read_batch_entries
        self.speculative_read_timeout_ms = speculative_read_timeout_ms
        self.speculative_reads = 0
        self._pending: dict[int, _PendingRead] = {}
        self._outbox: dict[str, list[int]] = {}
        self._commands: list[ReaderCommand] = []

    @property
    def done(self) -> bool:
        return not self._pending

    def read(self, entry_ids: Iterable[int], now_ms: int) -> None:
        for entry_id in entry_ids:
            assert entry_id >= 0 and entry_id not in self._pending
            bookies = self.metadata.segment_for(entry_id).bookies
            replicas = tuple(bookies[i] for i in read_order(entry_id, self.quorum))
            pending = _PendingRead(entry_id, replicas, 0)
            self._pending[entry_id] = pending
            self._ask_next(pending, now_ms)

    def _ask_next(self, pending: _PendingRead, now_ms: int) -> None:
        bookie_id = pending.replicas[pending.asked]
        pending.asked += 1
        self._ask(pending, bookie_id, now_ms)

    def _ask(self, pending: _PendingRead, bookie_id: str, now_ms: int) -> None:
        pending.sent_at_ms[bookie_id] = now_ms
        pending.last_sent_ms = now_ms
        self._outbox.setdefault(bookie_id, []).append(pending.entry_id)

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
                if pending is not None and event.bookie_id in pending.sent_at_ms:
                    self._ask(pending, event.bookie_id, now_ms)
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
        if pending is None or bookie_id not in pending.sent_at_ms:
            return  # decided already, or a late answer from a replica we moved past
        del pending.sent_at_ms[bookie_id]
        pending.failures.append((bookie_id, status, detail))
        if pending.asked < len(pending.replicas):
            if not pending.sent_at_ms:  # no other replica is still being asked
                self._ask_next(pending, now_ms)
            return
        if pending.sent_at_ms:
            return  # a speculative ask is still out
        del self._pending[entry_id]
        api, summary = _read_outcome(pending.failures)
        self._commands.append(EntryReadFailed(entry_id, api, f"entry {entry_id}: {summary}"))

    def tick(self, now_ms: int) -> None:
        """A replica that did not answer within read_entry_timeout_ms has failed; one that
        is slower than speculative_read_timeout_ms gets the next replica asked too."""
        for pending in list(self._pending.values()):
            expired = [
                bookie_id
                for bookie_id, sent_ms in pending.sent_at_ms.items()
                if now_ms - sent_ms >= self.read_entry_timeout_ms
            ]
            for bookie_id in expired:
                self._on_replica_failed(
                    pending.entry_id,
                    bookie_id,
                    None,
                    f"no answer within {self.read_entry_timeout_ms} ms",
                    now_ms,
                )
            if (
                self.speculative_read_timeout_ms
                and pending.entry_id in self._pending
                and pending.sent_at_ms
                and pending.asked < len(pending.replicas)
                and now_ms - pending.last_sent_ms >= self.speculative_read_timeout_ms
            ):
                self.speculative_reads += 1
                self._ask_next(pending, now_ms)

    def take_commands(self) -> list[ReaderCommand]:
        sends: list[ReaderCommand] = []
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
        if status not in ABSENT:
            return api_for_status(status), summary
    return ApiCodes.NO_SUCH_ENTRY, summary


def lac_from_replies(replies: Sequence[tuple[BookieStatus, int]]) -> int | None:
    """The LAC from the read_lac answers of a segment's bookies: the highest one (each
    bookie's LAC is a lower bound of the real one). -1 if every bookie knows nothing of the
    ledger; None if none answered usefully."""
    values = [lac for status, lac in replies if status is BookieStatus.OK]
    if values:
        return max(values)
    if replies and all(status in ABSENT for status, _ in replies):
        return -1
    return None
