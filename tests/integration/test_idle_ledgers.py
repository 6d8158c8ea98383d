"""An idle ledger costs the gateway nothing (issue 12): the gateway's Ledgers, in this
process against a real stack, with 10 and then 1,000 open ledgers, each written once and
then left alone. Its work is counted in calls (`LedgerWriter.tick`, `WriterHandle.pump`),
not timed: each writer is ticked for its one explicit LAC, then never again, however long
the gateway runs and however many ledgers are open. The memory each idle ledger holds in
the gateway is measured with tracemalloc and bounded."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

from services.gateway.ledgers import Ledgers
from shared.protocol.driver import WriterHandle
from shared.protocol.writer import LedgerWriter
from tests.support.gateway import in_process_ledgers
from tests.support.stack import gateway_settings, running_stack

EXPLICIT_LAC_MS = 100
# The idle time under test: ten sweeps of the 50 ms ticker this replaced, which ticked and
# pumped every open writer on each.
IDLE_S = 0.5
MEMORY_PER_LEDGER_MAX = 10 * 1024
CREATE_WINDOW = 50


class Calls:
    def __init__(self) -> None:
        self.ticks = 0
        self.pumps = 0

    def now(self) -> tuple[int, int]:
        return self.ticks, self.pumps


@pytest.fixture
def calls(monkeypatch) -> Calls:
    counted = Calls()
    tick, pump = LedgerWriter.tick, WriterHandle.pump

    def counting_tick(self, now_ms: int) -> None:
        counted.ticks += 1
        tick(self, now_ms)

    def counting_pump(self) -> None:
        counted.pumps += 1
        pump(self)

    monkeypatch.setattr(LedgerWriter, "tick", counting_tick)
    monkeypatch.setattr(WriterHandle, "pump", counting_pump)
    return counted


async def _open_idle_ledgers(ledgers: Ledgers, count: int) -> None:
    """`count` ledgers, one entry appended to each, CREATE_WINDOW at a time."""

    async def one() -> None:
        created = await ledgers.create(
            ensemble_size=3,
            write_quorum=3,
            ack_quorum=2,
            digest="crc32c",
            password=b"pw",
            metadata={"app": "idle"},
        )
        await ledgers.append(created.ledger_id, b"pw", [b"once"])

    for start in range(0, count, CREATE_WINDOW):
        await asyncio.gather(*(one() for _ in range(min(CREATE_WINDOW, count - start))))


async def _until_quiet(ledgers: Ledgers, timeout_s: float = 60.0) -> None:
    """Until every writer sent its explicit LAC and holds no timer and no task, and the
    client has no request to a bookie on its way (the explicit LACs go out merged)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not ledgers.client.quiet or any(
        not h.quiet or h.core.next_deadline_ms() is not None for h in ledgers.writers.values()
    ):
        assert loop.time() < deadline, "the writers did not go quiet"
        await asyncio.sleep(0.02)


# Where the gateway's own coroutines live: the bookies and the metadata service of the stack
# run in this process too, and their request handlers come and go on their own schedule.
CLIENT_CODE = ("/services/gateway/", "/shared/protocol/", "/shared/bookie_client.py")


def _client_tasks() -> int:
    """The tasks running the gateway's and the protocol client's code."""
    files = [getattr(t.get_coro(), "cr_code", None) for t in asyncio.all_tasks()]
    return sum(
        code is not None and any(part in code.co_filename for part in CLIENT_CODE) for code in files
    )


async def test_idle_ledgers_cost_no_calls_and_bounded_memory(
    settings, fresh_database_url, nc, calls: Calls
) -> None:
    measured: dict[int, dict[str, float]] = {}
    async with running_stack(settings, fresh_database_url) as stack:
        client_settings = gateway_settings(stack.settings, explicit_lac_interval_ms=EXPLICIT_LAC_MS)
        for count in (10, 1_000):
            ledgers = in_process_ledgers(nc, client_settings)
            background = asyncio.create_task(ledgers.run_ack_events())  # as the gateway runs
            try:
                gc.collect()
                tracemalloc.start()
                before_bytes = tracemalloc.get_traced_memory()[0]
                started = calls.now()
                await _open_idle_ledgers(ledgers, count)
                await _until_quiet(ledgers)
                quiet = calls.now()
                tasks = _client_tasks()
                await asyncio.sleep(IDLE_S)  # time passing is what is under test here
                idle = calls.now()
                gc.collect()
                held_bytes = tracemalloc.get_traced_memory()[0] - before_bytes
                tracemalloc.stop()
                pending = ledgers.metrics.registry.get_sample_value("quire_gateway_pending_adds")
                measured[count] = {
                    "ticks": quiet[0] - started[0],
                    "pumps": quiet[1] - started[1],
                    "idle_calls": sum(idle) - sum(quiet),
                    "tasks": tasks,
                    "bytes_per_ledger": held_bytes / count,
                    "pending_adds": pending,
                }
            finally:
                if tracemalloc.is_tracing():
                    tracemalloc.stop()
                background.cancel()
                await asyncio.gather(background, return_exceptions=True)
                await ledgers.stop()
    print("idle ledgers:", measured)  # the figures, for `pytest -s`
    for count, m in measured.items():
        # Each writer is ticked for its one explicit LAC (twice at most: a timer may fire a
        # little before its deadline and be armed again), then never while idle.
        assert m["ticks"] <= 2 * count, (count, m)
        # Pumps: the append, its three bookies' replies and the LAC tick, per ledger.
        assert m["pumps"] <= 6 * count, (count, m)
        assert m["idle_calls"] == 0, (count, m)
        assert m["pending_adds"] == 0, (count, m)
    # Memory per idle ledger, where the gateway's fixed memory is spread thin enough.
    assert measured[1_000]["bytes_per_ledger"] < MEMORY_PER_LEDGER_MAX, measured
    # A quiet handle holds no task: as many tasks run with 1,000 idle ledgers as with 10.
    assert measured[1_000]["tasks"] <= measured[10]["tasks"] + 2, measured
