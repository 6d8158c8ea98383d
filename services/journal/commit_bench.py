"""How the journal's group commit should reach the disk: `python -m
services.journal.commit_bench [--seconds S] [--adders N]`.

The same group-commit loop (take everything pending, one write, one fdatasync, answer
every add of the batch) with three ways of doing the blocking IO off the event loop:

- `to_thread`: `asyncio.to_thread(write + fdatasync)` per commit (the journal's way);
- `writer_thread`: one dedicated thread fed by a queue, answering through
  `call_soon_threadsafe`;
- `aiofiles`: `await f.write(...)`, `await f.flush()`, `await aiofiles.os.fsync(fd)` (each
  call its own hop to the default executor).

N adders each append a 1 KiB record and wait for its commit, in a loop. Prints adds/s,
commits/s, mean batch size and the p50/p99 add latency of each mode, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

RECORD = os.urandom(1024)

Commit = Callable[[bytes], Awaitable[None]]


async def _group_commit_loop(
    commit: Commit, seconds: float, adders: int
) -> dict[str, float | int | str]:
    pending: list[asyncio.Future[None]] = []
    wakeup = asyncio.Event()
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    commits = 0
    stop_at = time.perf_counter() + seconds

    async def writer() -> None:
        nonlocal commits
        while True:
            if not pending:
                wakeup.clear()
                await wakeup.wait()
                continue
            batch = pending[:]
            pending.clear()
            try:
                await commit(RECORD * len(batch))
            except Exception as exc:  # fail the adds loudly instead of hanging them
                for future in batch:
                    future.set_exception(exc)
                raise
            commits += 1
            for future in batch:
                future.set_result(None)

    async def adder() -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            future: asyncio.Future[None] = loop.create_future()
            pending.append(future)
            wakeup.set()
            await future
            latencies.append(time.perf_counter() - started)

    writer_task = asyncio.create_task(writer())
    started = time.perf_counter()
    cpu_started = time.process_time()
    await asyncio.gather(*(adder() for _ in range(adders)))
    elapsed = time.perf_counter() - started
    writer_task.cancel()
    latencies.sort()
    cpu = time.process_time() - cpu_started
    return _report(latencies, commits, elapsed, cpu)


def _report(latencies: list[float], commits: int, elapsed: float, cpu: float) -> dict:
    """One mode's figures from its sorted add latencies (s), commits, wall and CPU time."""
    return {
        "cpu_us_per_add": round(cpu / max(len(latencies), 1) * 1e6, 1),
        "adds_per_s": round(len(latencies) / elapsed),
        "commits_per_s": round(commits / elapsed),
        "mean_batch": round(len(latencies) / max(commits, 1), 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 3),
    }


async def run_to_thread(path: Path, seconds: float, adders: int) -> dict:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(data: bytes) -> None:
        os.write(fd, data)
        os.fdatasync(fd)

    async def commit(data: bytes) -> None:
        await asyncio.to_thread(write, data)

    try:
        return await _group_commit_loop(commit, seconds, adders)
    finally:
        os.close(fd)


async def run_writer_thread(path: Path, seconds: float, adders: int) -> dict:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    jobs: queue.SimpleQueue[tuple[bytes, asyncio.Future[None]] | None] = queue.SimpleQueue()

    def run() -> None:
        while (job := jobs.get()) is not None:
            data, future = job
            os.write(fd, data)
            os.fdatasync(fd)
            loop.call_soon_threadsafe(future.set_result, None)

    thread = threading.Thread(target=run, name="journal-writer", daemon=True)
    thread.start()

    async def commit(data: bytes) -> None:
        future: asyncio.Future[None] = loop.create_future()
        jobs.put((data, future))
        await future

    try:
        return await _group_commit_loop(commit, seconds, adders)
    finally:
        jobs.put(None)
        thread.join()
        os.close(fd)


async def run_aiofiles(path: Path, seconds: float, adders: int) -> dict:
    import aiofiles
    import aiofiles.os

    fdatasync = aiofiles.os.wrap(os.fdatasync)  # aiofiles has no fsync of its own
    async with aiofiles.open(path, "ab", buffering=0) as f:

        async def commit(data: bytes) -> None:
            await f.write(data)
            await fdatasync(f.fileno())

        return await _group_commit_loop(commit, seconds, adders)


async def run_inline(path: Path, seconds: float, adders: int) -> dict:
    """write + fdatasync on the event loop's own thread: no hop at all (the loop is
    blocked for the fdatasync)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def commit(data: bytes) -> None:
        os.write(fd, data)
        os.fdatasync(fd)

    try:
        return await _group_commit_loop(commit, seconds, adders)
    finally:
        os.close(fd)


async def run_thread_loop(path: Path, seconds: float, adders: int) -> dict:
    """The writer thread owns the group-commit loop: an add is appended to a deque, the
    thread is woken only when it is idle, takes everything pending, writes, fdatasyncs,
    and wakes the loop once per commit to answer the whole batch."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    pending: collections.deque[asyncio.Future[None]] = collections.deque()
    cond = threading.Condition()
    idle = [False]
    stop = [False]
    latencies: list[float] = []
    commits = 0
    stop_at = time.perf_counter() + seconds

    def answer(batch: list[asyncio.Future[None]]) -> None:
        nonlocal commits
        commits += 1
        for future in batch:
            future.set_result(None)

    def run() -> None:
        while True:
            with cond:
                while not pending and not stop[0]:
                    idle[0] = True
                    cond.wait()
                    idle[0] = False
                if stop[0]:
                    return
            batch = []
            while pending:
                batch.append(pending.popleft())
            os.write(fd, RECORD * len(batch))
            os.fdatasync(fd)
            loop.call_soon_threadsafe(answer, batch)

    thread = threading.Thread(target=run, name="journal-writer", daemon=True)
    thread.start()

    async def adder() -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            future: asyncio.Future[None] = loop.create_future()
            pending.append(future)
            if idle[0]:
                with cond:
                    cond.notify()
            await future
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    cpu_started = time.process_time()
    await asyncio.gather(*(adder() for _ in range(adders)))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    with cond:
        stop[0] = True
        cond.notify()
    thread.join()
    os.close(fd)
    latencies.sort()
    return _report(latencies, commits, elapsed, cpu)


MODES = {
    "to_thread": run_to_thread,
    "writer_thread": run_writer_thread,
    "aiofiles": run_aiofiles,
    "inline": run_inline,
    "thread_loop": run_thread_loop,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--adders", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--rounds", type=int, default=2, help="each mode this often, interleaved")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, dict[int, list[dict]]] = {mode: {} for mode in MODES}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for _ in range(args.rounds):
            for adders in args.adders:
                for mode, run in MODES.items():
                    path = Path(tmp) / f"{mode}.log"
                    result = _run(run(path, args.seconds, adders))
                    results[mode].setdefault(adders, []).append(result)
                    path.unlink()
    print(json.dumps(results, indent=1))


def _run(coro):
    import uvloop

    return uvloop.run(coro)


if __name__ == "__main__":
    main()
