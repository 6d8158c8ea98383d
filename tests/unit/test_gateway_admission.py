"""Admission control: per-client bound (429 + Retry-After) and a deadline on each request's
progress (504 before the answer starts; a cut stream after)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from services.gateway.admission import AdmissionControl
from services.gateway.problems import ResponseCut

release = asyncio.Event()


async def slow_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers 200 once `release` is set (or at once for /fast)."""
    if scope["path"] != "/fast":
        await release.wait()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def client(app, token: str | None = None, address: str = "10.0.0.1") -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app, client=(address, 1234))
    return httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers)


async def test_a_client_past_its_bound_gets_429_others_do_not() -> None:
    release.clear()
    app = AdmissionControl(
        slow_app, max_in_flight_per_client=2, request_timeout_ms=10_000, long_poll_timeout_ms=1
    )
    async with client(app) as a, client(app, address="10.0.0.2") as b, client(app, "t") as c:
        held = [asyncio.create_task(a.get("/slow")) for _ in range(2)]
        await asyncio.sleep(0.05)
        refused = await a.get("/slow")
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["code"] == "TOO_MANY_REQUESTS"
        assert (await b.get("/fast")).status_code == 200  # another address
        assert (await c.get("/fast")).status_code == 200  # a token is its own client
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        assert (await a.get("/fast")).status_code == 200  # the slots came back
    assert app.in_flight == {} and app.rejected == 1


async def test_a_slow_request_gets_504() -> None:
    release.clear()
    app = AdmissionControl(
        slow_app, max_in_flight_per_client=10, request_timeout_ms=100, long_poll_timeout_ms=1
    )
    async with client(app) as a:
        response = await a.get("/slow")
    assert response.status_code == 504 and response.json()["code"] == "TIMEOUT"
    assert app.timed_out == 1 and app.in_flight == {}


async def test_a_long_poll_has_its_own_deadline() -> None:
    release.clear()
    app = AdmissionControl(
        slow_app, max_in_flight_per_client=10, request_timeout_ms=50, long_poll_timeout_ms=5_000
    )
    async with client(app) as a:
        poll = asyncio.create_task(a.get("/v1/ledgers/1/lac", params={"timeout_ms": 1000}))
        await asyncio.sleep(0.2)  # past request_timeout_ms, within the long-poll deadline
        release.set()
        assert (await poll).status_code == 200


async def test_health_is_never_limited() -> None:
    release.clear()
    app = AdmissionControl(
        slow_app, max_in_flight_per_client=1, request_timeout_ms=100, long_poll_timeout_ms=1
    )
    async with client(app) as a:
        busy = asyncio.create_task(a.get("/slow"))  # takes the client's one slot
        health = asyncio.create_task(a.get("/healthz"))
        await asyncio.sleep(0.3)  # past the deadline: /slow times out, /healthz waits on
        assert (await busy).status_code == 504
        release.set()
        assert (await health).status_code == 200


PARTS = 60
PART_GAP_S = 0.01  # the app's work between parts: 0.6 s in all


async def streaming_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Writes PARTS parts, PART_GAP_S apart; /stall stops after the first part."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for index in range(PARTS):
        if scope["path"] == "/stall" and index == 1:
            await asyncio.Event().wait()
        await asyncio.sleep(PART_GAP_S)
        await send({"type": "http.response.body", "body": b"%d," % index, "more_body": True})
    await send({"type": "http.response.body", "body": b"end"})


async def test_the_deadline_is_on_progress_so_a_long_stream_goes_on() -> None:
    """The whole stream takes twice the deadline; no part takes long. (The gaps are far
    below the deadline, so a busy machine does not turn this into a timeout.)"""
    app = AdmissionControl(
        streaming_app, max_in_flight_per_client=10, request_timeout_ms=300, long_poll_timeout_ms=1
    )
    async with client(app) as a:
        response = await a.get("/stream")
    assert response.status_code == 200
    assert response.content == b"".join(b"%d," % i for i in range(PARTS)) + b"end"
    assert app.timed_out == 0


async def test_a_stream_that_stalls_is_cut() -> None:
    app = AdmissionControl(
        streaming_app, max_in_flight_per_client=10, request_timeout_ms=100, long_poll_timeout_ms=1
    )
    async with client(app) as a:
        with pytest.raises(ResponseCut) as caught:
            await a.get("/stall")
    assert caught.value.error.api.code == "TIMEOUT"
    assert app.timed_out == 1 and app.in_flight == {}
