"""Request/reply over a nats-py client with less Python per request: the client's hot path
to the bookies (`shared.bookie_client`).

nats-py's `Client.request` does, per request: a NUID and `secrets.token_hex` (an
`os.urandom` call) for the reply subject, a future with a done callback, `publish` with
subject checks, a future and an `asyncio.Queue.put` to wake its flusher task, and
`asyncio.wait_for` on the answer (a second future, a done callback and a timer); its
answer goes through the reply subscription's queue to that subscription's task before the
callback resolves the future. One entry at a time, the client's Python per add was 3.3x
JetStream's client's for the same entry (docs/performance.md, issue 20).

`Requests` keeps nats-py's connection, parser, reconnection and pending buffer, and cuts
the rest:
- reply subjects `<inbox>.<random>.<counter>` under one wildcard subscription whose
  messages are dispatched where nats-py's read loop parses them (its "future"
  subscription, the one its old-style requests use), straight to the request's future;
- one timer per request for its timeout, no `wait_for`;
- the request goes into nats-py's pending buffer (in order with everything else it
  sends), and the buffer is written at the end of the event-loop turn by one callback
  (every request of the turn in one socket write), or, while the socket's own buffer is
  backed up or the connection is not up, by nats-py's flusher (which waits for the socket
  and for reconnection as it does for any publish).

A request with headers (a traced one) goes through nats-py's own `request`. The
internals used are nats-py 2.x's; `available` says whether this client has them (else
every request takes nats-py's path)."""

from __future__ import annotations

import asyncio
import os

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, NoRespondersError, TimeoutError
from nats.protocol.command import pub_cmd

NO_RESPONDERS_STATUS = "503"
STATUS_HEADER = "Status"
# Above this many bytes waiting in the socket's buffer the end-of-turn write leaves the
# pending buffer to nats-py's flusher, which waits for the socket to drain.
MAX_UNSENT_BYTES = 1024 * 1024


class _Dispatch:
    """Stands in for the future of a nats-py "future" subscription: nats-py calls
    `set_result` with each message as its read loop parses it."""

    __slots__ = ("_prefix_len", "_waiting")

    def __init__(self, waiting: dict[str, asyncio.Future[Msg]], prefix_len: int) -> None:
        self._waiting = waiting
        self._prefix_len = prefix_len

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    def set_result(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject[self._prefix_len :], None)
        if future is not None and not future.done():
            future.set_result(msg)


class Requests:
    """Requests over `nc` (see the module docstring). Answers that come after their
    request timed out are dropped; at most one request per reply token waits."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._waiting: dict[str, asyncio.Future[Msg]] = {}  # reply token -> its request
        self._counter = 0
        self._prefix = ""
        self._started: asyncio.Future[None] | None = None
        self._write_scheduled = False
        self.requests = 0  # sent through the lean path
        self.fallbacks = 0  # sent through nats-py's request (headers, or no internals)

    @property
    def available(self) -> bool:
        """This nats-py client has the internals the lean path uses."""
        nc = self._nc
        return all(
            hasattr(nc, name)
            for name in ("_pending", "_pending_data_size", "_flush_queue", "_transport")
        )

    @property
    def waiting(self) -> int:
        """Requests sent and not answered or timed out (bounded by the callers' own bounds:
        the add batcher's requests per bookie, the reads in flight)."""
        return len(self._waiting)

    async def _start(self) -> None:
        nc = self._nc
        self._prefix = f"{nc._inbox_prefix.decode()}.{os.urandom(8).hex()}."
        await nc.subscribe(self._prefix + "*", future=_Dispatch(self._waiting, len(self._prefix)))  # type: ignore[arg-type]

    async def request(
        self,
        subject: str,
        payload: bytes,
        timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> Msg:
        """As `nc.request`: the answer, or NoRespondersError, nats' TimeoutError, or the
        connection's error."""
        nc = self._nc
        if headers or not self.available:
            self.fallbacks += 1
            return await nc.request(subject, payload, timeout=timeout_s, headers=headers)
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        if not self._started.done():
            await asyncio.shield(self._started)
        self._started.result()  # a failed subscribe fails every request
        if nc.is_closed:
            raise ConnectionClosedError
        self._counter += 1
        token = str(self._counter)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = future
        command = pub_cmd(subject, self._prefix + token, payload)
        nc._pending.append(command)
        nc._pending_data_size += len(command)
        nc.stats["out_msgs"] += 1
        nc.stats["out_bytes"] += len(payload)
        self.requests += 1
        if not self._write_scheduled:
            self._write_scheduled = True
            loop.call_soon(self._write)
        timer = loop.call_later(timeout_s, _expire, future)
        try:
            msg = await future
        finally:
            timer.cancel()
            self._waiting.pop(token, None)
        if not msg.data and msg.headers and msg.headers.get(STATUS_HEADER) == NO_RESPONDERS_STATUS:
            raise NoRespondersError
        return msg

    def _write(self) -> None:
        """Write what nats-py's pending buffer holds: now if the socket takes it, else
        through nats-py's flusher."""
        self._write_scheduled = False
        nc = self._nc
        if not nc._pending:
            return  # nats-py's flusher wrote it meanwhile
        transport = nc._transport
        writer = getattr(transport, "_io_writer", None)
        if (
            nc.is_connected
            and not nc.is_connecting
            and writer is not None
            and writer.transport.get_write_buffer_size() <= MAX_UNSENT_BYTES
        ):
            pending = nc._pending
            nc._pending = []
            nc._pending_data_size = 0
            try:
                transport.writelines(pending)
            except Exception:  # the connection broke: nats-py's flusher and read loop see it
                nc._pending[:0] = pending
                nc._pending_data_size += sum(len(p) for p in pending)
                self._kick_flusher()
            return
        self._kick_flusher()

    def _kick_flusher(self) -> None:
        queue = self._nc._flush_queue
        if queue is not None and queue.empty():
            queue.put_nowait(asyncio.get_running_loop().create_future())


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(TimeoutError)


__all__ = ["Requests"]
