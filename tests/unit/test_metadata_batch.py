"""GroupCommit (services/metadata/batch.py) on its own: what queues while a batch is being
written goes in the next one, never two items with one key, and each item keeps its own
outcome. Batches are held open by events the test sets, not by time."""

from __future__ import annotations

import asyncio

import pytest

from services.metadata.batch import GroupCommit


class Writer:
    """Records each batch; a batch waits for `release` before it answers."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.release = asyncio.Event()
        self.fail_batch: Exception | None = None

    async def run(self, items: list[tuple[str, int]]) -> list[int | BaseException]:
        self.batches.append(items)
        await self.release.wait()
        if self.fail_batch is not None:
            raise self.fail_batch
        return [ValueError(key) if value < 0 else value * 10 for key, value in items]


def group(writer: Writer, in_flight: int = 1, max_items: int = 64) -> GroupCommit:
    return GroupCommit(writer.run, lambda item: item[0], max_items=max_items, in_flight=in_flight)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_queued_items_go_together_and_each_keeps_its_outcome() -> None:
    writer = Writer()
    commits = group(writer)
    first = asyncio.create_task(commits.submit(("a", 1)))
    await settle()
    assert writer.batches == [[("a", 1)]]  # alone, at once
    rest = [asyncio.create_task(commits.submit(item)) for item in [("b", 2), ("c", -1), ("d", 4)]]
    await settle()
    assert commits.stats.pending == 3
    writer.release.set()
    outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert writer.batches == [[("a", 1)], [("b", 2), ("c", -1), ("d", 4)]]
    assert outcomes[:2] == [10, 20] and outcomes[3] == 40
    assert isinstance(outcomes[2], ValueError)  # only its own item failed
    assert (commits.stats.batches, commits.stats.items, commits.stats.pending) == (2, 4, 0)


async def test_one_key_never_twice_in_a_batch_and_batches_are_bounded() -> None:
    writer = Writer()
    commits = group(writer, max_items=2)
    blocker = asyncio.create_task(commits.submit(("x", 0)))
    await settle()
    tasks = [
        asyncio.create_task(commits.submit(item))
        for item in [("a", 1), ("a", 2), ("b", 3), ("c", 4)]
    ]
    await settle()
    writer.release.set()
    assert await asyncio.gather(blocker, *tasks) == [0, 10, 20, 30, 40]
    assert writer.batches[1:] == [[("a", 1), ("b", 3)], [("a", 2), ("c", 4)]]


async def test_a_failed_batch_fails_its_items_only() -> None:
    writer = Writer()
    commits = group(writer, in_flight=2)
    writer.fail_batch = RuntimeError("connection lost")
    tasks = [asyncio.create_task(commits.submit((k, 1))) for k in "abc"]
    await settle()
    writer.release.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    writer.fail_batch = None
    assert await commits.submit(("d", 5)) == 50  # the next batch is unaffected


async def test_close_cancels_queued_and_refuses_new_items() -> None:
    writer = Writer()
    commits = group(writer)
    running = asyncio.create_task(commits.submit(("a", 1)))
    await settle()
    queued = asyncio.create_task(commits.submit(("b", 1)))
    await settle()
    await commits.close()
    (outcome,) = await asyncio.gather(queued, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError)
    (outcome,) = await asyncio.gather(running, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError)  # its batch was cancelled
    with pytest.raises(RuntimeError):
        await commits.submit(("c", 1))


async def test_what_arrives_in_one_turn_goes_in_one_batch_beside_a_running_one() -> None:
    writer = Writer()
    commits = group(writer, in_flight=2)
    first = asyncio.create_task(commits.submit(("a", 1)))
    await settle()
    assert writer.batches == [[("a", 1)]]  # alone: nothing else arrived in its turn
    # A burst while one batch is being written: a slot is free, and the burst takes it
    # whole, not its first item alone.
    burst = [asyncio.create_task(commits.submit((k, 2))) for k in "bcd"]
    await settle()
    assert writer.batches == [[("a", 1)], [("b", 2), ("c", 2), ("d", 2)]]
    writer.release.set()
    assert await asyncio.gather(first, *burst) == [10, 20, 20, 20]
    assert (commits.stats.batches, commits.stats.items, commits.stats.pending) == (2, 4, 0)
