"""The writer of one ledger (BookKeeper's LedgerHandle and PendingAddOp) as a sans-IO state
machine: entry ids, replication to the write set, confirmation in order, ensemble changes,
close, and the flow control of its add requests per bookie.

Input is `add(payloads, now_ms)`, `step(event, now_ms)` (a bookie answered, a send failed,
the metadata store answered) and `tick(now_ms)`; output is `take_commands()`: what the
driver must now send, complete or fail, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shared.models import LedgerMetadata, LedgerState, Segment, UpdateLedgerRequest
from shared.protocol.ensemble import RandomLike
from shared.protocol.flow import DEFAULT_MAX_SEND_BYTES, AddFlowControl
from shared.protocol.messages import (
    AddSendFailed,
    BookieAddReply,
    CloseDone,
    CloseFailed,
    CompleteAdds,
    EnsembleChanged,
    FailAdds,
    LedgerUpdated,
    LedgerUpdateFailed,
    ListWritableBookies,
    SendWriteLac,
    UpdateLedger,
    WritableBookies,
    WriterCommand,
    WriterEvent,
    api_for_status,
)
from shared.protocol.placement import DEFAULT_LOCATION, PlacementPolicy
from shared.quorum import AckSet, QuorumSpec, write_set
from shared.status import ApiCode, ApiCodes, BookieStatus, QuireError
from shared.wire import AddItem, add_flags

# Fatal for a writer whatever the quorum: BookKeeper's unrecoverable add errors.
_UNRECOVERABLE_ADD = frozenset({BookieStatus.FENCED, BookieStatus.UNAUTHORIZED})


class Signer(Protocol):
    def sign(
        self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes
    ) -> bytes: ...


@dataclass(slots=True)
class _PendingAdd:
    entry_id: int
    length: int
    frame: bytes
    added_at_ms: int
    acks: AckSet
    failed: set[int] = field(default_factory=set)
    sent: bool = False


@dataclass(slots=True)
class _EnsembleChange:
    """One ensemble change in flight: first the writable bookies, then the CAS."""

    first_entry_id: int
    failed: dict[int, str]  # ensemble index -> the bookie it replaces
    replaced: dict[int, str] = field(default_factory=dict)  # index -> the new bookie
    proposed: list[Segment] | None = None
    placement_fallback: str = ""  # why the replacements break the placement policy


class LedgerWriter:
    """The writer handle of one ledger (BookKeeper's LedgerHandle and PendingAddOp): assigns
    entry ids, replicates, confirms in order, replaces failed bookies, closes.

    Ensemble change (LedgerHandle.handleBookieFailure / ChangeEnsembleOp): a bookie that
    fails an add is replaced by a writable bookie not in the ensemble; the new segment starts
    at LAC + 1 and is stored by CAS before anything goes to the replacement; then the pending
    adds are resent to it. While a change is in flight nothing is confirmed (the segment
    boundary is the LAC) and new adds wait. A failure that leaves the entry's ack quorum
    reachable is delayed (delayEnsembleChange): the add may complete, the bookie is
    replaced after; but a bookie that could not be reached at all (no responder) is
    replaced at once, as BookKeeper does without delayEnsembleChange. With `recovery` the
    writer re-writes what a LedgerRecovery found: adds carry FLAG_RECOVERY_ADD, and the
    metadata stays IN_RECOVERY until the close.

    Flow control (`flow.py`): at most `max_add_requests_per_bookie` SendAdds go unanswered
    per bookie (None: no bound), the rest held and merged; the driver answers each SendAdds
    with exactly one BookieAddReply or AddSendFailed.

    Back-pressure: `fits(count)` says whether an add of `count` payloads stays under
    `max_pending_adds` (None: no bound); the driver waits until it does.
    """

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
        rng: RandomLike | None = None,
        explicit_lac_interval_ms: int = 0,
        ensemble_change_retry_ms: int = 1_000,
        ensemble_change_delay_ms: int = 50,
        recovery: bool = False,
        max_add_requests_per_bookie: int | None = None,
        max_pending_adds: int | None = None,
        placement: PlacementPolicy | None = None,
        now_ms: int = 0,
    ) -> None:
        assert max_pending_adds is None or max_pending_adds >= 1
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
        self.explicit_lac_interval_ms = explicit_lac_interval_ms
        self.ensemble_change_retry_ms = ensemble_change_retry_ms
        self.ensemble_change_delay_ms = ensemble_change_delay_ms
        self.placement = placement or PlacementPolicy()
        self.recovery = recovery
        self.max_add_requests_per_bookie = max_add_requests_per_bookie
        self.max_pending_adds = max_pending_adds
        # The digest type rides along so that the bookie can verify what it stores.
        self._flags = add_flags(metadata.digest, recovery=recovery)
        self._rng = rng
        self.broken: QuireError | None = None
        self.closing = False
        self.closed: LedgerMetadata | None = None
        self.ensemble_changes = 0
        self._pending: dict[int, _PendingAdd] = {}
        self._outbox: dict[str, list[tuple[int, AddItem]]] = {}
        self._commands: list[WriterCommand] = []
        self._flow = AddFlowControl(max_add_requests_per_bookie, max_send_bytes)
        # Bookies of the last segment that failed and wait for a replacement.
        self._failed: dict[int, str] = {}
        # A failed bookie was unreachable (not slow): its replacement need not wait.
        self._change_at_once = False
        self._change: _EnsembleChange | None = None
        self._change_due_ms = 0
        self._close_cas = False  # the close CAS is in flight
        self._lac_on_bookies = lac  # the highest LAC the bookies were sent
        self._last_add_ms = now_ms
        self._now_ms = now_ms  # the latest time seen (add, step, tick)
        # The metadata as last read from the store. A recovery changes its ensemble only
        # locally (as BookKeeper's ReadOnlyLedgerHandle does) from entry `_local_from` on,
        # and stores the new segments with its close: a concurrent recovery must keep
        # seeing (and reading from) the fenced ensemble, not bookies that lack the tail.
        self._stored = metadata
        self._local_from: int | None = None
        self._fenced_lac = lac
        self.close_failed: QuireError | None = None

    # -- inputs -------------------------------------------------------------------------------

    @property
    def add_requests_sent(self) -> int:
        """Every SendAdds handed to the driver."""
        return self._flow.requests_sent

    @property
    def add_sends_held(self) -> int:
        """Every SendAdds held back by flow control (and later merged)."""
        return self._flow.sends_held

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def fits(self, count: int) -> bool:
        """Whether an add of `count` payloads stays under max_pending_adds; a batch larger
        than the bound fits once nothing is pending (it goes alone)."""
        if self.max_pending_adds is None or not self._pending:
            return True
        return len(self._pending) + count <= self.max_pending_adds

    def add(self, payloads: Sequence[bytes], now_ms: int) -> tuple[int, int]:
        """Queue `payloads` as the next entries; their (first, last) entry ids."""
        assert payloads, "add needs at least one payload"
        self._check_writable()
        first = self.last_entry_id + 1
        for payload in payloads:
            self._add_one(payload, now_ms)
        return first, self.last_entry_id

    def add_recovered(self, entry_id: int, payload: bytes, length: int, now_ms: int) -> None:
        """Re-write an entry recovery found, keeping the ledger length it was written with."""
        assert self.recovery and entry_id == self.last_entry_id + 1, "recovery adds in order"
        self._check_writable()
        self.length = length - len(payload)
        self._add_one(payload, now_ms)

    def _check_writable(self) -> None:
        if self.broken is not None:
            raise QuireError(self.broken.api, self.broken.detail)
        if self.closing:
            raise QuireError(ApiCodes.LEDGER_CLOSED, f"ledger {self.ledger_id} is closing")

    def _add_one(self, payload: bytes, now_ms: int) -> None:
        entry_id = self.last_entry_id + 1
        self.last_entry_id = entry_id
        self.length += len(payload)
        self._last_add_ms = now_ms
        self._now_ms = max(self._now_ms, now_ms)
        self._lac_on_bookies = max(self._lac_on_bookies, self.lac)
        # The LAC rides on every add: the LAC known when the entry is sent. A recovery's
        # adds carry the LAC the fence found, never their own: a recovery that loses the
        # race to close must not have advertised entries beyond the winner's last one.
        lac = self._fenced_lac if self.recovery else self.lac
        frame = self._signer.sign(self.ledger_id, entry_id, lac, self.length, payload)
        pending = _PendingAdd(entry_id, self.length, frame, now_ms, AckSet(entry_id, self.quorum))
        self._pending[entry_id] = pending
        if self._change is None:
            self._send_to(pending, write_set(entry_id, self.quorum))

    def _send_to(self, pending: _PendingAdd, indexes: Iterable[int]) -> None:
        pending.sent = True
        bookies = self.metadata.segment_for(pending.entry_id).bookies
        item = AddItem(self._flags, self.master_key, pending.frame)
        for index in indexes:
            self._outbox.setdefault(bookies[index], []).append((pending.entry_id, item))

    def step(self, event: WriterEvent, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        match event:
            case BookieAddReply():
                self._on_reply(event)
                self._flow.answered(event.bookie_id)
            case AddSendFailed():
                for entry_id in event.entry_ids:
                    self._on_bookie_failed(
                        entry_id,
                        event.bookie_id,
                        None,
                        f"bookie {event.bookie_id}: {event.reason}",
                        unreachable=not event.timed_out,
                    )
                self._flow.answered(event.bookie_id)
            case WritableBookies():
                self._on_writable_bookies(event)
            case LedgerUpdated():
                self._on_updated(event.metadata)
            case LedgerUpdateFailed():
                self._on_update_failed(event.current, event.reason)
            case _:
                raise AssertionError(f"unknown event {event!r}")
        self._progress()

    def _on_reply(self, event: BookieAddReply) -> None:
        if event.status is BookieStatus.OK and self._ack_all(event):
            return
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

    def _ack_all(self, event: BookieAddReply) -> bool:
        """The usual answer: OK for every entry sent, in order, all in one segment. Each is
        `_on_ack`ed with the bookie's index looked up once (an ack per entry and bookie was
        most of the core's work per entry); False, having done nothing, for any other."""
        entry_ids, results = event.entry_ids, event.results
        if not entry_ids or len(results) != len(entry_ids):
            return False
        ledger_id, ok = self.ledger_id, BookieStatus.OK
        for entry_id, result in zip(entry_ids, results, strict=True):
            if (
                result.entry_id != entry_id
                or result.ledger_id != ledger_id
                or result.status is not ok
            ):
                return False
        segment = self.metadata.segment_for(entry_ids[0])
        if self.metadata.segment_for(entry_ids[-1]) is not segment:
            return False
        bookies = segment.bookies
        if event.bookie_id not in bookies:
            return True  # a stray answer: none of its entries is on that bookie
        index = bookies.index(event.bookie_id)
        size, write_quorum = self.quorum.ensemble_size, self.quorum.write_quorum
        pending_of, change = self._pending.get, self._change
        for entry_id in entry_ids:
            # `index in write_set(entry_id)`: (entry_id + i) % size == index for an i < Qw.
            if (index - entry_id) % size >= write_quorum:
                continue
            pending = pending_of(entry_id)
            if pending is None or index in pending.failed:
                continue  # late, duplicate or stray; or a bookie already counted as failed
            if change is not None and index in change.failed:
                continue  # its bookie is being replaced: the replacement must store it
            pending.acks.add(index)
        return True

    def _index_of(self, entry_id: int, bookie_id: str) -> int | None:
        bookies = self.metadata.segment_for(entry_id).bookies
        index = bookies.index(bookie_id) if bookie_id in bookies else None
        return index if index in write_set(entry_id, self.quorum) else None

    def _on_ack(self, entry_id: int, bookie_id: str) -> None:
        pending = self._pending.get(entry_id)
        index = self._index_of(entry_id, bookie_id)
        if pending is None or index is None or index in pending.failed:
            return  # late, duplicate or stray; or a bookie already counted as failed
        if self._change is not None and index in self._change.failed:
            return  # its bookie is being replaced: the replacement must store the entry
        pending.acks.add(index)

    def _on_bookie_failed(
        self,
        entry_id: int,
        bookie_id: str,
        status: BookieStatus | None,
        detail: str,
        *,
        unreachable: bool = False,
    ) -> None:
        """`status` None: the bookie did not answer; `unreachable`: the request could not
        even be delivered (the bookie is down)."""
        index = self._index_of(entry_id, bookie_id)
        if index is None or self.broken is not None:
            return
        if status in _UNRECOVERABLE_ADD:
            # Fenced or refused: no add of this handle can succeed any more.
            self._break(api_for_status(status), f"entry {entry_id}: {detail}")
            return
        pending = self._pending.get(entry_id)
        if pending is not None:
            if index in pending.acks.acked:
                return
            pending.failed.add(index)
        elif entry_id < self.metadata.segments[-1].first_entry_id:
            return  # an older segment's bookie: not ours to replace
        if unreachable:
            # Nothing in flight to it can complete: waiting would only acknowledge more
            # entries on Qw-1 bookies. Change at once, as BookKeeper does at its first
            # failed write.
            self._change_at_once = True
        # Also for an entry that completed without it: the bookie is replaced after.
        if index in self._failed:
            return
        if not self._failed:
            # A delayed change waits a little, so that the adds in flight may complete first.
            self._change_due_ms = max(
                self._change_due_ms, self._now_ms + self.ensemble_change_delay_ms
            )
        self._failed[index] = bookie_id

    # -- ensemble change ----------------------------------------------------------------------

    def _quorum_blocked(self) -> _PendingAdd | None:
        """The first pending entry whose ack quorum is out of reach without replacements."""
        for pending in self._pending.values():
            reachable = self.quorum.write_quorum - len(pending.failed - pending.acks.acked)
            if reachable < self.quorum.ack_quorum:
                return pending
        return None

    def _maybe_change_ensemble(self, ticking: bool) -> None:
        """Start replacing the failed bookies: at once when an add cannot reach its ack
        quorum without them; otherwise (delayed write failure) at the first tick
        ensemble_change_delay_ms after the first failure, so that the adds in flight may
        complete first, and ensemble_change_retry_ms later when no writable bookie was found.
        A bookie that could not be reached at all is replaced at once too: no add in flight
        to it can complete."""
        if not self._change_wanted():
            return
        if self._quorum_blocked() is None and not self._change_at_once:
            if not ticking or self._now_ms < self._change_due_ms:
                return
        self._change_at_once = False
        self._change = _EnsembleChange(self.lac + 1, dict(sorted(self._failed.items())))
        self._commands.append(ListWritableBookies())

    def _change_wanted(self) -> bool:
        """Failed bookies wait for a replacement and no change is in flight."""
        if self._change is not None or not self._failed or self.broken is not None:
            return False
        # A closing ledger with nothing left to write needs no new segment.
        return not (
            self._close_cas or self.closed is not None or (self.closing and not self._pending)
        )

    def _on_writable_bookies(self, event: WritableBookies) -> None:
        change = self._change
        if change is None or change.proposed is not None or self.broken is not None:
            return
        if self.closed is not None:
            self._change = None
            return
        current = self.metadata.segments[-1].bookies
        candidates = sorted(set(event.bookie_ids) - set(current))
        if len(candidates) < len(change.failed):
            self._no_replacement(change, f"{len(candidates)} writable bookie(s) can replace them")
            return
        # The placement policy picks among the writable bookies (BookKeeper's
        # replaceBookie): the write quorums around each replaced position keep their racks.
        located = dict(event.locations)
        writable = {b: located.get(b, DEFAULT_LOCATION) for b in event.bookie_ids}
        try:
            placed = self.placement.replace(
                current, self.quorum.write_quorum, change.failed, writable, self._rng, known=located
            )
        except QuireError as exc:
            self._no_replacement(change, exc.detail)
            return
        ensemble = list(placed.bookies)
        for index in change.failed:
            change.replaced[index] = ensemble[index]
        change.placement_fallback = placed.reason if placed.fallback else ""
        segments = [s for s in self.metadata.segments if s.first_entry_id < change.first_entry_id]
        change.proposed = [
            *segments,
            Segment(first_entry_id=change.first_entry_id, bookies=ensemble),
        ]
        if self.recovery:
            if self._local_from is None or change.first_entry_id < self._local_from:
                self._local_from = change.first_entry_id
            local = self.metadata.model_copy(update={"segments": change.proposed})
            self._finish_change(change, local, stored=False)
            return
        self._cas_change(change)

    def _no_replacement(self, change: _EnsembleChange, why: str) -> None:
        self._change = None
        detail = (
            f"ledger {self.ledger_id}: {len(change.failed)} bookie(s) of the ensemble failed "
            f"({', '.join(change.failed.values())}) and {why}"
        )
        if self._quorum_blocked() is not None:
            self._break(ApiCodes.NOT_ENOUGH_BOOKIES, detail)
        else:
            # Delayed write failure: the adds still reach their ack quorum; try again later.
            self._change_due_ms = self._now_ms + self.ensemble_change_retry_ms

    def _cas_change(self, change: _EnsembleChange) -> None:
        assert change.proposed is not None
        self._commands.append(
            UpdateLedger(
                UpdateLedgerRequest(
                    ledger_id=self.ledger_id,
                    expected_version=self.metadata.version,
                    segments=change.proposed,
                )
            )
        )

    def _finish_change(
        self, change: _EnsembleChange, metadata: LedgerMetadata, stored: bool = True
    ) -> None:
        """The new segment is stored (or, for a recovery, taken locally): now (and only
        now) send to the replacements."""
        self._change = None
        self._change_due_ms = 0
        if stored:
            self._adopt(metadata)
        else:
            self.metadata = metadata
        self.ensemble_changes += 1
        for index in change.replaced:
            if self._failed.get(index) == change.failed[index]:
                del self._failed[index]
        replaced = tuple(sorted(change.replaced))
        for pending in self._pending.values():
            if not pending.sent:
                self._send_to(pending, write_set(pending.entry_id, self.quorum))
                continue
            indexes = [i for i in write_set(pending.entry_id, self.quorum) if i in replaced]
            for index in indexes:
                pending.acks.remove(index)
                pending.failed.discard(index)
            self._send_to(pending, indexes)
        self._commands.append(
            EnsembleChanged(
                change.first_entry_id,
                tuple((i, change.failed[i], change.replaced[i]) for i in replaced),
                metadata,
                change.placement_fallback,
            )
        )

    def _adopt(self, current: LedgerMetadata) -> None:
        """Take what the store holds; a recovery keeps its local segments on top."""
        self._stored = current
        if self._local_from is None:
            self.metadata = current
            return
        local_from = self._local_from
        segments = [
            *(s for s in current.segments if s.first_entry_id < local_from),
            *(s for s in self.metadata.segments if s.first_entry_id >= local_from),
        ]
        self.metadata = current.model_copy(update={"segments": segments})

    # -- metadata answers ---------------------------------------------------------------------

    def _on_updated(self, stored: LedgerMetadata) -> None:
        if self._change is not None and self._change.proposed is not None:
            self._finish_change(self._change, stored)
        elif self._close_cas:
            self._close_cas = False
            self._closed(stored)

    def _on_update_failed(self, current: LedgerMetadata | None, reason: str) -> None:
        if self._change is not None and self._change.proposed is not None:
            self._resolve_change_conflict(self._change, current, reason)
        elif self._close_cas:
            self._close_cas = False
            self._resolve_close_conflict(current, reason)

    def _resolve_change_conflict(
        self, change: _EnsembleChange, current: LedgerMetadata | None, reason: str
    ) -> None:
        """As ChangeEnsembleOp does: a close or recovery wins; a change elsewhere in the
        ledger (re-replication of an older segment) is rebased on; our own CAS whose answer
        was lost is a success."""
        if current is None:
            self._change = None
            self._break(ApiCodes.UNAVAILABLE, f"ensemble change of {self.ledger_id}: {reason}")
            return
        if current.segments == change.proposed and self._state_is_ours(current):
            self._finish_change(change, current)
            return
        if self._yield_to(current):
            self._change = None
            return
        if current.segments[-1] == self.metadata.segments[-1]:
            self._adopt(current)
            segments = [s for s in current.segments if s.first_entry_id < change.first_entry_id]
            assert change.proposed is not None
            change.proposed = [*segments, change.proposed[-1]]
            self._cas_change(change)
            return
        self._change = None
        self._break(
            ApiCodes.LEDGER_FENCED,
            f"ledger {self.ledger_id}: its last segment was changed by another client",
        )

    def _state_is_ours(self, current: LedgerMetadata) -> bool:
        expected = LedgerState.IN_RECOVERY if self.recovery else LedgerState.OPEN
        return current.state is expected

    def _yield_to(self, current: LedgerMetadata) -> bool:
        """A concurrent close or recovery wins over this writer: break (or, for a recovery,
        adopt the close). True if the writer yielded."""
        if current.state is LedgerState.CLOSED:
            self._adopt(current)
            if self.recovery:
                self._break(ApiCodes.LEDGER_CLOSED, f"ledger {self.ledger_id} was closed")
                self.closed = current
                self._commands.append(CloseDone(current))
            else:
                # Only a recovery closes a ledger its writer still holds: fenced.
                self._break(
                    ApiCodes.LEDGER_FENCED,
                    f"ledger {self.ledger_id} was closed by another client at entry "
                    f"{current.last_entry_id}",
                )
            return True
        if current.state is LedgerState.IN_RECOVERY and not self.recovery:
            self._adopt(current)
            self._break(
                ApiCodes.LEDGER_FENCED, f"ledger {self.ledger_id} is being recovered by another"
            )
            return True
        return False

    # -- close --------------------------------------------------------------------------------

    def start_close(self) -> None:
        """No add is taken from now on; the CAS to CLOSED at the LAC goes once nothing is
        pending (even on a broken handle, as BookKeeper closes at lastAddConfirmed).
        The outcome is CloseDone or CloseFailed."""
        self.closing = True
        self.close_failed = None
        self._progress()

    def _maybe_close(self) -> None:
        if not self.closing or self.closed is not None or self._close_cas:
            return
        if self._pending or self._change is not None or self.close_failed is not None:
            return
        if self.recovery and self.broken is not None:
            return  # a recovery that could not re-write everything must not close
        if not self._state_is_ours(self.metadata):
            # Closed or being recovered by someone else (this writer broke on it): a CAS
            # from here would overwrite their decision.
            self._resolve_close_conflict(self.metadata, "changed by another client")
            return
        self._close_cas = True
        self._commands.append(
            UpdateLedger(
                UpdateLedgerRequest(
                    ledger_id=self.ledger_id,
                    expected_version=self.metadata.version,
                    state=LedgerState.CLOSED,
                    last_entry_id=self.lac,
                    length=self.confirmed_length,
                    # A recovery's local ensemble changes are stored with its close.
                    segments=self.metadata.segments if self._local_from is not None else None,
                )
            )
        )

    def _closed(self, stored: LedgerMetadata) -> None:
        self._local_from = None
        self._adopt(stored)
        self.closed = stored
        self._commands.append(CloseDone(stored))

    def _resolve_close_conflict(self, current: LedgerMetadata | None, reason: str) -> None:
        """As LedgerHandle.doAsyncCloseInternal: closed at our LAC is our close; closed at
        another entry is a recovery that won (a recovery adopts it, a writer is fenced);
        still open (or, for a recovery, still in recovery) at the same last segment: retry
        on the newer version."""
        if current is None:
            self._close_failed(ApiCodes.UNAVAILABLE, f"close of {self.ledger_id}: {reason}")
            return
        if current.state is LedgerState.CLOSED:
            if current.last_entry_id == self.lac or self.recovery:
                self._closed(current)
                return
            self._adopt(current)
            self._close_failed(
                ApiCodes.LEDGER_FENCED,
                f"ledger {self.ledger_id} was closed by someone else at entry "
                f"{current.last_entry_id}; this writer confirmed {self.lac}",
            )
            return
        if self._state_is_ours(current) and current.segments[-1] == self._stored.segments[-1]:
            self._adopt(current)
            self._maybe_close()
            return
        self._adopt(current)
        fenced = current.state is LedgerState.IN_RECOVERY and not self.recovery
        self._close_failed(
            ApiCodes.LEDGER_FENCED if fenced else ApiCodes.UNAVAILABLE,
            f"ledger {self.ledger_id} changed under the close (now {current.state.value})",
        )

    def _close_failed(self, api: ApiCode, detail: str) -> None:
        self.close_failed = QuireError(api, detail)
        self._commands.append(CloseFailed(api, detail))

    # -- time ---------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Fail the adds that waited past add_entry_timeout_ms (addEntryQuorumTimeout); retry a
        delayed ensemble change; send the LAC when idle."""
        if self._pending and self.broken is None:
            oldest = self._pending[self.lac + 1]
            if now_ms - oldest.added_at_ms >= self.add_entry_timeout_ms:
                self._break(
                    ApiCodes.TIMEOUT,
                    f"entry {oldest.entry_id} not acknowledged by "
                    f"{self.quorum.ack_quorum} bookies within "
                    f"{self.add_entry_timeout_ms} ms",
                )
        self._now_ms = max(self._now_ms, now_ms)
        self._maybe_change_ensemble(ticking=True)
        self._maybe_write_lac(now_ms)
        self._progress()

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which `tick` would do anything: the oldest pending add's
        timeout, a delayed ensemble change, the explicit LAC of an idle writer whose LAC the
        bookies lack. None when nothing is due, whatever the time. A tick before it does
        nothing; the driver needs to tick only then."""
        if self.broken is not None:
            return None
        deadlines = []
        if self._pending:
            oldest = self._pending[self.lac + 1]
            deadlines.append(oldest.added_at_ms + self.add_entry_timeout_ms)
        if self._change_wanted():
            # A change whose ack quorum is blocked starts without a tick (`_progress`).
            deadlines.append(self._change_due_ms)
        if (lac_due := self._lac_due_ms()) is not None:
            deadlines.append(lac_due)
        return min(deadlines, default=None)

    def _lac_due_ms(self) -> int | None:
        """When an explicit LAC is due; None while adds are pending or the bookies have it."""
        if not self.explicit_lac_interval_ms or self.broken is not None or self.recovery:
            return None
        if self.closed is not None:
            return None  # the close stored the last entry: readers take it from there
        if self._pending or self.lac <= self._lac_on_bookies:
            return None
        return self._last_add_ms + self.explicit_lac_interval_ms

    def _maybe_write_lac(self, now_ms: int) -> None:
        """Explicit LAC (BookKeeper's explicitLacInterval): an idle writer tells the bookies
        its LAC, which otherwise only rides on the next add."""
        due = self._lac_due_ms()
        if due is None or now_ms < due:
            return
        self._lac_on_bookies = self.lac
        for bookie_id in self.metadata.segments[-1].bookies:
            self._commands.append(SendWriteLac(bookie_id, self.lac))

    def abort(self, api: ApiCode, detail: str) -> None:
        """Fail everything pending and break the handle (ledger deleted, gateway stopping)."""
        if self.broken is None:
            self._break(api, detail)

    # -- state changes ------------------------------------------------------------------------

    def _break(self, api: ApiCode, detail: str) -> None:
        if self.broken is not None:
            return
        self.broken = QuireError(api, detail)
        if self._pending:
            self._commands.append(FailAdds(self.lac + 1, self.last_entry_id, api, detail))
        self._pending.clear()
        self._outbox.clear()
        self._flow.clear()
        self._change = None

    def _progress(self) -> None:
        self._confirm()
        self._maybe_change_ensemble(ticking=False)
        self._maybe_close()

    def _confirm(self) -> None:
        """Advance the LAC over every leading entry that reached its ack quorum; never while
        an ensemble change is in flight (its segment starts at the LAC + 1)."""
        if self._change is not None:
            return
        first = self.lac + 1
        while (pending := self._pending.get(self.lac + 1)) is not None and pending.acks.complete:
            del self._pending[pending.entry_id]
            self.lac = pending.entry_id
            self.confirmed_length = pending.length
        if self.lac >= first:
            self._commands.append(CompleteAdds(first, self.lac, self.lac, self.confirmed_length))

    # -- outputs ------------------------------------------------------------------------------

    @property
    def has_commands(self) -> bool:
        """`take_commands` would hand out something now."""
        return bool(self._commands or self._outbox or self._flow.has_released)

    def take_commands(self) -> list[WriterCommand]:
        """What the driver must do now, in order: sends (batched per bookie, and held while
        the bookie has its limit of requests unanswered), then completions, failures and
        metadata requests in the order they arose."""
        sends = self._flow.sends(self._outbox)
        commands, self._commands = self._commands, []
        return [*sends, *commands]
