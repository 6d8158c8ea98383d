"""`quire bench read`: catch-up and tailing reads.

Catch-up: one ledger of N entries is written and closed, then read back whole by one
reader twice: cold, then warm. Cold is the first read of a region never read before (so
nothing of it is in a ledgerstore's read cache), once every bookie has flushed its write
cache and the bookies' files have been evicted from the OS page cache (`pagecache.drop`);
the ledgerstores' cache counters over each pass are reported, so the reader of the figures
can see where the entries came from. Warm is the same range again at once.

Tailing: one writer appends single entries at a fixed rate while R readers follow the LAC;
the lag of an entry is the time from its append's acknowledgement to a reader receiving it.

JetStream, for the comparison: the same N messages into an R3 stream, read back by one
pull consumer (fetch batches), cold (its servers restarted, their files evicted the same
way) then warm."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quire.bench import pagecache
from quire.bench.histogram import Histogram
from quire.bench.targets import (
    CLOSE_TIMEOUT_S,
    PASSWORD,
    InProcessTarget,
    JetStreamTarget,
    Quorum,
)
from shared.config import QuireSettings
from shared.metrics import Scrape, scrape

# The ledgerstore counters that say where each pass's entries came from: the report's
# name -> the metric (docs/metrics.md).
CACHE_COUNTERS = {
    "ledgerstore_read_entry": "quire_ledgerstore_read_entries_total",
    "write_cache_hits": "bookie_write_cache_hits",
    "read_cache_hits": "bookie_read_cache_hits",
    "read_cache_misses": "bookie_read_cache_misses",
    "readahead_batch_count": "bookie_readahead_batch_count_count",
}
FLUSH_TIMEOUT_S = 60.0  # for every bookie's write cache to be flushed before the cold read
STATS_TIMEOUT_S = 5.0
# An in-process tail reader asks the bookies for the LAC this often once it has caught up
# (each poll is a request to every bookie of the ledger): its lag includes up to this much.
LAC_POLL_S = 0.005
CONSUMER_READY_TIMEOUT_S = 30.0  # for a consumer to be created once the servers are up
FETCH_TIMEOUT_S = 30.0  # for one JetStream fetch (nats-py's default is 5 s)

Batch = list[tuple[int, bytes]]  # (entry id, payload), in order


@dataclass(frozen=True)
class ReadSpec:
    entries: int = 100_000
    entry_size: int = 1024
    batch: int = 500  # entries per append while writing; per fetch from JetStream
    write_window: int = 8  # appends outstanding while writing


@dataclass(frozen=True)
class TailSpec:
    rate: float = 1_000.0  # entries/s, one entry per append
    readers: int = 4
    duration_s: float = 10.0
    entry_size: int = 1024


@dataclass
class ReadPass:
    """One read of the whole range."""

    entries: int = 0
    bytes: int = 0
    elapsed_s: float = 0.0
    batches: int = 0
    batch_wait: Histogram = field(default_factory=Histogram)  # microseconds
    first_error: str | None = None
    cache: dict[str, int] = field(default_factory=dict)  # ledgerstore counters over the pass
    page_cache: dict[str, int] = field(default_factory=dict)  # of the files, before the pass

    def summary(self) -> dict[str, Any]:
        ms = 1000.0
        figures: dict[str, Any] = {
            "entries": self.entries,
            "bytes": self.bytes,
            "elapsed_s": round(self.elapsed_s, 3),
            "entries_per_s": round(self.entries / self.elapsed_s, 1) if self.elapsed_s else 0.0,
            "mb_per_s": round(self.bytes / self.elapsed_s / 1e6, 3) if self.elapsed_s else 0.0,
            "batches": self.batches,
            "batch_p50_ms": self.batch_wait.percentile(0.50) / ms,
            "batch_p99_ms": self.batch_wait.percentile(0.99) / ms,
            "batch_max_ms": self.batch_wait.max_us / ms,
            "error": self.first_error,
        }
        if self.cache:
            figures["ledgerstore"] = self.cache
        if self.page_cache:
            figures["page_cache_before"] = self.page_cache
        return figures


async def read_pass(batches: AsyncIterator[Batch], first: int, last: int) -> ReadPass:
    """Consume the stream of `first`..`last`, checking that the entries come in order and
    timing each batch's wait; a failure ends the pass and is reported with it."""
    result = ReadPass()
    expected = first
    started = waited_from = time.perf_counter()
    try:
        async for batch in batches:
            now = time.perf_counter()
            result.batch_wait.record(int((now - waited_from) * 1_000_000))
            result.batches += 1
            for entry_id, payload in batch:
                if entry_id != expected:
                    raise RuntimeError(f"entry {entry_id} came where {expected} was due")
                expected += 1
                result.bytes += len(payload)
            result.entries += len(batch)
            waited_from = time.perf_counter()
        if expected != last + 1:
            raise RuntimeError(f"the stream ended after entry {expected - 1}, not {last}")
    except Exception as exc:  # reported with the figures; the bench goes on
        result.first_error = f"{type(exc).__name__}: {exc}"
    finally:
        await batches.aclose()
    result.elapsed_s = time.perf_counter() - started
    return result


class LedgerstoreStats:
    """The bookies' ledgerstore counters, scraped from their metrics (`urls`: bookie id ->
    the ledgerstore's metrics URL, from cluster.json)."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls

    async def read(self) -> dict[str, Scrape]:
        scrapes = await asyncio.gather(
            *(scrape(url, STATS_TIMEOUT_S) for url in self.urls.values())
        )
        return dict(zip(self.urls, scrapes, strict=True))

    async def counters(self) -> dict[str, int]:
        """CACHE_COUNTERS summed over the bookies."""
        stats = await self.read()
        return {
            name: int(sum(s.value(metric) for s in stats.values()))
            for name, metric in CACHE_COUNTERS.items()
        }

    async def applied_entries(self) -> int:
        """Entries the ledgerstores have applied from their journals, summed."""
        stats = await self.read()
        return int(sum(s.value("quire_ledgerstore_add_entries_total") for s in stats.values()))

    async def wait_flushed(self, applied_at_least: int, settle_s: float = 0.0) -> None:
        """Until the ledgerstores applied at least `applied_at_least` entries from their
        journals and none holds one in its write cache (a flush every flush_interval_ms): a
        cold read must not be served from it. An empty write cache alone is not enough: a
        ledgerstore applies its journal a little after the journal acknowledged the adds.
        With `settle_s`, also until the count has not moved for that long: for a write
        whose copies beyond the ack quorum may be fewer (a bookie that fell behind)."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        last_applied, moved_at = -1.0, time.monotonic()
        while True:
            stats = await self.read()
            applied = sum(s.value("quire_ledgerstore_add_entries_total") for s in stats.values())
            holding = [b for b, s in stats.items() if s.value("bookie_write_cache_count")]
            if applied != last_applied:
                last_applied, moved_at = applied, time.monotonic()
            settled = time.monotonic() - moved_at >= settle_s
            if applied >= applied_at_least and not holding and settled:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"write caches not flushed after {FLUSH_TIMEOUT_S:g} s: applied "
                    f"{applied:,} of {applied_at_least:,} entries; holding: {holding}"
                )
            await asyncio.sleep(0.1)


# -- the readers -------------------------------------------------------------------------------


class Reads(abc.ABC):
    """A system to write N entries to and read them back from."""

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def write(self, spec: ReadSpec) -> None:
        """spec.entries entries of spec.entry_size bytes, then closed (Quire) or flushed."""

    @abc.abstractmethod
    def stream(self, first: int, last: int) -> AsyncIterator[Batch]: ...

    @abc.abstractmethod
    async def aclose(self) -> None: ...


async def write_windowed(append, spec: ReadSpec) -> None:
    """spec.entries in appends of spec.batch, spec.write_window of them outstanding. The
    payloads are all the same: the read checks ids, lengths and digests, not contents."""
    payload = bytes(spec.entry_size)
    window = asyncio.Semaphore(spec.write_window)

    async def one(count: int) -> None:
        async with window:
            await append([payload] * count)

    starts = range(0, spec.entries, spec.batch)
    await asyncio.gather(*(one(min(spec.batch, spec.entries - s)) for s in starts))


class InProcessReads(Reads):
    """Quire through the protocol library in this process (ProtocolClient.read_stream)."""

    def __init__(self, settings: QuireSettings, quorum: Quorum) -> None:
        self.target = InProcessTarget(settings, quorum)
        self.metadata = None

    async def open(self) -> None:
        await self.target.open()

    async def write(self, spec: ReadSpec) -> None:
        ledger_id = await self.target.create()
        handle = self.target.writers[ledger_id]
        await write_windowed(handle.append, spec)
        self.metadata = await handle.close(CLOSE_TIMEOUT_S)
        handle.release()
        del self.target.writers[ledger_id]

    async def stream(self, first: int, last: int) -> AsyncIterator[Batch]:
        client = self.target.client
        assert client is not None and self.metadata is not None
        batches = client.read_stream(self.metadata, PASSWORD.encode(), first, last)
        try:
            async for batch in batches:
                yield [(entry.entry_id, entry.payload) for entry in batch]
        finally:
            await batches.aclose()

    async def aclose(self) -> None:
        await self.target.aclose()


class ClientReads(Reads):
    """Quire through the gateway with the client library (`read_stream`, HTTP or gRPC). It
    streams single entries: each `batch` of them counts as one batch here."""

    def __init__(self, via: str, address: str, quorum: Quorum, batch: int) -> None:
        self.via = via
        self.address = address
        self.quorum = quorum
        self.batch = batch
        self.client = None
        self.ledger_id = -1

    async def open(self) -> None:
        from quire.client import GrpcClient, HttpClient

        self.client = HttpClient(self.address) if self.via == "http" else GrpcClient(self.address)

    async def write(self, spec: ReadSpec) -> None:
        client = self.client
        assert client is not None
        created = await client.create(
            password=PASSWORD,
            ensemble_size=self.quorum.ensemble,
            write_quorum=self.quorum.write_quorum,
            ack_quorum=self.quorum.ack_quorum,
            metadata={"app": "quire-bench"},
        )
        self.ledger_id = created.ledger_id

        async def append(payloads) -> None:
            await client.append(self.ledger_id, PASSWORD, payloads)

        await write_windowed(append, spec)
        await client.close(self.ledger_id, PASSWORD)

    async def stream(self, first: int, last: int) -> AsyncIterator[Batch]:
        assert self.client is not None
        entries = self.client.read_stream(self.ledger_id, PASSWORD, first, last)
        batch: Batch = []
        try:
            async for entry in entries:
                batch.append((entry.entry_id, entry.data))
                if len(batch) == self.batch:
                    yield batch
                    batch = []
            if batch:
                yield batch
        finally:
            await entries.aclose()

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()


class JetStreamReads(Reads):
    """The JetStreamTarget's R3 stream, one subject written, read back by one pull
    consumer in fetches of `batch` (no acks: a reader, like Quire's)."""

    SUBJECT_INDEX = 0

    def __init__(self, directory: Path, batch: int) -> None:
        self.target = JetStreamTarget(directory)
        self.batch = batch

    async def open(self) -> None:
        await self.target.open()

    async def write(self, spec: ReadSpec) -> None:
        await write_windowed(await self.target.ledger(self.SUBJECT_INDEX), spec)

    async def forget(self) -> None:
        """nats-server keeps recently written message blocks in its memory: a restart of
        every server drops them."""
        await self.target.restart()

    async def stream(self, first: int, last: int) -> AsyncIterator[Batch]:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        js = self.target.js
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        subscription = await _until_served(
            lambda: js.pull_subscribe(f"quirebench.{self.SUBJECT_INDEX}", config=config)
        )
        try:
            position = first
            while position <= last:
                wanted = min(self.batch, last - position + 1)
                messages = await _until_served(
                    lambda: subscription.fetch(wanted, timeout=FETCH_TIMEOUT_S)  # noqa: B023
                )
                batch = [(position + i, m.data) for i, m in enumerate(messages)]
                position += len(batch)
                yield batch
        finally:
            await subscription.unsubscribe()

    async def aclose(self) -> None:
        await self.target.aclose()


async def _until_served(call: Callable[[], Awaitable[Any]]) -> Any:
    """`call()` again while JetStream answers 503: after a restart the cluster may still be
    moving its meta or consumer leaders, and a pull or an API request then finds no
    responder (nothing was consumed). Within CONSUMER_READY_TIMEOUT_S."""
    from nats.js.errors import ServiceUnavailableError

    deadline = time.monotonic() + CONSUMER_READY_TIMEOUT_S
    while True:
        try:
            return await call()
        except ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


async def catch_up(
    reads: Reads,
    spec: ReadSpec,
    directories: list[Path],
    forget: Callable[[], Awaitable[None]],
    stats: LedgerstoreStats | None,
    say,
) -> dict[str, Any]:
    """Write, then read cold and warm: the figures of each (see the module's docstring).
    `forget` makes the system drop what it holds in memory of what it wrote (Quire's
    ledgerstores hold nothing of a region never read once their write caches are
    flushed: LedgerstoreStats.wait_flushed); `directories` hold its files, evicted from
    the page cache before the cold read; `stats` are Quire's ledgerstores'."""
    say(f"writing {spec.entries:,} entries of {spec.entry_size} B ...")
    started = time.perf_counter()
    await reads.write(spec)
    write_s = time.perf_counter() - started
    await forget()
    files = pagecache.files_under(directories)  # the write made the entry logs
    figures: dict[str, Any] = {
        "write": {
            "entries": spec.entries,
            "elapsed_s": round(write_s, 3),
            "entries_per_s": round(spec.entries / write_s, 1),
        }
    }
    for name in ("cold", "warm"):
        if name == "cold":
            await asyncio.to_thread(pagecache.drop, files)
        page_cache = await asyncio.to_thread(pagecache.resident, files)
        before = await stats.counters() if stats is not None else {}
        say(f"reading {spec.entries:,} entries {name} ...")
        result = await read_pass(reads.stream(0, spec.entries - 1), 0, spec.entries - 1)
        if stats is not None:
            after = await stats.counters()
            result.cache = {k: after[k] - before[k] for k in CACHE_COUNTERS}
        result.page_cache = page_cache
        figures[name] = result.summary() | {
            "page_cache_after": await asyncio.to_thread(pagecache.resident, files)
        }
    return figures


# -- tailing -----------------------------------------------------------------------------------


class Tail(abc.ABC):
    """One ledger written by one writer and followed by readers."""

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def create(self) -> None: ...

    @abc.abstractmethod
    async def append(self, payload: bytes) -> int:
        """The entry id, once acknowledged."""

    @abc.abstractmethod
    async def close_ledger(self) -> None: ...

    @abc.abstractmethod
    def follow(self) -> AsyncIterator[Batch]:
        """The ledger's entries from 0, as they are confirmed, to its end once closed."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...


class InProcessTail(Tail):
    """The writer and the readers are two protocol clients in this process: the readers
    learn the LAC from the bookies (polled) and read up to it with read_stream."""

    def __init__(self, settings: QuireSettings, quorum: Quorum) -> None:
        self.writer = InProcessTarget(settings, quorum)
        self.reader = InProcessTarget(settings, quorum)  # another client: holds no writer
        self.ledger_id = -1
        self.metadata = None
        self.last: int | None = None  # the last entry, once closed

    async def open(self) -> None:
        await self.writer.open()
        await self.reader.open()

    async def create(self) -> None:
        assert self.reader.client is not None
        self.ledger_id = await self.writer.create()
        self.metadata = await self.reader.client.meta.get_ledger(self.ledger_id)

    async def append(self, payload: bytes) -> int:
        first, _, _ = await self.writer.writers[self.ledger_id].append([payload])
        return first

    async def close_ledger(self) -> None:
        handle = self.writer.writers.pop(self.ledger_id)
        closed = await handle.close(CLOSE_TIMEOUT_S)
        handle.release()
        self.last = closed.last_entry_id

    async def follow(self) -> AsyncIterator[Batch]:
        client = self.reader.client
        assert client is not None and self.metadata is not None
        following = 0
        while self.last is None or following <= self.last:
            # A closed ledger's last entry is confirmed; the bookies' LAC may lag it by one.
            last = self.last
            lac = last if last is not None else await client.read_lac_from_bookies(self.metadata)
            if lac < following:
                await asyncio.sleep(LAC_POLL_S)
                continue
            batches = client.read_stream(self.metadata, PASSWORD.encode(), following, lac)
            try:
                async for batch in batches:
                    yield [(entry.entry_id, entry.payload) for entry in batch]
                    following = batch[-1].entry_id + 1
            finally:
                await batches.aclose()

    async def aclose(self) -> None:
        await self.writer.aclose()
        await self.reader.aclose()


class ClientTail(Tail):
    """Through the gateway: the client library's append and `tail` (HTTP or gRPC)."""

    def __init__(self, via: str, address: str, quorum: Quorum) -> None:
        self.reads = ClientReads(via, address, quorum, batch=1)

    async def open(self) -> None:
        await self.reads.open()

    async def create(self) -> None:
        reads, quorum = self.reads, self.reads.quorum
        assert reads.client is not None
        created = await reads.client.create(
            password=PASSWORD,
            ensemble_size=quorum.ensemble,
            write_quorum=quorum.write_quorum,
            ack_quorum=quorum.ack_quorum,
            metadata={"app": "quire-bench"},
        )
        reads.ledger_id = created.ledger_id

    async def append(self, payload: bytes) -> int:
        assert self.reads.client is not None
        first, _, _ = await self.reads.client.append(self.reads.ledger_id, PASSWORD, [payload])
        return first

    async def close_ledger(self) -> None:
        assert self.reads.client is not None
        await self.reads.client.close(self.reads.ledger_id, PASSWORD)

    async def follow(self) -> AsyncIterator[Batch]:
        assert self.reads.client is not None
        async for entry in self.reads.client.tail(self.reads.ledger_id, PASSWORD, 0):
            yield [(entry.entry_id, entry.data)]

    async def aclose(self) -> None:
        await self.reads.aclose()


TAIL_WINDOW = 64  # appends the writer keeps outstanding at most
TAIL_END_TIMEOUT_S = 60.0  # for the readers to reach the closed ledger's end


async def tailing(tail: Tail, spec: TailSpec, say) -> dict[str, Any]:
    """The writer appends one entry every 1/rate s for the duration, then closes the
    ledger; each reader follows from entry 0 to the end. An entry's lag runs from its
    append's acknowledgement to its arrival at a reader."""
    await tail.create()
    payload = bytes(spec.entry_size)
    acked: dict[int, float] = {}
    lag = Histogram()
    counts = {"read": 0, "read_before_ack": 0}
    errors: list[str] = []

    async def reader() -> None:
        try:
            async for batch in tail.follow():
                now = time.perf_counter()
                for entry_id, _ in batch:
                    counts["read"] += 1
                    at = acked.get(entry_id)
                    if at is None:  # the ack's continuation has not run yet
                        counts["read_before_ack"] += 1
                    else:
                        lag.record(int((now - at) * 1_000_000))
        except Exception as exc:
            errors.append(f"reader: {type(exc).__name__}: {exc}")

    readers = [asyncio.create_task(reader()) for _ in range(spec.readers)]
    window = asyncio.Semaphore(TAIL_WINDOW)
    outstanding: set[asyncio.Task] = set()

    async def one() -> None:
        try:
            entry_id = await tail.append(payload)
            acked[entry_id] = time.perf_counter()
        except Exception as exc:
            errors.append(f"append: {type(exc).__name__}: {exc}")
        finally:
            window.release()

    say(f"tailing: {spec.rate:g} entries/s for {spec.duration_s:g} s, {spec.readers} readers ...")
    interval_s = 1 / spec.rate
    scheduled = started = time.perf_counter()
    try:
        while scheduled < started + spec.duration_s:
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await window.acquire()
            task = asyncio.create_task(one())
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
            scheduled += interval_s
        await asyncio.gather(*outstanding)
        written_s = time.perf_counter() - started
        await tail.close_ledger()
        done, pending = await asyncio.wait(readers, timeout=TAIL_END_TIMEOUT_S)
        if pending:
            errors.append(f"{len(pending)} readers had not reached the end after the close")
    finally:
        for task in (*outstanding, *readers):
            task.cancel()
    ms = 1000.0
    return {
        "entries_written": len(acked),
        "write_entries_per_s": round(len(acked) / written_s, 1),
        "entries_read": counts["read"],
        "lag_p50_ms": lag.percentile(0.50) / ms,
        "lag_p99_ms": lag.percentile(0.99) / ms,
        "lag_max_ms": lag.max_us / ms,
        "read_before_ack": counts["read_before_ack"],
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }
