"""The asyncio driver of the protocol: runs the sans-IO cores (`writer`, `reader`,
`recovery`) over a bookie transport and a metadata transport (`transport.py`). The
gateway and the bench drive the cores through this one module.

Everything here is IO and the bookkeeping of futures; every protocol decision is the
cores'. What the caller wants to count or announce (metrics, events) reaches it through a
`ProtocolObserver`; this module knows nothing of its callers.

Spans (only for a traced operation: an unsampled append costs one `recording()` check):
`ledger.add` for each traced append, from `WriterHandle.append` until its outcome (event
`ack quorum reached`); its span context rides with the SendAdds that carry its entries to
the `BookieAddBatcher`, whose request to a bookie is then a CLIENT span (child of the first
traced append it carries, linked to the others; `BookieTransport.add(traced=...)`).
`ledger.close`, `ledger.recover` and `ledger.rereplicate` around those operations, and
`ledger.ensemble_change` (a background span, linked to the traced appends waiting) around
an ensemble change. The writers' own work (pumps, deadlines, bookie requests) runs in a
context of its own (`_DETACHED`), not in that of whichever request happened to schedule it:
a bookie request or a CAS carries a trace only when a traced operation is given it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import heapq
import logging
import os
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode, use_span

from shared import clock
from shared.config import GatewaySettings
from shared.digest import DigestManager, LedgerKeys, mac_key, master_key
from shared.metaclient import MetadataError
from shared.models import BookieState, CreateLedgerRequest, LedgerMetadata
from shared.protocol.flow import merge_sends, send_size, split_add_reply
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
    FragmentReplicated,
    LedgerUpdated,
    LedgerUpdateFailed,
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
    WritableBookies,
)
from shared.protocol.placement import PlacementPolicy
from shared.protocol.reader import LedgerReader, ReadSettings, lac_from_replies
from shared.protocol.recovery import LedgerRecovery
from shared.protocol.replication import LedgerReplication, ReplicationSettings
from shared.protocol.transport import BookieTransport, BookieUnreachable, MetadataTransport
from shared.protocol.writer import LedgerWriter
from shared.quorum import QuorumSpec
from shared.status import ApiCode, ApiCodes, BookieStatus, QuireError
from shared.telemetry import (
    BACKGROUND_ATTRIBUTE,
    background_span,
    current_span_context,
    internal_span,
    recording,
    tracer,
    tracer_provider,
)
from shared.wire import AddItem, AddResult

log = logging.getLogger(__name__)

# How often `drive` ticks a read's or a recovery's core while it waits (their timeouts'
# resolution); a writer is ticked by its own deadlines instead (`WriterHandle`).
TICK_INTERVAL_S = 0.05
# The resolution of a writer's deadlines (add timeouts, a delayed ensemble change, the
# explicit LAC): the deadlines of a client's writers that fall in the same 10 ms are met
# by one event-loop timer.
DEADLINE_RESOLUTION_MS = 10
SALT_BYTES = 16

Clock = Callable[[], int]
AddReply = BookieAddReply | AddSendFailed
OnAddReply = Callable[[AddReply], None]
# The span contexts of the traced appends a send carries (none: untraced, the usual case).
Traced = tuple[SpanContext, ...]
NOT_TRACED: Traced = ()

# The context the writers' callbacks (pumps, deadlines, batch flushes) run in: none of the
# request that scheduled them. Callbacks never nest and leave it as they found it, so one
# does for all; a task gets a fresh one (`_detached_task`), as its spans come and go
# across awaits.
_DETACHED = contextvars.Context()


def _detached_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.create_task(coro, context=contextvars.Context())


def _start_background_span(
    name: str, attributes: dict[str, Any], links: Sequence[SpanContext]
) -> Span | None:
    """A root span for rare background work that outlives one block of code (as
    `background_span`, which is a `with`): recorded whenever tracing is on."""
    if tracer_provider() is None:
        return None
    return tracer(__name__).start_span(
        name,
        context=Context(),
        attributes={BACKGROUND_ATTRIBUTE: True, **attributes},
        links=[Link(link) for link in links],
    )


def _end_failed(span: Span, detail: str) -> None:
    span.set_status(Status(StatusCode.ERROR, detail))
    span.end()


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def monotonic_us() -> int:
    """Add latencies are measured in microseconds (the SLA histograms' unit): a loopback
    add takes well under a millisecond, which the cores' ms clock would round to 0 or 1."""
    return time.monotonic_ns() // 1_000


def wall_clock_ms() -> int:
    """Bookie leases are wall-clock times (they are compared across machines)."""
    return clock.wall_ms()


def password_hash(salt_hex: str, password: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(salt_hex) + password).hexdigest()


class ProtocolObserver:
    """What a driver reports as it goes; every method does nothing here. The gateway
    overrides them for its metrics and events."""

    def adds_acknowledged(
        self,
        ledger_id: int,
        first: int,
        last: int,
        latency_us: int,
        nbytes: int,
        bookies: Sequence[str],
        quorum: QuorumSpec,
    ) -> None:
        """Entries first..last of one append reached their ack quorum, `latency_us` after
        the append began: `nbytes` payload bytes written to the segment of `bookies`. An
        append whose entries are confirmed across an ensemble change is reported in parts,
        one per segment (the part before the change when it is confirmed)."""

    def adds_failed(self, count: int) -> None:
        """`count` entries of appends failed."""

    def add_requests(self, sent: int, held: int) -> None:
        """A writer sent `sent` more add requests and held back `held` more sends."""

    def bookie_add_batch(self, sends: int) -> None:
        """One add request went to a bookie carrying `sends` writers' sends."""

    def pending_adds_changed(self, delta: int) -> None:
        """A writer's pending adds grew (or shrank, negative) by `delta`."""

    def ensemble_changed(self, command: EnsembleChanged) -> None:
        """A writer or a recovery replaced bookies."""

    def placement_fallback(self, ledger_id: int, reason: str) -> None:
        """A new ledger's ensemble could not meet the placement policy (not enforced, so it
        was placed at random): BookKeeper logs it; the gateway counts it too."""

    def replica_corrupt(self, ledger_id: int, command: ReplicaCorrupt) -> None:
        """A bookie returned a frame that failed its digest."""

    def entries_read(self, ok: bool, count: int) -> None:
        """`count` entries were read (or one failed to be)."""

    def speculative_reads(self, count: int) -> None:
        """A read asked `count` more replicas early."""

    def read_retries_refused(self, count: int) -> None:
        """The retry budget refused `count` speculative reads or retries on another replica."""

    def read_backoffs(self, count: int) -> None:
        """Bookies timed out or answered TOO_MANY_REQUESTS `count` times: each backed off."""


@dataclass
class _ReadCounts:
    """A reader's counters as last reported to the observer."""

    speculative_reads: int = 0
    retries_refused: int = 0
    backoffs: int = 0

    def report(
        self, core: LedgerReader, observer: ProtocolObserver, read: int, failed: bool
    ) -> None:
        if read:
            observer.entries_read(True, read)
        if failed:
            observer.entries_read(False, 1)
        if core.speculative_reads != self.speculative_reads:
            observer.speculative_reads(core.speculative_reads - self.speculative_reads)
            self.speculative_reads = core.speculative_reads
        if core.retries_refused != self.retries_refused:
            observer.read_retries_refused(core.retries_refused - self.retries_refused)
            self.retries_refused = core.retries_refused
        if core.backoffs != self.backoffs:
            observer.read_backoffs(core.backoffs - self.backoffs)
            self.backoffs = core.backoffs


@dataclass(frozen=True)
class ReplicationResult:
    """What `ProtocolClient.replicate` did: the metadata as stored after, the fragments it
    replicated (each with its new bookie), and the entries and frame bytes it copied."""

    metadata: LedgerMetadata
    fragments: tuple[FragmentReplicated, ...]
    entries: int
    bytes: int


@dataclass(frozen=True)
class Finished:
    """What a dispatch returns to end `drive` with `value`."""

    value: Any


async def drive(
    core: Any,
    dispatch: Callable[[Any], Any],
    clock: Clock,
    finished: Callable[[], bool] = lambda: False,
) -> Any:
    """Run a sans-IO core (step/tick/take_commands) until done. `dispatch` handles each
    command: None (handled), an awaitable (IO whose result is stepped into the core), or
    Finished(value) to return `value`; it may raise. IO still in flight is cancelled."""
    in_flight: set[asyncio.Future] = set()
    try:
        while True:
            for command in core.take_commands():
                outcome = dispatch(command)
                if isinstance(outcome, Finished):
                    return outcome.value
                if outcome is not None:
                    in_flight.add(asyncio.ensure_future(outcome))
            if finished():
                return None
            done: set[asyncio.Future] = set()
            if in_flight:
                done, in_flight = await asyncio.wait(
                    in_flight, timeout=TICK_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED
                )
            else:  # nothing to wait for but time (the core's timeouts)
                await asyncio.sleep(TICK_INTERVAL_S)
            for task in done:
                core.step(task.result(), clock())
            core.tick(clock())
    finally:
        for task in in_flight:
            task.cancel()


@dataclass
class _AppendRequest:
    first_entry_id: int
    last_entry_id: int
    started_us: int  # the client's clock_us
    length_before: int  # the ledger's length before the append, and after it: its bytes
    length_after: int
    future: asyncio.Future[int]  # resolves with the LAC once every entry is acknowledged
    span: Span | None = None  # `ledger.add`, when the append is traced

    def carried_by(self, command: SendAdds) -> bool:
        """Some entry of this append is in the send."""
        return any(self.first_entry_id <= e <= self.last_entry_id for e in command.entry_ids)


class WriterHandle:
    """Runs one LedgerWriter: sends what it says, feeds it the answers, resolves appends.
    Time passes for it by its core's deadlines (`LedgerWriter.next_deadline_ms`): at most
    one place in its client's `DeadlineWheel`, none when nothing is due. A quiet handle
    holds no task: an idle writer costs its one explicit-LAC deadline."""

    def __init__(self, core: LedgerWriter, client: ProtocolClient) -> None:
        self.core = core
        self._client = client
        self._requests: deque[_AppendRequest] = deque()
        self._sends: set[asyncio.Task[None]] = set()
        self._sends_out = 0  # SendAdds given to the batcher and not yet answered
        # Made when someone waits for it (back-pressure, drain): most appends never do.
        self._changed: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[LedgerMetadata] | None = None
        self._pump_scheduled = False
        self.deadline_ms: int | None = None  # the deadline armed in the wheel, if any
        # The core's counters as last reported to the observer.
        self._add_requests_seen = 0
        self._add_sends_held_seen = 0
        self._pending_seen = 0
        self._confirmed_length = core.confirmed_length  # as of the last CompleteAdds
        # The appends of _requests that are traced (few: the sampled ones), and the span of
        # the ensemble change under way, if tracing is on.
        self._traced: list[_AppendRequest] = []
        self._change_span: Span | None = None

    @property
    def ledger_id(self) -> int:
        return self.core.ledger_id

    async def append(self, payloads: Sequence[bytes]) -> tuple[int, int, int]:
        """Append and wait for the acknowledgement: (first, last, lac)."""
        # Back-pressure: wait while the pending adds would exceed the core's bound.
        while not self.core.fits(len(payloads)):
            await asyncio.shield(self._change_future())
        first, last, future = self._start_append(payloads)
        lac = await future
        return first, last, lac

    def append_future(self, payloads: Sequence[bytes]) -> asyncio.Future[int]:
        """`append` without a coroutine: a future of the LAC once every entry is
        acknowledged (a bench's paced load starts thousands a second, and a task per
        append was a tenth of its client's CPU). While back-pressure holds the append
        back, it is `append` in a task (a Task is a Future too). Raises as `append` does
        when the append cannot be queued."""
        if not self.core.fits(len(payloads)):
            return asyncio.ensure_future(self._append_lac(payloads))
        return self._start_append(payloads)[2]

    async def _append_lac(self, payloads: Sequence[bytes]) -> int:
        return (await self.append(payloads))[2]

    def _start_append(self, payloads: Sequence[bytes]) -> tuple[int, int, asyncio.Future[int]]:
        """Queue the append (it fits): (first, last, the future of its LAC)."""
        span = self._start_add_span() if recording() else None
        started_us = self._client.clock_us()
        length_before = self.core.length
        try:
            first, last = self.core.add(payloads, self._client.clock())
        except BaseException as exc:
            if span is not None:
                span.record_exception(exc)
                _end_failed(span, repr(exc))
            raise
        request = _AppendRequest(
            first,
            last,
            started_us,
            length_before,
            self.core.length,
            self._client.loop.create_future(),
            span,
        )
        if span is not None:
            span.set_attributes(
                {
                    "quire.entry_id": first,
                    "quire.last_entry_id": last,
                    "quire.entries": last - first + 1,
                }
            )
            self._traced.append(request)
        self._requests.append(request)
        self._schedule_pump()
        return first, last, request.future

    def _start_add_span(self) -> Span:
        quorum = self.core.quorum
        return tracer(__name__).start_span(
            "ledger.add",
            attributes={
                "quire.ledger_id": self.ledger_id,
                "quire.ensemble_size": quorum.ensemble_size,
                "quire.write_quorum": quorum.write_quorum,
                "quire.ack_quorum": quorum.ack_quorum,
            },
        )

    def _traced_in(self, command: SendAdds) -> Traced:
        """The span contexts of the traced appends whose entries `command` carries."""
        return tuple(
            r.span.get_span_context()
            for r in self._traced
            if r.span is not None and r.carried_by(command)
        )

    def _schedule_pump(self) -> None:
        """Pump once at the end of this turn of the event loop: the appends and bookie
        replies of one turn then go out as one add message per bookie instead of one
        each (the core batches what is queued when its commands are taken). The client
        pumps every handle due in a turn from one callback."""
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._client.pump_soon(self)

    def scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    def pump(self) -> None:
        """Carry out the core's commands. Never awaits: runs to the end in one go."""
        for command in self.core.take_commands():
            match command:
                case SendAdds():
                    self._sends_out += 1
                    traced = self._traced_in(command) if self._traced else NOT_TRACED
                    self._client.adds.submit(command, self._on_add_reply, traced)
                case CompleteAdds():
                    self._complete(command)
                case FailAdds():
                    self._fail(command)
                case UpdateLedger():
                    self._spawn(self._update(command))
                case ListWritableBookies():
                    self._start_change_span()
                    self._spawn(self._list_writable())
                case SendWriteLac():
                    self._client.lacs.submit(
                        command.bookie_id, self.ledger_id, self.core.master_key, command.lac
                    )
                case EnsembleChanged():
                    self._end_change_span(command)
                    self._client.observer.ensemble_changed(command)
                case CloseDone():
                    if self._closed is not None and not self._closed.done():
                        self._closed.set_result(command.metadata)
                case CloseFailed():
                    if self._closed is not None and not self._closed.done():
                        self._closed.set_exception(QuireError(command.api, command.detail))
        if self._change_span is not None and self.core.broken is not None:
            self._fail_change_span(f"the writer broke: {self.core.broken}")
        self._report_counts()
        self._arm_timer()

    # -- the ensemble change's span -------------------------------------------------------------

    def _start_change_span(self) -> None:
        """An ensemble change is rare and tells why appends were slow: recorded whenever
        tracing is on, linked to the traced appends waiting for it. It lasts from the
        bookie listing to the stored segment (a retry after finding no replacement
        continues it)."""
        if self._change_span is None:
            self._change_span = _start_background_span(
                "ledger.ensemble_change",
                {"quire.ledger_id": self.ledger_id},
                [r.span.get_span_context() for r in self._traced if r.span is not None],
            )

    def _in_change(self) -> contextlib.AbstractContextManager:
        """The ensemble change's span as the current one (its requests are its children)."""
        if self._change_span is None:
            return contextlib.nullcontext()
        return use_span(self._change_span, end_on_exit=False)

    def _end_change_span(self, command: EnsembleChanged) -> None:
        span, self._change_span = self._change_span, None
        if span is None:
            return
        span.set_attributes(
            {
                "quire.first_entry_id": command.first_entry_id,
                "quire.failed_bookies": [old for _, old, _ in command.replaced],
                "quire.replacements": [new for _, _, new in command.replaced],
                "quire.version": command.metadata.version,
            }
        )
        span.end()

    def _fail_change_span(self, detail: str) -> None:
        span, self._change_span = self._change_span, None
        if span is not None:
            _end_failed(span, detail)

    def _arm_timer(self) -> None:
        """Keep the core's next deadline armed, moved as it moves: in the wheel a move is a
        dict operation, cheaper than the tick of a deadline that has gone (a ledger adding
        about once per explicit-LAC interval would otherwise be ticked after each add for
        the LAC its next add carried)."""
        deadline = self.core.next_deadline_ms()
        if deadline == self.deadline_ms:
            return
        if deadline is None:
            self._client.deadlines.cancel(self)
        else:
            self._client.deadlines.arm(self, deadline)

    def deadline_reached(self, now_ms: int) -> None:
        """The wheel took the handle out: its deadline has come."""
        self.tick(now_ms)  # re-arms for the next deadline, if any

    def _cancel_timer(self) -> None:
        self._client.deadlines.cancel(self)

    def _report_counts(self) -> None:
        pending = self.core.pending_count
        if pending != self._pending_seen:
            self._client.observer.pending_adds_changed(pending - self._pending_seen)
            self._pending_seen = pending
        sent, held = self.core.add_requests_sent, self.core.add_sends_held
        if (sent, held) != (self._add_requests_seen, self._add_sends_held_seen):
            self._client.observer.add_requests(
                sent - self._add_requests_seen, held - self._add_sends_held_seen
            )
            self._add_requests_seen, self._add_sends_held_seen = sent, held

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        return task

    async def _update(self, command: UpdateLedger) -> None:
        with self._in_change():
            outcome = await self._client.cas(command)
        self.core.step(outcome, self._client.clock())
        self.pump()

    async def _list_writable(self) -> None:
        try:
            with self._in_change():
                writable = await self._client.writable_bookies()
        except MetadataError as exc:
            log.warning("no bookie list for an ensemble change", extra={"err": exc.message})
            writable = {}
        event = WritableBookies(tuple(writable), tuple(self._client.locations.items()))
        self.core.step(event, self._client.clock())
        self.pump()

    def _on_add_reply(self, reply: AddReply) -> None:
        # Exactly one answer per SendAdds (the core's flow control counts on it); a
        # replaced bookie's late answer is harmless: the core maps answers by bookie.
        self._sends_out -= 1
        self.core.step(reply, self._client.clock())
        # Most answers leave nothing to carry out (an entry's first ack, and the one after
        # its ack quorum): with one entry per ledger and answer, a pump for each of them
        # was two of the three pumps per entry. Counts change only with commands.
        if self.core.has_commands or self.core.next_deadline_ms() != self.deadline_ms:
            self._schedule_pump()

    async def close(self, timeout_s: float) -> LedgerMetadata:
        """CAS the ledger CLOSED once every add in flight is decided (the core's outcome)."""
        with internal_span("ledger.close", attributes={"quire.ledger_id": self.ledger_id}):
            return await self._close(timeout_s)

    async def _close(self, timeout_s: float) -> LedgerMetadata:
        if self._closed is None or (self._closed.done() and self._closed.exception()):
            self._closed = asyncio.get_running_loop().create_future()
            self.core.start_close()
            self.pump()
        try:
            return await asyncio.wait_for(asyncio.shield(self._closed), timeout_s)
        except TimeoutError as exc:
            raise QuireError(
                ApiCodes.TIMEOUT, f"close of ledger {self.ledger_id} did not finish"
            ) from exc

    def _complete(self, command: CompleteAdds) -> None:
        now_us = self._client.clock_us()
        # The entries confirmed now are in one segment: an ensemble change's segment starts
        # at the LAC + 1 and nothing is confirmed while it is in flight (LedgerWriter._confirm).
        bookies = self.core.metadata.segment_for(command.first_entry_id).bookies
        length_before = self._confirmed_length
        self._confirmed_length = command.length
        while self._requests and self._requests[0].first_entry_id <= command.last_entry_id:
            request = self._requests[0]
            # The part of the append confirmed now (an append may be confirmed in parts);
            # lengths grow with entry ids, so its bytes are the lengths' difference.
            self._client.observer.adds_acknowledged(
                self.ledger_id,
                max(request.first_entry_id, command.first_entry_id),
                min(request.last_entry_id, command.last_entry_id),
                now_us - request.started_us,
                min(request.length_after, command.length)
                - max(request.length_before, length_before),
                bookies,
                self.core.quorum,
            )
            if request.last_entry_id > command.last_entry_id:
                break
            self._requests.popleft()
            if request.span is not None:
                request.span.add_event("ack quorum reached", {"quire.lac": command.lac})
                request.span.end()
                self._traced.remove(request)
            if not request.future.done():
                request.future.set_result(command.lac)
        self._notify()

    def _fail(self, command: FailAdds) -> None:
        while self._requests and self._requests[0].first_entry_id <= command.last_entry_id:
            request = self._requests.popleft()
            self._client.observer.adds_failed(request.last_entry_id - request.first_entry_id + 1)
            if request.span is not None:
                _end_failed(request.span, f"{command.api.code}: {command.detail}")
                self._traced.remove(request)
            if not request.future.done():
                request.future.set_exception(QuireError(command.api, command.detail))
        self._notify()

    def _change_future(self) -> asyncio.Future[None]:
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set_result(None)
            self._changed = None

    def tick(self, now_ms: int) -> None:
        self.core.tick(now_ms)
        self.pump()

    @property
    def quiet(self) -> bool:
        """Holds no timer, no task, no send and no append: costs nothing but its memory."""
        return (
            self.deadline_ms is None
            and not self._sends
            and not self._sends_out
            and not self._requests
        )

    @property
    def has_requests(self) -> bool:
        """Appends wait for their outcome."""
        return bool(self._requests)

    async def wait_changed(self, timeout_s: float) -> None:
        """Until an add completes or fails, or `timeout_s` passes."""
        try:
            await asyncio.wait_for(asyncio.shield(self._change_future()), timeout_s)
        except TimeoutError:
            pass

    async def drain(self, timeout_s: float) -> None:
        """Wait for every append in flight (the core's timeout fails them at the latest)."""
        deadline_ms = self._client.clock() + int(timeout_s * 1000)
        while self._requests and (remaining_ms := deadline_ms - self._client.clock()) > 0:
            await self.wait_changed(remaining_ms / 1000)

    def abort(self, api: ApiCode, detail: str) -> None:
        """Fail what is pending and let go: no timer, no task left behind."""
        self.core.abort(api, detail)
        self.pump()
        self._cancel_timer()
        self._fail_change_span(detail)
        for task in self._sends:
            task.cancel()

    def release(self) -> None:
        """The handle is done with (closed, or dropped by its owner): cancel its timer."""
        self._cancel_timer()
        self._fail_change_span("the writer was released")


class DeadlineWheel:
    """The deadlines of every writer handle of a client (BookKeeper's hashed wheel timer
    for add timeouts): handles in slots of `resolution_ms`, a heap of the slots in use,
    one event-loop timer for the earliest. Arming, moving and cancelling a handle's
    deadline is a dict operation; the loop's timer fires at most once a slot, for every
    handle due in it, whatever the number of handles. A deadline is met up to
    `resolution_ms` late, never early (a tick before its deadline does nothing)."""

    def __init__(self, clock: Clock, resolution_ms: int = DEADLINE_RESOLUTION_MS) -> None:
        assert resolution_ms >= 1
        self._clock = clock
        self.resolution_ms = resolution_ms
        self._slots: dict[int, dict[WriterHandle, None]] = {}  # slot -> its handles
        self._slot_of: dict[WriterHandle, int] = {}
        self._heap: list[int] = []  # every slot in _slots, and emptied ones not yet popped
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot = 0  # the slot the loop's timer is armed for

    def __len__(self) -> int:
        """Handles armed."""
        return len(self._slot_of)

    @property
    def timer_armed(self) -> bool:
        """An event-loop timer is armed (none once nothing is, after at most one more)."""
        return self._timer is not None

    def arm(self, handle: WriterHandle, deadline_ms: int) -> None:
        """Tick `handle` once `deadline_ms` has come (instead of any deadline it had)."""
        self._remove(handle)
        slot = -(-deadline_ms // self.resolution_ms)  # rounded up: never early
        handles = self._slots.get(slot)
        if handles is None:
            handles = self._slots[slot] = {}
            heapq.heappush(self._heap, slot)
        handles[handle] = None
        self._slot_of[handle] = slot
        handle.deadline_ms = deadline_ms
        if self._timer is None or slot < self._timer_slot:
            self._arm_loop(slot)

    def cancel(self, handle: WriterHandle) -> None:
        self._remove(handle)

    def _remove(self, handle: WriterHandle) -> None:
        slot = self._slot_of.pop(handle, None)
        if slot is None:
            return
        handle.deadline_ms = None
        handles = self._slots[slot]
        del handles[handle]
        if not handles:
            del self._slots[slot]  # its heap entry is skipped when it comes up

    def _arm_loop(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        # At least 1 ms: asyncio may fire a timer up to its clock resolution early, and a
        # slot not yet due is only armed again.
        delay_ms = max(slot * self.resolution_ms - self._clock(), 1)
        self._timer = asyncio.get_running_loop().call_later(
            delay_ms / 1000, self._fire, context=_DETACHED
        )
        self._timer_slot = slot

    def _fire(self) -> None:
        self._timer = None
        now = self._clock()
        due: list[WriterHandle] = []
        heap = self._heap
        while heap and heap[0] * self.resolution_ms <= now:
            handles = self._slots.pop(heapq.heappop(heap), None)
            if handles:
                due.extend(handles)
        for handle in due:
            del self._slot_of[handle]
            handle.deadline_ms = None
        while heap and heap[0] not in self._slots:
            heapq.heappop(heap)
        if heap:  # before the ticks: what they arm is compared with the earliest left
            self._arm_loop(heap[0])
        for handle in due:
            handle.deadline_reached(now)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass(slots=True, eq=False)  # in sets by identity
class _BatchRequest:
    """One add request of the batcher to a bookie: the sends it carries."""

    bookie_id: str
    sends: list[tuple[SendAdds, OnAddReply, Traced]]
    answered: bool = False
    gone: bool = False  # stopped because its bookie is gone (a probe found no responder)
    stop: Callable[[], Any] | None = None  # stops waiting for the answer
    probe: asyncio.TimerHandle | None = None  # asks whether the bookie is gone

    @property
    def commands(self) -> list[SendAdds]:
        return [command for command, _, _ in self.sends]


class BookieAddBatcher:
    """The adds of every writer of a client to one bookie, as few requests as the load
    allows (BookKeeper's per-bookie channel, shared by all the client's ledgers): at most
    `max_requests_per_bookie` add requests unanswered per bookie; sends that come meanwhile
    wait and go out merged, up to `max_send_bytes` a request, when one is answered. With
    thousands of ledgers each adding a trickle, a bookie then gets a few large requests
    instead of one per ledger (the per-message cost in the client, NATS and each journal
    is what a many-ledger load runs out of first). A bookie with a request slot free gets
    the sends of a turn of the event loop at its end, as one request.

    A send is answered through its callback, exactly once (the writer's flow control
    counts on it): no task and no future per send, which with one entry per send were
    most of the client's cost per entry. A request goes through the transport's
    `add_nowait` where it has one (`BookieClient`: its answer comes back as a callback
    where the NATS client parses it, with no task, future or coroutine per request), else
    as a task awaiting `add` (a traced request, a test's transport).

    A request unanswered after `probe_after_ms` makes it ask whether the bookie still has a
    responder at all (one probe at a time per bookie). A bookie killed while requests were
    in flight to it never answers them, and with its request slots full nothing new goes to
    it to meet "no responders": without the probe its writers would go on acknowledging on
    the other bookies until the add timeout. When it is gone, its requests in flight fail
    at once as unreachable, so their writers replace it now (BookKeeper fails a closed
    channel's outstanding adds the same way)."""

    def __init__(
        self,
        bookies: BookieTransport,
        observer: ProtocolObserver,
        max_requests_per_bookie: int,
        probe_after_ms: int = 0,
    ) -> None:
        assert max_requests_per_bookie >= 1
        self._bookies = bookies
        self._observer = observer
        self.max_requests_per_bookie = max_requests_per_bookie
        self._probe_after_s = probe_after_ms / 1000  # 0: no probe
        self._in_flight: dict[str, int] = {}
        self._queued: dict[str, deque[tuple[SendAdds, OnAddReply, Traced]]] = {}
        self._traced_queued = 0  # queued sends that carry traced appends (usually none)
        self._add_nowait = getattr(bookies, "add_nowait", None)
        self._requests: set[_BatchRequest] = set()  # in flight
        self._probes: set[asyncio.Task[None]] = set()
        self._flush_due: set[str] = set()  # bookies with a flush due at the end of the turn
        # A pump of the client's writers is under way: it flushes when it ends.
        self.deferring = False
        self._closed = False
        self._requests_to: dict[str, set[_BatchRequest]] = {}  # in flight, by bookie
        self._probing: set[str] = set()

    def submit(self, command: SendAdds, on_reply: OnAddReply, traced: Traced = NOT_TRACED) -> None:
        """Send `command` (now, or merged with others once the bookie answers); its answer
        goes to `on_reply`, never from inside this call. `traced`: the span contexts of the
        traced appends it carries, for the request's span."""
        if self._closed:
            failed = AddSendFailed(command.bookie_id, command.entry_ids, "the client is closed")
            asyncio.get_running_loop().call_soon(on_reply, failed)
            return
        bookie_id = command.bookie_id
        self._queued.setdefault(bookie_id, deque()).append((command, on_reply, traced))
        if traced:
            self._traced_queued += 1
        if bookie_id not in self._flush_due:
            # At the end of this turn, not now: the sends of every writer pumped in the turn
            # then go to a free bookie as one request, not the first alone and the rest
            # merged behind it once it is answered. Within the client's pump of its
            # writers (`ProtocolClient._pump_all`), at the end of that pump.
            self._flush_due.add(bookie_id)
            if not self.deferring:
                loop = asyncio.get_running_loop()
                loop.call_soon(self._flush_if_free, bookie_id, context=_DETACHED)

    @property
    def quiet(self) -> bool:
        """No send waits and no request is in flight."""
        return not self._queued and not self._requests and not self._probes

    async def send(self, command: SendAdds) -> AddReply:
        """`submit` for a caller that awaits the answer (a recovery's driver), traced as
        the caller's current span is."""
        future: asyncio.Future[AddReply] = asyncio.get_running_loop().create_future()

        def answered(reply: AddReply) -> None:
            if not future.done():
                future.set_result(reply)

        span_context = current_span_context()
        self.submit(command, answered, NOT_TRACED if span_context is None else (span_context,))
        return await future

    def flush_deferred(self) -> None:
        """The end of a pump of the client's writers: what they submitted goes out now."""
        self.deferring = False
        for bookie_id in list(self._flush_due):
            self._flush_if_free(bookie_id)

    def _flush_if_free(self, bookie_id: str) -> None:
        """A request to the bookie may go out (otherwise its next answer sends what waits)."""
        if bookie_id not in self._flush_due:
            return  # flushed already
        self._flush_due.discard(bookie_id)
        if not self._closed and self._in_flight.get(bookie_id, 0) < self.max_requests_per_bookie:
            self._flush(bookie_id)

    def _flush(self, bookie_id: str) -> None:
        """Send what waits for the bookie as one request of at most max_send_bytes (a
        larger send goes alone)."""
        queued = self._queued.get(bookie_id)
        batch: list[tuple[SendAdds, OnAddReply, Traced]] = []
        size, limit = 0, self._bookies.max_send_bytes
        while queued:
            command_size = send_size(queued[0][0])
            if batch and size + command_size > limit:
                break
            batch.append(queued.popleft())
            size += command_size
        if not queued:
            self._queued.pop(bookie_id, None)
        if not batch:
            return
        self._in_flight[bookie_id] = self._in_flight.get(bookie_id, 0) + 1
        request = _BatchRequest(bookie_id, batch)
        self._requests.add(request)
        commands = [command for command, _, _ in batch]
        self._observer.bookie_add_batch(len(commands))
        traced = self._take_traced(batch) if self._traced_queued else NOT_TRACED
        items = merge_sends(commands)
        if self._add_nowait is not None and not traced:
            request.stop = self._add_nowait(
                bookie_id, items, lambda answer: self._add_answered(request, answer)
            )
        if request.stop is None:
            task = _detached_task(self._send_batch(request, items, traced))
            request.stop = task.cancel
            # A task cancelled before its first step (close(), or a probe that found the
            # bookie gone in the same turn) never runs its body: this answers its sends
            # then, and gives its request slot back.
            task.add_done_callback(lambda _: self._answer(request, ()))
        if self._probe_after_s:
            self._requests_to.setdefault(bookie_id, set()).add(request)
            request.probe = asyncio.get_running_loop().call_later(
                self._probe_after_s, self._unanswered, bookie_id
            )

    def _unanswered(self, bookie_id: str) -> None:
        """A request to the bookie waited probe_after_ms: ask whether it is still there."""
        if bookie_id in self._probing or self._closed:
            return
        self._probing.add(bookie_id)
        task = asyncio.ensure_future(self._probe(bookie_id))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, bookie_id: str) -> None:
        try:
            there = await self._bookies.has_responder(bookie_id)
        finally:
            self._probing.discard(bookie_id)
        if there:
            return
        for request in list(self._requests_to.get(bookie_id, ())):
            request.gone = True
            self._stop(request)

    def _stop(self, request: _BatchRequest) -> None:
        """Stop waiting for the request's answer; its sends are answered as failed (in a
        later callback, never inside the caller's)."""
        if request.stop is not None:
            request.stop()
        asyncio.get_running_loop().call_soon(self._answer, request, ())

    async def _send_batch(
        self, request: _BatchRequest, items: list[AddItem], traced: Traced
    ) -> None:
        bookie_id = request.bookie_id
        replies: Sequence[AddReply] = ()
        try:
            if traced:
                status, results = await self._bookies.add(bookie_id, items, traced=traced)
            else:
                status, results = await self._bookies.add(bookie_id, items)
            replies = split_add_reply(request.commands, status, results)
        except BookieUnreachable as exc:
            replies = self._failed(request, exc)
        finally:
            self._answer(request, replies)

    def _add_answered(
        self,
        request: _BatchRequest,
        answer: tuple[BookieStatus, list[AddResult]] | BookieUnreachable,
    ) -> None:
        """`add_nowait`'s answer."""
        if isinstance(answer, BookieUnreachable):
            self._answer(request, self._failed(request, answer))
        else:
            self._answer(request, split_add_reply(request.commands, *answer))

    @staticmethod
    def _failed(request: _BatchRequest, exc: BookieUnreachable) -> list[AddReply]:
        bookie_id = request.bookie_id
        return [
            AddSendFailed(bookie_id, c.entry_ids, str(exc), exc.timed_out) for c in request.commands
        ]

    def _answer(self, request: _BatchRequest, replies: Sequence[AddReply]) -> None:
        """Answer each send of the request, once; free its request slot."""
        if request.answered:
            return
        request.answered = True
        bookie_id, batch = request.bookie_id, request.sends
        self._requests.discard(request)
        if request.probe is not None:
            request.probe.cancel()
            self._requests_to[bookie_id].discard(request)
        if not replies and request.gone:
            reason = "no responder any more (its process is gone)"
            replies = [AddSendFailed(bookie_id, c.entry_ids, reason, False) for c, _, _ in batch]
        elif not replies:  # cancelled (the client is closing): still one answer each
            replies = [AddSendFailed(bookie_id, c.entry_ids, "cancelled") for c, _, _ in batch]
        self._in_flight[bookie_id] -= 1
        if self._queued.get(bookie_id) and not self._closed:
            self._flush(bookie_id)
        for (_, on_reply, _), reply in zip(batch, replies, strict=True):
            on_reply(reply)

    def _take_traced(self, batch: list[tuple[SendAdds, OnAddReply, Traced]]) -> Traced:
        """The span contexts the batch's sends carry (they leave the queue)."""
        traced = [t for _, _, t in batch if t]
        self._traced_queued -= len(traced)
        return tuple(context for contexts in traced for context in contexts)

    def close(self) -> None:
        """Send nothing more: the requests in flight are cancelled, and every send still
        waiting is answered as failed."""
        self._closed = True
        for request in list(self._requests):
            self._stop(request)
        for task in self._probes:
            task.cancel()
        loop = asyncio.get_running_loop()
        for bookie_id, queued in self._queued.items():
            for command, on_reply, _ in queued:
                failed = AddSendFailed(bookie_id, command.entry_ids, "the client is closed")
                loop.call_soon(on_reply, failed)
        self._queued.clear()


class BookieLacBatcher:
    """The explicit LACs (write_lac) of every writer of a client to one bookie, merged: sent
    at the end of the event-loop turn, or, while a request to that bookie is unanswered,
    all together when it is answered (a ledger's latest LAC only). Thousands of ledgers
    that each add about once per explicit_lac_interval_ms would otherwise send one request
    per ledger and bookie after every add. Fire and forget: a LAC not written reaches the
    bookies with the ledger's next add anyway."""

    MAX_ITEMS = 4096  # LACs in one request (36 bytes each)

    def __init__(self, bookies: BookieTransport) -> None:
        self._bookies = bookies
        self._queued: dict[str, dict[int, tuple[bytes, int]]] = {}  # ledger -> (key, LAC)
        self._busy: set[str] = set()  # bookies with a request unanswered or a flush due
        self._requests: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def quiet(self) -> bool:
        """No LAC waits and no request is in flight."""
        return not self._queued and not self._busy and not self._requests

    def submit(self, bookie_id: str, ledger_id: int, master_key: bytes, lac: int) -> None:
        if self._closed:
            return
        queued = self._queued.setdefault(bookie_id, {})
        if ledger_id not in queued or queued[ledger_id][1] < lac:
            queued[ledger_id] = (master_key, lac)
        if bookie_id not in self._busy:
            self._busy.add(bookie_id)
            asyncio.get_running_loop().call_soon(self._flush, bookie_id)

    def _flush(self, bookie_id: str) -> None:
        queued = self._queued.pop(bookie_id, None)
        if not queued or self._closed:
            self._busy.discard(bookie_id)
            return
        items = [(ledger_id, key, lac) for ledger_id, (key, lac) in queued.items()]
        rest = items[self.MAX_ITEMS :]
        if rest:
            self._queued[bookie_id] = {ledger_id: (key, lac) for ledger_id, key, lac in rest}
        task = asyncio.create_task(self._send(bookie_id, items[: self.MAX_ITEMS]))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _send(self, bookie_id: str, items: list[tuple[int, bytes, int]]) -> None:
        try:
            await self._bookies.write_lac(bookie_id, items)
        except BookieUnreachable as exc:  # the next adds carry the LACs anyway
            log.debug("explicit LACs not written", extra={"err": str(exc), "count": len(items)})
        finally:
            self._flush(bookie_id)  # what came meanwhile, or the bookie is free again

    def close(self) -> None:
        self._closed = True
        self._queued.clear()
        for task in self._requests:
            task.cancel()


class ProtocolClient:
    """A BookKeeper client over the transports: creates ledgers (and their writer
    handles), recovers, reads entries and LACs. `settings` bounds and times it all (the
    gateway's section of the settings, whoever the client is)."""

    def __init__(
        self,
        bookies: BookieTransport,
        meta: MetadataTransport,
        settings: GatewaySettings,
        *,
        observer: ProtocolObserver | None = None,
        rng: random.Random | None = None,
        clock: Clock = monotonic_ms,
        wall_clock: Clock = wall_clock_ms,
        clock_us: Clock | None = None,
        placement: PlacementPolicy | None = None,
    ) -> None:
        self.bookies = bookies
        self.meta = meta
        self.settings = settings
        # Where ensembles go (new ledgers, ensemble changes, re-replication targets).
        self.placement = placement or PlacementPolicy()
        # Every registered bookie's location as last listed: replacements are placed beside
        # ensemble bookies that may not be writable (read-only, lost) but keep their rack.
        self.locations: dict[str, str] = {}
        self.observer = observer or ProtocolObserver()
        self.rng = rng or random.Random(os.urandom(16))
        self.clock = clock
        # Add latencies (microseconds): the real clock's finer reading, or a test's clock
        # scaled (so that a test that sets the time sets the latencies too).
        if clock_us is None:
            clock_us = monotonic_us if clock is monotonic_ms else lambda: clock() * 1000
        self.clock_us = clock_us
        self.wall_clock = wall_clock
        self.adds = BookieAddBatcher(
            bookies,
            self.observer,
            settings.max_add_requests_per_bookie,
            settings.add_bookie_probe_ms,
        )
        self.lacs = BookieLacBatcher(bookies)
        self.deadlines = DeadlineWheel(clock)
        self._pumps: list[WriterHandle] = []  # handles to pump at the end of this turn
        self._loop: asyncio.AbstractEventLoop | None = None  # `loop`

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running event loop, looked up once (`asyncio.get_running_loop` is a getpid
        system call each time: one per append was a few percent of a bench's client CPU).
        A client runs in one event loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def pump_soon(self, handle: WriterHandle) -> None:
        """Pump `handle` at the end of this turn of the event loop, with every other handle
        due then: one callback a turn for the client, not one for each writer."""
        if not self._pumps:
            self.loop.call_soon(self._pump_all, context=_DETACHED)
        self._pumps.append(handle)

    def _pump_all(self) -> None:
        pumps, self._pumps = self._pumps, []
        # The sends of every writer pumped now go out together when they all are, in this
        # callback: no further turn of the event loop before the requests.
        self.adds.deferring = True
        try:
            for handle in pumps:
                try:
                    handle.scheduled_pump()
                except Exception:  # a bug in one writer must not leave the others unpumped
                    log.exception("pump of ledger %d failed", handle.ledger_id)
        finally:
            self.adds.flush_deferred()

    @property
    def quiet(self) -> bool:
        """Nothing of its writers waits to go to a bookie or is on its way."""
        return self.adds.quiet and self.lacs.quiet

    def close(self) -> None:
        """Stop sending: requests in flight are cancelled (the writers are going away)."""
        self.adds.close()
        self.lacs.close()
        self.deadlines.close()

    # -- metadata -----------------------------------------------------------------------------

    async def cas(self, command: UpdateLedger) -> LedgerUpdated | LedgerUpdateFailed:
        """Run a core's compare-and-set; on a lost race or an unknown outcome, say what is
        stored now (the core decides, as BookKeeper's MetadataUpdateLoop callers do)."""
        request = command.request
        try:
            return LedgerUpdated(await self.meta.update_ledger(request))
        except MetadataError as exc:
            reason = f"{exc.code}: {exc.message}"
            if exc.current is not None:
                return LedgerUpdateFailed(exc.current, reason)
        try:
            return LedgerUpdateFailed(await self.meta.get_ledger(request.ledger_id), reason)
        except MetadataError as exc:
            return LedgerUpdateFailed(None, f"{reason}; re-read: {exc.code}: {exc.message}")

    async def writable_bookies(self) -> dict[str, str]:
        """The registered bookies that are writable and whose lease has not expired, each
        with its network location (for placement); raises MetadataError."""
        now_ms = self.wall_clock()
        bookies = await self.meta.list_bookies()
        self.bookies.bookies_listed(bookies)
        self.locations = {b.bookie_id: b.location for b in bookies}
        return {
            b.bookie_id: b.location
            for b in bookies
            if b.state is BookieState.WRITABLE and b.lease_expires_at > now_ms
        }

    # -- create -------------------------------------------------------------------------------

    async def create_ledger(
        self,
        *,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        digest: str,
        password: bytes,
        metadata: dict[str, str],
        excluding: Collection[str] = (),
    ) -> WriterHandle:
        """Choose an ensemble (of writable bookies not in `excluding`), create the ledger's
        metadata, and open its writer. Raises QuireError (bad quorum, not enough bookies) or
        MetadataError."""
        if not 1 <= ack_quorum <= write_quorum <= ensemble_size:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT,
                "need 1 <= ack_quorum <= write_quorum <= ensemble_size, got "
                f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}",
            )
        placed = self.placement.new_ensemble(
            ensemble_size, write_quorum, await self.writable_bookies(), self.rng, excluding
        )
        ensemble = list(placed.bookies)
        salt = os.urandom(SALT_BYTES).hex()
        request = CreateLedgerRequest(
            ensemble_size=ensemble_size,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            digest=digest,
            password_salt=salt,
            password_hash=password_hash(salt, password),
            metadata=metadata,
            ensemble=ensemble,
            # Stored so that the replicator can write the ledger's entries again without
            # the password (LedgerMetadata.master_key says why).
            master_key=master_key(password).hex(),
            mac_key=mac_key(password).hex(),
        )
        created = await self.meta.create_ledger(request)
        if placed.fallback:
            log.warning(
                "new ledger placed at random: the placement policy cannot be met",
                extra={
                    "ledger_id": created.ledger_id,
                    "policy": self.placement.name,
                    "reason": placed.reason,
                },
            )
            self.observer.placement_fallback(created.ledger_id, placed.reason)
        settings = self.settings
        core = LedgerWriter(
            created,
            master_key(password),
            DigestManager(created.digest, password),
            add_entry_timeout_ms=settings.add_entry_timeout_ms,
            max_send_bytes=self.bookies.max_send_bytes,
            rng=self.rng,
            explicit_lac_interval_ms=settings.explicit_lac_interval_ms,
            max_add_requests_per_bookie=settings.max_add_requests_per_bookie,
            max_pending_adds=settings.max_pending_adds_per_ledger,
            placement=self.placement,
            now_ms=self.clock(),
        )
        return WriterHandle(core, self)

    # -- bookie requests as core events -------------------------------------------------------

    async def send_adds(self, command: SendAdds) -> AddReply:
        """One writer's send, merged with other writers' sends to the same bookie."""
        return await self.adds.send(command)

    async def send_reads(self, command: SendReads) -> BookieReadReply | ReadSendFailed:
        try:
            status, results = await self.bookies.read(command.bookie_id, list(command.items))
            return BookieReadReply(command.bookie_id, command.entry_ids, status, tuple(results))
        except BookieUnreachable as exc:
            return ReadSendFailed(command.bookie_id, command.entry_ids, str(exc), exc.timed_out)

    async def send_fence(
        self, command: SendFence, ledger_id: int, key: bytes
    ) -> FenceReply | FenceSendFailed:
        try:
            reply = await self.bookies.fence(command.bookie_id, ledger_id, key)
            return FenceReply(command.bookie_id, reply.status, reply.lac)
        except BookieUnreachable as exc:
            return FenceSendFailed(command.bookie_id, str(exc))

    # -- recovery -----------------------------------------------------------------------------

    async def recover(
        self, metadata: LedgerMetadata, credentials: bytes | LedgerKeys
    ) -> LedgerRecovery:
        """BookKeeper's open-with-recovery: fence, find the last entry, close. The finished
        core (its `result`, `recovered_entries`); raises QuireError if it failed.
        `credentials` is the ledger's password, or its keys (a replicator has no password)."""
        settings = self.settings
        keys = (
            credentials
            if isinstance(credentials, LedgerKeys)
            else LedgerKeys.from_password(credentials)
        )
        core = LedgerRecovery(
            metadata,
            keys.master_key,
            DigestManager.for_keys(metadata.digest, keys),
            self.clock(),
            rng=self.rng,
            placement=self.placement,
            retry_interval_ms=settings.recovery_retry_interval_ms,
            recovery_timeout_ms=settings.recovery_timeout_ms,
            add_entry_timeout_ms=settings.add_entry_timeout_ms,
            max_send_bytes=self.bookies.max_send_bytes,
            read_batch_size=settings.recovery_read_batch_size,
        )

        def dispatch(command: Any) -> Any:
            match command:
                case RecoveryDone():
                    return Finished(command.metadata)
                case RecoveryFailed():
                    raise QuireError(command.api, command.detail)
                case ReplicaCorrupt():
                    self.observer.replica_corrupt(core.ledger_id, command)
                case EnsembleChanged():
                    self.observer.ensemble_changed(command)
                case _:
                    return self._core_io(core, command)
            return None

        with internal_span("ledger.recover", attributes={"quire.ledger_id": metadata.ledger_id}):
            await drive(core, dispatch, self.clock)
        return core

    async def _core_io(self, core: LedgerRecovery | LedgerReplication, command: Any) -> Any:
        """One command of a recovery or a replication as IO; the event it turns into."""
        match command:
            case UpdateLedger():
                return await self.cas(command)
            case SendFence():
                return await self.send_fence(command, core.ledger_id, core.master_key)
            case SendReads():
                return await self.send_reads(command)
            case SendAdds():
                return await self.send_adds(command)
            case ListWritableBookies():
                try:
                    writable = await self.writable_bookies()
                    return WritableBookies(tuple(writable), tuple(self.locations.items()))
                except MetadataError:
                    return WritableBookies(())
        raise AssertionError(f"unknown command {command!r}")

    # -- re-replication -----------------------------------------------------------------------

    def replication_settings(self) -> ReplicationSettings:
        """A replication's bounds with BookKeeper's defaults, reading as this client reads."""
        return ReplicationSettings(read=self.read_settings())

    async def replicate(
        self,
        metadata: LedgerMetadata,
        bad_bookies: Collection[str],
        *,
        settings: ReplicationSettings | None = None,
        on_fragment: Callable[[FragmentReplicated], None] | None = None,
    ) -> ReplicationResult:
        """Copy every fragment of the ledger stored on `bad_bookies` to a new bookie and
        store each new ensemble (`replication.LedgerReplication`); `on_fragment` hears of
        each as it is stored. The open last segment of a ledger that is not closed is left
        (`replication.open_fragment_on`: fence and recover it first). Raises QuireError:
        INVALID_ARGUMENT for a ledger whose keys are not stored (created before they were),
        else the failure's code; what was replicated before a failure stays so."""
        keys = LedgerKeys.of(metadata)
        if keys is None:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT,
                f"ledger {metadata.ledger_id} was created before ledger keys were stored "
                "with its metadata: it cannot be re-replicated",
            )
        core = LedgerReplication(
            metadata,
            bad_bookies,
            keys,
            self.clock(),
            settings=settings or self.replication_settings(),
            rng=self.rng,
            placement=self.placement,
        )

        def dispatch(command: Any) -> Any:
            match command:
                case ReplicationDone():
                    return Finished(
                        ReplicationResult(
                            command.metadata,
                            tuple(core.replicated),
                            core.entries_copied,
                            core.bytes_copied,
                        )
                    )
                case ReplicationFailed():
                    raise QuireError(command.api, command.detail)
                case FragmentReplicated():
                    if on_fragment is not None:
                        on_fragment(command)
                case ReplicaCorrupt():
                    self.observer.replica_corrupt(core.ledger_id, command)
                case _:
                    return self._core_io(core, command)
            return None

        attributes = {
            "quire.ledger_id": metadata.ledger_id,
            "quire.bad_bookies": sorted(bad_bookies),
        }
        # Re-replication is background work: traced whenever tracing is on.
        span = (
            internal_span("ledger.rereplicate", attributes=attributes)
            if recording()
            else background_span("ledger.rereplicate", attributes=attributes)
        )
        with span:
            return await drive(core, dispatch, self.clock)

    # -- reads --------------------------------------------------------------------------------

    def read_settings(self) -> ReadSettings:
        """The reader's bounds and timeouts, from the client's settings."""
        # Each of the core's settings is the gateway setting of its name.
        values = {f.name: getattr(self.settings, f.name) for f in dataclasses.fields(ReadSettings)}
        values["read_window_initial_entries"] = min(
            values["read_window_initial_entries"], values["read_window_max_entries"]
        )
        return ReadSettings(**values)

    async def read_stream(
        self,
        metadata: LedgerMetadata,
        password: bytes,
        first: int,
        last: int,
        *,
        unconfirmed: bool = False,
    ) -> AsyncIterator[list[EntryRead]]:
        """Entries first..last in order, in batches as they arrive (a LedgerReader: memory
        bounded by its read-ahead whatever the range). Raises QuireError with the failed
        entry's API code; with `unconfirmed`, ends quietly before the first entry that no
        replica has (NO_SUCH_ENTRY). A consumer that stops iterating (and closes the
        iterator) cancels what is in flight; nothing more is sent meanwhile, since the core
        only runs while the iteration does."""
        core = LedgerReader(
            metadata, DigestManager(metadata.digest, password), self.read_settings()
        )
        core.read(first, last, self.clock())
        in_flight: set[asyncio.Future] = set()
        reported = _ReadCounts()
        try:
            while True:
                batch: list[EntryRead] = []
                failed: EntryReadFailed | None = None
                for command in core.take_commands():
                    match command:
                        case SendReads():
                            in_flight.add(asyncio.ensure_future(self.send_reads(command)))
                        case EntryRead():
                            batch.append(command)
                        case EntryReadFailed():
                            failed = command
                        case ReplicaCorrupt():
                            self.observer.replica_corrupt(metadata.ledger_id, command)
                # With `unconfirmed`, an entry no replica has is the range's end, no failure.
                ended = unconfirmed and failed is not None and failed.api == ApiCodes.NO_SUCH_ENTRY
                reported.report(core, self.observer, len(batch), failed is not None and not ended)
                if batch:
                    yield batch
                if ended:
                    return
                if failed is not None:
                    raise QuireError(failed.api, failed.detail)
                if core.done:
                    return
                done: set[asyncio.Future] = set()
                if in_flight:
                    done, in_flight = await asyncio.wait(
                        in_flight, timeout=TICK_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED
                    )
                else:  # nothing to wait for but time (a backoff)
                    await asyncio.sleep(TICK_INTERVAL_S)
                for task in done:
                    core.step(task.result(), self.clock())
                core.tick(self.clock())
        finally:
            for task in in_flight:
                task.cancel()

    async def read_lac_from_bookies(self, metadata: LedgerMetadata) -> int:
        """The LAC as the last segment's bookies know it (their highest answer)."""
        bookies = metadata.segments[-1].bookies

        async def one(bookie_id: str):
            try:
                reply = await self.bookies.read_lac(bookie_id, metadata.ledger_id)
                return reply.status, reply.lac
            except BookieUnreachable:
                return None

        replies = [r for r in await asyncio.gather(*(one(b) for b in bookies)) if r is not None]
        lac = lac_from_replies(replies)
        if lac is None:
            raise QuireError(
                ApiCodes.UNAVAILABLE, f"no bookie of ledger {metadata.ledger_id} answered its LAC"
            )
        return lac
