"""`quire bench autorecovery`: from a bookie lost for good to every ledger whole again.

N ledgers of K entries each are written through the protocol driver in this process. The
victim is the bookie that holds the most of them; `open_ledgers` of its ledgers are left
open by a writer that then goes quiet (a Pulsar broker's idle topic), the others are closed.
The victim is killed with SIGKILL, both of its processes (its one process if co-hosted),
and is not restarted. The bench watches the metadata store: the registry shows the bookie
lost (its lease lapsed), the auditor marks its ledgers, the replicators copy their
fragments to other bookies and store the new ensembles, open ledgers are fenced and closed
after the grace period. Once no ledger names the lost bookie and the under-replication queue
is empty, every ledger is read back and compared, entry by entry, with what was written,
and every segment is checked to name `ensemble` live bookies.

Foreground traffic: one more writer appends single entries at `foreground_rate` to a ledger
whose ensemble leaves the victim out, from `BASELINE_S` before the kill to the end; its add
latencies before the kill and while the closed ledgers are copied are reported side by side:
re-replication must not starve it.

Figures: seconds from the kill to the bookie seen lost, to the first mark, to full repair;
the entries and bytes the lost bookie held (what had to be copied); the copy rate from the
first mark to the end."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quire.bench.histogram import Histogram
from quire.bench.procstat import Process, exited
from quire.bench.targets import PASSWORD, InProcessTarget, Quorum
from shared.config import QuireSettings
from shared.models import BookieState, LedgerMetadata, LedgerState
from shared.protocol.replication import fragments_on, stored_entry_ids
from shared.status import ApiCodes, QuireError

APPEND_BATCH = 100  # entries per append while writing
FOREGROUND_CREATE_TIMEOUT_S = 30.0
APPEND_WINDOW = 8  # appends outstanding per ledger while writing
WRITE_CONCURRENCY = 16  # ledgers written at once
POLL_S = 0.5  # how often the metadata store is looked at while waiting for the repair
READ_CONCURRENCY = 8  # ledgers read back at once
BASELINE_S = 5.0  # the foreground writer runs this long before the kill


class RepairTimeout(RuntimeError):
    """The repair did not finish within the spec's timeout."""


@dataclass(frozen=True)
class AutorecoverySpec:
    ledgers: int = 200
    entries: int = 500
    entry_size: int = 1024
    open_ledgers: int = 20  # of `ledgers`, left open by a quiet writer
    timeout_s: float = 600.0  # for the repair to finish
    foreground_rate: float = 100.0  # entries/s of the foreground writer (0: none)


@dataclass
class Timeline:
    """Seconds since the kill; None: not seen."""

    lost_s: float | None = None
    first_mark_s: float | None = None
    # The ledgers closed before the kill no longer name the lost bookie (the open ones wait
    # for the grace period before they are fenced and closed).
    closed_repaired_s: float | None = None
    repaired_s: float | None = None
    most_marked: int = 0  # the under-replication queue's largest size seen


@dataclass
class Written:
    last_entry: dict[int, int] = field(default_factory=dict)  # ledger id -> last entry id


def payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    """The entry's bytes, derived from its ids: the read-back compares without keeping
    what was written in memory."""
    seed = hashlib.blake2b(b"%d:%d" % (ledger_id, entry_id), digest_size=32).digest()
    return (seed * (size // len(seed) + 1))[:size]


def held_by(metadata: LedgerMetadata, bookie_id: str) -> int:
    """How many of a closed ledger's entries the bookie holds a replica of (the replicator's
    own rule of what a fragment stores: `shared.protocol.replication`)."""
    quorum = metadata.quorum
    return sum(
        len(list(stored_entry_ids(quorum, f.first_entry_id, f.last_entry_id, f.ensemble_index)))
        for f in fragments_on(metadata, {bookie_id})
    )


def names(metadata: LedgerMetadata, bookie_id: str) -> bool:
    return any(bookie_id in segment.bookies for segment in metadata.segments)


async def write_ledgers(
    target: InProcessTarget, spec: AutorecoverySpec, progress: Callable[[str], None]
) -> Written:
    written = Written()
    limit = asyncio.Semaphore(WRITE_CONCURRENCY)

    async def one() -> None:
        async with limit:
            ledger_id = await target.create()
            handle = target.writers[ledger_id]
            window = asyncio.Semaphore(APPEND_WINDOW)

            async def append(first: int) -> None:
                async with window:
                    count = min(APPEND_BATCH, spec.entries - first)
                    await handle.append(
                        [payload(ledger_id, first + i, spec.entry_size) for i in range(count)]
                    )

            await asyncio.gather(*(append(f) for f in range(0, spec.entries, APPEND_BATCH)))
            written.last_entry[ledger_id] = spec.entries - 1

    await asyncio.gather(*(one() for _ in range(spec.ledgers)))
    progress(f"wrote {spec.ledgers} ledgers of {spec.entries} entries")
    return written


async def close_all_but(target: InProcessTarget, keep_open: set[int]) -> None:
    limit = asyncio.Semaphore(WRITE_CONCURRENCY)

    async def close(ledger_id: int) -> None:
        async with limit:
            await target.writers[ledger_id].close(60.0)
            target.writers.pop(ledger_id).release()

    await asyncio.gather(*(close(i) for i in list(target.writers) if i not in keep_open))


async def all_ledgers(target: InProcessTarget, ids: Sequence[int]) -> list[LedgerMetadata]:
    assert target.client is not None
    meta = target.client.meta
    return list(await asyncio.gather(*(meta.get_ledger(i) for i in ids)))


def kill_bookie(processes: Sequence[Process], bookie_id: str) -> list[int]:
    # Its journal and ledgerstore processes, or its one co-hosted process (named bookie-N).
    pids = [p.pid for p in processes if p.name == bookie_id or p.name.startswith(f"{bookie_id}.")]
    if len(pids) != (1 if any(p.name == bookie_id for p in processes) else 2):
        raise RuntimeError(f"expected the process(es) of bookie {bookie_id}, found {pids}")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


async def wait_for_repair(
    target: InProcessTarget,
    ids: Sequence[int],
    closed_ids: set[int],
    victim: str,
    killed_at: float,
    timeout_s: float,
    progress: Callable[[str], None],
) -> Timeline:
    assert target.client is not None
    meta = target.client.meta
    timeline = Timeline()
    deadline = killed_at + timeout_s
    while True:
        now = time.monotonic() - killed_at
        if timeline.lost_s is None:
            states = {b.bookie_id: b.state for b in await meta.list_bookies()}
            if states.get(victim) is BookieState.LOST:
                timeline.lost_s = now
        queued = await meta.list_underreplicated(None, 1000)
        if queued.ledgers and timeline.first_mark_s is None:
            timeline.first_mark_s = now
        timeline.most_marked = max(timeline.most_marked, len(queued.ledgers))
        remaining: list[int] = []
        if timeline.first_mark_s is not None:
            remaining = [m.ledger_id for m in await all_ledgers(target, ids) if names(m, victim)]
            if timeline.closed_repaired_s is None and not closed_ids.intersection(remaining):
                timeline.closed_repaired_s = now
            if not remaining and not queued.ledgers:
                timeline.repaired_s = now
                return timeline
        if time.monotonic() > deadline:
            # The queue rows (marks and claims) say which worker held what, for the logs.
            raise RepairTimeout(
                f"not repaired after {timeout_s:.0f} s: {len(queued.ledgers)} ledgers still "
                f"queued, {len(remaining)} still name {victim}: {remaining[:20]}; queued: "
                f"{[q.model_dump() for q in queued.ledgers[:5]]}"
            )
        progress(
            f"{now:6.1f} s after the kill: lost={timeline.lost_s is not None} "
            f"queued={len(queued.ledgers)} naming the lost bookie={len(remaining)}"
        )
        await asyncio.sleep(POLL_S)


async def check_ledgers(
    target: InProcessTarget,
    written: Written,
    live_bookies: set[str],
    quorum: Quorum,
    entry_size: int,
) -> dict[str, Any]:
    """Every ledger closed at its last written entry, each segment on `ensemble` live
    bookies, every entry read back equal to what was written."""
    assert target.client is not None
    client = target.client
    ledgers = await all_ledgers(target, list(written.last_entry))
    problems: list[str] = []
    states: Counter[str] = Counter()
    for metadata in ledgers:
        states[metadata.state.value] += 1
        expected = written.last_entry[metadata.ledger_id]
        if metadata.state is LedgerState.CLOSED and metadata.last_entry_id != expected:
            problems.append(
                f"ledger {metadata.ledger_id} closed at {metadata.last_entry_id}, wrote {expected}"
            )
        for segment in metadata.segments:
            if len(set(segment.bookies) & live_bookies) != quorum.ensemble:
                problems.append(f"ledger {metadata.ledger_id} segment {segment} is not whole")
    limit = asyncio.Semaphore(READ_CONCURRENCY)
    entries_read = 0

    async def read_back(metadata: LedgerMetadata) -> None:
        nonlocal entries_read
        last = written.last_entry[metadata.ledger_id]
        async with limit:
            next_id = 0
            async for batch in client.read_stream(metadata, PASSWORD.encode(), 0, last):
                for entry in batch:
                    if entry.entry_id != next_id or entry.payload != payload(
                        metadata.ledger_id, entry.entry_id, entry_size
                    ):
                        problems.append(
                            f"ledger {metadata.ledger_id} entry {entry.entry_id} differs"
                        )
                        return
                    next_id += 1
            entries_read += next_id
            if next_id != last + 1:
                problems.append(f"ledger {metadata.ledger_id}: read {next_id} of {last + 1}")

    await asyncio.gather(*(read_back(m) for m in ledgers))
    return {"states": dict(states), "entries_read": entries_read, "problems": problems[:20]}


class Foreground:
    """One writer at a fixed rate, one entry per append, on a ledger without the victim;
    each add's latency is kept with the time it was sent (seconds since the kill)."""

    def __init__(self, target: InProcessTarget, rate: float, entry_size: int) -> None:
        self.target = target
        self.rate = rate
        self.entry_size = entry_size
        self.samples: list[tuple[float, int]] = []  # (sent, latency in microseconds)
        self.errors: list[str] = []
        self.killed_at = 0.0  # set at the kill; before it, times are negative
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self.ledger_id: int | None = None

    async def start(self, victim: str) -> None:
        # Every bookie but the victim: one whose registration lapsed for a moment (a loaded
        # machine) makes too few for the ensemble, so wait for it a little.
        deadline = time.monotonic() + FOREGROUND_CREATE_TIMEOUT_S
        while True:
            try:
                self.ledger_id = await self.target.create(excluding={victim})
                break
            except QuireError as exc:
                if exc.api is not ApiCodes.NOT_ENOUGH_BOOKIES or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        self.killed_at = time.monotonic() + BASELINE_S
        self._task = asyncio.create_task(self._run())

    async def _one(self, data: bytes) -> None:
        assert self.ledger_id is not None
        sent = time.monotonic()
        try:
            await self.target.writers[self.ledger_id].append([data])
        except Exception as exc:  # noqa: BLE001 (reported, not fatal to the bench)
            self.errors.append(str(exc))
            return
        self.samples.append((sent - self.killed_at, int((time.monotonic() - sent) * 1e6)))

    async def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        index = 0
        while True:
            next_at += interval
            data = payload(-1, index, self.entry_size)
            task = asyncio.create_task(self._one(data))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            index += 1
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._pending:
            await asyncio.wait(self._pending, timeout=60.0)

    def window(self, start_s: float, end_s: float) -> dict[str, Any]:
        histogram = Histogram()
        for sent, latency_us in self.samples:
            if start_s <= sent < end_s:
                histogram.record(latency_us)
        return histogram.summary()


async def run_autorecovery(
    settings: QuireSettings,
    quorum: Quorum,
    spec: AutorecoverySpec,
    processes: Sequence[Process],
    progress: Callable[[str], None],
    data_dir: Path,
) -> dict[str, Any]:
    """The figures; raises RepairTimeout naming `data_dir` (the cluster's, whose logs
    tell what the auditor and the replicators did) when the repair does not finish."""
    target = InProcessTarget(settings, quorum)
    await target.open()
    # Made before anything can fail: the `finally` stops it (a no-op before it started).
    foreground = Foreground(target, spec.foreground_rate, spec.entry_size)
    try:
        written = await write_ledgers(target, spec, progress)
        before = await all_ledgers(target, list(written.last_entry))
        holders = Counter(b for m in before for b in {b for s in m.segments for b in s.bookies})
        victim = holders.most_common(1)[0][0]
        # The open ledgers have no last entry yet: count what they hold as if closed there.
        as_closed = [
            m.model_copy(
                update={
                    "state": LedgerState.CLOSED,
                    "last_entry_id": written.last_entry[m.ledger_id],
                }
            )
            for m in before
        ]
        held_entries = sum(held_by(m, victim) for m in as_closed)
        ledgers_on_victim = sum(1 for m in before if names(m, victim))
        # The ledgers left open are ones the victim holds: they need fencing to be repaired.
        keep_open = {m.ledger_id for m in before if names(m, victim)}
        keep_open = set(sorted(keep_open)[: spec.open_ledgers])
        await close_all_but(target, keep_open)
        before = await all_ledgers(target, list(written.last_entry))
        if spec.foreground_rate > 0:
            await foreground.start(victim)
            await asyncio.sleep(max(0.0, foreground.killed_at - time.monotonic()))
        # A process that died at its start (a port taken meanwhile) leaves a bookie half
        # there (its journal registered, its reads gone), which no repair can get past.
        if down := exited(list(processes)):
            raise RuntimeError(f"before the kill, {down} had exited; see {data_dir / 'logs'}")
        progress(f"killing {victim}: it holds {held_entries:,} entries of {ledgers_on_victim}")
        killed_at = time.monotonic()
        foreground.killed_at = killed_at
        kill_bookie(processes, victim)
        closed_ids = {m.ledger_id for m in before if m.state is LedgerState.CLOSED}
        try:
            timeline = await wait_for_repair(
                target,
                list(written.last_entry),
                closed_ids,
                victim,
                killed_at,
                spec.timeout_s,
                progress,
            )
        except RepairTimeout as exc:
            survivors = [p for p in processes if not p.name.startswith(f"{victim}.")]
            raise RepairTimeout(
                f"{exc}; exited since the kill: {exited(survivors)}; the cluster's logs: "
                f"{data_dir / 'logs'}"
            ) from None
        live = {
            b.bookie_id
            for b in await target.client.meta.list_bookies()  # type: ignore[union-attr]
            if b.state is not BookieState.LOST
        }
        await foreground.stop()
        check = await check_ledgers(target, written, live, quorum, spec.entry_size)
    finally:
        await foreground.stop()
        # The open ledgers' writers were fenced by the repair: nothing of theirs to close.
        for handle in target.writers.values():
            handle.abort(ApiCodes.LEDGER_FENCED, "the bench is done")
            handle.release()
        target.writers.clear()
        with contextlib.suppress(Exception):
            await target.aclose()
    assert timeline.repaired_s is not None and timeline.first_mark_s is not None
    assert timeline.closed_repaired_s is not None
    held_bytes = held_entries * spec.entry_size
    # The copy rate over the closed ledgers' repair: the open ones wait out the grace period.
    closed_bytes = spec.entry_size * sum(
        held_by(m, victim) for m in as_closed if m.ledger_id in closed_ids
    )
    copy_s = timeline.closed_repaired_s - timeline.first_mark_s
    return {
        "victim": victim,
        "ledgers_on_victim": ledgers_on_victim,
        "entries_on_victim": held_entries,
        "mb_on_victim": round(held_bytes / 1e6, 1),
        "lost_after_s": None if timeline.lost_s is None else round(timeline.lost_s, 1),
        "first_mark_after_s": round(timeline.first_mark_s, 1),
        "closed_repaired_after_s": round(timeline.closed_repaired_s, 1),
        "repaired_after_s": round(timeline.repaired_s, 1),
        "most_queued": timeline.most_marked,
        "copy_mb_per_s": round(closed_bytes / 1e6 / copy_s, 1) if copy_s > 0 else None,
        "foreground": {
            "rate": spec.foreground_rate,
            "before_kill": foreground.window(-BASELINE_S, 0.0),
            "during_copy": foreground.window(timeline.first_mark_s, timeline.closed_repaired_s),
            "errors": foreground.errors[:10],
        },
        "check": check,
    }
