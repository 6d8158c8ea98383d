"""The ledgerstore's read requests: a bounded queue served by a bounded number of workers
(BookKeeper's read thread pool, `numReadWorkerThreads` and
`maxPendingReadRequestsPerThread`).

A request is stamped when it arrives (`offer`, called inline by the endpoint, so nothing
waits unbounded in the NATS subscription before it). With the queue full it is answered
TOO_MANY_REQUESTS at once: its reader asks another replica or backs off, and the bookie
takes on no work it cannot do in time. A request that waited in the queue longer than its
sender's timeout (carried in the request, `shared.wire`) is dropped unread and
unanswered: its sender started its clock before ours did, so it has stopped waiting and
would throw any answer away, and reading it would only delay the requests behind it. So
an overload ends with its cause: what the clients gave up on is not served.

Writes first: while the journal is making adds durable (`LedgerStore.durable_notes` moved
since the last request served), a worker pauses after each request so that serving reads
takes at most `read_share` of its time (`read_share_while_writing`). A read's work (its
Python on the event loop and on a read thread) competes with the add path for the one
GIL and the machine's cores; the pause leaves those to the adds, and slows the whole read
pipeline (NATS, the readers) with it. A read is never starved: reads keep at least that
share, each pause is bounded (READ_PAUSE_MAX_S), and with no writes there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.metrics import OpStats
from shared.status import BookieStatus

log = logging.getLogger(__name__)

READ_PAUSE_MAX_S = 0.05  # the longest pause after one request (a slow disk read's)


class Responder(Protocol):
    """What the queue needs of a request: `nats.micro`'s Request is one."""

    async def respond(self, data: bytes = b"") -> None: ...

    async def respond_error(self, code: str, description: str) -> None: ...


@dataclass(slots=True)
class QueuedRead:
    request: Responder
    data: bytes  # the encoded request: 17 bytes an entry (decoded only when served)
    arrived_s: float
    deadline_s: float  # math.inf: its sender waits without limit


@dataclass
class ReadQueueStats:
    """Under BookKeeper's request stats names (bookie_ prefix dropped)."""

    read_entry_requests: int = 0  # read requests received
    read_entry_rejected: int = 0  # answered TOO_MANY_REQUESTS: the queue was full
    read_entry_expired: int = 0  # dropped unread: waited past their sender's timeout
    read_entry_queue_size: int = 0  # waiting for a worker now
    read_entry_in_progress: int = 0  # being served now
    read_paused_s: float = 0.0  # pauses after requests served while writing (writes first)
    # READ_ENTRY_SCHEDULING_DELAY, of those served.
    scheduling_delay: OpStats = field(default_factory=OpStats)
    # READ_ENTRY_REQUEST: from arrival to the reply (not success: refused, expired, failed).
    request_latency: OpStats = field(default_factory=OpStats)


class ReadQueue:
    def __init__(
        self,
        store: LedgerStore,
        workers: int,
        max_pending: int,
        clock: Callable[[], float] = time.monotonic,
        read_share: float = 1.0,
    ) -> None:
        self.store = store
        self.read_share = read_share
        self._notes_at_start = store.durable_notes
        self.workers = workers
        self.max_pending = max_pending
        self.stats = ReadQueueStats()
        self._clock = clock
        self._queue: asyncio.Queue[QueuedRead] = asyncio.Queue(max_pending)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"ledgerstore-read-{n}")
            for n in range(self.workers)
        ]

    async def offer(self, request: Responder, data: bytes) -> None:
        """A request as it arrives: queued, or answered at once (full queue, malformed).
        Never waits for a worker."""
        self.stats.read_entry_requests += 1
        if self._queue.full():  # first: a refused request costs no decoding
            self.stats.read_entry_rejected += 1
            await request.respond(wire.encode_read_reply(BookieStatus.TOO_MANY_REQUESTS, []))
            self.stats.request_latency.record(0.0, success=False)
            return
        try:
            timeout_ms = wire.read_request_timeout_ms(data)
        except wire.WireError as exc:
            log.warning("bad read request", extra={"err": str(exc)})
            await request.respond(wire.encode_read_reply(BookieStatus.BAD_REQUEST, []))
            return
        now_s = self._clock()
        deadline_s = now_s + timeout_ms / 1000 if timeout_ms else math.inf
        self._queue.put_nowait(QueuedRead(request, data, now_s, deadline_s))
        self.stats.read_entry_queue_size = self._queue.qsize()

    async def _work(self) -> None:
        notes_seen = self._notes_at_start  # this worker's: each paces its own reads
        while True:
            queued = await self._queue.get()
            self.stats.read_entry_queue_size = self._queue.qsize()
            started_s = self._clock()
            try:
                await self._serve(queued)
            finally:
                self._queue.task_done()
            notes = self.store.durable_notes
            if notes != notes_seen and self.read_share < 1:
                notes_seen = notes
                await self._writes_first(self._clock() - started_s)

    async def _writes_first(self, busy_s: float) -> None:
        """After a request that took `busy_s` while adds were made durable (since this
        worker's last request): pause so that reads take at most `read_share` of the
        worker's time."""
        pause_s = min(busy_s * (1 - self.read_share) / self.read_share, READ_PAUSE_MAX_S)
        self.stats.read_paused_s += pause_s
        await asyncio.sleep(pause_s)

    async def _serve(self, queued: QueuedRead) -> None:
        now_s = self._clock()
        stats = self.stats
        delay_ms = (now_s - queued.arrived_s) * 1000
        if now_s >= queued.deadline_s:
            stats.read_entry_expired += 1
            stats.request_latency.record(delay_ms, success=False)
            return
        stats.scheduling_delay.record(delay_ms)
        stats.read_entry_in_progress += 1
        served = False
        try:
            # Checked when it was offered: a failure here is a bug, answered as one.
            items = wire.decode_read_request(queued.data).items
            results = await self.store.read(items)
            await queued.request.respond(wire.encode_read_reply(BookieStatus.OK, results))
            served = True
        except Exception:
            log.exception("read failed")
            with contextlib.suppress(Exception):
                await queued.request.respond_error("500", "internal error")
        finally:
            stats.read_entry_in_progress -= 1
            stats.request_latency.record((self._clock() - queued.arrived_s) * 1000, served)

    async def drain(self) -> None:
        """Serve what is queued (the endpoint has stopped taking requests), then stop the
        workers."""
        if self._tasks:
            await self._queue.join()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
