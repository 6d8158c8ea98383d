"""Group commit for the metadata store: changes of one kind that arrive while earlier ones
are being written go to PostgreSQL together, as one statement (one round trip, one
transaction, one WAL flush), the metadata analogue of the journal's group commit.

Every request queues; at the end of the event-loop turn it arrived in, what queued starts
as one batch if fewer than `in_flight` batches are being written, and each batch that ends
starts the next with all that queued meanwhile (up to `max_items`). Requests arrive in
bursts (the NATS client hands over every message of one socket read in one turn): a
request that went alone at once when it found a slot free took that slot for itself, and
the rest of its burst followed in a second statement with its own round trip and WAL
flush (at 32 in flight, the one-change statements cost the service about as much as the
batched ones: docs/performance.md, issue 20, round three).
Waiting for the end of the turn puts the burst in one. One request at a time pays a
future and a task for it, and waits for nothing. Each item of a batch has its own outcome
(`run` answers one per item, a value or an exception), so a refused compare-and-set
refuses only its own request. Items with the same key (the same ledger) never share a batch: the
second waits for the next one, so that one statement never changes a row twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class BatchStats:
    batches: int = 0  # statements run
    items: int = 0  # changes they carried
    pending: int = 0  # changes waiting for a batch now


class GroupCommit(Generic[Item, Result]):
    def __init__(
        self,
        run: Callable[[list[Item]], Awaitable[Sequence[Result | BaseException]]],
        key: Callable[[Item], Hashable],
        *,
        max_items: int,
        in_flight: int,
    ) -> None:
        self._run = run
        self._key = key
        self._max_items = max_items
        self._in_flight = in_flight
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._writing = 0  # batches being written, each in a task of its own
        self._start_due = False  # an end-of-turn start is scheduled
        self._closed = False
        self.stats = BatchStats()

    async def submit(self, item: Item) -> Result:
        if self._closed:
            raise RuntimeError("the store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((item, future))
        self.stats.pending = len(self._pending)
        if not self._start_due:
            self._start_due = True
            loop.call_soon(self._start_at_end_of_turn)
        return await future

    def _start_at_end_of_turn(self) -> None:
        self._start_due = False
        self._start_batches()

    def _start_batches(self) -> None:
        while self._pending and self._writing < self._in_flight and not self._closed:
            batch, keys, left = [], set(), []
            for entry in self._pending:
                key = self._key(entry[0])
                if entry[1].done():  # its request gave up (cancelled) before it was sent
                    continue
                if len(batch) < self._max_items and key not in keys:
                    keys.add(key)
                    batch.append(entry)
                else:
                    left.append(entry)
            self._pending = left
            if not batch:
                break
            self._writing += 1
            task = asyncio.create_task(self._write(batch), name="metadata-group-commit")
            self._running.add(task)
        self.stats.pending = len(self._pending)

    async def _write(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        self.stats.batches += 1
        self.stats.items += len(batch)
        try:
            outcomes = await self._run([item for item, _ in batch])
            assert len(outcomes) == len(batch), "one outcome per item"
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        except BaseException:
            for _, future in batch:
                future.cancel()
            raise
        finally:
            self._writing -= 1
            self._running.discard(asyncio.current_task())  # type: ignore[arg-type]
            self._start_batches()

    async def close(self) -> None:
        """Cancel the batches being written; their requests fail."""
        self._closed = True
        for task in list(self._running):
            task.cancel()
        if self._running:
            await asyncio.wait(list(self._running))
        for _, future in self._pending:
            if not future.done():
                future.cancel()
        self._pending = []
