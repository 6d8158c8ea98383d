"""Range reads stream on every surface (HTTP JSON and NDJSON, gRPC `Read`, both clients):
a range of 100,000 entries, far longer than any batch, comes whole in one request, the
gateway holding a bounded part of it at a time; a failure after the first entries reaches
the client as a failure; the request deadline is on progress, so a long read that keeps
going is not cut; a client that goes away stops the read. Memory is counted in entries a
batch (the gateway's quire_gateway_read_stream_batch_entries histogram), never timed."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from click.testing import Result
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from quire.cli import app as cli_app
from quire.client import Entry, GrpcClient, HttpClient, QuireClient, QuireClientError
from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from tests.support.stack import (
    Stack,
    gateway_settings,
    running_stack,
    scratch_database,
    stack_settings,
)

pytestmark = pytest.mark.slow

PASSWORD = "pw"
PW = {"Quire-Ledger-Password": PASSWORD}
ENTRIES = 100_000
# The most entries a streamed range may hold at once, far below the range: the reader asks
# nothing more than read_ahead_max_entries past the next entry not yet taken, so no batch
# handed out is larger (set to this in the stack's settings).
BATCH_ENTRIES_MAX = 1_000
BATCH_METRIC = "quire_gateway_read_stream_batch_entries"
READS_ANSWERED = (  # the labels of the HTTP range reads answered 200
    ("method", "GET"),
    ("route", "/v1/ledgers/{ledger_id}/entries"),
    ("status", "200"),
)


def payload(entry_id: int) -> bytes:
    return b"entry-%d" % entry_id


EXPECTED = [Entry(i, payload(i)) for i in range(ENTRIES)]


@pytest.fixture(scope="module")
async def stack(nats_url: str, database_url: str, tmp_path_factory) -> AsyncIterator[Stack]:
    settings = stack_settings(nats_url, tmp_path_factory.mktemp("read-stream-stack"))
    settings.gateway.read_ahead_max_entries = BATCH_ENTRIES_MAX
    with scratch_database(database_url) as db:
        async with running_stack(settings, db) as s:
            yield s


def grpc_client(stack: Stack) -> GrpcClient:
    return GrpcClient(f"127.0.0.1:{stack.settings.gateway.grpc_port}")


@pytest.fixture(scope="module")
async def long_ledger(stack: Stack) -> int:
    """A closed ledger of ENTRIES small entries (AppendStream keeps their order)."""
    async with grpc_client(stack) as client:
        ledger = await client.create_ledger(password=PASSWORD)
        assert await ledger.append_many([payload(i) for i in range(ENTRIES)]) == (0, ENTRIES - 1)
        assert await ledger.close() == ENTRIES - 1
        return ledger.ledger_id


async def metric_samples(http: httpx.AsyncClient) -> dict[tuple[str, tuple], float]:
    text = (await http.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class BatchCount:
    """The streamed batches counted between `start` and `check` (the histogram's deltas)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.before: dict[tuple[str, tuple], float] = {}

    async def start(self) -> None:
        self.before = await metric_samples(self.http)

    async def delta(self, name: str, labels: tuple = ()) -> float:
        key = (name, labels)
        return (await metric_samples(self.http)).get(key, 0) - self.before.get(key, 0)

    async def check(self, entries: int) -> None:
        """Every batch since `start` held at most BATCH_ENTRIES_MAX entries, and together
        they held `entries`."""
        count = await self.delta(f"{BATCH_METRIC}_count")
        bounded = await self.delta(f"{BATCH_METRIC}_bucket", (("le", f"{BATCH_ENTRIES_MAX}.0"),))
        assert await self.delta(f"{BATCH_METRIC}_sum") == entries
        assert count >= entries / BATCH_ENTRIES_MAX
        assert bounded == count, f"{count - bounded} batches held over {BATCH_ENTRIES_MAX}"


async def test_http_json_streams_a_long_range_whole(stack: Stack, long_ledger: int) -> None:
    batches = BatchCount(stack.http)
    await batches.start()
    params = {"from": 0, "to": ENTRIES + 100}  # capped at the last entry
    response = await stack.http.get(f"/v1/ledgers/{long_ledger}/entries", params=params, headers=PW)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["lac"] == ENTRIES - 1
    got = [Entry(e["entry_id"], base64.b64decode(e["data"])) for e in body["entries"]]
    assert got == EXPECTED
    await batches.check(ENTRIES)


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_a_client_streams_a_long_range_to_the_lac(
    stack: Stack, long_ledger: int, transport: str
) -> None:
    """`to` omitted: up to the LAC, in one request (NDJSON over HTTP, gRPC `Read`)."""
    batches = BatchCount(stack.http)
    await batches.start()
    client: QuireClient = HttpClient(stack.url) if transport == "http" else grpc_client(stack)
    async with client:
        got = [e async for e in client.read_stream(long_ledger, PASSWORD, 0, None)]
        assert got == EXPECTED
        await batches.check(ENTRIES)
        if transport == "http":
            assert await batches.delta("quire_gateway_http_requests_total", READS_ANSWERED) == 1
        # A range that starts past the LAC is empty, not an error.
        assert await client.read(long_ledger, PASSWORD, ENTRIES + 5, None) == []


async def test_grpc_read_streams_a_long_range_an_entry_a_message(
    stack: Stack, long_ledger: int
) -> None:
    """`Read` (what API.md names; the client uses `ReadBatches`), to the LAC."""
    batches = BatchCount(stack.http)
    await batches.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.settings.gateway.grpc_port}") as ch:
        request = pb.ReadRequest(ledger_id=long_ledger, from_entry_id=0)
        metadata = (("quire-ledger-password", PASSWORD),)
        call = pb_grpc.LedgersStub(ch).Read(request, metadata=metadata)
        got = [Entry(m.entry_id, m.data) async for m in call]
    assert got == EXPECTED
    await batches.check(ENTRIES)


async def test_the_request_deadline_is_on_progress_not_on_the_whole_read(
    stack: Stack, long_ledger: int
) -> None:
    """A gateway whose request_timeout_ms is a fraction of what the whole range takes to
    stream (100,000 entries in many batches, each a round trip to the bookies; seconds on
    this machine) streams it to the end, in both formats. (Not much less than a second: on
    a busy machine one batch can take a few hundred ms.)"""
    hurried = gateway_settings(stack.settings, request_timeout_ms=1_000)
    await stack.start("gateway-hurried", "gateway", hurried)
    try:
        url = f"http://127.0.0.1:{hurried.gateway.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            response = await http.get(f"/v1/ledgers/{long_ledger}/entries", headers=PW)
            assert response.status_code == 200
            assert len(response.json()["entries"]) == ENTRIES
        async with HttpClient(url) as client:
            assert await client.read(long_ledger, PASSWORD, 0, None) == EXPECTED
    finally:
        await stack.stop("gateway-hurried")


async def test_a_client_that_goes_away_stops_the_read(stack: Stack, long_ledger: int) -> None:
    """Once the client has gone and the gateway has counted the request as done, the read
    asked the bookies for a small part of the range only, and asks nothing more."""
    counts = BatchCount(stack.http)
    await counts.start()
    path = f"/v1/ledgers/{long_ledger}/entries"
    headers = {**PW, "Accept": "application/x-ndjson"}
    async with stack.http.stream("GET", path, headers=headers) as r:
        lines = r.aiter_lines()
        assert json.loads(await anext(lines))["entry_id"] == 0
        await lines.aclose()
    # The response closed unread: the gateway sees the connection go and ends the request,
    # its read closed with it.
    deadline = asyncio.get_running_loop().time() + 30
    while not await counts.delta("quire_gateway_http_requests_total", READS_ANSWERED):
        assert asyncio.get_running_loop().time() < deadline, "the request never ended"
        await asyncio.sleep(0.05)
    read = await counts.delta("quire_gateway_read_entries_total", (("result", "ok"),))
    assert 0 < read < ENTRIES / 3, f"{read} entries read for a client that took one"


# -- a failure after the first entries ------------------------------------------------------


@pytest.fixture(scope="module")
async def broken_stack(nats_url: str, database_url: str, tmp_path_factory) -> AsyncIterator:
    """A stack of its own, since the test stops bookies."""
    settings = stack_settings(nats_url, tmp_path_factory.mktemp("read-broken-stack"))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db) as s:
            yield s


@pytest.fixture(scope="module")
async def half_lost_ledger(broken_stack: Stack) -> tuple[int, int]:
    """An E1/Qw1 ledger whose first segment (entries 0..99) is readable and whose second
    (from 100) lives on one bookie, stopped: a range read fails at entry 100. The ledger and
    the entries readable."""
    stack = broken_stack
    async with HttpClient(stack.url) as client:
        ledger = await client.create_ledger(
            password=PASSWORD, ensemble_size=1, write_quorum=1, ack_quorum=1
        )
        lid = ledger.ledger_id
        await ledger.append_many([payload(i) for i in range(100)], batch=50)
        # Read back from its one replica (the ledgerstore has them) before the journal goes.
        assert await ledger.read(0, 99) == EXPECTED[:100]
        first = (await client.get(lid)).segments[0]["bookies"][0]
        await stack.stop(f"{first}.journal")  # the next append moves to another bookie
        await ledger.append_many([payload(i) for i in range(100, 200)], batch=50)
        segments = (await client.get(lid)).segments
        assert [s["first_entry_id"] for s in segments] == [0, 100]
        second = segments[1]["bookies"][0]
        await stack.stop(f"{second}.ledgerstore")
        return lid, 100


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_a_failure_after_the_first_entries_fails_the_client(
    broken_stack: Stack, half_lost_ledger: tuple[int, int], transport: str
) -> None:
    lid, readable = half_lost_ledger
    stack = broken_stack
    client: QuireClient = HttpClient(stack.url) if transport == "http" else grpc_client(stack)
    got: list[Entry] = []
    async with client:
        with pytest.raises(QuireClientError) as caught:
            async for entry in client.read_stream(lid, PASSWORD, 0, 199):
                got.append(entry)
    assert got == EXPECTED[:readable]
    assert caught.value.code not in ("RESPONSE_CUT", "INTERNAL"), caught.value


async def test_a_late_failure_leaves_the_json_document_incomplete(
    broken_stack: Stack, half_lost_ledger: tuple[int, int]
) -> None:
    lid, _ = half_lost_ledger
    received = b""
    path = f"/v1/ledgers/{lid}/entries"
    async with broken_stack.http.stream("GET", path, params={"to": 199}, headers=PW) as response:
        assert response.status_code == 200  # the first entries were read before answering
        with pytest.raises(httpx.RemoteProtocolError):
            async for chunk in response.aiter_raw():
                received += chunk
    assert received.startswith(b'{"entries": [{"entry_id": 0,')
    with pytest.raises(json.JSONDecodeError):
        json.loads(received)


# -- the command line -----------------------------------------------------------------------


def quire_cli(*args: str) -> Result:
    """`quire ARGS` in a thread of its own (it runs its own event loop, while the stack's
    runs on in the test's)."""
    return CliRunner().invoke(cli_app, list(args))


async def test_the_cli_reads_a_long_range_in_one_request(stack: Stack, long_ledger: int) -> None:
    counts = BatchCount(stack.http)
    await counts.start()
    lid = str(long_ledger)
    done = await asyncio.to_thread(
        quire_cli, "ledger", "read", lid, "-p", PASSWORD, "--gateway", stack.url, "-o", "json"
    )
    assert done.exit_code == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [Entry(r["entry_id"], base64.b64decode(r["data"])) for r in rows] == EXPECTED
    assert await counts.delta("quire_gateway_http_requests_total", READS_ANSWERED) == 1
    table = await asyncio.to_thread(
        quire_cli, "ledger", "read", lid, "-p", PASSWORD, "--gateway", stack.url, "--to", "1"
    )
    assert table.stdout.splitlines() == ["entry_id\tsize\tdata", "0\t7\tentry-0", "1\t7\tentry-1"]


async def test_the_cli_fails_a_read_that_breaks_off(
    broken_stack: Stack, half_lost_ledger: tuple[int, int]
) -> None:
    lid, readable = half_lost_ledger
    args = ["ledger", "read", str(lid), "-p", PASSWORD, "--gateway", broken_stack.url]
    done = await asyncio.to_thread(quire_cli, *args, "-o", "json")
    assert done.exit_code == 1 and "error:" in done.stderr
    assert done.stdout.count('"entry_id"') == readable  # printed as they came
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.stdout)
