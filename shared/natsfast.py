"""Request/reply over a nats-py client with less Python per message: the client's requests
to the bookies (`shared.bookie_client`, `Requests`) and a bookie's answers to them
(`respond_soon`, `publish_soon`: the journal answers each add request from its group
commit's completion, a callback, with no coroutine per reply).

nats-py's `Client.request` does, per request: a NUID and `secrets.token_hex` (an
`os.urandom` call) for the reply subject, a future with a done callback, `publish` with
subject checks, a future and an `asyncio.Queue.put` to wake its flusher task, and
`asyncio.wait_for` on the answer (a second future, a done callback and a timer); its
answer goes through the reply subscription's queue to that subscription's task before the
callback resolves the future. One entry at a time, the client's CPU per add was 3.3x
JetStream's client's for the same entry (docs/performance.md, issue 20).

`Requests` keeps nats-py's connection, parser, reconnection and pending buffer, and cuts
the rest:
- reply subjects `<inbox>.<random>.<counter>` under one wildcard subscription whose
  messages are dispatched where nats-py's read loop parses them (its "future"
  subscription, the one its old-style requests use), straight to the request's callback
  (`send`, which the add batcher uses through `BookieClient.add_nowait`) or future
  (`request`);
- one timer per request for its timeout, no `wait_for`;
- the request goes into nats-py's pending buffer (in order with everything else it
  sends), and the buffer is written at the end of the event-loop turn by one callback
  (every request of the turn in one socket write), or, while the socket's own buffer is
  backed up or the connection is not up, by nats-py's flusher (which waits for the socket
  and for reconnection as it does for any publish).

A request with headers (a traced one) goes through nats-py's own `request`. A reply
(`respond_soon`) is one `PUB <inbox> <size>` line appended to the same pending buffer and
written by the same end-of-turn write; on a client that is not connected it falls back to
nats-py's `publish` in a task, which buffers or raises as nats-py decides.

Incoming, `subscribe_lean` serves a hot subject (the journal's `add`) where nats-py's read
loop parses each message: its handler gets (reply subject, payload, headers) with no Msg
(nor subject and reply decoding), no subscription queue and task switch, and no micro
Request and its bookkeeping; nats-py's own `_process_msg` still serves every other
subscription. In process that path costs 1.7-1.9 us a message against 3.8-4.5 us through a
micro endpoint (docs/performance.md, issue 20, round three). `lean_stats` counts what every
lean path did (Prometheus: `shared.metrics.natsfast_metrics`).

The internals used are nats-py 2.x's (`_pending`, `_pending_data_size`, `_flush_queue`,
`_transport`, `_subs`, `_process_msg`, `_process_headers`, the micro `Request._msg`;
constraints.txt pins the version);
`available` says whether a client has them (else every request takes nats-py's path).
tests/integration/test_natsfast.py and test_nats_reply.py run both against a real
nats-server."""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError, NoRespondersError, TimeoutError
from nats.micro.request import Request
from nats.protocol.command import pub_cmd

log = logging.getLogger(__name__)

NO_RESPONDERS_STATUS = "503"
STATUS_HEADER = "Status"
# Above this many bytes waiting in the socket's buffer the end-of-turn write leaves the
# pending buffer to nats-py's flusher, which waits for the socket to drain.
MAX_UNSENT_BYTES = 1024 * 1024


class LeanStats:
    """What the lean paths of this process did, over all its clients (Prometheus:
    `shared.metrics.natsfast_metrics`, in every service)."""

    __slots__ = (
        "delivered",
        "delivered_with_headers",
        "handler_errors",
        "replies",
        "reply_fallbacks",
        "request_fallbacks",
        "requests",
        "requesters",
        "writes",
    )

    def __init__(self) -> None:
        self.requests = 0  # requests sent through `Requests`' lean path
        self.request_fallbacks = 0  # sent through nats-py's request (headers, no internals)
        self.requesters: weakref.WeakSet[Requests] = weakref.WeakSet()  # for `waiting`
        self.replies = 0  # replies and publishes queued by `publish_soon` / `reply_soon`
        self.reply_fallbacks = 0  # of them, published by nats-py (not connected)
        self.writes = 0  # end-of-turn socket writes
        self.delivered = 0  # messages handed to a lean subscription's handler
        self.delivered_with_headers = 0  # of them, with headers (a traced request)
        self.handler_errors = 0  # handlers that raised (the message was dropped)

    @property
    def waiting(self) -> int:
        """Requests sent through `Requests` and not answered, timed out or cancelled."""
        return sum(requests.waiting for requests in list(self.requesters))


lean_stats = LeanStats()


class _NeverDone:
    """What nats-py asks of a "future" subscription's future besides `set_result`: it is
    never cancelled or done, so nats-py hands it every message."""

    __slots__ = ()

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False


class _Dispatch(_NeverDone):
    """Stands in for the future of a nats-py "future" subscription: nats-py calls
    `set_result` with each message as its read loop parses it."""

    __slots__ = ("_prefix_len", "_waiting")

    def __init__(self, waiting: dict[str, _Waiter], prefix_len: int) -> None:
        self._waiting = waiting
        self._prefix_len = prefix_len

    def set_result(self, msg: Msg) -> None:
        waiter = self._waiting.pop(msg.subject[self._prefix_len :], None)
        if waiter is not None:
            waiter.answer(msg)


class _Waiter:
    """One request's answer to come: `on_answer` gets the message or the error, once."""

    __slots__ = ("on_answer", "timer")

    def __init__(self, on_answer: OnAnswer) -> None:
        self.on_answer: OnAnswer | None = on_answer
        self.timer: asyncio.TimerHandle | None = None

    def answer(self, answer: Msg | Exception) -> None:
        on_answer, self.on_answer = self.on_answer, None
        if on_answer is None:
            return
        if self.timer is not None:
            self.timer.cancel()
        if (
            isinstance(answer, Msg)
            and not answer.data
            and answer.headers
            and answer.headers.get(STATUS_HEADER) == NO_RESPONDERS_STATUS
        ):
            answer = NoRespondersError()
        try:
            on_answer(answer)
        except Exception:  # nats-py's read loop, which calls this, would stop for good
            log.exception("a NATS answer's callback failed")


OnAnswer = Callable[[Msg | Exception], None]


class Requests:
    """Requests over `nc` (see the module docstring). Answers that come after their
    request timed out or was cancelled are dropped."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._waiting: dict[str, _Waiter] = {}  # reply token -> its request
        self._counter = 0
        self._prefix = ""
        self._started: asyncio.Future[None] | None = None
        self.requests = 0  # sent through the lean path
        self.fallbacks = 0  # sent through nats-py's request (headers, or no internals)
        lean_stats.requesters.add(self)

    @property
    def available(self) -> bool:
        """This nats-py client has the internals the lean path uses."""
        nc = self._nc
        return all(
            hasattr(nc, name)
            for name in ("_pending", "_pending_data_size", "_flush_queue", "_transport", "_subs")
        )

    @property
    def ready(self) -> bool:
        """`send` may be called: the reply subscription is set up (`start`)."""
        started = self._started
        return started is not None and started.done() and not _failed(started)

    @property
    def waiting(self) -> int:
        """Requests sent and not answered, timed out or cancelled (bounded by the callers'
        own bounds: the add batcher's requests per bookie, the reads in flight)."""
        return len(self._waiting)

    async def start(self) -> None:
        """Subscribe to the replies' subjects (once; later calls wait for the first, and a
        call after a failed one tries again)."""
        if self._started is None or _failed(self._started):
            self._started = asyncio.ensure_future(self._subscribe())
        await asyncio.shield(self._started)

    async def _subscribe(self) -> None:
        nc = self._nc
        prefix = f"{nc._inbox_prefix.decode()}.{os.urandom(8).hex()}."
        await nc.subscribe(prefix + "*", future=_Dispatch(self._waiting, len(prefix)))  # type: ignore[arg-type]
        self._prefix = prefix

    async def request(
        self,
        subject: str,
        payload: bytes,
        timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> Msg:
        """As `nc.request`: the answer, or NoRespondersError, nats' TimeoutError, or the
        connection's error."""
        if headers or not self.available:
            self.fallbacks += 1
            lean_stats.request_fallbacks += 1
            return await self._nc.request(subject, payload, timeout=timeout_s, headers=headers)
        await self.start()
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

        def answered(answer: Msg | Exception) -> None:
            if future.done():
                return
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)

        cancel = self.send(subject, payload, timeout_s, answered)
        try:
            return await future
        finally:
            cancel()

    def send(
        self, subject: str, payload: bytes, timeout_s: float, on_answer: OnAnswer
    ) -> Callable[[], None]:
        """Send a request (`ready` must be true); `on_answer` gets its answer or its error
        (NoRespondersError, nats' TimeoutError after `timeout_s`, ConnectionClosedError),
        later, never from inside this call, and only once. What it returns stops the wait:
        `on_answer` is not called after it."""
        nc = self._nc
        loop = asyncio.get_running_loop()
        self._counter += 1
        token = str(self._counter)
        waiter = _Waiter(on_answer)
        if nc.is_closed:
            loop.call_soon(waiter.answer, ConnectionClosedError())
            return waiter_cancel(self._waiting, token, waiter)
        self._waiting[token] = waiter
        _append(nc, pub_cmd(subject, self._prefix + token, payload), len(payload))
        self.requests += 1
        lean_stats.requests += 1
        waiter.timer = loop.call_later(timeout_s, self._expire, token, waiter)
        return waiter_cancel(self._waiting, token, waiter)

    def _expire(self, token: str, waiter: _Waiter) -> None:
        if self._waiting.get(token) is waiter:
            del self._waiting[token]
        waiter.timer = None
        waiter.answer(TimeoutError())


# -- replies, and the end-of-turn write ------------------------------------------------

_write_scheduled: set[int] = set()  # id() of the clients with an end-of-turn write due
_fallbacks: set[asyncio.Task[None]] = set()  # replies published while not connected


def respond_soon(request: Request, payload: bytes) -> None:
    """Answer `request` with `payload` (no headers), queued at once; never raises (a reply
    that cannot go is lost as a failed publish would be: the requester times out)."""
    reply = request._msg.reply
    if reply:
        publish_soon(request._msg._client, reply, payload)


def publish_soon(nc: NatsClient, subject: str, payload: bytes) -> None:
    """Publish `payload` on `subject` (no headers, no reply inbox) without awaiting."""
    lean_stats.replies += 1
    if not nc.is_connected or nc.is_draining_pubs or nc._flush_queue is None:
        lean_stats.reply_fallbacks += 1
        task = asyncio.ensure_future(_publish(nc, subject, payload))
        _fallbacks.add(task)
        task.add_done_callback(_fallbacks.discard)
        return
    _append(nc, b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload), len(payload))


async def _publish(nc: NatsClient, subject: str, payload: bytes) -> None:
    try:
        await nc.publish(subject, payload)
    except Exception as exc:
        log.debug("reply not sent", extra={"subject": subject, "err": repr(exc)})


def _append(nc: NatsClient, command: bytes, payload_size: int) -> None:
    """Queue one protocol command in nats-py's pending buffer (in order with everything
    else it sends), as its publish does, and see it written at the end of the turn."""
    nc._pending.append(command)
    nc._pending_data_size += len(command)
    stats: Any = nc.stats
    stats["out_msgs"] += 1
    stats["out_bytes"] += payload_size
    if id(nc) not in _write_scheduled:
        _write_scheduled.add(id(nc))
        asyncio.get_running_loop().call_soon(_write, nc)


def _write(nc: NatsClient) -> None:
    """Write what nats-py's pending buffer holds (every command of the turn in one socket
    write): now if the socket takes it, else through nats-py's flusher, which waits for
    the socket to drain and for reconnection as it does for any publish."""
    _write_scheduled.discard(id(nc))
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
        lean_stats.writes += 1
        transport.writelines(pending)  # a broken connection: the read loop sees it
        return
    queue = nc._flush_queue
    if queue is not None and queue.empty():
        queue.put_nowait(asyncio.get_running_loop().create_future())


# -- incoming messages without a Msg ---------------------------------------------------

# A lean subscription's handler: (reply subject, payload, headers or None), called in
# nats-py's read loop as the message is parsed; it must not block, and never raises into
# the read loop (an exception is logged and counted, the message dropped).
Deliver = Callable[[bytes, bytes, "dict[str, str] | None"], None]


class _LeanSink(_NeverDone):
    """A lean subscription's "future" (see `_Dispatch`): takes the messages nats-py's own
    `_process_msg` builds before the subscription is in the lean table (those parsed
    while `subscribe` was awaiting), and hands them to the same handler."""

    __slots__ = ("deliver",)

    def __init__(self, deliver: Deliver) -> None:
        self.deliver = deliver

    def set_result(self, msg: Msg) -> None:
        _deliver(self.deliver, msg.reply.encode(), msg.data, msg.headers)


def _deliver(deliver: Deliver, reply: bytes, data: bytes, headers: dict[str, str] | None) -> None:
    lean_stats.delivered += 1
    if headers:
        lean_stats.delivered_with_headers += 1
    try:
        deliver(reply, data, headers)
    except Exception:  # nats-py's read loop, which calls this, would stop for good
        lean_stats.handler_errors += 1
        log.exception("a lean subscription's handler failed")


def _lean_table(nc: NatsClient) -> dict[int, Deliver]:
    """The lean subscriptions of `nc` by sid, installing on first use a `_process_msg`
    that hands their messages to their handler (reply, payload, headers) as nats-py's
    parser reads them: no Msg, no subject decoding, no pending queue, no task switch, no
    micro request. Any other subscription's message goes to nats-py's own."""
    table: dict[int, Deliver] | None = getattr(nc, "_quire_lean", None)
    if table is not None:
        return table
    lean: dict[int, Deliver] = {}
    process_msg = nc._process_msg
    process_headers = nc._process_headers
    stats: Any = nc.stats

    async def lean_process_msg(
        sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        deliver = lean.get(sid)
        if deliver is None:
            await process_msg(sid, subject, reply, data, headers)
            return
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        if headers:
            _deliver(deliver, reply, data, await process_headers(headers))
        else:
            _deliver(deliver, reply, data, None)

    nc._process_msg = lean_process_msg  # type: ignore[method-assign]
    nc._quire_lean = lean  # type: ignore[attr-defined]
    return lean


async def subscribe_lean(
    nc: NatsClient, subject: str, deliver: Deliver, queue: str = ""
) -> Subscription:
    """Subscribe to `subject` (in queue group `queue`) with `deliver` called for each
    message in nats-py's read loop (`_lean_table`). Unsubscribing (or draining) the
    subscription it returns stops the deliveries."""
    if not all(hasattr(nc, name) for name in ("_process_msg", "_process_headers", "_subs")):
        sink = _LeanSink(deliver)  # a client without the internals: nats-py's own path

        async def callback(msg: Msg) -> None:
            sink.set_result(msg)

        return await nc.subscribe(subject, queue=queue, cb=callback)
    table = _lean_table(nc)
    sub = await nc.subscribe(subject, queue=queue, future=_LeanSink(deliver))  # type: ignore[arg-type]
    if sub._id in nc._subs:
        table[sub._id] = deliver
    return sub


def unsubscribe_lean(nc: NatsClient, sub: Subscription) -> None:
    """Stop handing `sub`'s messages to its handler (call before unsubscribing it: the
    messages the server sent meanwhile are dropped, as nats-py drops a closed
    subscription's)."""
    table: dict[int, Deliver] | None = getattr(nc, "_quire_lean", None)
    if table is not None:
        table.pop(sub._id, None)


def reply_soon(nc: NatsClient, reply: bytes, payload: bytes) -> None:
    """`publish_soon` to a reply subject as a lean subscription's handler gets it."""
    if not nc.is_connected or nc.is_draining_pubs or nc._flush_queue is None:
        publish_soon(nc, reply.decode(), payload)
        return
    lean_stats.replies += 1
    _append(nc, b"PUB %s %d\r\n%s\r\n" % (reply, len(payload), payload), len(payload))


def _failed(future: asyncio.Future[None]) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)


def waiter_cancel(waiting: dict[str, _Waiter], token: str, waiter: _Waiter) -> Callable[[], None]:
    def cancel() -> None:
        if waiting.get(token) is waiter:
            del waiting[token]
        waiter.on_answer = None
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None

    return cancel


__all__ = [
    "Deliver",
    "LeanStats",
    "Requests",
    "lean_stats",
    "publish_soon",
    "reply_soon",
    "respond_soon",
    "subscribe_lean",
    "unsubscribe_lean",
]
