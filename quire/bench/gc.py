"""`quire bench gc`: how much space garbage collection and compaction give back, how long it
takes, and what compaction costs the writers meanwhile.

1. Reclaim. `ledgers` ledgers are written interleaved (all open at once, `batch` entries
   to each in turn, round after round), so that with a small entry-log size limit every
   sealed log holds a little of every ledger, then closed. Once the ledgerstores have
   flushed it all, each bookie's entry-log bytes are summed (every `entrylog-*.log` under its
   directory). Then 9 of every 10 ledgers are deleted through the HTTP API (metadata only,
   as a user does), a garbage collection with forced major compaction is triggered on every
   bookie (`PUT /api/v1/bookie/gc`), and the bench waits until each bookie has finished that
   run (`GET /api/v1/bookie/gc_details`). The entry-log bytes after, per bookie and in all,
   are compared with the live data: what the kept ledgers put on that bookie, each entry
   as it lies in an entry log (20-byte head, digest header and digest, payload), the least
   any store of them could take. Every kept ledger is read back and compared.
2. Cost. A foreground writer appends single entries at `foreground_rate` for
   `foreground_s` with nothing else running; then another batch of ledgers is written and
   9 in 10 deleted (fresh fragmentation), and the same writer runs again while a forced
   major compaction of it runs: add latency p50/p99 without and with compaction, same run,
   same cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from quire.bench.autorecovery import Written, check_ledgers, close_all_but, held_by, payload
from quire.bench.histogram import Histogram
from quire.bench.load import LoadResult, LoadSpec, run_load
from quire.bench.reads import LedgerstoreStats
from quire.bench.targets import PASSWORD, InProcessTarget, Quorum
from shared.bookie.entrylog_format import ENTRY_HEAD_SIZE, parse_entry_log_name
from shared.config import QuireSettings
from shared.digest import DIGEST_SIZES, HEADER_SIZE, DigestType
from shared.models import LedgerMetadata

CREATE_CONCURRENCY = 32  # ledgers created, closed or deleted at once
POLL_S = 0.1  # how often gc_details is asked while waiting for a run to end
HTTP_TIMEOUT_S = 60.0
FOREGROUND_WARMUP_S = 1.0
FOREGROUND_IN_FLIGHT = 64  # appends outstanding at once: room for stalls at the rate
WRITABLE_TIMEOUT_S = 60.0  # for every bookie to register before the bench writes
KEEP_ONE_IN = 10  # of every 10 ledgers written, one is kept: 90% deleted


@dataclass(frozen=True)
class GcSpec:
    ledgers: int = 200
    entries: int = 500  # per ledger
    entry_size: int = 1024
    batch: int = 10  # entries appended to a ledger at its turn: the interleaving's grain
    foreground_rate: float = 2_000.0  # entries/s of the foreground writer (0: no cost phase)
    foreground_s: float = 20.0  # each of its two runs
    timeout_s: float = 600.0  # for one garbage collection run on every bookie


def record_size(entry_size: int) -> int:
    """Bytes one crc32c entry of `entry_size` takes in an entry log: the log's entry head,
    then the frame (digest header, digest, payload)."""
    return ENTRY_HEAD_SIZE + HEADER_SIZE + DIGEST_SIZES[DigestType.CRC32C] + entry_size


def entry_log_bytes(bookie_dir: Path) -> tuple[int, int]:
    """(bytes, files) of the entry logs under a bookie's directory (its ledger directories
    are relative to it unless configured elsewhere)."""
    sizes = [
        path.stat().st_size
        for path in bookie_dir.rglob("entrylog-*.log")
        if parse_entry_log_name(path.name) is not None
    ]
    return sum(sizes), len(sizes)


def disk_usage(bookie_dirs: dict[str, Path]) -> dict[str, dict[str, int]]:
    usage = {}
    for bookie_id, path in bookie_dirs.items():
        size, files = entry_log_bytes(path)
        usage[bookie_id] = {"bytes": size, "entry_logs": files}
    return usage


def live_bytes(
    kept: Sequence[LedgerMetadata], bookie_ids: Sequence[str], entry_size: int
) -> dict[str, int]:
    """What the kept (closed) ledgers hold on each bookie, in entry-log bytes."""
    size = record_size(entry_size)
    return {b: size * sum(held_by(m, b) for m in kept) for b in bookie_ids}


class AdminApi:
    """The gateway's HTTP API as the bench uses it: ledger deletion and BookKeeper's GC
    admin paths."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=HTTP_TIMEOUT_S)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def delete_ledgers(self, ledger_ids: Sequence[int]) -> None:
        limit = asyncio.Semaphore(CREATE_CONCURRENCY)
        headers = {"Quire-Ledger-Password": PASSWORD}

        async def delete(ledger_id: int) -> None:
            async with limit:
                response = await self.http.delete(f"/v1/ledgers/{ledger_id}", headers=headers)
            if response.status_code != 204:
                raise RuntimeError(f"DELETE ledger {ledger_id}: {response.text}")

        await asyncio.gather(*(delete(i) for i in ledger_ids))

    async def trigger_gc(self, force_major: bool, force_minor: bool) -> None:
        body = {"forceMajor": force_major, "forceMinor": force_minor}
        response = await self.http.put("/api/v1/bookie/gc", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"PUT /api/v1/bookie/gc: {response.text}")

    async def gc_details(self) -> dict[str, dict[str, Any]]:
        """Each bookie's GarbageCollectionStatus (the gateway answers a list of one per
        bookie, as BookKeeper's GCDetailsService, or an error entry for a bookie that did
        not answer)."""
        response = await self.http.get("/api/v1/bookie/gc_details")
        if response.status_code != 200:
            raise RuntimeError(f"GET /api/v1/bookie/gc_details: {response.text}")
        answers = response.json()
        failed = {b: a["error"] for b, a in answers.items() if "error" in a}
        if failed:
            raise RuntimeError(f"GET /api/v1/bookie/gc_details: {failed}")
        return {b: a[0] for b, a in answers.items()}


def compacting(details: dict[str, Any]) -> bool:
    return bool(
        details["gcRunning"]
        or details["forceCompacting"]
        or details["majorCompacting"]
        or details["minorCompacting"]
    )


@dataclass
class GcRun:
    """One forced run on every bookie, as gc_details showed it (polled every POLL_S)."""

    started: float  # time.perf_counter() at the trigger
    ended_after_s: dict[str, float]  # per bookie: seconds from the trigger to its run's end
    before: dict[str, dict[str, Any]]
    after: dict[str, dict[str, Any]]

    @property
    def ended(self) -> float:
        return self.started + max(self.ended_after_s.values())

    def figures(self) -> dict[str, Any]:
        def gained(bookie_id: str, key: str) -> int:
            return self.after[bookie_id][key] - self.before[bookie_id][key]

        return {
            bookie_id: {
                "ended_after_s": round(seconds, 2),
                "deleted_ledgers": gained(bookie_id, "deletedLedgers"),
                "reclaimed_by_deletion_bytes": gained(bookie_id, "reclaimedByDeletionBytes"),
                "reclaimed_by_compaction_bytes": gained(bookie_id, "reclaimedByCompactionBytes"),
                "major_compactions": gained(bookie_id, "majorCompactionCounter"),
                "skipped": self.after[bookie_id]["lastSkipped"],
            }
            for bookie_id, seconds in sorted(self.ended_after_s.items())
        }


async def forced_gc(
    api: AdminApi, bookie_ids: Sequence[str], timeout_s: float, progress: Callable[[str], None]
) -> GcRun:
    """Trigger GC with forced major compaction on every bookie; wait until each has ended a
    run since (its gcRuns counter moved and nothing runs)."""
    before = await api.gc_details()
    started = time.perf_counter()
    await api.trigger_gc(force_major=True, force_minor=False)
    ended: dict[str, float] = {}
    details = before
    while len(ended) < len(bookie_ids):
        await asyncio.sleep(POLL_S)
        details = await api.gc_details()
        now = time.perf_counter() - started
        for bookie_id in bookie_ids:
            mine = details[bookie_id]
            if (
                bookie_id not in ended
                and mine["gcRuns"] > before[bookie_id]["gcRuns"]
                and not compacting(mine)
            ):
                ended[bookie_id] = now
        if now > timeout_s:
            raise RuntimeError(
                f"GC not over after {timeout_s:.0f} s on {set(bookie_ids) - set(ended)}"
            )
    progress(f"GC with forced major compaction over on every bookie in {max(ended.values()):.1f} s")
    return GcRun(started, ended, before, details)


async def write_interleaved(
    target: InProcessTarget, spec: GcSpec, progress: Callable[[str], None]
) -> Written:
    """`spec.ledgers` ledgers, all open at once, `spec.batch` entries to each in turn until
    each has `spec.entries`; then closed."""
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create() -> int:
        async with limit:
            return await target.create()

    ids = list(await asyncio.gather(*(create() for _ in range(spec.ledgers))))
    for first in range(0, spec.entries, spec.batch):
        count = min(spec.batch, spec.entries - first)

        async def append(ledger_id: int, first: int = first, count: int = count) -> None:
            data = [payload(ledger_id, first + i, spec.entry_size) for i in range(count)]
            await target.writers[ledger_id].append(data)

        await asyncio.gather(*(append(i) for i in ids))
    await close_all_but(target, set())
    progress(
        f"wrote {spec.ledgers} ledgers of {spec.entries} entries, interleaved, and closed them"
    )
    return Written({i: spec.entries - 1 for i in ids})


async def write_and_delete(
    target: InProcessTarget,
    api: AdminApi,
    stats: LedgerstoreStats,
    quorum: Quorum,
    spec: GcSpec,
    progress: Callable[[str], None],
) -> tuple[Written, list[int]]:
    """Write the ledgers interleaved, wait until every ledgerstore has flushed them, delete
    9 in 10: (the kept, the deleted ids)."""
    applied = await stats.applied_entries()
    written = await write_interleaved(target, spec, progress)
    await stats.wait_flushed(applied + spec.ledgers * spec.entries * quorum.write_quorum)
    ids = sorted(written.last_entry)
    deleted = [i for n, i in enumerate(ids) if n % KEEP_ONE_IN]
    await api.delete_ledgers(deleted)
    progress(f"deleted {len(deleted)} of {len(ids)} ledgers through the HTTP API")
    kept = Written({i: written.last_entry[i] for i in ids if i not in set(deleted)})
    return kept, deleted


def seconds_within(result: LoadResult, measure_from: float, start: float, end: float) -> Histogram:
    """The latencies of the run's whole seconds (by acknowledgement) that lie within
    [start, end] (perf_counter times)."""
    histogram = Histogram()
    for point in result.timeline:
        if start <= measure_from + point.second and measure_from + point.second + 1.0 <= end:
            histogram.merge(point.latency)
    return histogram


async def foreground(
    target: InProcessTarget, spec: GcSpec, during: Callable[[], Any] | None = None
) -> tuple[LoadResult, float]:
    """One writer, one entry per append, at `spec.foreground_rate` for `spec.foreground_s`
    after a warm-up; `during()` (a coroutine function) is started once the warm-up is over.
    The result, and when (perf_counter) the measurement began."""
    load = LoadSpec(
        entry_size=spec.entry_size,
        in_flight=FOREGROUND_IN_FLIGHT,
        rate=spec.foreground_rate,
        duration_s=spec.foreground_s,
        warmup_s=FOREGROUND_WARMUP_S,
    )
    measure_from: list[float] = []
    task: list[asyncio.Task[Any]] = []

    def progress(elapsed_s: float, _entries: int, _errors: int) -> None:
        if not measure_from:
            measure_from.append(time.perf_counter() - elapsed_s + load.warmup_s)
        if during is not None and not task and time.perf_counter() >= measure_from[0]:
            task.append(asyncio.ensure_future(during()))

    result = await run_load(target, load, progress)
    if task:
        await task[0]
    return result, measure_from[0]


async def run_gc(
    settings: QuireSettings,
    http_url: str,
    bookie_dirs: dict[str, Path],
    ledgerstore_metrics: dict[str, str],
    quorum: Quorum,
    spec: GcSpec,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    bookie_ids = sorted(bookie_dirs)
    target = InProcessTarget(settings, quorum)
    api = AdminApi(http_url)
    stats = LedgerstoreStats(ledgerstore_metrics)
    await target.open()
    try:
        assert target.client is not None
        await every_bookie_writable(target, bookie_ids)
        kept, deleted = await write_and_delete(target, api, stats, quorum, spec, progress)
        before = disk_usage(bookie_dirs)
        metadata = [await target.client.meta.get_ledger(i) for i in kept.last_entry]
        live = live_bytes(metadata, bookie_ids, spec.entry_size)
        run = await forced_gc(api, bookie_ids, spec.timeout_s, progress)
        after = disk_usage(bookie_dirs)
        check = await check_ledgers(target, kept, set(bookie_ids), quorum, spec.entry_size)
        reclaim = reclaim_figures(before, after, live, run)
        reclaim["ledgers_deleted"] = len(deleted)
        reclaim["ledgers_kept"] = len(kept.last_entry)
        reclaim["check"] = check
        cost = await compaction_cost(target, api, stats, quorum, spec, bookie_ids, progress)
    finally:
        with contextlib.suppress(Exception):
            await target.aclose()
        await api.aclose()
    return {"reclaim": reclaim, "cost": cost}


async def every_bookie_writable(target: InProcessTarget, bookie_ids: Sequence[str]) -> None:
    """Until every bookie of the cluster is registered writable: the cluster answers ready
    with enough bookies for an ensemble, and ledgers created before the last one registers
    would all leave it out (its disk would show nothing to reclaim)."""
    assert target.client is not None
    deadline = time.monotonic() + WRITABLE_TIMEOUT_S
    while missing := set(bookie_ids) - set(await target.client.writable_bookies()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"bookies not writable after {WRITABLE_TIMEOUT_S:g} s: {missing}")
        await asyncio.sleep(POLL_S)


def reclaim_figures(
    before: dict[str, dict[str, int]],
    after: dict[str, dict[str, int]],
    live: dict[str, int],
    run: GcRun,
) -> dict[str, Any]:
    per_bookie = {}
    for bookie_id in sorted(before):
        per_bookie[bookie_id] = {
            "entry_log_bytes_before": before[bookie_id]["bytes"],
            "entry_logs_before": before[bookie_id]["entry_logs"],
            "live_bytes": live[bookie_id],
            "entry_log_bytes_after": after[bookie_id]["bytes"],
            "entry_logs_after": after[bookie_id]["entry_logs"],
            "after_over_live": _ratio(after[bookie_id]["bytes"], live[bookie_id]),
        } | run.figures()[bookie_id]
    total_before = sum(b["bytes"] for b in before.values())
    total_after = sum(b["bytes"] for b in after.values())
    total_live = sum(live.values())
    return {
        "entry_log_bytes_before": total_before,
        "live_bytes": total_live,
        "entry_log_bytes_after": total_after,
        "after_over_live": _ratio(total_after, total_live),
        "worst_after_over_live": max((b["after_over_live"] or 0.0) for b in per_bookie.values()),
        "gc_s": round(max(run.ended_after_s.values()), 2),
        "bookies": per_bookie,
    }


def _ratio(numerator: int, denominator: int) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


async def compaction_cost(
    target: InProcessTarget,
    api: AdminApi,
    stats: LedgerstoreStats,
    quorum: Quorum,
    spec: GcSpec,
    bookie_ids: Sequence[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Foreground add latency without compaction, then while a forced major compaction of
    freshly fragmented data runs."""
    if not spec.foreground_rate:
        return {}
    quiet, _ = await foreground(target, spec)
    progress(f"foreground without compaction: {quiet.latency.summary()}")
    await write_and_delete(target, api, stats, quorum, spec, progress)
    runs: list[GcRun] = []

    async def gc() -> None:
        runs.append(await forced_gc(api, bookie_ids, spec.timeout_s, progress))

    busy, measure_from = await foreground(target, spec, gc)
    run = runs[0]
    during = seconds_within(busy, measure_from, run.started, run.ended)
    progress(f"foreground during compaction: {during.summary()}")
    return {
        "rate": spec.foreground_rate,
        "duration_s": spec.foreground_s,
        "without_compaction": quiet.latency.summary() | {"errors": quiet.errors},
        "with_compaction_whole_run": busy.latency.summary() | {"errors": busy.errors},
        "during_compaction": during.summary(),
        "gc_s": round(max(run.ended_after_s.values()), 2),
        # Seconds since the measurement began: the GC run's span, and each second's p99.
        "gc_window_s": [
            round(run.started - measure_from, 2),
            round(run.ended - measure_from, 2),
        ],
        "with_compaction_p99_ms_by_second": [
            round(point.latency.percentile(0.99) / 1000, 1) for point in busy.timeline
        ],
        # The GC went on after the writer stopped: only its first part was measured.
        "gc_outlasted_run": run.ended > measure_from + spec.foreground_s,
        "gc": run.figures(),
    }
