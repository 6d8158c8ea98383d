"""One contract for both Python clients (HTTP and gRPC), run against the same real stack:
whatever the transport, the same calls give the same results and the same error codes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from quire.client import Entry, GrpcClient, HttpClient, QuireClient, QuireClientError
from tests.support.stack import MAX_ENTRY, Stack, running_stack, scratch_database, stack_settings

PASSWORD = "pw"


@pytest.fixture(scope="module")
async def stack(nats_url: str, database_url: str, tmp_path_factory) -> AsyncIterator[Stack]:
    settings = stack_settings(nats_url, tmp_path_factory.mktemp("client-stack"))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db) as s:
            yield s


@pytest.fixture(params=["http", "grpc"])
async def client(request, stack: Stack) -> AsyncIterator[QuireClient]:
    if request.param == "http":
        made: QuireClient = HttpClient(stack.url)
    else:
        made = GrpcClient(f"127.0.0.1:{stack.settings.gateway.grpc_port}")
    async with made:
        yield made


async def test_write_read_close(client: QuireClient) -> None:
    ledger = await client.create_ledger(password=PASSWORD, metadata={"k": "v"})
    assert ledger.ledger.state == "OPEN" and ledger.ledger.metadata["k"] == "v"
    # Beside the user's keys, the gateway that holds its writer (the one this client reached).
    assert {"quire.writer.http", "quire.writer.grpc"} < set(ledger.ledger.metadata)
    assert await ledger.append(b"zero") == 0
    payloads = [f"entry-{i}".encode() for i in range(1, 121)]
    assert await ledger.append_many(payloads, batch=40) == (1, 120)
    entries = await ledger.read(0, 120)
    assert entries == [Entry(0, b"zero"), *(Entry(i + 1, p) for i, p in enumerate(payloads))]
    assert await ledger.read(0, None) == entries  # up to the LAC
    assert [e async for e in ledger.read_stream(100, 500)] == entries[100:]  # capped at it
    assert await ledger.lac() == 120
    assert await ledger.close() == 120
    assert (await client.get(ledger.ledger_id)).state == "CLOSED"
    with pytest.raises(QuireClientError) as caught:
        await ledger.append(b"late")
    assert caught.value.code == "LEDGER_CLOSED"


async def test_tail_sees_appends_then_ends_at_close(client: QuireClient) -> None:
    ledger = await client.create_ledger(password=PASSWORD)
    seen: list[bytes] = []

    async def follow() -> None:
        async for entry in ledger.tail(0):
            seen.append(entry.data)

    follower = asyncio.create_task(follow())
    for i in range(5):
        await ledger.append(b"t%d" % i)
    await ledger.close()
    await asyncio.wait_for(follower, 30)
    assert seen == [b"t0", b"t1", b"t2", b"t3", b"t4"]


async def test_list_and_delete(client: QuireClient) -> None:
    a = await client.create_ledger(password=PASSWORD)
    b = await client.create_ledger(password=PASSWORD)
    page, _ = await client.list(after=a.ledger_id - 1, limit=2)
    assert [m.ledger_id for m in page] == [a.ledger_id, b.ledger_id]
    await client.delete(a.ledger_id, PASSWORD)
    with pytest.raises(QuireClientError) as caught:
        await client.get(a.ledger_id)
    assert caught.value.code == "NO_SUCH_LEDGER"


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda c, lid: c.append(lid, "wrong", [b"x"]), "UNAUTHORIZED"),
        (lambda c, lid: c.append(lid, PASSWORD, [b"x" * (MAX_ENTRY + 1)]), "ENTRY_TOO_LARGE"),
        (lambda c, lid: c.read(lid, PASSWORD, 5, 1), "INVALID_ARGUMENT"),
        (lambda c, lid: c.get(10**12), "NO_SUCH_LEDGER"),
        (
            lambda c, lid: c.create(password="p", ensemble_size=2, write_quorum=3),
            "INVALID_ARGUMENT",
        ),
        (
            lambda c, lid: c.create(password="p", ensemble_size=7, write_quorum=3),
            "NOT_ENOUGH_BOOKIES",
        ),
    ],
)
async def test_same_error_codes_on_both_transports(client: QuireClient, call, code: str) -> None:
    ledger = await client.create_ledger(password=PASSWORD)
    with pytest.raises(QuireClientError) as caught:
        await call(client, ledger.ledger_id)
    assert caught.value.code == code
