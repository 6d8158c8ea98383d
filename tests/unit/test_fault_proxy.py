"""The fault proxy with real sockets: forwarding, a partition (blackhole), a reset, a heal;
and a real nats-server behind it: a partitioned client's request times out, a healed one
gets its answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import nats
import pytest

from quire.faults.proxy import FaultProxy
from tests.support.wait import until


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    with FaultProxy() as p:
        yield p


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    """An echo server on a free loopback port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield ("127.0.0.1", server.sockets[0].getsockname()[1])
    server.close()


async def roundtrip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> bytes:
    writer.write(data)
    await writer.drain()
    return await reader.readexactly(len(data))


async def test_forwards_both_ways_and_counts(proxy: FaultProxy, echo) -> None:
    port = proxy.listen("bookie-1.journal", echo)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await roundtrip(reader, writer, b"hello" * 1000) == b"hello" * 1000
    stats = proxy.stats()["bookie-1.journal"]
    assert stats["state"] == "open"
    assert stats["accepted"] == 1 and stats["open_connections"] == 1
    assert stats["bytes_up"] == 5000 and stats["bytes_down"] == 5000
    writer.close()
    await until(lambda: proxy.stats()["bookie-1.journal"]["open_connections"] == 0, "closed")


async def test_listeners_are_independent(proxy: FaultProxy, echo) -> None:
    a = proxy.listen("a", echo)
    b = proxy.listen("b", echo)
    ra, wa = await asyncio.open_connection("127.0.0.1", a)
    rb, wb = await asyncio.open_connection("127.0.0.1", b)
    proxy.partition("a")
    assert await roundtrip(rb, wb, b"still") == b"still"
    wa.write(b"held")
    await wa.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ra.readexactly(4), 0.3)
    for w in (wa, wb):
        w.close()


async def test_partition_holds_bytes_until_heal(proxy: FaultProxy, echo) -> None:
    port = proxy.listen("gateway", echo)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await roundtrip(reader, writer, b"before") == b"before"
    proxy.partition("gateway")
    writer.write(b"during")
    await writer.drain()
    # A blackhole: the connection stays up and nothing comes back.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(6), 0.3)
    assert proxy.stats()["gateway"]["open_connections"] == 1
    # A new connection is accepted and hangs.
    r2, w2 = await asyncio.open_connection("127.0.0.1", port)
    w2.write(b"new")
    await w2.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r2.readexactly(3), 0.3)
    proxy.heal("gateway")
    # What was sent across the cut arrives once healed, as TCP's retransmissions would.
    assert await asyncio.wait_for(reader.readexactly(6), 5) == b"during"
    assert await asyncio.wait_for(r2.readexactly(3), 5) == b"new"
    for w in (writer, w2):
        w.close()


async def test_reset_closes_and_refuses_until_heal(proxy: FaultProxy, echo) -> None:
    port = proxy.listen("metadata", echo)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await roundtrip(reader, writer, b"x") == b"x"
    proxy.reset("metadata")
    assert await asyncio.wait_for(reader.read(10), 5) == b""
    r2, w2 = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(r2.read(10), 5) == b""
    assert proxy.stats()["metadata"]["refused"] == 1
    proxy.heal("metadata")
    r3, w3 = await asyncio.open_connection("127.0.0.1", port)
    assert await roundtrip(r3, w3, b"back") == b"back"
    for w in (writer, w2, w3):
        w.close()


async def test_upstream_down_closes_the_client(proxy: FaultProxy) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    upstream = ("127.0.0.1", server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    port = proxy.listen("auditor", upstream)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(10), 5) == b""
    assert proxy.stats()["auditor"]["upstream_failures"] == 1
    writer.close()


async def test_nats_request_through_the_proxy(proxy: FaultProxy, nats_server) -> None:
    host, port = nats_server.url.removeprefix("nats://").rsplit(":", 1)
    listen_port = proxy.listen("replicator", (host, int(port)))
    server = await nats.connect(nats_server.url)
    client = await nats.connect(
        f"nats://127.0.0.1:{listen_port}",
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
    )
    try:

        async def answer(msg) -> None:
            await msg.respond(b"pong")

        await server.subscribe("proxy.test.ping", cb=answer)
        await server.flush()
        assert (await client.request("proxy.test.ping", b"", timeout=5)).data == b"pong"

        proxy.partition("replicator")
        with pytest.raises(nats.errors.TimeoutError):
            await client.request("proxy.test.ping", b"", timeout=0.5)

        proxy.heal("replicator")

        async def answered() -> bool:
            try:
                return (await client.request("proxy.test.ping", b"", timeout=1)).data == b"pong"
            except nats.errors.TimeoutError:
                return False

        await until(answered, "a request answered after the heal", timeout_s=20)
    finally:
        await client.close()
        await server.close()
