"""shared.natsfast's replies against the session's nats-server: a reply queued without a coroutine
arrives whole and in order with the client's ordinary publishes, answers a request, and a
client that is closed loses the reply without raising."""

from __future__ import annotations

import asyncio

import nats
from nats.micro.request import Request

from shared.natsfast import publish_soon, respond_soon

PAYLOADS = [b"", b"x", b"\r\n", b"PUB a 1\r\n", bytes(range(256)) * 40]


async def _collect(nc, subject: str, count: int) -> tuple[list[bytes], asyncio.Future]:
    got: list[bytes] = []
    done = asyncio.get_running_loop().create_future()

    async def take(msg) -> None:
        got.append(msg.data)
        if len(got) == count and not done.done():
            done.set_result(None)

    await nc.subscribe(subject, cb=take)
    await nc.flush()
    return got, done


async def test_publish_soon_delivers_in_order_with_ordinary_publishes(nc) -> None:
    got, done = await _collect(nc, "nats-reply.order", 2 * len(PAYLOADS))
    expected = []
    for i, payload in enumerate(PAYLOADS):
        publish_soon(nc, "nats-reply.order", payload)
        await nc.publish("nats-reply.order", b"%d" % i)
        expected += [payload, b"%d" % i]
    await asyncio.wait_for(done, 10)
    assert got == expected


async def test_respond_soon_answers_a_request(nc) -> None:
    async def echo(msg) -> None:
        respond_soon(Request(msg), b"re:" + msg.data)

    await nc.subscribe("nats-reply.echo", cb=echo)
    await nc.flush()
    answers = await asyncio.gather(
        *(nc.request("nats-reply.echo", b"%d" % i, timeout=10) for i in range(50))
    )
    assert [a.data for a in answers] == [b"re:%d" % i for i in range(50)]


async def test_a_closed_client_loses_the_reply_without_raising(nats_url: str, nc) -> None:
    got, done = await _collect(nc, "nats-reply.after", 1)
    other = await nats.connect(nats_url)
    await other.close()
    publish_soon(other, "nats-reply.after", b"lost")  # the fallback publish fails, logged
    publish_soon(nc, "nats-reply.after", b"kept")
    await asyncio.wait_for(done, 10)
    assert got == [b"kept"]
