"""The gateway's driver: runs the sans-IO cores of `core.py` against real bookies (NATS) and
the metadata service, and holds the writer handle of every ledger this gateway created.

Everything here is IO and bookkeeping of futures; every protocol decision is the cores'."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NatsClient

from services.gateway.bookie_client import BookieClient, BookieUnreachable
from shared.config import QuireSettings
from shared.digest import DigestManager, master_key
from shared.events import EventPublisher
from shared.metaclient import MetadataClient, MetadataError
from shared.models import (
    BookieInfo,
    BookieState,
    CreateLedgerRequest,
    LedgerMetadata,
    LedgerState,
    ListLedgersReply,
    MetaErrorCode,
)
from shared.protocol.ensemble import choose_ensemble
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
from shared.status import ApiCodes, QuireError

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.05
ACK_EVENT_INTERVAL_MS = 1_000
# Latency samples kept per ledger per event window (the count is exact beyond it).
ACK_SAMPLES_MAX = 10_000
LAC_POLL_INTERVAL_S = 0.05
SALT_BYTES = 16

MonotonicMs = Callable[[], int]


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def password_hash(salt_hex: str, password: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(salt_hex) + password).hexdigest()


def check_password(metadata: LedgerMetadata, password: bytes | None) -> None:
    """403 UNAUTHORIZED unless `password` matches the ledger's salted hash."""
    if password is None:
        raise QuireError(ApiCodes.UNAUTHORIZED, "the Quire-Ledger-Password header is missing")
    expected = metadata.password_hash
    if not hmac.compare_digest(password_hash(metadata.password_salt, password), expected):
        raise QuireError(ApiCodes.UNAUTHORIZED, f"wrong password for ledger {metadata.ledger_id}")


def metadata_error(exc: MetadataError, ledger_id: int | None = None) -> QuireError:
    match exc.code:
        case MetaErrorCode.NO_SUCH_LEDGER:
            return QuireError(ApiCodes.NO_SUCH_LEDGER, f"no ledger {ledger_id}")
        case MetaErrorCode.BAD_REQUEST:
            return QuireError(ApiCodes.INVALID_ARGUMENT, exc.message)
        case MetaErrorCode.UNAVAILABLE:
            return QuireError(ApiCodes.UNAVAILABLE, exc.message)
        case MetaErrorCode.LEDGER_CLOSED:
            return QuireError(ApiCodes.LEDGER_CLOSED, exc.message)
    return QuireError(ApiCodes.INTERNAL, f"metadata service: {exc.code}: {exc.message}")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


@dataclass(frozen=True)
class Finished:
    """What a dispatch returns to end `drive` with `value`."""

    value: Any


async def drive(
    core: Any,
    dispatch: Callable[[Any], Any],
    clock: Callable[[], int],
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
    started_ms: int
    future: asyncio.Future[int]  # resolves with the LAC once every entry is acknowledged


@dataclass
class _AckWindow:
    """Acknowledgements of one ledger since the last entries.acknowledged event."""

    count: int = 0
    first_entry_id: int = -1
    last_entry_id: int = -1
    latencies_ms: list[float] = field(default_factory=list)


class WriterHandle:
    """Runs one LedgerWriter: sends what it says, feeds it the answers, resolves appends."""

    def __init__(self, core: LedgerWriter, bookies: BookieClient, ledgers: Ledgers) -> None:
        self.core = core
        self._bookies = bookies
        self._ledgers = ledgers
        self._requests: deque[_AppendRequest] = deque()
        self._sends: set[asyncio.Task[None]] = set()
        self._changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed: asyncio.Future[LedgerMetadata] | None = None
        self._pump_scheduled = False
        # The core's flow-control counters as last reported to the metrics.
        self._add_requests_seen = 0
        self._add_sends_held_seen = 0

    @property
    def ledger_id(self) -> int:
        return self.core.ledger_id

    async def append(self, payloads: Sequence[bytes]) -> tuple[int, int, int]:
        """Append and wait for the acknowledgement: (first, last, lac)."""
        # Back-pressure: wait while the pending adds would exceed the core's bound.
        while not self.core.fits(len(payloads)):
            await asyncio.shield(self._changed)
        now = self._ledgers.clock()
        first, last = self.core.add(payloads, now)
        request = _AppendRequest(first, last, now, asyncio.get_running_loop().create_future())
        self._requests.append(request)
        self._schedule_pump()
        lac = await request.future
        return first, last, lac

    def _schedule_pump(self) -> None:
        """Pump once at the end of this turn of the event loop: the appends and bookie
        replies of one turn then go out as one add message per bookie instead of one
        each (the core batches what is queued when its commands are taken)."""
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    def pump(self) -> None:
        """Carry out the core's commands. Never awaits: runs to the end in one go."""
        for command in self.core.take_commands():
            match command:
                case SendAdds():
                    self._spawn(self._send(command))
                case CompleteAdds():
                    self._complete(command)
                case FailAdds():
                    self._fail(command)
                case UpdateLedger():
                    self._spawn(self._update(command))
                case ListWritableBookies():
                    self._spawn(self._list_writable())
                case SendWriteLac():
                    self._spawn(self._write_lac(command))
                case EnsembleChanged():
                    self._ledgers.ensemble_changed(command)
                case CloseDone():
                    if self._closed is not None and not self._closed.done():
                        self._closed.set_result(command.metadata)
                case CloseFailed():
                    if self._closed is not None and not self._closed.done():
                        self._closed.set_exception(QuireError(command.api, command.detail))
        self._count_flow_control()
        self._ledgers.metrics.pending_adds.set(self._ledgers.pending_adds())

    def _count_flow_control(self) -> None:
        metrics = self._ledgers.metrics
        sent, held = self.core.add_requests_sent, self.core.add_sends_held
        if sent > self._add_requests_seen:
            metrics.add_requests.inc(sent - self._add_requests_seen)
            self._add_requests_seen = sent
        if held > self._add_sends_held_seen:
            metrics.add_sends_held.inc(held - self._add_sends_held_seen)
            self._add_sends_held_seen = held

    def _spawn(self, coro) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        return task

    async def _update(self, command: UpdateLedger) -> None:
        self.core.step(await self._ledgers.cas(command), self._ledgers.clock())
        self.pump()

    async def _list_writable(self) -> None:
        try:
            writable = await self._ledgers.writable_bookies()
        except QuireError as exc:
            log.warning("no bookie list for an ensemble change", extra={"err": exc.detail})
            writable = []
        self.core.step(WritableBookies(tuple(writable)), self._ledgers.clock())
        self.pump()

    async def _write_lac(self, command: SendWriteLac) -> None:
        try:
            await self._bookies.write_lac(
                command.bookie_id, self.ledger_id, self.core.master_key, command.lac
            )
        except BookieUnreachable as exc:  # the next add carries the LAC anyway
            log.debug("explicit LAC not written", extra={"err": str(exc)})

    async def close(self, timeout_s: float) -> LedgerMetadata:
        """CAS the ledger CLOSED once every add in flight is decided (the core's outcome)."""
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

    async def _send(self, command: SendAdds) -> None:
        # A replaced bookie's late answer is harmless: the core maps answers by bookie.
        try:
            status, results = await self._bookies.add(command.bookie_id, list(command.items))
            event: BookieAddReply | AddSendFailed = BookieAddReply(
                command.bookie_id, command.entry_ids, status, tuple(results)
            )
        except BookieUnreachable as exc:
            event = AddSendFailed(command.bookie_id, command.entry_ids, str(exc))
        self.core.step(event, self._ledgers.clock())
        self._schedule_pump()

    def _complete(self, command: CompleteAdds) -> None:
        now = self._ledgers.clock()
        while self._requests and self._requests[0].last_entry_id <= command.last_entry_id:
            request = self._requests.popleft()
            latency_ms = now - request.started_ms
            self._ledgers.record_acks(
                self.ledger_id, request.first_entry_id, request.last_entry_id, latency_ms
            )
            if not request.future.done():
                request.future.set_result(command.lac)
        self._notify()

    def _fail(self, command: FailAdds) -> None:
        while self._requests and self._requests[0].first_entry_id <= command.last_entry_id:
            request = self._requests.popleft()
            count = request.last_entry_id - request.first_entry_id + 1
            self._ledgers.metrics.adds.labels("failed").inc(count)
            if not request.future.done():
                request.future.set_exception(QuireError(command.api, command.detail))
        self._notify()

    def _notify(self) -> None:
        self._changed.set_result(None)
        self._changed = asyncio.get_running_loop().create_future()

    def tick(self, now_ms: int) -> None:
        self.core.tick(now_ms)
        self.pump()

    async def wait_changed(self, timeout_s: float) -> None:
        """Until an add completes or fails, or `timeout_s` passes."""
        try:
            await asyncio.wait_for(asyncio.shield(self._changed), timeout_s)
        except TimeoutError:
            pass

    async def drain(self, timeout_s: float) -> None:
        """Wait for every append in flight (the core's timeout fails them at the latest)."""
        deadline = time.monotonic() + timeout_s
        while self._requests and time.monotonic() < deadline:
            await self.wait_changed(deadline - time.monotonic())

    def abort(self, api, detail: str) -> None:
        self.core.abort(api, detail)
        self.pump()
        for task in self._sends:
            task.cancel()


class Ledgers:
    """The gateway's operations on ledgers, as the HTTP (and later gRPC) API calls them."""

    def __init__(
        self,
        nc: NatsClient,
        settings: QuireSettings,
        meta: MetadataClient,
        bookies: BookieClient,
        events: EventPublisher | None,
        metrics,
        *,
        rng: random.Random | None = None,
        clock: MonotonicMs = monotonic_ms,
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.meta = meta
        self.bookies = bookies
        self.events = events
        self.metrics = metrics
        self._adds_ok = metrics.adds.labels("ok")  # counted on every acknowledgement
        self.clock = clock
        self._rng = rng or random.Random(os.urandom(16))
        self.writers: dict[int, WriterHandle] = {}
        self._acks: dict[int, _AckWindow] = {}
        self._last_ack_event_ms = clock()

    # -- background ---------------------------------------------------------------------------

    async def run_ticker(self) -> None:
        """Time passes for every writer (add timeouts); acks are summarised once a second."""
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            now = self.clock()
            for handle in list(self.writers.values()):
                handle.tick(now)  # timeouts, delayed ensemble changes, explicit LAC
            if now - self._last_ack_event_ms >= ACK_EVENT_INTERVAL_MS:
                self._last_ack_event_ms = now
                self.flush_ack_events()

    def pending_adds(self) -> int:
        return sum(h.core.pending_count for h in self.writers.values())

    def record_acks(self, ledger_id: int, first: int, last: int, latency_ms: float) -> None:
        count = last - first + 1
        self._adds_ok.inc(count)
        self.metrics.add_latency.observe(latency_ms / 1000)
        window = self._acks.setdefault(ledger_id, _AckWindow(first_entry_id=first))
        window.count += count
        window.last_entry_id = last
        room = ACK_SAMPLES_MAX - len(window.latencies_ms)
        window.latencies_ms.extend([latency_ms] * min(count, room))

    def flush_ack_events(self) -> None:
        windows, self._acks = self._acks, {}
        if self.events is None:
            return
        for ledger_id, window in windows.items():
            latencies = sorted(window.latencies_ms)
            self.events.emit(
                "entries.acknowledged",
                ledger_id=ledger_id,
                count=window.count,
                first_entry_id=window.first_entry_id,
                last_entry_id=window.last_entry_id,
                latency_ms_p50=percentile(latencies, 0.50),
                latency_ms_p99=percentile(latencies, 0.99),
                latency_ms_max=latencies[-1] if latencies else 0.0,
            )

    async def stop(self) -> None:
        """Fail what is still pending (the gateway is going away), then report the acks."""
        for handle in list(self.writers.values()):
            await handle.drain(timeout_s=2.0)
            handle.abort(ApiCodes.UNAVAILABLE, "the gateway is shutting down")
        self.writers.clear()
        self.flush_ack_events()

    # -- metadata -----------------------------------------------------------------------------

    async def _call_meta(self, coro, ledger_id: int | None = None):
        try:
            return await coro
        except MetadataError as exc:
            raise metadata_error(exc, ledger_id) from exc

    async def get(self, ledger_id: int) -> LedgerMetadata:
        return await self._call_meta(self.meta.get_ledger(ledger_id), ledger_id)

    async def list(self, after: int | None, limit: int) -> ListLedgersReply:
        return await self._call_meta(self.meta.list_ledgers(after, limit))

    async def list_bookies(self) -> list[BookieInfo]:
        return await self._call_meta(self.meta.list_bookies())

    async def bookie_info(self, bookie_id: str) -> dict[str, Any]:
        """The bookie's registry row and what it says of itself (its journal's `info`);
        NO_SUCH_BOOKIE (404) when it is neither registered nor answering."""
        row = next((b for b in await self.list_bookies() if b.bookie_id == bookie_id), None)
        try:
            info: dict[str, Any] | None = await self.bookies.info(bookie_id)
        except BookieUnreachable:  # not running, or not answering: the registry row is all
            info = None
        if row is None and info is None:
            raise QuireError(ApiCodes.NO_SUCH_BOOKIE, f"no bookie {bookie_id}")
        body: dict[str, Any] = {"bookie_id": bookie_id, **(info or {})}
        body["state"] = row.state.value if row else body.get("state")
        body["registry"] = row.model_dump(mode="json") if row else None
        body["reachable"] = info is not None
        return body

    async def writable_bookies(self) -> list[str]:
        now_ms = time.time_ns() // 1_000_000
        return [
            b.bookie_id
            for b in await self.list_bookies()
            if b.state is BookieState.WRITABLE and b.lease_expires_at > now_ms
        ]

    async def _authorized(self, ledger_id: int, password: bytes | None) -> LedgerMetadata:
        """The ledger's metadata (the writer's copy if this gateway holds it), once the
        password checked out."""
        handle = self._live_writer(ledger_id)
        metadata = handle.core.metadata if handle is not None else await self.get(ledger_id)
        check_password(metadata, password)
        return metadata

    def _live_writer(self, ledger_id: int) -> WriterHandle | None:
        """This gateway's writer of the ledger, unless it broke (fenced by a recovery, say):
        then the stored metadata and the bookies know better than its copy."""
        handle = self.writers.get(ledger_id)
        return handle if handle is not None and handle.core.broken is None else None

    async def readiness(self) -> dict[str, object]:
        """Whether this gateway can serve: NATS connected, metadata answering, enough
        writable bookies. Raises nothing; `ready` says it all."""
        status: dict[str, object] = {"nats": self.nc.is_connected}
        try:
            writable = await asyncio.wait_for(self.writable_bookies(), 2.0)
            status.update(metadata=True, writable_bookies=len(writable))
        except (QuireError, TimeoutError) as exc:
            status.update(metadata=False, writable_bookies=0, error=str(exc))
        needed = self.settings.gateway.ready_min_writable_bookies
        status["ready"] = bool(
            status["nats"] and status["metadata"] and status["writable_bookies"] >= needed
        )
        return status

    # -- create, delete -----------------------------------------------------------------------

    async def create(
        self,
        *,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        digest: str,
        password: bytes,
        metadata: dict[str, str],
    ) -> LedgerMetadata:
        if not 1 <= ack_quorum <= write_quorum <= ensemble_size:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT,
                "need 1 <= ack_quorum <= write_quorum <= ensemble_size, got "
                f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}",
            )
        ensemble = choose_ensemble(await self.writable_bookies(), ensemble_size, self._rng)
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
        )
        created: LedgerMetadata = await self._call_meta(self.meta.create_ledger(request))
        core = LedgerWriter(
            created,
            master_key(password),
            DigestManager(created.digest, password),
            add_entry_timeout_ms=self.settings.gateway.add_entry_timeout_ms,
            max_send_bytes=self.bookies.max_send_bytes,
            rng=self._rng,
            explicit_lac_interval_ms=self.settings.gateway.explicit_lac_interval_ms,
            max_add_requests_per_bookie=self.settings.gateway.max_add_requests_per_bookie,
            max_pending_adds=self.settings.gateway.max_pending_adds_per_ledger,
            now_ms=self.clock(),
        )
        self.writers[created.ledger_id] = WriterHandle(core, self.bookies, self)
        self.metrics.writer_handles.set(len(self.writers))
        return created

    async def delete(self, ledger_id: int, password: bytes | None) -> None:
        await self._authorized(ledger_id, password)
        await self._call_meta(self.meta.delete_ledger(ledger_id), ledger_id)
        handle = self.writers.pop(ledger_id, None)
        if handle is not None:
            handle.abort(ApiCodes.NO_SUCH_LEDGER, f"ledger {ledger_id} was deleted")
        self.metrics.writer_handles.set(len(self.writers))

    # -- append, close ------------------------------------------------------------------------

    async def append(
        self, ledger_id: int, password: bytes | None, payloads: Sequence[bytes]
    ) -> tuple[int, int, int]:
        metadata = await self._authorized(ledger_id, password)
        handle = self.writers.get(ledger_id)
        if handle is None:
            raise self._not_writable(metadata)
        return await handle.append(payloads)

    @staticmethod
    def _not_writable(metadata: LedgerMetadata) -> QuireError:
        if metadata.state is LedgerState.CLOSED:
            return QuireError(ApiCodes.LEDGER_CLOSED, f"ledger {metadata.ledger_id} is closed")
        if metadata.state is LedgerState.IN_RECOVERY:
            return QuireError(
                ApiCodes.LEDGER_FENCED, f"ledger {metadata.ledger_id} is being recovered"
            )
        return QuireError(
            ApiCodes.LEDGER_FENCED,
            f"ledger {metadata.ledger_id} is open but this gateway does not hold its writer "
            "handle (it was created by another gateway, or before this one restarted); only "
            "its writer may append. POST /v1/ledgers/{id}/recover fences and closes it.",
        )

    async def close(self, ledger_id: int, password: bytes | None) -> LedgerMetadata:
        metadata = await self._authorized(ledger_id, password)
        handle = self.writers.get(ledger_id)
        if handle is None:
            if metadata.state is LedgerState.CLOSED:
                return metadata  # closing a closed ledger changes nothing (BookKeeper too)
            raise self._not_writable(metadata)
        timeout_s = self.settings.gateway.add_entry_timeout_ms / 1000 + 5
        try:
            closed = await handle.close(timeout_s)
        except QuireError as exc:
            if exc.api is ApiCodes.LEDGER_FENCED:
                self._drop_writer(handle)  # someone else closed it: this handle is done
            raise
        self._drop_writer(handle)
        return closed

    def _drop_writer(self, handle: WriterHandle) -> None:
        if self.writers.get(handle.ledger_id) is handle:
            del self.writers[handle.ledger_id]
        self.metrics.writer_handles.set(len(self.writers))

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

    def ensemble_changed(self, command: EnsembleChanged) -> None:
        self.metrics.ensemble_changes.inc()
        replaced = [{"index": i, "old": old, "new": new} for i, old, new in command.replaced]
        log.info(
            "ensemble changed",
            extra={
                "ledger_id": command.metadata.ledger_id,
                "first_entry_id": command.first_entry_id,
                "replaced": replaced,
            },
        )
        if self.events is not None:
            self.events.emit(
                "ledger.ensemble_changed",
                ledger_id=command.metadata.ledger_id,
                first_entry_id=command.first_entry_id,
                replaced=replaced,
                version=command.metadata.version,
            )

    # -- recovery -----------------------------------------------------------------------------

    async def recover(self, ledger_id: int, password: bytes | None) -> LedgerMetadata:
        """BookKeeper's open-with-recovery: fence, find the last entry, close. A writer of
        this ledger (here or anywhere) gets LEDGER_FENCED from then on."""
        metadata = await self.get(ledger_id)
        check_password(metadata, password)
        assert password is not None
        gateway = self.settings.gateway
        core = LedgerRecovery(
            metadata,
            master_key(password),
            DigestManager(metadata.digest, password),
            self.clock(),
            rng=self._rng,
            retry_interval_ms=gateway.recovery_retry_interval_ms,
            recovery_timeout_ms=gateway.recovery_timeout_ms,
            add_entry_timeout_ms=gateway.add_entry_timeout_ms,
            max_send_bytes=self.bookies.max_send_bytes,
            read_batch_size=gateway.recovery_read_batch_size,
        )
        try:
            result = await self._run_recovery(core, password)
        except QuireError:
            self.metrics.recoveries.labels("failed").inc()
            raise
        self.metrics.recoveries.labels("ok").inc()
        if self.events is not None and core.recovered_entries:
            self.events.emit(
                "ledger.recovered",
                ledger_id=ledger_id,
                last_entry_id=result.last_entry_id,
                recovered_entries=core.recovered_entries,
            )
        return result

    async def _run_recovery(self, core: LedgerRecovery, password: bytes) -> LedgerMetadata:
        def dispatch(command: Any) -> Any:
            match command:
                case RecoveryDone():
                    return Finished(command.metadata)
                case RecoveryFailed():
                    raise QuireError(command.api, command.detail)
                case ReplicaCorrupt():
                    self._report_corrupt(core.ledger_id, command)
                case EnsembleChanged():
                    self.ensemble_changed(command)
                case _:
                    return self._recovery_io(core, command)
            return None

        return await drive(core, dispatch, self.clock)

    async def _recovery_io(self, core: LedgerRecovery, command):
        """One command of a recovery as IO; the event it turns into."""
        match command:
            case UpdateLedger():
                return await self.cas(command)
            case SendFence():
                try:
                    reply = await self.bookies.fence(
                        command.bookie_id, core.ledger_id, core.master_key
                    )
                    return FenceReply(command.bookie_id, reply.status, reply.lac)
                except BookieUnreachable as exc:
                    return FenceSendFailed(command.bookie_id, str(exc))
            case SendReads():
                return await self._send_reads(command)
            case SendAdds():
                try:
                    status, results = await self.bookies.add(command.bookie_id, list(command.items))
                    return BookieAddReply(
                        command.bookie_id, command.entry_ids, status, tuple(results)
                    )
                except BookieUnreachable as exc:
                    return AddSendFailed(command.bookie_id, command.entry_ids, str(exc))
            case ListWritableBookies():
                try:
                    return WritableBookies(tuple(await self.writable_bookies()))
                except QuireError:
                    return WritableBookies(())
        raise AssertionError(f"unknown recovery command {command!r}")

    # -- LAC ----------------------------------------------------------------------------------

    async def _current_lac(self, metadata: LedgerMetadata) -> int:
        handle = self._live_writer(metadata.ledger_id)
        if handle is not None:
            return handle.core.lac
        if metadata.state is LedgerState.CLOSED:
            assert metadata.last_entry_id is not None
            return metadata.last_entry_id
        return await self._read_lac_from_bookies(metadata)

    async def _read_lac_from_bookies(self, metadata: LedgerMetadata) -> int:
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

    async def read_lac(
        self, ledger_id: int, password: bytes | None, after: int | None = None, timeout_ms: int = 0
    ) -> int:
        """The LAC; with `after`, waits up to `timeout_ms` for it to pass `after` (long poll)."""
        metadata = await self._authorized(ledger_id, password)
        timeout_ms = min(max(timeout_ms, 0), self.settings.gateway.long_poll_max_timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        latest = [metadata]
        watcher: asyncio.Task[None] | None = None
        try:
            while True:
                current = latest[0]  # the watcher may replace it meanwhile
                lac = await self._current_lac(current)
                remaining_s = deadline - time.monotonic()
                if after is None or lac > after or remaining_s <= 0:
                    return lac
                handle = self._live_writer(ledger_id)
                if handle is not None:
                    await handle.wait_changed(remaining_s)
                elif current.state is LedgerState.CLOSED:
                    return lac  # a closed ledger's LAC never moves
                else:
                    # Another writer's ledger: poll its bookies, and follow its metadata so
                    # that an ensemble change or a close during the poll is seen at once.
                    watcher = watcher or asyncio.create_task(self._follow(ledger_id, latest))
                    await asyncio.sleep(min(LAC_POLL_INTERVAL_S, remaining_s))
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    async def _follow(self, ledger_id: int, latest: list[LedgerMetadata]) -> None:
        """Keep latest[0] the ledger's newest metadata (metadata change notifications)."""
        with contextlib.suppress(MetadataError):
            async for metadata in self.meta.watch_ledger(ledger_id):
                if metadata is not None and metadata.version > latest[0].version:
                    latest[0] = metadata

    # -- reads --------------------------------------------------------------------------------

    async def read_range(
        self,
        ledger_id: int,
        password: bytes | None,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> tuple[list[tuple[int, bytes]], int]:
        """Entries first..last (inclusive), capped at the LAC unless `unconfirmed`; and the
        LAC. An unconfirmed range ends at the first entry no replica has."""
        metadata = await self._authorized(ledger_id, password)
        lac = await self._current_lac(metadata)
        max_entries = self.settings.gateway.max_batch_entries
        if last is None:
            if unconfirmed:  # as BookKeeper's readUnconfirmedEntries: the range is explicit
                raise QuireError(ApiCodes.INVALID_ARGUMENT, "an unconfirmed read needs `to`")
            last = first + max_entries - 1  # a page, capped at the LAC below
        elif last < first - 1 or last - first + 1 > max_entries:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT,
                f"a range holds 0 to {max_entries} entries; got from={first} to={last}",
            )
        if not unconfirmed:
            last = min(last, lac)
        entry_ids = list(range(first, last + 1))
        outcomes = await self._read_entries(metadata, password or b"", entry_ids)
        entries = []
        for entry_id in entry_ids:
            outcome = outcomes[entry_id]
            if isinstance(outcome, EntryReadFailed):
                if unconfirmed and entry_id > lac and outcome.api == ApiCodes.NO_SUCH_ENTRY:
                    break
                raise QuireError(outcome.api, outcome.detail)
            entries.append((entry_id, outcome.payload))
        return entries, lac

    async def read_entry(
        self, ledger_id: int, password: bytes | None, entry_id: int, unconfirmed: bool = False
    ) -> tuple[bytes, int]:
        metadata = await self._authorized(ledger_id, password)
        lac = await self._current_lac(metadata)
        if entry_id > lac and not unconfirmed:
            raise QuireError(
                ApiCodes.NO_SUCH_ENTRY,
                f"entry {entry_id} is beyond the LAC {lac} of ledger {ledger_id}",
            )
        outcome = (await self._read_entries(metadata, password or b"", [entry_id]))[entry_id]
        if isinstance(outcome, EntryReadFailed):
            raise QuireError(outcome.api, outcome.detail)
        return outcome.payload, lac

    async def _read_entries(
        self, metadata: LedgerMetadata, password: bytes, entry_ids: list[int]
    ) -> dict[int, EntryRead | EntryReadFailed]:
        """Run a LedgerReader over `entry_ids` until each is read or failed."""
        gateway = self.settings.gateway
        core = LedgerReader(
            metadata,
            DigestManager(metadata.digest, password),
            read_entry_timeout_ms=gateway.read_entry_timeout_ms,
            speculative_read_timeout_ms=gateway.speculative_read_timeout_ms,
        )
        core.read(entry_ids, self.clock())
        outcomes: dict[int, EntryRead | EntryReadFailed] = {}

        def dispatch(command: Any) -> Any:
            match command:
                case SendReads():
                    return self._send_reads(command)
                case EntryRead() | EntryReadFailed():
                    outcomes[command.entry_id] = command
                    result = "ok" if isinstance(command, EntryRead) else "failed"
                    self.metrics.reads.labels(result).inc()
                case ReplicaCorrupt():
                    self._report_corrupt(metadata.ledger_id, command)
            return None

        await drive(core, dispatch, self.clock, finished=lambda: core.done)
        self.metrics.speculative_reads.inc(core.speculative_reads)
        return outcomes

    async def _send_reads(self, command: SendReads) -> BookieReadReply | ReadSendFailed:
        try:
            status, results = await self.bookies.read(command.bookie_id, list(command.items))
            return BookieReadReply(command.bookie_id, command.entry_ids, status, tuple(results))
        except BookieUnreachable as exc:
            return ReadSendFailed(command.bookie_id, command.entry_ids, str(exc), exc.timed_out)

    def _report_corrupt(self, ledger_id: int, command: ReplicaCorrupt) -> None:
        self.metrics.corrupt_replicas.inc()
        log.warning(
            "corrupt replica",
            extra={
                "ledger_id": ledger_id,
                "entry_id": command.entry_id,
                "bookie_id": command.bookie_id,
                "detail": command.detail,
            },
        )
        if self.events is not None:
            self.events.emit(
                "entry.corrupt",
                ledger_id=ledger_id,
                bookie_id=command.bookie_id,
                entry_id=command.entry_id,
                detail=command.detail,
            )
