"""Many open ledgers (the Pulsar shape): what N open, idle ledgers cost every process of
the cluster (`quire bench idle`), and whether creating and writing a new ledger stays as
fast as the number of open ledgers grows (`quire bench open-ledgers`)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quire.bench.histogram import Histogram
from quire.bench.load import create_ledgers
from quire.bench.procstat import Process, cpu_seconds, rss_bytes
from quire.bench.targets import Append, Target

KIB = 1024


@dataclass(frozen=True)
class IdleSpec:
    ledgers: int
    seconds: float  # each CPU measurement window
    settle_s: float  # after the appends, before measuring: their deferred work ends
    entry_size: int = 1024
    concurrency: int = 32  # ledgers created (and appended to) at once


async def _cpu_window(processes: list[Process], seconds: float) -> dict[str, float]:
    """% of one core each process used over `seconds` of wall time."""
    before, started = cpu_seconds(processes), time.perf_counter()
    await asyncio.sleep(seconds)
    after, elapsed = cpu_seconds(processes), time.perf_counter() - started
    return {name: (after[name] - before[name]) / elapsed * 100 for name in before}


async def _append_once(appends: list[Append], entry_size: int, concurrency: int) -> int:
    """One entry to each ledger, `concurrency` at a time; the number that failed."""
    payloads = [os.urandom(entry_size)]
    limit = asyncio.Semaphore(concurrency)

    async def one(append: Append) -> bool:
        async with limit:
            await append(payloads)
            return True

    outcomes = await asyncio.gather(*(one(a) for a in appends), return_exceptions=True)
    return sum(1 for outcome in outcomes if outcome is not True)


async def measure_idle(
    target: Target,
    processes: list[Process],
    gateway_pid: int,
    spec: IdleSpec,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """CPU of every process idle with no ledgers of ours, then idle with `spec.ledgers`
    open ledgers of one entry each; the gateway's RSS before, after opening, at the end."""
    rss_before = rss_bytes(gateway_pid)
    say(f"measuring {spec.seconds:g} s with no ledgers opened ...")
    baseline = await _cpu_window(processes, spec.seconds)
    say(f"opening {spec.ledgers:,} ledgers and appending one entry to each ...")
    started = time.perf_counter()
    appends = await create_ledgers(target, spec.ledgers, spec.concurrency)
    failed = await _append_once(appends, spec.entry_size, spec.concurrency)
    open_s = time.perf_counter() - started
    rss_open = rss_bytes(gateway_pid)
    await asyncio.sleep(spec.settle_s)
    say(f"measuring {spec.seconds:g} s with {spec.ledgers:,} open idle ledgers ...")
    loaded = await _cpu_window(processes, spec.seconds)
    rss_end = rss_bytes(gateway_pid)
    return {
        "ledgers": spec.ledgers,
        "open_s": round(open_s, 3),
        "append_errors": failed,
        "processes": [
            {
                "name": p.name,
                "kind": p.kind,
                "pid": p.pid,
                "cpu_pct_no_ledgers": round(baseline[p.name], 2),
                "cpu_pct_open_ledgers": round(loaded[p.name], 2),
            }
            for p in processes
        ],
        "cpu_pct_total_no_ledgers": round(sum(baseline.values()), 2),
        "cpu_pct_total_open_ledgers": round(sum(loaded.values()), 2),
        "gateway_rss_kib": {
            "before": rss_before // KIB,
            "after_open": rss_open // KIB,
            "at_end": rss_end // KIB,
            "per_open_ledger": round((rss_end - rss_before) / KIB / spec.ledgers, 2),
        },
    }


@dataclass(frozen=True)
class RoundsSpec:
    total: int  # stop once this many ledgers are open
    per_round: int
    clients: int  # concurrent create-then-append sequences
    batch: int = 4  # entries in the one append to each new ledger
    entry_size: int = 1024
    max_round_s: float | None = None  # stop after a round slower than this


def _ms(histogram: Histogram, q: float) -> float:
    return round(histogram.percentile(q) / 1000, 1)


async def _round(target: Target, first: int, spec: RoundsSpec) -> dict[str, Any]:
    """`spec.per_round` new ledgers, each created then written with one batch, by
    `spec.clients` concurrent clients."""
    payloads = [os.urandom(spec.entry_size)] * spec.batch
    create, append = Histogram(), Histogram()
    errors: list[str] = []
    indexes = iter(range(first, first + spec.per_round))

    async def client() -> None:
        for index in indexes:  # shared: each index is taken by one client
            # Failures are counted and shown; the round goes on.
            try:
                started = time.perf_counter()
                append_to = await target.ledger(index)
                created = time.perf_counter()
            except Exception as exc:
                errors.append(f"create: {type(exc).__name__}: {exc}")
                continue
            create.record(int((created - started) * 1_000_000))
            try:
                await append_to(payloads)
            except Exception as exc:
                errors.append(f"append: {type(exc).__name__}: {exc}")
                continue
            append.record(int((time.perf_counter() - created) * 1_000_000))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(spec.clients)))
    round_s = time.perf_counter() - started
    return {
        "round_s": round(round_s, 3),
        "ledgers": create.count,  # open now, written or not
        "ledgers_per_s": round(create.count / round_s, 1),
        "create_p50_ms": _ms(create, 0.50),
        "create_p99_ms": _ms(create, 0.99),
        "append_p50_ms": _ms(append, 0.50),
        "append_p99_ms": _ms(append, 0.99),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }


async def run_rounds(
    target: Target, spec: RoundsSpec, on_round: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Rounds until `spec.total` ledgers are open (or a round is slower than
    `spec.max_round_s`); each round's row, with the open ledgers before it."""
    rows: list[dict[str, Any]] = []
    open_ledgers = 0
    stopped = "all ledgers open"
    while open_ledgers < spec.total:
        row = {"open_before": open_ledgers} | await _round(target, open_ledgers, spec)
        rows.append(row)
        on_round(row)
        open_ledgers += row["ledgers"]
        if row["ledgers"] == 0:
            stopped = "a round opened no ledger"
            break
        if spec.max_round_s is not None and row["round_s"] > spec.max_round_s:
            stopped = f"a round took over {spec.max_round_s:g} s"
            break
    return {"rounds": rows, "open_ledgers": open_ledgers, "stopped": stopped}
