"""The gateway's operations on ledgers, as the HTTP and gRPC APIs call them: the facade over
the protocol library's driver (`shared.protocol.driver`). What stays here is the gateway's
own: the password check, metadata errors as API codes, metrics, the acknowledgement events,
the registry of this gateway's writer handles. Time passes for each handle by its own
deadlines (`WriterHandle`): nothing here visits every open ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NatsClient

from shared.auditor_client import AuditorClient
from shared.bookie_client import BookieClient, BookieUnreachable
from shared.config import QuireSettings
from shared.events import EventPublisher
from shared.latency import latency_bucket, percentile, to_event
from shared.metaclient import MetadataClient, MetadataError
from shared.models import (
    BookieInfo,
    LedgerMetadata,
    LedgerState,
    ListLedgersReply,
    MetaErrorCode,
)
from shared.protocol.driver import (
    Clock,
    ProtocolClient,
    ProtocolObserver,
    WriterHandle,
    monotonic_ms,
    password_hash,
)
from shared.protocol.messages import EnsembleChanged, ReplicaCorrupt
from shared.protocol.placement import PlacementPolicy
from shared.quorum import QuorumSpec
from shared.status import ApiCodes, QuireError
from shared.subjects import Subjects

log = logging.getLogger(__name__)

ACK_EVENT_INTERVAL_MS = 1_000
LAC_POLL_INTERVAL_S = 0.05

# Keys of a ledger's custom metadata that Quire keeps for itself: users may set none under
# this prefix. The gateway that creates a ledger records there where its writer is, so that
# any other gateway can send the ledger's appends and close to it.
RESERVED_METADATA_PREFIX = "quire."
WRITER_HTTP_KEY = "quire.writer.http"
WRITER_GRPC_KEY = "quire.writer.grpc"


def _ms(us: int | None) -> float:
    return 0.0 if us is None else us / 1000


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


@dataclass(frozen=True, slots=True)
class WriterAddress:
    """Where a gateway is reached from outside: its HTTP base URL and its gRPC host:port."""

    http: str
    grpc: str

    @classmethod
    def recorded(cls, metadata: LedgerMetadata) -> WriterAddress | None:
        """The writer its creating gateway recorded; None for a ledger created without one
        (before gateways recorded it, or by an in-process client)."""
        http = metadata.metadata.get(WRITER_HTTP_KEY)
        grpc = metadata.metadata.get(WRITER_GRPC_KEY)
        return cls(http, grpc) if http is not None and grpc is not None else None

    def custom_metadata(self) -> dict[str, str]:
        return {WRITER_HTTP_KEY: self.http, WRITER_GRPC_KEY: self.grpc}


class WriterElsewhere(QuireError):
    """An append or close of an OPEN ledger whose writer handle another gateway holds: the
    HTTP API answers 307 to that gateway, the gRPC API names it in trailing metadata."""

    def __init__(self, ledger_id: int, writer: WriterAddress) -> None:
        super().__init__(
            ApiCodes.WRITER_REDIRECT,
            f"ledger {ledger_id} is written by the gateway at {writer.http} "
            f"(gRPC {writer.grpc}): send its appends and its close there",
        )
        self.writer = writer


@dataclass(frozen=True, slots=True)
class Page:
    """A part of a range read, as `Ledgers.read_stream` yields it."""

    entries: list[tuple[int, bytes]]  # (entry id, payload), dense and in order
    lac: int  # the LAC the read saw when it began
    final: bool  # no page follows


@dataclass(slots=True)
class _AckWindow:
    """Acknowledgements of one ledger, all written to one ensemble, since the last
    entries.acknowledged event. Every entry's latency is counted in `latency_us`
    (shared/latency.py's buckets): sums of these histograms are exact."""

    first_entry_id: int
    bookies: Sequence[str]
    quorum: QuorumSpec
    count: int = 0
    last_entry_id: int = -1
    nbytes: int = 0
    latency_us: dict[int, int] = field(default_factory=dict)


class Ledgers(ProtocolObserver):
    """The gateway's operations on ledgers, as the HTTP and gRPC APIs call them; the
    protocol driver reports to it (ProtocolObserver) for the metrics and events."""

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
        clock: Clock = monotonic_ms,
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.meta = meta
        self.bookies = bookies
        self.events = events
        self.metrics = metrics
        self._adds_ok = metrics.adds.labels("ok")  # counted on every acknowledgement
        self.clock = clock
        self.client = ProtocolClient(
            bookies,
            meta,
            settings.gateway,
            observer=self,
            rng=rng,
            clock=clock,
            placement=PlacementPolicy(settings.placement.rules()),
        )
        self.writers: dict[int, WriterHandle] = {}
        # This gateway's address, recorded in the ledgers it creates (`advertise`); None
        # records none (an in-process gateway that nobody reaches from outside).
        self.address: WriterAddress | None = None
        self._acks: dict[int, _AckWindow] = {}
        # The operator commands that only the elected auditor carries out.
        timeout_s = settings.request_timeout_ms / 1000
        self.auditor = AuditorClient(nc, Subjects(settings.subject_prefix), meta, timeout_s)

    # -- background ---------------------------------------------------------------------------

    async def run_ack_events(self) -> None:
        """Acks are summarised once a second: an event per ledger that had acks, none for
        a quiet one."""
        while True:
            await asyncio.sleep(ACK_EVENT_INTERVAL_MS / 1000)
            self.flush_ack_events()

    # -- what the driver reports (ProtocolObserver) --------------------------------------------

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
        # On every acknowledged append: counters and a dict increment, no per-entry work.
        count = last - first + 1
        self._adds_ok.inc(count)
        self.metrics.add_latency.observe(latency_us / 1_000_000)
        window = self._acks.get(ledger_id)
        if window is not None and window.bookies is not bookies and window.bookies != bookies:
            # One event, one ensemble: the SLA jobs attribute its entries to its bookies.
            self._emit_acks(ledger_id, self._acks.pop(ledger_id))
            window = None
        if window is None:
            window = self._acks[ledger_id] = _AckWindow(first, bookies, quorum)
        window.count += count
        window.last_entry_id = last
        window.nbytes += nbytes
        bucket = latency_bucket(latency_us)
        window.latency_us[bucket] = window.latency_us.get(bucket, 0) + count

    def flush_ack_events(self) -> None:
        windows, self._acks = self._acks, {}
        for ledger_id, window in windows.items():
            self._emit_acks(ledger_id, window)

    def _emit_acks(self, ledger_id: int, window: _AckWindow) -> None:
        if self.events is None:
            return
        histogram = window.latency_us
        self.events.emit(
            "entries.acknowledged",
            ledger_id=ledger_id,
            count=window.count,
            first_entry_id=window.first_entry_id,
            last_entry_id=window.last_entry_id,
            bytes=window.nbytes,
            ensemble=list(window.bookies),
            ensemble_size=window.quorum.ensemble_size,
            write_quorum=window.quorum.write_quorum,
            ack_quorum=window.quorum.ack_quorum,
            latency_us=to_event(histogram),
            # The older summary, read off the histogram (bucket lower bounds, in ms).
            latency_ms_p50=_ms(percentile(histogram, 0.50)),
            latency_ms_p99=_ms(percentile(histogram, 0.99)),
            latency_ms_max=_ms(max(histogram, default=None)),
        )

    def adds_failed(self, count: int) -> None:
        self.metrics.adds.labels("failed").inc(count)

    def add_requests(self, sent: int, held: int) -> None:
        self.metrics.add_sends.inc(sent)
        self.metrics.add_sends_held.inc(held)

    def bookie_add_batch(self, sends: int) -> None:
        self.metrics.add_requests.inc()

    def pending_adds_changed(self, delta: int) -> None:
        self.metrics.pending_adds.inc(delta)

    def entries_read(self, ok: bool, count: int) -> None:
        self.metrics.reads.labels("ok" if ok else "failed").inc(count)

    def speculative_reads(self, count: int) -> None:
        self.metrics.speculative_reads.inc(count)

    def read_retries_refused(self, count: int) -> None:
        self.metrics.read_retries_refused.inc(count)

    def read_backoffs(self, count: int) -> None:
        self.metrics.read_backoffs.inc(count)

    async def stop(self) -> None:
        """Fail what is still pending (the gateway is going away), then report the acks."""
        handles = list(self.writers.values())
        busy = [h for h in handles if h.has_requests]
        await asyncio.gather(*(h.drain(timeout_s=2.0) for h in busy))  # 2 s in all
        for handle in handles:
            handle.abort(ApiCodes.UNAVAILABLE, "the gateway is shutting down")
        self.writers.clear()
        self.client.close()
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

    async def writable_bookies(self) -> dict[str, str]:
        return await self._call_meta(self.client.writable_bookies())

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

    def advertise(self, address: WriterAddress) -> None:
        """Record `address` as the writer of every ledger created from now on."""
        self.address = address

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
        reserved = sorted(k for k in metadata if k.startswith(RESERVED_METADATA_PREFIX))
        if reserved:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT,
                f"metadata keys under {RESERVED_METADATA_PREFIX!r} are Quire's own: {reserved}",
            )
        if self.address is not None:
            metadata = {**metadata, **self.address.custom_metadata()}
        handle = await self._call_meta(
            self.client.create_ledger(
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                digest=digest,
                password=password,
                metadata=metadata,
            )
        )
        self.writers[handle.ledger_id] = handle
        self.metrics.writer_handles.set(len(self.writers))
        return handle.core.metadata

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

    def _writer_elsewhere(self, metadata: LedgerMetadata) -> WriterElsewhere | None:
        """Whether another gateway holds the writer of this OPEN ledger. The recorded
        writer being this gateway (it restarted, the handle went with it) is no redirect:
        the owner never sends a client on, so a redirect is followed at most once."""
        writer = WriterAddress.recorded(metadata)
        if metadata.state is not LedgerState.OPEN or writer is None or writer == self.address:
            return None
        return WriterElsewhere(metadata.ledger_id, writer)

    def _not_writable(self, metadata: LedgerMetadata) -> QuireError:
        elsewhere = self._writer_elsewhere(metadata)
        if elsewhere is not None:
            return elsewhere
        if metadata.state is LedgerState.CLOSED:
            return QuireError(ApiCodes.LEDGER_CLOSED, f"ledger {metadata.ledger_id} is closed")
        if metadata.state is LedgerState.IN_RECOVERY:
            return QuireError(
                ApiCodes.LEDGER_FENCED, f"ledger {metadata.ledger_id} is being recovered"
            )
        return QuireError(
            ApiCodes.LEDGER_FENCED,
            f"ledger {metadata.ledger_id} is open but this gateway does not hold its writer "
            "handle (it was created before this gateway restarted, or by a gateway that "
            "recorded no address); only its writer may append. "
            "POST /v1/ledgers/{id}/recover fences and closes it.",
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
        handle.release()
        if self.writers.get(handle.ledger_id) is handle:
            del self.writers[handle.ledger_id]
        self.metrics.writer_handles.set(len(self.writers))

    def placement_fallback(self, ledger_id: int, reason: str) -> None:
        self.metrics.placement_fallbacks.labels("create").inc()

    def ensemble_changed(self, command: EnsembleChanged) -> None:
        self.metrics.ensemble_changes.inc()
        if command.placement_fallback:
            self.metrics.placement_fallbacks.labels("ensemble_change").inc()
            log.warning(
                "replacement placed at random: the placement policy cannot be met",
                extra={
                    "ledger_id": command.metadata.ledger_id,
                    "reason": command.placement_fallback,
                },
            )
        # The acks so far were written to the old ensemble: their event goes out before the
        # change's (the next ack would end the window anyway, but only when it comes).
        window = self._acks.pop(command.metadata.ledger_id, None)
        if window is not None:
            self._emit_acks(command.metadata.ledger_id, window)
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
        started_ts_ms = self.client.wall_clock()
        started_ms = self.clock()
        try:
            core = await self.client.recover(metadata, password)
        except QuireError:
            self.metrics.recoveries.labels("failed").inc()
            raise
        assert core.result is not None
        result = core.result
        self.metrics.recoveries.labels("ok").inc()
        if self.events is not None and core.fenced:
            # Every recovery that fenced (not a closed ledger's, which changes nothing), with
            # nothing to re-write too: the SLA jobs time fence to close.
            self.events.emit(
                "ledger.recovered",
                ledger_id=ledger_id,
                last_entry_id=result.last_entry_id,
                recovered_entries=core.recovered_entries,
                started_ts_ms=started_ts_ms,
                duration_ms=self.clock() - started_ms,
            )
        return result

    # -- LAC ----------------------------------------------------------------------------------

    async def _current_lac(self, metadata: LedgerMetadata) -> int:
        handle = self._live_writer(metadata.ledger_id)
        if handle is not None:
            return handle.core.lac
        if metadata.state is LedgerState.CLOSED:
            assert metadata.last_entry_id is not None
            return metadata.last_entry_id
        return await self.client.read_lac_from_bookies(metadata)

    async def read_lac(
        self, ledger_id: int, password: bytes | None, after: int | None = None, timeout_ms: int = 0
    ) -> int:
        """The LAC; with `after`, waits up to `timeout_ms` for it to pass `after` (long poll)."""
        metadata = await self._authorized(ledger_id, password)
        timeout_ms = min(max(timeout_ms, 0), self.settings.gateway.long_poll_max_timeout_ms)
        deadline_ms = self.clock() + timeout_ms
        latest = [metadata]
        watcher: asyncio.Task[None] | None = None
        try:
            while True:
                current = latest[0]  # the watcher may replace it meanwhile
                lac = await self._current_lac(current)
                remaining_s = (deadline_ms - self.clock()) / 1000
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

    async def read_stream(
        self,
        ledger_id: int,
        password: bytes | None,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> AsyncIterator[Page]:
        """Entries first..last (inclusive) in pages as they are read, in order, memory
        bounded whatever the range (`ProtocolClient.read_stream`). The password and the LAC
        are checked before the first page (so that its errors can still get a status); a
        confirmed range ends at the LAC seen then (one LAC describes every page), `last`
        None meaning "to that LAC". An unconfirmed range needs `last` and ends early at the
        first entry past the LAC that no replica has. An empty range is one empty page."""
        metadata = await self._authorized(ledger_id, password)
        lac = await self._current_lac(metadata)
        if last is None:
            if unconfirmed:  # as BookKeeper's readUnconfirmedEntries: the range is explicit
                raise QuireError(ApiCodes.INVALID_ARGUMENT, "an unconfirmed read needs `to`")
            last = lac
        elif last < first - 1:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT, f"the range from={first} to={last} runs backwards"
            )
        if not unconfirmed:
            last = min(last, lac)
        if last < first:
            yield Page([], lac, final=True)
            return
        following = first
        held: list[tuple[int, bytes]] | None = None  # unconfirmed: final only once it ends
        stream = self.client.read_stream(
            metadata, password or b"", first, last, unconfirmed=unconfirmed
        )
        async with aclosing(stream):
            async for batch in stream:
                entries = [(entry.entry_id, entry.payload) for entry in batch]
                following = entries[-1][0] + 1
                if not unconfirmed:
                    yield Page(entries, lac, final=following > last)
                    continue
                if held is not None:
                    yield Page(held, lac, final=False)
                held = entries
        if unconfirmed:
            if following <= min(last, lac):
                # Entries up to the LAC were acknowledged: their absence is a loss, not an end.
                raise QuireError(
                    ApiCodes.NO_SUCH_ENTRY,
                    f"entry {following} of ledger {ledger_id} is not on any replica, "
                    f"though the LAC is {lac}",
                )
            yield Page(held or [], lac, final=True)

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
        stream = self.client.read_stream(metadata, password or b"", entry_id, entry_id)
        async with aclosing(stream):
            [[entry]] = [batch async for batch in stream]
        return entry.payload, lac

    def replica_corrupt(self, ledger_id: int, command: ReplicaCorrupt) -> None:
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
