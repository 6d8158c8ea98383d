"""The gateway's gRPC API (API.md section 3) over a real stack in this process (metadata on
PostgreSQL, three bookies, the gateway) on real NATS, through a real gRPC channel."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from shared.models import PRIVATE_LEDGER_FIELDS
from tests.support.stack import (
    MAX_BATCH,
    MAX_ENTRY,
    running_stack,
    scratch_database,
    stack_settings,
)

PASSWORD = "s3cret"
AUTH = (("quire-ledger-password", PASSWORD),)
WRONG = (("quire-ledger-password", "wrong"),)


@pytest.fixture(scope="module")
async def grpc_stub(
    nats_url: str, database_url: str, tmp_path_factory
) -> AsyncIterator[pb_grpc.LedgersStub]:
    settings = stack_settings(nats_url, tmp_path_factory.mktemp("grpc-stack"))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db) as s:
            target = f"127.0.0.1:{s.settings.gateway.grpc_port}"
            async with grpc.aio.insecure_channel(target) as channel:
                stub = pb_grpc.LedgersStub(channel)
                stub.channel = channel  # type: ignore[attr-defined]
                yield stub


def error_code(error: grpc.aio.AioRpcError) -> str:
    """The stable code string, from the status details (ErrorInfo) and the trailers alike."""
    trailer = dict(error.trailing_metadata() or ()).get("quire-error-code")
    status = rpc_status.from_call(error)
    assert status is not None, error
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.domain == "quire.v1"
    assert info.reason == trailer
    return info.reason


async def expect_error(call, status: grpc.StatusCode, code: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        result = call()
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    assert caught.value.code() == status, caught.value
    assert error_code(caught.value) == code


async def create(stub: pb_grpc.LedgersStub, **fields) -> pb.Ledger:
    request = pb.CreateRequest(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD, **fields
    )
    return await stub.Create(request)


async def test_create_get_list_delete(grpc_stub: pb_grpc.LedgersStub) -> None:
    ledger = await create(grpc_stub, digest="hmac", metadata={"app": "grpc"})
    assert ledger.state == "OPEN" and ledger.digest == "hmac"
    assert not ledger.HasField("last_entry_id")
    assert len(ledger.segments[0].bookies) == 3 and ledger.metadata["app"] == "grpc"
    got = await grpc_stub.Get(pb.GetRequest(ledger_id=ledger.ledger_id))
    assert got == ledger
    # The message has no field for the password material or the ledger's keys.
    assert not PRIVATE_LEDGER_FIELDS & set(pb.Ledger.DESCRIPTOR.fields_by_name)
    page = await grpc_stub.List(pb.ListRequest(after=ledger.ledger_id - 1, limit=1))
    assert [m.ledger_id for m in page.ledgers] == [ledger.ledger_id]
    await grpc_stub.Delete(pb.DeleteRequest(ledger_id=ledger.ledger_id), metadata=AUTH)
    await expect_error(
        lambda: grpc_stub.Get(pb.GetRequest(ledger_id=ledger.ledger_id)),
        grpc.StatusCode.NOT_FOUND,
        "NO_SUCH_LEDGER",
    )


async def test_append_read_close(grpc_stub: pb_grpc.LedgersStub) -> None:
    lid = (await create(grpc_stub)).ledger_id
    one = await grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=[b"a"]), metadata=AUTH)
    assert (one.first_entry_id, one.last_entry_id) == (0, 0)
    many = [bytes([i]) * i for i in range(1, 11)]
    batch = await grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=many), metadata=AUTH)
    assert (batch.first_entry_id, batch.last_entry_id, batch.lac) == (1, 10, 10)
    read = grpc_stub.Read(
        pb.ReadRequest(ledger_id=lid, from_entry_id=0, to_entry_id=10), metadata=AUTH
    )
    assert [(e.entry_id, e.data) async for e in read] == list(enumerate([b"a", *many]))
    lac = await grpc_stub.ReadLac(pb.ReadLacRequest(ledger_id=lid), metadata=AUTH)
    assert lac.lac == 10
    closed = await grpc_stub.Close(pb.CloseRequest(ledger_id=lid), metadata=AUTH)
    assert (closed.state, closed.last_entry_id) == ("CLOSED", 10)
    await expect_error(
        lambda: grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=[b"x"]), metadata=AUTH),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEDGER_CLOSED",
    )


async def test_read_streams_pages_past_the_batch_limit(grpc_stub: pb_grpc.LedgersStub) -> None:
    lid = (await create(grpc_stub)).ledger_id
    payloads = [f"e{i}".encode() for i in range(MAX_BATCH * 2 + 7)]
    for start in range(0, len(payloads), MAX_BATCH):
        chunk = payloads[start : start + MAX_BATCH]
        await grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=chunk), metadata=AUTH)
    await grpc_stub.Close(pb.CloseRequest(ledger_id=lid), metadata=AUTH)
    request = pb.ReadRequest(ledger_id=lid, from_entry_id=0, to_entry_id=len(payloads) + 50)
    got = [e.data async for e in grpc_stub.Read(request, metadata=AUTH)]
    assert got == payloads  # capped at the last entry


async def test_append_stream_acks_in_entry_order(grpc_stub: pb_grpc.LedgersStub) -> None:
    lid = (await create(grpc_stub)).ledger_id
    payloads = [os.urandom(i % 100) for i in range(300)]

    async def requests() -> AsyncIterator[pb.AppendStreamRequest]:
        for data in payloads:
            yield pb.AppendStreamRequest(ledger_id=lid, entry=data)

    acks = [a async for a in grpc_stub.AppendStream(requests(), metadata=AUTH)]
    assert [a.entry_id for a in acks] == list(range(300))
    assert all(a.lac >= a.entry_id for a in acks)
    read = grpc_stub.Read(
        pb.ReadRequest(ledger_id=lid, from_entry_id=0, to_entry_id=299), metadata=AUTH
    )
    assert [e.data async for e in read] == payloads


async def test_append_stream_cancelled_midway_keeps_what_was_acknowledged(
    grpc_stub: pb_grpc.LedgersStub,
) -> None:
    lid = (await create(grpc_stub)).ledger_id
    gate = asyncio.Event()

    async def requests() -> AsyncIterator[pb.AppendStreamRequest]:
        for i in range(5):
            yield pb.AppendStreamRequest(ledger_id=lid, entry=b"%d" % i)
        await gate.wait()  # the client stops sending; then cancels

    call = grpc_stub.AppendStream(requests(), metadata=AUTH)
    seen = []
    async for ack in call:
        seen.append(ack.entry_id)
        if len(seen) == 5:
            break
    call.cancel()
    assert seen == [0, 1, 2, 3, 4]
    # The server is unharmed and the acknowledged entries are there.
    more = await grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=[b"5"]), metadata=AUTH)
    assert more.first_entry_id == 5
    read = grpc_stub.Read(
        pb.ReadRequest(ledger_id=lid, from_entry_id=0, to_entry_id=5), metadata=AUTH
    )
    assert [e.data async for e in read] == [b"0", b"1", b"2", b"3", b"4", b"5"]


async def test_tail_follows_the_lac_until_the_ledger_closes(
    grpc_stub: pb_grpc.LedgersStub,
) -> None:
    lid = (await create(grpc_stub)).ledger_id
    tail = grpc_stub.Tail(pb.TailRequest(ledger_id=lid, from_entry_id=0), metadata=AUTH)
    received: list[bytes] = []

    async def follow() -> None:
        async for entry in tail:
            received.append(entry.data)

    follower = asyncio.create_task(follow())
    for i in range(3):
        await grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=[b"t%d" % i]), metadata=AUTH)
    await grpc_stub.Close(pb.CloseRequest(ledger_id=lid), metadata=AUTH)
    await asyncio.wait_for(follower, 30)
    assert received == [b"t0", b"t1", b"t2"]


async def test_tail_cancellation(grpc_stub: pb_grpc.LedgersStub) -> None:
    lid = (await create(grpc_stub)).ledger_id
    await grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=[b"x", b"y"]), metadata=AUTH)
    tail = grpc_stub.Tail(pb.TailRequest(ledger_id=lid, from_entry_id=0), metadata=AUTH)
    first = await tail.read()
    assert first.entry_id == 0
    tail.cancel()
    assert (await grpc_stub.Get(pb.GetRequest(ledger_id=lid))).state == "OPEN"


async def test_errors_carry_their_codes(grpc_stub: pb_grpc.LedgersStub) -> None:
    lid = (await create(grpc_stub)).ledger_id
    await grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=[b"x"]), metadata=AUTH)
    cases = [
        (
            lambda: grpc_stub.Create(pb.CreateRequest(ensemble_size=3, write_quorum=4)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda: grpc_stub.Create(pb.CreateRequest(digest="md5", password="p")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda: grpc_stub.Create(
                pb.CreateRequest(ensemble_size=9, write_quorum=3, ack_quorum=2)
            ),
            grpc.StatusCode.UNAVAILABLE,
            "NOT_ENOUGH_BOOKIES",
        ),
        (
            lambda: grpc_stub.Get(pb.GetRequest(ledger_id=-1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda: grpc_stub.Append(pb.AppendRequest(ledger_id=lid, entries=[b"x"])),
            grpc.StatusCode.PERMISSION_DENIED,
            "UNAUTHORIZED",
        ),
        (
            lambda: grpc_stub.Append(
                pb.AppendRequest(ledger_id=lid, entries=[b"x"]), metadata=WRONG
            ),
            grpc.StatusCode.PERMISSION_DENIED,
            "UNAUTHORIZED",
        ),
        (
            lambda: grpc_stub.Append(
                pb.AppendRequest(ledger_id=lid, entries=[b"ok", b"x" * (MAX_ENTRY + 1)]),
                metadata=AUTH,
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "ENTRY_TOO_LARGE",
        ),
        (
            lambda: grpc_stub.Append(pb.AppendRequest(ledger_id=lid), metadata=AUTH),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda: grpc_stub.Read(
                pb.ReadRequest(ledger_id=lid, from_entry_id=5, to_entry_id=1), metadata=AUTH
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda: grpc_stub.ReadLac(
                pb.ReadLacRequest(ledger_id=lid, timeout_ms=-1), metadata=AUTH
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda: grpc_stub.Close(pb.CloseRequest(ledger_id=987654321), metadata=AUTH),
            grpc.StatusCode.NOT_FOUND,
            "NO_SUCH_LEDGER",
        ),
    ]
    for call, status, code in cases:
        await expect_error(call, status, code)
    # None of it changed anything: one entry, still open.
    ledger = await grpc_stub.Get(pb.GetRequest(ledger_id=lid))
    assert ledger.state == "OPEN" and ledger.version == 0
    lac = await grpc_stub.ReadLac(pb.ReadLacRequest(ledger_id=lid), metadata=AUTH)
    assert lac.lac == 0


async def test_health_and_reflection(grpc_stub: pb_grpc.LedgersStub) -> None:
    channel = grpc_stub.channel  # type: ignore[attr-defined]
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "quire.v1.Ledgers"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def ask() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    replies = [r async for r in reflect.ServerReflectionInfo(ask())]
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"quire.v1.Ledgers", "grpc.health.v1.Health"} <= names
