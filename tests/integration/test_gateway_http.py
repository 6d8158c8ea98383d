"""The gateway's HTTP API (API.md section 2) over a real stack in this process: the metadata
service on PostgreSQL, three bookies (journal + ledgerstore each) and the gateway, all on
real NATS, driven with httpx over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from shared.digest import mac_key, master_key
from shared.latency import from_event, latency_bucket, percentile
from shared.metaclient import MetadataClient
from shared.models import PRIVATE_LEDGER_FIELDS
from shared.subjects import Subjects
from tests.support.stack import (
    MAX_BATCH,
    MAX_ENTRY,
    Stack,
    gateway_settings,
    running_stack,
    scratch_database,
    stack_settings,
)

PW = {"Quire-Ledger-Password": "s3cret"}
WRONG_PW = {"Quire-Ledger-Password": "nope"}
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
async def stack(nats_url: str, database_url: str, tmp_path_factory) -> AsyncIterator[Stack]:
    """One stack for the module's tests (each works on ledgers of its own)."""
    settings = stack_settings(nats_url, tmp_path_factory.mktemp("gateway-stack"))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db) as s:
            yield s


async def create(http: httpx.AsyncClient, **body) -> dict:
    request = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "password": "s3cret", **body}
    response = await http.post("/v1/ledgers", json=request)
    assert response.status_code == 201, response.text
    return response.json()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def append_raw(http, ledger_id: int, data: bytes, headers=PW) -> httpx.Response:
    return await http.post(
        f"/v1/ledgers/{ledger_id}/entries",
        content=data,
        headers={**headers, "Content-Type": "application/octet-stream"},
    )


async def append_batch(http, ledger_id: int, entries: list[bytes], headers=PW) -> httpx.Response:
    return await http.post(
        f"/v1/ledgers/{ledger_id}/entries",
        json={"entries": [b64(e) for e in entries]},
        headers=headers,
    )


async def read_all(http, ledger_id: int, **params) -> dict:
    response = await http.get(f"/v1/ledgers/{ledger_id}/entries", params=params, headers=PW)
    assert response.status_code == 200, response.text
    return response.json()


def payloads_of(body: dict) -> list[bytes]:
    return [base64.b64decode(e["data"]) for e in body["entries"]]


# -- the happy path ---------------------------------------------------------------------------


async def test_create_append_read_close(stack: Stack) -> None:
    http = stack.http
    ledger = await create(http, digest="crc32c", metadata={"app": "test"})
    assert (ledger["ensemble_size"], ledger["write_quorum"], ledger["ack_quorum"]) == (3, 3, 2)
    assert ledger["state"] == "OPEN" and ledger["last_entry_id"] is None
    assert len(ledger["segments"]) == 1 and len(set(ledger["segments"][0]["bookies"])) == 3
    assert not {"password", *PRIVATE_LEDGER_FIELDS} & set(ledger)
    assert "s3cret" not in json.dumps(ledger)
    lid = ledger["ledger_id"]
    # The ledger's keys are stored (for the replicator), never shown.
    rt = stack.runtimes["gateway"]
    stored = await MetadataClient(rt.nc, rt.subjects).get_ledger(lid)
    assert stored.master_key == master_key(b"s3cret").hex()
    assert stored.mac_key == mac_key(b"s3cret").hex()
    assert stored.master_key not in json.dumps(ledger)

    first = bytes(range(256)) * 3
    response = await append_raw(http, lid, first)
    assert response.status_code == 200, response.text
    assert response.json() == {"entry_id": 0, "lac": 0}
    batch = [b"", b"\x00\xff" * 100, os.urandom(MAX_ENTRY)]
    response = await append_batch(http, lid, batch)
    assert response.status_code == 200, response.text
    assert response.json() == {"first_entry_id": 1, "last_entry_id": 3, "lac": 3}

    body = await read_all(http, lid, **{"from": 0, "to": 3})
    assert [e["entry_id"] for e in body["entries"]] == [0, 1, 2, 3]
    assert payloads_of(body) == [first, *batch] and body["lac"] == 3
    one = await http.get(f"/v1/ledgers/{lid}/entries/2", headers=PW)
    assert one.status_code == 200 and one.content == batch[1]
    assert one.headers["content-type"] == "application/octet-stream"
    assert one.headers["Quire-LAC"] == "3"
    # A range past the LAC is capped at it.
    assert len((await read_all(http, lid, **{"from": 2, "to": 40}))["entries"]) == 2

    closed = await http.post(f"/v1/ledgers/{lid}/close", headers=PW)
    assert closed.status_code == 200, closed.text
    assert closed.json()["state"] == "CLOSED" and closed.json()["last_entry_id"] == 3
    meta = (await http.get(f"/v1/ledgers/{lid}")).json()
    assert meta["state"] == "CLOSED" and meta["last_entry_id"] == 3
    assert meta["length"] == sum(map(len, [first, *batch]))
    again = await append_raw(http, lid, b"late")
    assert again.status_code == 409 and again.json()["code"] == "LEDGER_CLOSED"
    # Close is idempotent; reads and the LAC still work after it.
    assert (await http.post(f"/v1/ledgers/{lid}/close", headers=PW)).json()["last_entry_id"] == 3
    assert payloads_of(await read_all(http, lid, **{"from": 0, "to": 3})) == [first, *batch]
    lac = await http.get(f"/v1/ledgers/{lid}/lac", headers=PW)
    assert lac.json() == {"lac": 3}

    listed = (await http.get("/v1/ledgers", params={"after": lid - 1, "limit": 1})).json()
    assert [m["ledger_id"] for m in listed["ledgers"]] == [lid]
    assert not PRIVATE_LEDGER_FIELDS & set(listed["ledgers"][0])
    assert stored.master_key not in json.dumps(listed)
    assert (await http.delete(f"/v1/ledgers/{lid}", headers=PW)).status_code == 204
    gone = await http.get(f"/v1/ledgers/{lid}")
    assert gone.status_code == 404 and gone.json()["code"] == "NO_SUCH_LEDGER"


async def test_every_digest_type_round_trips(stack: Stack) -> None:
    for digest in ("crc32", "crc32c", "hmac", "dummy"):
        lid = (
            await create(stack.http, digest=digest, ensemble_size=2, write_quorum=2, ack_quorum=1)
        )["ledger_id"]
        assert (await append_batch(stack.http, lid, [digest.encode()] * 3)).status_code == 200
        assert payloads_of(await read_all(stack.http, lid)) == [digest.encode()] * 3


async def test_empty_ledger_closes_at_minus_one(stack: Stack) -> None:
    lid = (await create(stack.http))["ledger_id"]
    assert (await stack.http.get(f"/v1/ledgers/{lid}/lac", headers=PW)).json() == {"lac": -1}
    closed = (await stack.http.post(f"/v1/ledgers/{lid}/close", headers=PW)).json()
    assert closed["last_entry_id"] == -1
    assert (await read_all(stack.http, lid))["entries"] == []


async def test_lac_long_poll(stack: Stack) -> None:
    http = stack.http
    lid = (await create(http))["ledger_id"]
    await append_raw(http, lid, b"e0")

    started = time.monotonic()
    poll = asyncio.create_task(
        http.get(f"/v1/ledgers/{lid}/lac", headers=PW, params={"after": 0, "timeout_ms": 10_000})
    )
    await asyncio.sleep(0.3)
    assert not poll.done()
    await append_raw(http, lid, b"e1")
    response = await poll
    assert response.json() == {"lac": 1}
    assert time.monotonic() - started < 5  # answered at the append, not at the timeout

    started = time.monotonic()
    response = await http.get(
        f"/v1/ledgers/{lid}/lac", headers=PW, params={"after": 1, "timeout_ms": 400}
    )
    elapsed = time.monotonic() - started
    assert response.json() == {"lac": 1} and 0.35 <= elapsed < 3
    # Already past `after`: at once.
    response = await http.get(
        f"/v1/ledgers/{lid}/lac", headers=PW, params={"after": -1, "timeout_ms": 10_000}
    )
    assert response.json() == {"lac": 1}


async def test_entries_acknowledged_events(stack: Stack, nc) -> None:
    ledger = await create(stack.http)
    lid = ledger["ledger_id"]
    subject = Subjects(stack.settings.subject_prefix).event("entries.acknowledged")
    subscription = await nc.subscribe(subject)
    await append_batch(stack.http, lid, [b"x"] * 5)
    await append_raw(stack.http, lid, b"yyy")
    # The summary goes out about once a second: the six entries may span two of them.
    deadline = time.monotonic() + 10
    summaries = []
    while sum(e["data"]["count"] for e in summaries) < 6:
        msg = await subscription.next_msg(timeout=max(0.1, deadline - time.monotonic()))
        event = json.loads(msg.data)
        if event["ledger_id"] == lid:
            summaries.append(event)
    await subscription.unsubscribe()
    assert sum(e["data"]["count"] for e in summaries) == 6
    assert summaries[0]["data"]["first_entry_id"] == 0
    assert summaries[-1]["data"]["last_entry_id"] == 5
    assert sum(e["data"]["bytes"] for e in summaries) == 5 + 3
    for event in summaries:
        data = event["data"]
        assert data["last_entry_id"] - data["first_entry_id"] + 1 == data["count"]
        assert data["ensemble"] == ledger["segments"][0]["bookies"]
        assert (data["ensemble_size"], data["write_quorum"], data["ack_quorum"]) == (3, 3, 2)
        # Every entry in the histogram, in shared.latency's buckets (microseconds).
        histogram = from_event(data["latency_us"])
        assert sum(histogram.values()) == data["count"]
        assert all(latency_bucket(bucket) == bucket for bucket in histogram)
        assert data["latency_ms_p50"] == percentile(histogram, 0.5) / 1000
        assert 0 <= data["latency_ms_p50"] <= data["latency_ms_p99"] <= data["latency_ms_max"]


# -- errors -------------------------------------------------------------------------------------


def error_cases(lid: int) -> list[tuple[str, str, dict, int, str]]:
    entries = f"/v1/ledgers/{lid}/entries"
    raw = {"Content-Type": "application/octet-stream"}
    good = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "password": "p"}
    return [
        (
            "POST",
            "/v1/ledgers",
            {"json": {**good, "ensemble_size": 4, "write_quorum": 3}},
            503,
            "NOT_ENOUGH_BOOKIES",
        ),
        (
            "POST",
            "/v1/ledgers",
            {"json": {**good, "ack_quorum": 3, "write_quorum": 2}},
            400,
            "INVALID_ARGUMENT",
        ),
        ("POST", "/v1/ledgers", {"json": {**good, "digest": "md5"}}, 422, "INVALID_ARGUMENT"),
        ("POST", "/v1/ledgers", {"json": {**good, "password": None}}, 422, "INVALID_ARGUMENT"),
        ("POST", "/v1/ledgers", {"json": {**good, "colour": "red"}}, 422, "INVALID_ARGUMENT"),
        ("POST", "/v1/ledgers", {"json": {**good, "ensemble_size": 0}}, 422, "INVALID_ARGUMENT"),
        (
            "POST",
            "/v1/ledgers",
            {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
            422,
            "INVALID_ARGUMENT",
        ),
        ("GET", "/v1/ledgers/abc", {}, 422, "INVALID_ARGUMENT"),
        ("GET", "/v1/ledgers/-1", {}, 422, "INVALID_ARGUMENT"),
        ("GET", "/v1/ledgers/987654321", {}, 404, "NO_SUCH_LEDGER"),
        ("GET", "/v1/ledgers", {"params": {"limit": 0}}, 422, "INVALID_ARGUMENT"),
        ("GET", "/v1/nothing-here", {}, 404, "NOT_FOUND"),
        # append
        ("POST", entries, {"content": b"x", "headers": raw}, 403, "UNAUTHORIZED"),
        ("POST", entries, {"content": b"x", "headers": {**raw, **WRONG_PW}}, 403, "UNAUTHORIZED"),
        (
            "POST",
            "/v1/ledgers/987654321/entries",
            {"content": b"x", "headers": {**raw, **PW}},
            404,
            "NO_SUCH_LEDGER",
        ),
        (
            "POST",
            entries,
            {"content": b"x" * (MAX_ENTRY + 1), "headers": {**raw, **PW}},
            413,
            "ENTRY_TOO_LARGE",
        ),
        (
            "POST",
            entries,
            {"json": {"entries": [b64(b"ok"), b64(b"x" * (MAX_ENTRY + 1))]}, "headers": PW},
            413,
            "ENTRY_TOO_LARGE",
        ),
        (
            "POST",
            entries,
            {"json": {"entries": [b64(b"ok"), "not base64!"]}, "headers": PW},
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            entries,
            {"json": {"entries": [b64(b"ok"), 7]}, "headers": PW},
            400,
            "INVALID_ARGUMENT",
        ),
        ("POST", entries, {"json": {"entries": []}, "headers": PW}, 400, "INVALID_ARGUMENT"),
        (
            "POST",
            entries,
            {"json": {"entries": [b64(b"a")] * (MAX_BATCH + 1)}, "headers": PW},
            400,
            "INVALID_ARGUMENT",
        ),
        ("POST", entries, {"json": ["x"], "headers": PW}, 400, "INVALID_ARGUMENT"),
        (
            "POST",
            entries,
            {"content": b"{bad", "headers": {"Content-Type": "application/json", **PW}},
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            entries,
            {"content": b"x", "headers": {"Content-Type": "text/plain", **PW}},
            400,
            "INVALID_ARGUMENT",
        ),
        # read
        ("GET", f"{entries}/5", {"headers": PW}, 404, "NO_SUCH_ENTRY"),
        ("GET", f"{entries}/0", {}, 403, "UNAUTHORIZED"),
        ("GET", f"{entries}/0", {"headers": WRONG_PW}, 403, "UNAUTHORIZED"),
        ("GET", entries, {"params": {"from": 3, "to": 1}, "headers": PW}, 400, "INVALID_ARGUMENT"),
        ("GET", entries, {"params": {"from": -1}, "headers": PW}, 422, "INVALID_ARGUMENT"),
        ("GET", entries, {"headers": WRONG_PW}, 403, "UNAUTHORIZED"),
        ("GET", "/v1/ledgers/987654321/entries/0", {"headers": PW}, 404, "NO_SUCH_LEDGER"),
        # LAC, close, delete
        ("GET", f"/v1/ledgers/{lid}/lac", {"headers": WRONG_PW}, 403, "UNAUTHORIZED"),
        (
            "GET",
            f"/v1/ledgers/{lid}/lac",
            {"params": {"timeout_ms": -1}, "headers": PW},
            422,
            "INVALID_ARGUMENT",
        ),
        ("POST", f"/v1/ledgers/{lid}/close", {}, 403, "UNAUTHORIZED"),
        ("POST", f"/v1/ledgers/{lid}/close", {"headers": WRONG_PW}, 403, "UNAUTHORIZED"),
        ("DELETE", f"/v1/ledgers/{lid}", {"headers": WRONG_PW}, 403, "UNAUTHORIZED"),
        ("DELETE", f"/v1/ledgers/{lid}", {}, 403, "UNAUTHORIZED"),
        ("DELETE", "/v1/ledgers/987654321", {"headers": PW}, 404, "NO_SUCH_LEDGER"),
    ]


async def test_every_error_is_a_problem_and_changes_nothing(stack: Stack) -> None:
    http = stack.http
    ledger = await create(http)
    lid = ledger["ledger_id"]
    stored = [b"zero", b"one", b"two"]
    assert (await append_batch(http, lid, stored)).status_code == 200
    before = (await http.get("/v1/ledgers", params={"limit": 1000})).json()["ledgers"]

    failures = []
    for method, path, kwargs, status, code in error_cases(lid):
        response = await http.request(method, path, **kwargs)
        got = (
            response.status_code,
            response.headers.get("content-type"),
            response.json().get("code") if response.content else None,
        )
        if got != (status, PROBLEM, code):
            failures.append((method, path, got, response.text[:200]))
        elif response.status_code < 500 or code == "NOT_ENOUGH_BOOKIES":
            problem = response.json()
            assert {"type", "title", "status", "detail", "code"} <= set(problem)
            assert problem["status"] == status and problem["detail"]
            assert "s3cret" not in response.text
    assert not failures, failures

    # Nothing changed: same ledgers, same versions, same entries, same LAC.
    after = (await http.get("/v1/ledgers", params={"limit": 1000})).json()["ledgers"]
    assert after == before
    body = await read_all(http, lid)
    assert payloads_of(body) == stored and body["lac"] == 2
    # And the ledger still takes appends at the next entry id.
    assert (await append_raw(http, lid, b"three")).json() == {"entry_id": 3, "lac": 3}


async def test_appends_need_the_writer_handle(stack: Stack) -> None:
    """A second gateway does not hold the writer handle: it sends appends and the close to
    the writer's gateway (307, tests/integration/test_gateway_writers.py), but reads with
    the LAC the bookies know."""
    http = stack.http
    lid = (await create(http))["ledger_id"]
    await append_batch(http, lid, [b"a", b"b"])
    await append_raw(http, lid, b"c")
    other = gateway_settings(stack.settings)
    await stack.start("gateway-2", "gateway", other)
    try:
        port = other.gateway.http_port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http2:
            redirected = await append_raw(http2, lid, b"d")
            assert redirected.status_code == 307
            assert redirected.json()["code"] == "WRITER_REDIRECT"
            assert redirected.headers["location"] == f"{stack.url}/v1/ledgers/{lid}/entries"
            # Each entry carried the LAC before it: the bookies know LAC 1 (BookKeeper too).
            lac = (await http2.get(f"/v1/ledgers/{lid}/lac", headers=PW)).json()["lac"]
            assert lac == 1
            assert payloads_of(await read_all(http2, lid)) == [b"a", b"b"]
            unconfirmed = await read_all(http2, lid, **{"from": 0, "to": 5, "unconfirmed": True})
            assert payloads_of(unconfirmed) == [b"a", b"b", b"c"]
            closing = await http2.post(f"/v1/ledgers/{lid}/close", headers=PW)
            assert closing.status_code == 307 and closing.json()["code"] == "WRITER_REDIRECT"
    finally:
        await stack.stop("gateway-2")
    # The writer still writes.
    assert (await append_raw(http, lid, b"d")).json() == {"entry_id": 3, "lac": 3}


async def test_operations_endpoints(stack: Stack) -> None:
    http = stack.http
    assert (await http.get("/healthz")).status_code == 200
    ready = await http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["writable_bookies"] == 3
    bookies = (await http.get("/v1/bookies")).json()["bookies"]
    assert sorted(b["bookie_id"] for b in bookies) == ["bookie-1", "bookie-2", "bookie-3"]
    assert all(b["state"] == "writable" for b in bookies)
    spec = (await http.get("/openapi.json")).json()
    for path in (
        "/v1/ledgers",
        "/v1/ledgers/{ledger_id}",
        "/v1/ledgers/{ledger_id}/entries",
        "/v1/ledgers/{ledger_id}/entries/{entry_id}",
        "/v1/ledgers/{ledger_id}/lac",
        "/v1/ledgers/{ledger_id}/close",
        "/v1/bookies",
        "/healthz",
        "/readyz",
    ):
        assert path in spec["paths"], path
    # The OpenAPI document names none of the private fields (nor does any answer).
    assert not any(name in json.dumps(spec) for name in PRIVATE_LEDGER_FIELDS)
    lid = (await create(http))["ledger_id"]
    await append_raw(http, lid, b"m")
    text = (await http.get("/metrics")).text
    assert "quire_gateway_add_latency_seconds_count" in text
    assert 'quire_gateway_add_entries_total{result="ok"}' in text
    assert (
        'quire_gateway_http_requests_total{method="POST",route="/v1/ledgers/{ledger_id}/'
        'entries",status="200"}'
    ) in text


async def test_readyz_needs_enough_bookies(stack: Stack) -> None:
    strict = gateway_settings(stack.settings, ready_min_writable_bookies=4)
    await stack.start("gateway-strict", "gateway", strict)
    try:
        url = f"http://127.0.0.1:{strict.gateway.http_port}"
        async with httpx.AsyncClient(base_url=url) as http:
            response = await http.get("/readyz")
        assert response.status_code == 503 and response.json()["writable_bookies"] == 3
        assert response.headers["content-type"] == PROBLEM
    finally:
        await stack.stop("gateway-strict")


# -- faults ---------------------------------------------------------------------------------


async def test_reads_fall_back_when_a_ledgerstore_is_stopped(settings, fresh_database_url) -> None:
    async with running_stack(settings, fresh_database_url) as stack:
        http = stack.http
        lid = (await create(http))["ledger_id"]
        stored = [os.urandom(100 + i) for i in range(6)]
        assert (await append_batch(http, lid, stored)).status_code == 200
        await stack.stop("bookie-1.ledgerstore")
        body = await read_all(http, lid, **{"from": 0, "to": 5})
        assert payloads_of(body) == stored
        for entry_id, payload in enumerate(stored):
            one = await http.get(f"/v1/ledgers/{lid}/entries/{entry_id}", headers=PW)
            assert one.status_code == 200 and one.content == payload
        # With Qw > Qa, a stopped journal does not stop appends either.
        await stack.stop("bookie-2.journal")
        response = await append_raw(http, lid, b"after")
        assert response.json() == {"entry_id": 6, "lac": 6}


async def test_a_range_longer_than_a_page_is_streamed_whole(stack: Stack) -> None:
    ledger = await create(stack.http)
    lid = ledger["ledger_id"]
    payloads = [f"p{i}".encode() for i in range(MAX_BATCH * 3 + 5)]
    for start in range(0, len(payloads), MAX_BATCH):
        batch = {"entries": [b64(p) for p in payloads[start : start + MAX_BATCH]]}
        response = await stack.http.post(f"/v1/ledgers/{lid}/entries", json=batch, headers=PW)
        assert response.status_code == 200, response.text
    # Beyond the LAC the range is capped; the body is one JSON document however it came.
    params = {"from": 3, "to": len(payloads) + 20}
    response = await stack.http.get(f"/v1/ledgers/{lid}/entries", params=params, headers=PW)
    assert response.status_code == 200
    body = response.json()
    assert body["lac"] == len(payloads) - 1
    assert [base64.b64decode(e["data"]) for e in body["entries"]] == payloads[3:]
    assert [e["entry_id"] for e in body["entries"]] == list(range(3, len(payloads)))


async def test_a_long_poll_on_another_gateway_sees_the_close_at_once(stack: Stack) -> None:
    """The reader's gateway follows the ledger's metadata (change notifications): the
    writer's close ends the poll with the last entry, with no wait for its timeout."""
    http = stack.http
    lid = (await create(http))["ledger_id"]
    await append_batch(http, lid, [b"a", b"b", b"c"])
    other = gateway_settings(stack.settings, explicit_lac_interval_ms=600_000)
    await stack.start("gateway-3", "gateway", other)
    try:
        port = other.gateway.http_port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http2:
            params = {"after": 2, "timeout_ms": 30_000}
            poll = asyncio.create_task(
                http2.get(f"/v1/ledgers/{lid}/lac", params=params, headers=PW)
            )
            await asyncio.sleep(0.5)  # the poll is under way, following the metadata
            started = time.monotonic()
            await append_raw(http, lid, b"d")
            closed = await http.post(f"/v1/ledgers/{lid}/close", headers=PW)
            assert closed.json()["last_entry_id"] == 3
            response = await asyncio.wait_for(poll, 30)
            assert response.json() == {"lac": 3}
            assert time.monotonic() - started < 10, "the close was not noticed"
    finally:
        await stack.stop("gateway-3")
