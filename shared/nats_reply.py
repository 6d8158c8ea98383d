"""Answer a NATS request without a coroutine: the reply is queued on the connection at once.

nats-py's `Msg.respond` / `Client.publish` is a coroutine per message: it validates the
subject, formats the PUB line through an f-string, and creates a future per flush. A
bookie answers every add request of every client, and a handler that answers from a
callback (the journal answers from its group commit's completion) would need a task per
reply just to await it. `respond_soon` does what publish does for a header-less message on
a connected client, synchronously: one `PUB <reply> <size>` line and the payload appended to
the client's pending buffer, and the client's flusher woken if it is idle (it then writes
everything pending with one `writelines`, as for any publish).

It uses nats-py internals that have been stable since 2.0 (`_pending`,
`_pending_data_size`, `_flush_queue`, `stats`, and the micro `Request._msg`); when the
client is not connected (reconnecting, draining, closed) it falls back to the ordinary
`publish` in a task, which buffers or raises as nats-py decides. tests/unit/
test_nats_reply.py pins the bytes against nats-py's own and tests/integration runs it
against a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client as NatsClient
from nats.micro.request import Request

log = logging.getLogger(__name__)

_fallbacks: set[asyncio.Task[None]] = set()  # publishes in flight while not connected


def reply_subject(request: Request) -> str:
    """The inbox a request is to be answered on ("" if it wants no answer)."""
    return request._msg.reply


def respond_soon(request: Request, payload: bytes) -> None:
    """Answer `request` with `payload` (no headers), queued at once; never raises (a reply
    that cannot go is lost as a failed publish would be: the requester times out)."""
    reply = request._msg.reply
    if reply:
        publish_soon(request._msg._client, reply, payload)


def publish_soon(nc: NatsClient, subject: str, payload: bytes) -> None:
    """Publish `payload` on `subject` (no headers, no reply inbox) without awaiting."""
    flush_queue = nc._flush_queue
    if not nc.is_connected or nc.is_draining_pubs or flush_queue is None:
        task = asyncio.ensure_future(_publish(nc, subject, payload))
        _fallbacks.add(task)
        task.add_done_callback(_fallbacks.discard)
        return
    command = b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)
    nc._pending.append(command)
    nc._pending_data_size += len(command)
    stats = nc.stats
    stats["out_msgs"] += 1
    stats["out_bytes"] += len(payload)
    if flush_queue.empty():
        # What nats-py's publish does (`_flush_pending`): hand the flusher a future to
        # settle once it has written everything pending.
        with contextlib.suppress(asyncio.QueueFull):
            flush_queue.put_nowait(asyncio.get_running_loop().create_future())


async def _publish(nc: NatsClient, subject: str, payload: bytes) -> None:
    try:
        await nc.publish(subject, payload)
    except Exception as exc:
        log.debug("reply not sent", extra={"subject": subject, "err": repr(exc)})
