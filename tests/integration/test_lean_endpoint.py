"""ServiceRuntime.add_lean_endpoint against a real nats-server: the handler gets each
request's reply subject, payload and headers; one that raises is logged and answered with
a micro error (code 500) and the endpoint keeps serving; the shutdown's drain stops it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.errors import NoRespondersError

from shared.config import QuireSettings
from shared.natsfast import reply_soon
from shared.service import ServiceRuntime

SUBJECT = "lean.endpoint"


@pytest.fixture
async def served(settings: QuireSettings) -> AsyncIterator[tuple[ServiceRuntime, list]]:
    rt = ServiceRuntime("test", settings, "test-1")
    await rt.start()
    seen: list = []

    def handle(reply: bytes, data: bytes, headers: dict[str, str] | None) -> None:
        seen.append((data, headers))
        if data == b"boom":
            raise RuntimeError("a bug in the handler")
        reply_soon(rt.nc, reply, b"ok:" + data)

    await rt.add_lean_endpoint("lean", SUBJECT, handle)
    await rt.nc.flush()
    try:
        yield rt, seen
    finally:
        if not rt.stopping:
            rt.stop()
            await rt.shutdown()


async def test_a_raising_handler_is_answered_with_a_micro_error(served, nc) -> None:
    _, seen = served
    failed = await nc.request(SUBJECT, b"boom", timeout=5)
    assert failed.data == b""
    assert failed.headers["Nats-Service-Error-Code"] == "500"
    assert (await nc.request(SUBJECT, b"next", timeout=5)).data == b"ok:next"
    traced = await nc.request(SUBJECT, b"t", timeout=5, headers={"traceparent": "00-a-b-01"})
    assert traced.data == b"ok:t" and seen[-1] == (b"t", {"traceparent": "00-a-b-01"})


async def test_the_drain_at_shutdown_stops_the_endpoint(served, nc) -> None:
    rt, seen = served
    assert (await nc.request(SUBJECT, b"1", timeout=5)).data == b"ok:1"
    rt.stop()
    await rt.shutdown()
    with pytest.raises(NoRespondersError):
        await nc.request(SUBJECT, b"2", timeout=2)
    assert [data for data, _ in seen] == [b"1"]
