"""`quire bench read --beside-writes`: do catch-up reads of cold data hurt writes?

In one invocation, on one cluster:
1. cold data: READERS ledgers of ENTRIES each are written and closed, every bookie's write
   cache is flushed (nothing of them left in a ledgerstore's memory) and the bookies'
   files are evicted from the page cache (`pagecache.drop`), as `quire bench read` does;
2. the write rate: `--write-rate`, or half the peak of a window-limited run at full speed
   measured first (issue 20's "half the peak write rate");
3. a write-only run at that rate (one writer, one new ledger, its window);
4. the files evicted again, then the same write run while READERS catch-up readers each
   read one of the cold ledgers from its first entry as fast as they can.

The readers run in a process of their own (another client, as a consumer on another
machine would be), so that their client work does not queue in the writer's event loop:
what the writer sees is the cluster's answer. Their process is started and connected
before the run and told to go when the run starts (its warm-up included); a reader that
reaches its ledger's end stops (then the reads were not cold for the whole run: the
report says when).

Reported: add p50/p99 of both runs and their ratio (issue 20's target 4: p99 with readers
within 1.5x of write-only), and the readers' entries/s."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from quire.bench import pagecache
from quire.bench.histogram import Histogram
from quire.bench.load import LoadResult, LoadSpec, run_load
from quire.bench.procstat import CpuMeter, Process
from quire.bench.reads import STATS_TIMEOUT_S, LedgerstoreStats, ReadSpec, write_windowed
from quire.bench.targets import CLOSE_TIMEOUT_S, PASSWORD, InProcessTarget, Quorum, Target
from shared.config import QuireSettings
from shared.metrics import scrape

READERS_READY_TIMEOUT_S = 60.0  # for the readers' process to start and connect
READERS_STOP_TIMEOUT_S = 30.0  # for it to report once told to stop
SYNC_METRIC = "quire_journal_sync_latency_seconds"  # per group commit: write + fdatasync
FLUSH_SETTLE_S = 1.5  # the ledgerstores' applied count still, their write caches empty


@dataclass(frozen=True)
class BesideSpec:
    readers: int = 4
    entries: int = 100_000  # in each reader's cold ledger
    entry_size: int = 1024
    write_rate: float | None = None  # None: half the peak, measured first
    in_flight: int = 64  # the writer's window
    duration_s: float = 10.0  # measured seconds of each write run
    warmup_s: float = 2.0
    batch: int = 500  # entries per append while writing the cold ledgers
    # The readers' process's nice value: readers elsewhere (another machine) take no CPU
    # from this one's bookies and writer; here they share its cores.
    readers_nice: int = 0


async def write_cold(target: InProcessTarget, spec: BesideSpec) -> list[int]:
    """The readers' ledgers, written (spec.batch per append) and closed at once."""
    read_spec = ReadSpec(entries=spec.entries, entry_size=spec.entry_size, batch=spec.batch)

    async def one() -> int:
        ledger_id = await target.create()
        handle = target.writers[ledger_id]
        await write_windowed(handle.append, read_spec)
        await handle.close(CLOSE_TIMEOUT_S)
        handle.release()
        del target.writers[ledger_id]
        return ledger_id

    return list(await asyncio.gather(*(one() for _ in range(spec.readers))))


# -- the readers' process --------------------------------------------------------------------


def _readers_main(
    nats: tuple[str, str, str],
    quorum: Quorum,
    ledger_ids: list[int],
    nice: int,
    conn: Connection,
) -> None:
    """The readers' process: connect, say "ready", wait for "go", read each ledger from its
    start in a reader of its own until its end or "stop"; send the figures."""
    import uvloop

    if nice:
        os.nice(nice)

    url, user, password = nats
    settings = QuireSettings(nats_url=url, nats_user=user, nats_password=password)
    conn.send(uvloop.run(_readers(settings, quorum, ledger_ids, conn)))


async def _readers(
    settings: QuireSettings, quorum: Quorum, ledger_ids: list[int], conn: Connection
) -> dict[str, Any]:
    client_target = InProcessTarget(settings, quorum)
    await client_target.open()
    client = client_target.client
    assert client is not None
    figures: dict[str, Any] = {"entries": 0, "bytes": 0, "errors": 0, "first_error": None}
    finished_after: list[float] = []
    batch_wait = Histogram()
    try:
        ledgers = [await client.meta.get_ledger(ledger_id) for ledger_id in ledger_ids]
        conn.send("ready")
        await asyncio.to_thread(conn.recv)  # "go"
        started, cpu_from = time.perf_counter(), time.process_time()

        async def reader(metadata) -> None:
            waited_from = time.perf_counter()
            try:
                stream = client.read_stream(metadata, PASSWORD.encode(), 0, metadata.last_entry_id)
                async for batch in stream:
                    now = time.perf_counter()
                    batch_wait.record(int((now - waited_from) * 1_000_000))
                    figures["entries"] += len(batch)
                    figures["bytes"] += sum(len(entry.payload) for entry in batch)
                    waited_from = now
                finished_after.append(time.perf_counter() - started)
            except Exception as exc:  # reported with the figures
                figures["errors"] += 1
                figures["first_error"] = figures["first_error"] or f"{type(exc).__name__}: {exc}"

        tasks = [asyncio.create_task(reader(metadata)) for metadata in ledgers]
        stop = asyncio.ensure_future(asyncio.to_thread(conn.recv))  # "stop"
        # return_exceptions: the readers cancelled below end this gather without an
        # exception left unretrieved.
        readers_done = asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.wait([stop, readers_done], return_when=asyncio.FIRST_COMPLETED)
        elapsed = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_from
        for task in tasks:
            task.cancel()
        await readers_done
        await stop  # the parent sends "stop" in any case
    finally:
        await client_target.aclose()
    ms = 1000.0
    return figures | {
        "readers": len(ledger_ids),
        "nice": os.nice(0),
        "elapsed_s": round(elapsed, 3),
        "entries_per_s": round(figures["entries"] / elapsed, 1) if elapsed else 0.0,
        "mb_per_s": round(figures["bytes"] / elapsed / 1e6, 3) if elapsed else 0.0,
        # The readers' own process (not counted in the write runs' CPU per entry).
        "client_cpu_cores": round(cpu_s / elapsed, 3) if elapsed else 0.0,
        "batch_p50_ms": batch_wait.percentile(0.5) / ms,
        "batch_p99_ms": batch_wait.percentile(0.99) / ms,
        # A reader that reached its ledger's end read nothing more: cold reads ended then.
        "readers_finished": len(finished_after),
        "first_finished_after_s": round(min(finished_after), 3) if finished_after else None,
    }


class ReadersProcess:
    """The readers in a process of their own (spawned: no fork of this one's threads)."""

    def __init__(
        self, settings: QuireSettings, quorum: Quorum, ledger_ids: list[int], nice: int = 0
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        nats = (
            settings.nats_url,
            settings.nats_user,
            settings.nats_password.get_secret_value(),
        )
        self._process = context.Process(
            target=_readers_main, args=(nats, quorum, ledger_ids, nice, child), daemon=True
        )

    async def start(self) -> None:
        self._process.start()
        ready = await asyncio.to_thread(self._conn.poll, READERS_READY_TIMEOUT_S)
        if not ready or self._conn.recv() != "ready":
            raise RuntimeError("the readers' process did not get ready")

    def go(self) -> None:
        self._conn.send("go")

    async def stop(self) -> dict[str, Any]:
        self._conn.send("stop")
        if not await asyncio.to_thread(self._conn.poll, READERS_STOP_TIMEOUT_S):
            raise RuntimeError("the readers' process did not report")
        figures = self._conn.recv()
        await asyncio.to_thread(self._process.join, READERS_STOP_TIMEOUT_S)
        return figures

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


class JournalSyncs:
    """The journals' group commits (write and fdatasync), from their metrics: how long
    a commit took over a run says whether the readers' disk reads slowed the journal."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    async def totals(self) -> tuple[float, float]:
        """(group commits, their seconds), summed over the journals."""
        scrapes = await asyncio.gather(*(scrape(url, STATS_TIMEOUT_S) for url in self.urls))
        count = sum(s.value(f"{SYNC_METRIC}_count") for s in scrapes)
        return count, sum(s.value(f"{SYNC_METRIC}_sum") for s in scrapes)

    @staticmethod
    def since(before: tuple[float, float], after: tuple[float, float]) -> dict[str, Any]:
        count, seconds = after[0] - before[0], after[1] - before[1]
        mean_ms = round(seconds / count * 1000, 3) if count else None
        return {"group_commits": int(count), "mean_ms": mean_ms}


# -- the runs --------------------------------------------------------------------------------


async def beside_writes(
    settings: QuireSettings,
    quorum: Quorum,
    writer: Target,
    spec: BesideSpec,
    directories: list[Path],
    stats: LedgerstoreStats,
    syncs: JournalSyncs,
    processes: list[Process] | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The whole sequence of the module's docstring; `writer` is the write runs' target
    (opened here), `directories` the bookies', `stats` their ledgerstores'."""
    cold = InProcessTarget(settings, quorum)
    await cold.open()
    try:
        say(f"writing {spec.readers} cold ledgers of {spec.entries:,} entries ...")
        applied = await stats.applied_entries()
        ledger_ids = await write_cold(cold, spec)
    finally:
        await cold.aclose()
    # Every entry is on its ack quorum; the other copies too unless a bookie fell behind.
    copies = spec.readers * spec.entries * quorum.ack_quorum
    await stats.wait_flushed(applied + copies, settle_s=FLUSH_SETTLE_S)

    load = LoadSpec(
        entry_size=spec.entry_size,
        in_flight=spec.in_flight,
        duration_s=spec.duration_s,
        warmup_s=spec.warmup_s,
    )
    figures: dict[str, Any] = {"cold_ledgers": ledger_ids}
    await writer.open()
    try:
        rate = spec.write_rate
        if rate is None:
            say(f"measuring the peak write rate (window {spec.in_flight}) ...")
            peak = await run_load(writer, load, cpu=CpuMeter(processes))
            figures["peak"] = peak.summary()
            rate = peak.entries_per_s / 2
        load = replace(load, rate=rate)
        figures["write_rate"] = round(rate, 1)

        files = pagecache.files_under(directories)
        await asyncio.to_thread(pagecache.drop, files)
        say(f"writing at {rate:,.0f} entries/s, no readers ...")
        synced = await syncs.totals()
        alone = await run_load(writer, load, cpu=CpuMeter(processes))
        figures["journal_syncs_write_only"] = syncs.since(synced, await syncs.totals())

        readers = ReadersProcess(settings, quorum, ledger_ids, spec.readers_nice)
        await asyncio.to_thread(pagecache.drop, pagecache.files_under(directories))
        figures["page_cache_before_readers"] = await asyncio.to_thread(
            pagecache.resident, pagecache.files_under(directories)
        )
        try:
            await readers.start()
            say(f"writing at {rate:,.0f} entries/s, {spec.readers} readers reading cold ...")
            before, synced = await stats.counters(), await syncs.totals()
            readers.go()
            beside = await run_load(writer, load, cpu=CpuMeter(processes))
            read = await readers.stop()
            after = await stats.counters()
            figures["journal_syncs_with_readers"] = syncs.since(synced, await syncs.totals())
        finally:
            readers.kill()
    finally:
        await writer.aclose()
    read["ledgerstore"] = {k: after[k] - before[k] for k in after}
    read["covered_the_run"] = read["readers_finished"] == 0
    read |= read_cpu(alone, beside, read)
    return figures | _compare(alone, beside) | {"readers": read}


def read_cpu(alone: LoadResult, beside: LoadResult, read: dict[str, Any]) -> dict[str, Any]:
    """What a cold entry read costs in CPU, and where: the readers' own process (their
    client: in the bench, on this machine's cores; a consumer elsewhere would not be) and
    the cluster's extra CPU with readers (each kind's cores in the run with readers less
    its cores in the write-only run, both over their measured windows), per entry read.
    The second is a difference of two runs' figures: it also holds whatever else changed
    between them (fewer writes when the writer fell behind, the machine's other load)."""
    rate = read["entries_per_s"]
    if not rate or not read["entries"]:
        return {"client_cpu_us_per_entry": None, "cluster_cpu_us_per_entry_by_kind": None}
    kinds = beside.cpu_s_by_kind or {}
    base = alone.cpu_s_by_kind or {}
    extra: dict[str, float] | None = None
    if kinds and beside.elapsed_s and alone.elapsed_s:
        extra = {
            kind: round(
                (seconds / beside.elapsed_s - base.get(kind, 0.0) / alone.elapsed_s) * 1e6 / rate,
                2,
            )
            for kind, seconds in sorted(kinds.items())
        }
    return {
        "client_cpu_us_per_entry": round(read["client_cpu_cores"] * 1e6 / rate, 2),
        "cluster_cpu_us_per_entry_by_kind": extra,
    }


def _compare(alone: LoadResult, beside: LoadResult) -> dict[str, Any]:
    a, b = alone.summary(), beside.summary()
    return {
        "write_only": a,
        "with_readers": b,
        "ratio_p99": round(b["p99_ms"] / a["p99_ms"], 3) if a["p99_ms"] else None,
        "ratio_p50": round(b["p50_ms"] / a["p50_ms"], 3) if a["p50_ms"] else None,
    }
