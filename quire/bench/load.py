"""The load: W writers over L ledgers (W >= L: every ledger has its own writer), each keeping
up to `in_flight` appends outstanding (a bounded pipelining window), at its share of a
target rate or as fast as acknowledgements come back. The ledgers are created, a bounded
number at a time, before the clock starts.

Latency is measured per append, from its (scheduled, under a rate) start to its
acknowledgement, into a log-bucketed histogram, and per second for the plot. Appends that
start during the warm-up are not counted."""

from __future__ import annotations

import asyncio
import heapq
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from quire.bench.histogram import Histogram
from quire.bench.procstat import CLIENT_KIND, CpuMeter
from quire.bench.targets import Append, Target

# The timeline keeps one histogram per interval; bounded by the duration.
TIMELINE_INTERVAL_S = 1.0
TIMELINE_MAX_POINTS = 3_600
# An event loop's timers fire at a resolution of about a millisecond (uvloop's are whole
# milliseconds, and a shorter delay fires on the next turn): a start due within it goes at
# once, timed from then, instead of the loop turning without a pause until it is due.
TIMER_SLACK_S = 0.001


@dataclass(frozen=True)
class LoadSpec:
    entry_size: int = 1024
    ledgers: int = 1
    writers: int = 1
    in_flight: int = 1
    batch: int = 1  # entries per append call
    rate: float | None = None  # entries/s over all writers; None = as fast as possible
    duration_s: float = 30.0
    warmup_s: float = 5.0
    create_concurrency: int = 32  # ledgers created at once before the measurement


@dataclass
class TimelinePoint:
    second: float  # since the measurement began
    entries: int
    latency: Histogram


@dataclass
class LoadResult:
    target: str
    entries: int
    bytes: int
    elapsed_s: float
    latency: Histogram  # per append, microseconds
    timeline: list[TimelinePoint] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    ledgers: int = 1
    create_s: float = 0.0  # creating the ledgers, before the measurement
    # CPU this process used (every thread, user and system) from the end of the warm-up
    # to the last answer: the client's work, which the machine's load does not change much.
    client_cpu_s: float = 0.0
    # CPU seconds by process kind over the same window, `client` (this process) included;
    # None when the system's processes are not known (a gateway URL alone).
    cpu_s_by_kind: dict[str, float] | None = None

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed_s / 1e6 if self.elapsed_s else 0.0

    def cpu_summary(self) -> dict[str, Any]:
        """CPU per acknowledged entry: every process of the system under test and this
        one, over the measured window, / the entries acknowledged in it; by kind too."""
        if self.cpu_s_by_kind is None:
            return {
                "cpu_us_per_entry": None,
                "cpu_note": "the system's processes are not known (a gateway URL alone, no "
                "--data-dir): only the bench process's CPU is measured",
            }
        entries = self.entries or 1
        by_kind = dict(sorted(self.cpu_s_by_kind.items(), key=lambda kv: -kv[1]))
        return {
            "cpu_us_per_entry": round(sum(by_kind.values()) * 1e6 / entries, 2),
            "cpu_us_per_entry_by_kind": {
                k: round(v * 1e6 / entries, 2) for k, v in by_kind.items()
            },
            "cpu_s_by_kind": {k: round(v, 4) for k, v in by_kind.items()},
            "cpu_cores": round(sum(by_kind.values()) / self.elapsed_s, 3)
            if self.elapsed_s
            else 0.0,
        }

    def summary(self) -> dict[str, Any]:
        ms = 1000.0
        return self.cpu_summary() | {
            "entries_per_s": round(self.entries_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 3),
            "p50_ms": self.latency.percentile(0.50) / ms,
            "p99_ms": self.latency.percentile(0.99) / ms,
            "p999_ms": self.latency.percentile(0.999) / ms,
            "max_ms": self.latency.max_us / ms,
            "mean_ms": round(self.latency.mean_us / ms, 3),
            "appends": self.latency.count,
            "entries": self.entries,
            "elapsed_s": round(self.elapsed_s, 3),
            "errors": self.errors,
            "ledgers": self.ledgers,
            "ledgers_create_s": round(self.create_s, 3),
            "client_cpu_cores": round(self.client_cpu_s / self.elapsed_s, 3)
            if self.elapsed_s
            else 0.0,
            "client_cpu_ms_per_1k_entries": round(self.client_cpu_s * 1e6 / self.entries, 1)
            if self.entries
            else 0.0,
        }


class _Recorder:
    """Counts what finished after the warm-up, overall and per timeline interval."""

    def __init__(self, measure_from: float, entry_size: int, batch: int) -> None:
        self.measure_from = measure_from
        self.entry_size = entry_size
        self.batch = batch
        self.latency = Histogram()
        self.timeline: list[TimelinePoint] = []
        self.entries = 0
        self.done_total = 0  # including the warm-up (for the progress bar)
        self.errors = 0
        self.first_error: str | None = None

    def record(self, started: float, finished: float) -> None:
        self.done_total += self.batch
        if started < self.measure_from:
            return
        latency_us = int((finished - started) * 1_000_000)
        self.latency.record(latency_us)
        self.entries += self.batch
        index = int((finished - self.measure_from) / TIMELINE_INTERVAL_S)
        if index >= TIMELINE_MAX_POINTS:
            return
        while len(self.timeline) <= index:
            self.timeline.append(
                TimelinePoint(len(self.timeline) * TIMELINE_INTERVAL_S, 0, Histogram())
            )
        point = self.timeline[index]
        point.entries += self.batch
        point.latency.record(latency_us)

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"


async def _writer(
    append: Append,
    spec: LoadSpec,
    recorder: _Recorder,
    stop_at: float,
) -> None:
    """One writer as fast as acknowledgements come back: `in_flight` slots each appending
    in a loop."""
    payloads = [os.urandom(spec.entry_size)] * spec.batch
    clock = time.perf_counter

    async def slot() -> None:
        while (started := clock()) < stop_at:
            try:
                await append(payloads)
            except Exception as exc:  # counted and shown; the run goes on
                recorder.failed(exc)
                await asyncio.sleep(0.01)
                continue
            recorder.record(started, clock())

    await asyncio.gather(*(slot() for _ in range(spec.in_flight)))


class _Pacer:
    """Every writer at its own rate (rate / writers), from one timer heap: the next start of
    each writer in a heap, one event-loop timer for the earliest, every start that is due
    launched when it fires. Thousands of slow writers then cost the bench one timer in all
    and a heap entry each, not a sleeping task each (a timer, a future and a task step of
    its own per append, on top of the append's). An append the client starts as a future
    (Quire's in-process `WriterHandle.append_future`) is waited for by a done callback; one
    that is a coroutine (JetStream's: nats-py's publish is one) runs in a task. Either way
    it starts at its scheduled time and its latency ends at the first turn of the loop
    after its answer.

    A writer keeps at most `in_flight` appends outstanding; a start that finds its window
    full waits, and goes the moment one of its appends ends. Latency counts from the
    scheduled start (or from the actual one, when that was up to TIMER_SLACK_S ahead of
    it), so a stall shows as latency instead of hiding as a lower rate (no coordinated
    omission). `done` resolves once every start before `stop_at` was made and
    answered."""

    def __init__(
        self,
        appends: list[Append],
        spec: LoadSpec,
        recorder: _Recorder,
        stop_at: float,
        start: float,
    ) -> None:
        self._appends = [appends[i % spec.ledgers] for i in range(spec.writers)]
        self._payloads = [os.urandom(spec.entry_size)] * spec.batch
        self._in_flight = spec.in_flight
        assert spec.rate
        self._interval_s = spec.batch * spec.writers / spec.rate
        self._recorder = recorder
        self._stop_at = stop_at
        # Starts spread over one interval; in order, so already a heap.
        self._heap = [
            (at, i)
            for i in range(spec.writers)
            if (at := start + self._interval_s * i / spec.writers) < stop_at
        ]
        self._outstanding = [0] * spec.writers
        self._waiting: dict[int, float] = {}  # writer -> its due start, while its window is full
        self._running: set[asyncio.Future[Any]] = set()  # the appends outstanding
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._cancelled = False
        self.done: asyncio.Future[None] = self._loop.create_future()
        self._arm()

    def _arm(self) -> None:
        """The timer for the earliest start, unless one is armed no later; `done` once
        nothing is left to start or to answer."""
        if not self._heap:
            if not self._running and not self._waiting and not self.done.done():
                self.done.set_result(None)
            return
        at = self._heap[0][0]
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer = self._loop.call_later(max(at - time.perf_counter(), 0), self._fire)
        self._timer_at = at

    def _fire(self) -> None:
        self._timer = None
        now = time.perf_counter()
        heap = self._heap
        while heap and heap[0][0] <= now + TIMER_SLACK_S:
            at, writer = heapq.heappop(heap)
            if self._outstanding[writer] >= self._in_flight:
                self._waiting[writer] = at
            else:
                # Latency from the scheduled start, or from now if that is (just) ahead.
                self._launch(writer, at, min(at, now))
        self._arm()

    def _launch(self, writer: int, due: float, started: float) -> None:
        """Start the writer's append scheduled at `due` (its latency counted from
        `started`), and schedule its next."""
        if self._cancelled:
            return
        self._outstanding[writer] += 1
        if (after := due + self._interval_s) < self._stop_at:
            heapq.heappush(self._heap, (after, writer))
        try:
            started_append = self._appends[writer](self._payloads)
        except Exception as exc:  # counted and shown; the run goes on
            self._recorder.failed(exc)
            self._ended(writer)
            return
        # A client that starts an append without a coroutine hands back a future: waited
        # for by a callback (no task, no coroutine frames to resume); a coroutine (the
        # JetStream client's append) runs in a task, as every append did before.
        if isinstance(started_append, asyncio.Future):
            future: asyncio.Future[Any] = started_append
        else:
            future = asyncio.ensure_future(started_append, loop=self._loop)
        self._running.add(future)
        future.add_done_callback(partial(self._answered, writer, started))

    def _answered(self, writer: int, started: float, future: asyncio.Future[Any]) -> None:
        """An append ended (answered, failed or cancelled): its latency counts from
        `started`, the scheduled start, up to now (the callback runs in the turn after
        the answer, as a task awaiting it would resume)."""
        self._running.discard(future)
        if not future.cancelled():
            if (exc := future.exception()) is not None:
                self._recorder.failed(exc)
            else:
                self._recorder.record(started, time.perf_counter())
        self._ended(writer)

    def _ended(self, writer: int) -> None:
        self._outstanding[writer] -= 1
        if (due := self._waiting.pop(writer, None)) is not None:
            self._launch(writer, due, due)  # overdue: at once
        self._arm()

    def cancel(self) -> None:
        """Start nothing more; cancel the appends outstanding."""
        self._cancelled = True
        if self._timer is not None:
            self._timer.cancel()
        for future in list(self._running):
            future.cancel()


async def create_ledgers(target: Target, count: int, concurrency: int) -> list[Append]:
    """`count` ledgers created `concurrency` at a time (thousands one by one take minutes);
    their append coroutines in index order."""
    limit = asyncio.Semaphore(concurrency)

    async def create(index: int) -> Append:
        async with limit:
            return await target.ledger(index)

    return list(await asyncio.gather(*(create(i) for i in range(count))))


async def run_load(
    target: Target,
    spec: LoadSpec,
    progress: Callable[[float, int, int], None] | None = None,
    cpu: CpuMeter | None = None,
) -> LoadResult:
    """Create the ledgers (before the clock starts), run the writers for warm-up +
    duration, return what they did. Writer i writes ledger i % ledgers, so with as many
    writers as ledgers each ledger has its own writer; under a rate each writer runs at
    rate / writers, their starts spread over one interval.
    `progress(elapsed_s, entries_done, errors)` is called about 10 times a second. `cpu`
    measures the system's processes over the measured window (without: this one only)."""
    if spec.writers < spec.ledgers:
        raise ValueError("every ledger needs a writer: writers must be >= ledgers")
    create_started = time.perf_counter()
    appends = await create_ledgers(target, spec.ledgers, spec.create_concurrency)
    create_s = time.perf_counter() - create_started
    meter = cpu if cpu is not None else CpuMeter(None)
    meter.prepare()
    loop_start = time.perf_counter()
    warmed_up = asyncio.get_running_loop().call_later(spec.warmup_s, meter.start)
    measure_from = loop_start + spec.warmup_s
    stop_at = measure_from + spec.duration_s
    recorder = _Recorder(measure_from, spec.entry_size, spec.batch)
    writers: list[asyncio.Task[None]] = []
    pacer: _Pacer | None = None
    if spec.rate:
        pacer = _Pacer(appends, spec, recorder, stop_at, loop_start)
        all_done: asyncio.Future = pacer.done
    else:
        writers = [
            asyncio.create_task(_writer(appends[i % spec.ledgers], spec, recorder, stop_at))
            for i in range(spec.writers)
        ]
        all_done = asyncio.gather(*writers)
    try:
        while not all_done.done():
            await asyncio.wait([all_done], timeout=0.1)
            if progress is not None:
                progress(time.perf_counter() - loop_start, recorder.done_total, recorder.errors)
        all_done.result()
    finally:
        if pacer is not None:
            pacer.cancel()
        for task in writers:
            task.cancel()
    # Appends still in flight at stop_at end after it; the elapsed time covers them.
    warmed_up.cancel()
    if meter.started:
        cpu_s = meter.stop()
    else:  # ended within the warm-up
        cpu_s = {CLIENT_KIND: 0.0}
    elapsed = max(time.perf_counter(), stop_at) - measure_from
    return LoadResult(
        target=target.name,
        entries=recorder.entries,
        bytes=recorder.entries * spec.entry_size,
        elapsed_s=elapsed,
        latency=recorder.latency,
        timeline=recorder.timeline,
        errors=recorder.errors,
        first_error=recorder.first_error,
        ledgers=spec.ledgers,
        create_s=create_s,
        client_cpu_s=cpu_s[CLIENT_KIND],
        cpu_s_by_kind=cpu_s if meter.known else None,
    )
