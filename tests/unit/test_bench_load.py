"""The bench's load runner against a counting fake target: every ledger created before the
clock starts, a bounded number at a time; every ledger written by its own writer; counts
that add up. Counts only, no timings."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

import pytest

from quire.bench.load import LoadSpec, run_load
from quire.bench.population import RoundsSpec, run_rounds
from quire.bench.targets import Append, Target


class CountingTarget(Target):
    """Ledgers that acknowledge at once; counts creations, concurrency and appends."""

    name = "fake"

    def __init__(self, fail_every: int = 0) -> None:
        self.created = 0
        self.creating = 0
        self.most_creating = 0
        self.appends: Counter[int] = Counter()
        self.entries = 0
        self.fail_every = fail_every
        self.calls = 0

    async def open(self) -> None:
        pass

    async def ledger(self, index: int) -> Append:
        self.creating += 1
        self.most_creating = max(self.most_creating, self.creating)
        await asyncio.sleep(0)  # let the other creations start
        self.creating -= 1
        self.created += 1

        async def append(payloads: Sequence[bytes]) -> None:
            self.calls += 1
            if self.fail_every and self.calls % self.fail_every == 0:
                raise RuntimeError("refused")
            self.appends[index] += 1
            self.entries += len(payloads)

        return append

    async def aclose(self) -> None:
        pass


def test_paced_writers_one_per_ledger_created_concurrently_bounded() -> None:
    target = CountingTarget()
    # 200 ledgers at 2 appends/s each for 1 s: the first start of every writer falls in the
    # first half second (starts spread over one interval), so each ledger gets appends.
    spec = LoadSpec(
        entry_size=16,
        ledgers=200,
        writers=200,
        in_flight=1,
        batch=1,
        rate=400.0,
        duration_s=1.0,
        warmup_s=0.0,
        create_concurrency=8,
    )
    result = asyncio.run(run_load(target, spec))
    assert target.created == 200
    assert target.most_creating == 8
    assert set(target.appends) == set(range(200))
    assert result.errors == 0
    # Every measured append is one recorded latency of one entry; starts at or after the
    # end are not issued, so no ledger has more than its two scheduled appends.
    assert result.entries == result.latency.count == sum(target.appends.values())
    assert max(target.appends.values()) <= 2
    summary = result.summary()
    assert summary["ledgers"] == 200
    # The bench process's own CPU over the measurement, per entry and in cores.
    assert summary["client_cpu_cores"] > 0
    assert summary["client_cpu_ms_per_1k_entries"] > 0


def test_fewer_writers_than_ledgers_is_refused() -> None:
    spec = LoadSpec(ledgers=3, writers=2)
    with pytest.raises(ValueError, match="every ledger needs a writer"):
        asyncio.run(run_load(CountingTarget(), spec))


def test_rounds_count_open_ledgers_and_errors() -> None:
    target = CountingTarget(fail_every=7)
    rows: list[dict] = []
    spec = RoundsSpec(total=50, per_round=20, clients=4, batch=4, entry_size=16)
    figures = asyncio.run(run_rounds(target, spec, rows.append))
    assert [row["open_before"] for row in figures["rounds"]] == [0, 20, 40]
    assert rows == figures["rounds"]
    assert figures["open_ledgers"] == target.created == 60
    failed = sum(row["errors"] for row in rows)
    assert failed == 60 // 7  # every 7th append refused
    assert target.entries == (60 - failed) * 4
    assert all(
        row["first_error"].startswith("append: RuntimeError") for row in rows if row["errors"]
    )


class SlowTarget(CountingTarget):
    """Appends that take `service_s` of simulated service time each (the fake bookie's
    work); counts the most outstanding at once per ledger and the tasks alive."""

    def __init__(self, service_s: float) -> None:
        super().__init__()
        self.service_s = service_s
        self.outstanding: Counter[int] = Counter()
        self.most_outstanding = 0
        self.most_tasks = 0

    async def ledger(self, index: int) -> Append:
        await super().ledger(index)

        async def append(payloads: Sequence[bytes]) -> None:
            self.outstanding[index] += 1
            self.most_outstanding = max(self.most_outstanding, self.outstanding[index])
            self.most_tasks = max(self.most_tasks, len(asyncio.all_tasks()))
            await asyncio.sleep(self.service_s)
            self.outstanding[index] -= 1
            self.appends[index] += 1
            self.entries += len(payloads)

        return append


def test_paced_writers_hold_no_task_while_they_wait_for_their_next_start() -> None:
    # 2,000 writers at one append per 10 s each: about 100 appends in the half second, so
    # fewer than 200 tasks even if a stalled loop started them all at once, and the writers
    # between two of their starts hold nothing but a heap entry (a task per writer: 2,000).
    target = SlowTarget(service_s=0.0)
    spec = LoadSpec(
        entry_size=16,
        ledgers=2_000,
        writers=2_000,
        in_flight=4,
        rate=200.0,
        duration_s=0.5,
        warmup_s=0.0,
        create_concurrency=64,
    )
    result = asyncio.run(run_load(target, spec))
    assert result.errors == 0
    assert result.entries == sum(target.appends.values()) > 0
    # run_load's own task and the appends outstanding, not one task per writer.
    assert target.most_tasks < 200, target.most_tasks


def test_a_full_window_delays_starts_without_dropping_them() -> None:
    # One writer, a start every 5 ms for 100 ms, each append taking 20 ms, at most 2 at
    # once: the window is full most of the time, and every start still goes (late, its
    # latency counted from its scheduled start).
    target = SlowTarget(service_s=0.02)
    spec = LoadSpec(
        entry_size=16,
        ledgers=1,
        writers=1,
        in_flight=2,
        rate=200.0,
        duration_s=0.1,
        warmup_s=0.0,
    )
    result = asyncio.run(run_load(target, spec))
    assert target.most_outstanding == 2
    # 20 starts (21 when the sum of the float intervals falls just short of the end).
    assert target.appends[0] == result.latency.count
    assert result.latency.count in (20, 21)
    # The last start waited for the window behind the earlier appends.
    assert result.latency.max_us > 20 * 20_000 / 2 - 100_000
