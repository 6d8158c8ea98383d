"""What `quire bench` writes to: Quire through the in-process protocol driver
(`shared.protocol.driver` over NATS), over HTTP or gRPC; or a JetStream stream for the comparison.

A target opens, makes "ledgers" (a JetStream subject stands for one), and gives for each an
`append(payloads)` coroutine that returns once the payloads are acknowledged durable."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import nats

from quire.bench.procstat import Process
from quire.infra import ManagedProcess, restart_nats_cluster, start_nats_cluster
from shared.bookie_client import BookieClient
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.models import LedgerMetadata
from shared.protocol.driver import ProtocolClient, WriterHandle
from shared.protocol.placement import PlacementPolicy
from shared.service import connect_nats
from shared.status import ApiCodes, QuireError
from shared.subjects import Subjects
from shared.telemetry import tracer, tracer_provider

log = logging.getLogger(__name__)

# An append: a coroutine, or a future (a Task is one) when the client can start an
# append without one (the paced load then waits for it with a callback, no task).
Append = Callable[[Sequence[bytes]], Awaitable[object]]
PASSWORD = "quire-bench"
JETSTREAM_READY_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 5.0  # for each ledger the bench closes at the end


@dataclass(frozen=True)
class Quorum:
    ensemble: int
    write_quorum: int
    ack_quorum: int


class Target(abc.ABC):
    name: str

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def ledger(self, index: int) -> Append:
        """A new ledger (or stream subject) to write to; its append coroutine."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    def processes(self) -> list[Process] | None:
        """The processes of the system under test, when the target started them itself
        (JetStream's servers); None: the caller knows them (cluster.json) or nobody does."""
        return None


class InProcessTarget(Target):
    """The protocol library's driver (`shared.protocol.driver`) in this process, against
    the cluster's bookies and metadata service over NATS: no HTTP, no gateway in the path.

    With a tracer provider installed in this process (`quire bench --compare tracing-off`)
    the bench is the edge where the sampling decision is made: `edge_ratio` of the appends,
    drawn at random, are each a root span `bench.append` with the driver's spans and the
    bookies' under it; the others run in no span at all, as the unsampled requests behind
    a gateway do (the bench, unlike a gateway, answers no `traceresponse`, so it makes no
    span to name an unsampled one)."""

    def __init__(self, settings: QuireSettings, quorum: Quorum, edge_ratio: float = 0.0) -> None:
        self.settings = settings
        self.quorum = quorum
        self.edge_ratio = edge_ratio
        self.client: ProtocolClient | None = None
        self.writers: dict[int, WriterHandle] = {}
        self._nc = None

    name = "quire"

    async def open(self) -> None:
        settings = self.settings
        self._nc = await connect_nats(settings, name="quire-bench")
        subjects = Subjects(settings.subject_prefix)
        meta = MetadataClient(self._nc, subjects, timeout_s=settings.request_timeout_ms / 1000)
        bookies = BookieClient(
            self._nc,
            subjects,
            add_timeout_ms=settings.gateway.add_bookie_timeout_ms,
            read_timeout_ms=settings.gateway.read_entry_timeout_ms,
            new_bookie_grace_ms=settings.gateway.new_bookie_grace_ms,
        )
        # Each writer handle keeps its own deadline timer: no ticker to run here. Placed as
        # the gateway places (QUIRE_PLACEMENT__*).
        self.client = ProtocolClient(
            bookies, meta, settings.gateway, placement=PlacementPolicy(settings.placement.rules())
        )

    async def create(self, excluding: Collection[str] = ()) -> int:
        assert self.client is not None
        handle = await self.client.create_ledger(
            ensemble_size=self.quorum.ensemble,
            write_quorum=self.quorum.write_quorum,
            ack_quorum=self.quorum.ack_quorum,
            digest="crc32c",
            password=PASSWORD.encode(),
            metadata={"app": "quire-bench"},
            excluding=excluding,
        )
        self.writers[handle.ledger_id] = handle
        return handle.ledger_id

    async def recover(self, ledger_id: int) -> LedgerMetadata:
        """Fence and close the ledger (open-with-recovery); its closed metadata."""
        assert self.client is not None
        metadata = await self.client.meta.get_ledger(ledger_id)
        core = await self.client.recover(metadata, PASSWORD.encode())
        assert core.result is not None
        return core.result

    async def ledger(self, index: int) -> Append:
        handle = self.writers[await self.create()]
        if tracer_provider() is not None and self.edge_ratio > 0:
            edge, ratio, draw = tracer(__name__), self.edge_ratio, random.random

            async def traced_append(payloads: Sequence[bytes]) -> None:
                with edge.start_as_current_span("bench.append"):
                    await handle.append(payloads)

            def sampled_append(payloads: Sequence[bytes]) -> Awaitable[object]:
                if draw() >= ratio:
                    return handle.append_future(payloads)
                return traced_append(payloads)

            return sampled_append

        return handle.append_future

    async def aclose(self) -> None:
        """Close every ledger written here (as a gateway's ClientTarget does), so that a
        running cluster is not left with the bench's ledgers open; a handle that cannot
        close in time is aborted."""
        limit = asyncio.Semaphore(ClientTarget.CLOSE_CONCURRENCY)

        async def close(handle: WriterHandle) -> None:
            async with limit:
                try:
                    await handle.close(CLOSE_TIMEOUT_S)
                except QuireError:
                    handle.abort(ApiCodes.UNAVAILABLE, "the bench is stopping")
                handle.release()

        await asyncio.gather(*(close(handle) for handle in self.writers.values()))
        self.writers.clear()
        if self.client is not None:
            self.client.close()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()


class ClientTarget(Target):
    """Through the gateway with quire.client (HTTP or gRPC). The gateway holds the writers
    of the ledgers made here: closing the target closes them, so a running cluster is not
    left with thousands of open ledgers after a run."""

    name = "quire"
    CLOSE_CONCURRENCY = 32
    # Requests outstanding at once: httpx's pool (100 connections) slows down badly with
    # thousands of requests waiting in it, so they wait here instead (still as latency).
    MAX_REQUESTS = 100

    def __init__(self, via: str, address: str, quorum: Quorum) -> None:
        self.via = via
        self.address = address
        self.quorum = quorum
        self.client = None
        self.ledger_ids: list[int] = []
        self.close_errors = 0
        self._requests = asyncio.Semaphore(self.MAX_REQUESTS)

    async def open(self) -> None:
        from quire.client import GrpcClient, HttpClient

        if self.via == "http":
            self.client = HttpClient(self.address)
        else:
            self.client = GrpcClient(self.address)

    async def ledger(self, index: int) -> Append:
        assert self.client is not None
        client, requests = self.client, self._requests
        async with requests:
            created = await client.create(
                password=PASSWORD,
                ensemble_size=self.quorum.ensemble,
                write_quorum=self.quorum.write_quorum,
                ack_quorum=self.quorum.ack_quorum,
                metadata={"app": "quire-bench"},
            )
        ledger_id = created.ledger_id
        self.ledger_ids.append(ledger_id)

        async def append(payloads: Sequence[bytes]) -> None:
            async with requests:
                await client.append(ledger_id, PASSWORD, payloads)

        return append

    async def aclose(self) -> None:
        if self.client is None:
            return
        client, limit = self.client, asyncio.Semaphore(self.CLOSE_CONCURRENCY)

        async def close(ledger_id: int) -> None:
            async with limit:
                await client.close(ledger_id, PASSWORD)

        outcomes = await asyncio.gather(
            *(close(ledger_id) for ledger_id in self.ledger_ids), return_exceptions=True
        )
        self.close_errors = sum(isinstance(outcome, BaseException) for outcome in outcomes)
        self.ledger_ids.clear()
        await client.aclose()


# -- JetStream ---------------------------------------------------------------------------------


class JetStreamTarget(Target):
    """A replicas-3 file stream on a local 3-node cluster; each "ledger" is a subject of it.
    Appends are acknowledged publishes (publish_async: the fastest nats-py path)."""

    name = "jetstream"
    STREAM = "QUIRE_BENCH"

    def __init__(self, directory: Path, replicas: int = 3) -> None:
        self.directory = directory
        self.replicas = replicas
        self.servers: list[ManagedProcess] = []
        self._nc = None
        self._js = None
        self._restarting = False

    async def open(self) -> None:
        from nats.js.api import StorageType, StreamConfig

        self.servers = await asyncio.to_thread(start_nats_cluster, self.directory)
        self._nc = await nats.connect(
            servers=[s.url for s in self.servers],
            name="quire-bench",
            max_reconnect_attempts=-1,
            error_cb=self._on_error,
        )
        # Publishes the stream may have pending: far more than any window we run with.
        self._js = self._nc.jetstream(publish_async_max_pending=1_000_000)
        config = StreamConfig(
            name=self.STREAM,
            subjects=["quirebench.>"],
            num_replicas=self.replicas,
            storage=StorageType.FILE,
        )
        # The cluster elects a meta leader a few seconds after its routes connect.
        deadline = time.monotonic() + JETSTREAM_READY_TIMEOUT_S
        while True:
            try:
                await self._js.add_stream(config)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25 + random.random() * 0.25)
        # Wait until the stream's own leader is elected and acknowledges a publish.
        while True:
            try:
                await self._js.publish("quirebench.ready", b"", timeout=2.0)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25)

    async def restart(self) -> None:
        """Every server stopped and started again on its data, so that what it wrote is
        no longer in its memory; returns once the stream has every message and a new
        consumer gets a message published now (a consumer's leader is elected after the
        stream's). The probe touches only the stream's last block and a subject of its own."""
        js = self.js
        messages = (await js.stream_info(self.STREAM)).state.messages
        self._restarting = True
        try:
            self.servers = await asyncio.to_thread(
                restart_nats_cluster, self.directory, self.servers
            )
        finally:
            self._restarting = False
        deadline = time.monotonic() + JETSTREAM_READY_TIMEOUT_S
        while True:
            try:
                info = await js.stream_info(self.STREAM)
                if info.cluster and info.cluster.leader and info.state.messages == messages:
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"stream {self.STREAM} not back after the restart")
            await asyncio.sleep(0.25)
        while True:
            try:
                await js.publish("quirebench.probe", b"", timeout=2.0)
                probe = await js.pull_subscribe("quirebench.probe")
                try:
                    await probe.fetch(1, timeout=2.0)
                finally:
                    await probe.unsubscribe()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25)

    async def _on_error(self, exc: Exception) -> None:
        # restart() stops every server: the client loses them on purpose and reconnects.
        if not self._restarting:
            log.error("nats: %r", exc)

    def processes(self) -> list[Process]:
        return [Process(server.name, "nats", server.pid) for server in self.servers]

    @property
    def js(self):
        """The JetStream context, once open (for `quire bench read`'s consumer)."""
        assert self._js is not None
        return self._js

    async def ledger(self, index: int) -> Append:
        js = self._js
        assert js is not None
        subject = f"quirebench.{index}"

        async def append(payloads: Sequence[bytes]) -> None:
            futures = [await js.publish_async(subject, payload) for payload in payloads]
            for future in futures:
                ack = await future
                if getattr(ack, "error", None):
                    raise RuntimeError(f"JetStream publish failed: {ack}")

        return append

    async def aclose(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
        for server in reversed(self.servers):
            await asyncio.to_thread(server.stop)
