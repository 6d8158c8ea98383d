"""End to end: the traces of a real `quire up` (every service its own process), as a user
finds them: the `traceresponse` of a call names its trace, and `quire trace show` (the
local span store under the data dir) gives every span of it, across processes, with the
group commits linked to it.

One cluster for the module, three bookies (E3/Qw3/Qa2 writes to each of them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from shared.tracestore import load_trace
from tests.support.cluster import QuireUp, quire_executable
from tests.support.wait import until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PASSWORD = "s3cret"
AUTH = {"Quire-Ledger-Password": PASSWORD}
TRACERESPONSE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
TRACE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    # The default sampling: only the calls that come with a sampled traceparent are traced.
    up = QuireUp(cluster_dir("e2e-traces") / "quire-data", bookies=3)
    with up.running():
        yield up


def traceparent() -> tuple[str, str, str]:
    """A sampled `traceparent` of our own: (header, trace id, span id)."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def answered_trace(value: str | None) -> tuple[str, str]:
    """(trace id, span id) of a sampled `traceresponse`."""
    assert value is not None, "no traceresponse"
    match = TRACERESPONSE.match(value)
    assert match and int(match.group(3), 16) & 1, value
    return match.group(1), match.group(2)


def create_ledger(client: httpx.Client) -> dict[str, Any]:
    body = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "password": PASSWORD}
    response = client.post("/v1/ledgers", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def trace_show(data_dir: Path, trace_id: str) -> list[dict[str, Any]]:
    """`quire trace show ID --output json`, as a user runs it."""
    result = subprocess.run(
        [quire_executable(), "trace", "show", trace_id, "--data-dir", str(data_dir), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["trace_id"] == trace_id
    return shown["spans"]


class Trace:
    """The spans `load_trace` (what `quire trace show` prints) gives for one trace."""

    def __init__(self, trace_id: str, spans: list[dict[str, Any]]) -> None:
        self.trace_id = trace_id
        self.spans = spans
        self.by_id = {span["span_id"]: span for span in spans}

    def children(self, parent: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
        return [
            s
            for s in self.spans
            if s["parent_span_id"] == parent["span_id"] and name in (None, s["name"])
        ]

    def named(self, pattern: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if re.fullmatch(pattern, s["name"])]

    def commit_of(self, journal_span: dict[str, Any]) -> list[dict[str, Any]]:
        """The group commits linked (both ways) with a journal's add span."""
        return [
            s
            for s in self.spans
            if s["name"] == "journal.commit"
            and journal_span["span_id"] in s["links"]
            and s["span_id"] in journal_span["links"]
        ]


def append_trace(data_dir: Path, trace_id: str, server_span_id: str) -> Trace | None:
    """The append's trace once every replica's part of it is stored, else None."""
    found = Trace(trace_id, load_trace(data_dir / "traces", trace_id))
    server = found.by_id.get(server_span_id)
    if server is None:
        return None
    adds = found.children(server, "ledger.add")
    if len(adds) != 1 or not adds[0]["end_ns"]:
        return None
    clients = found.children(adds[0])
    if len(clients) != 3:
        return None
    for client in clients:
        journals = found.children(client)
        if len(journals) != 1:
            return None
        commits = found.commit_of(journals[0])
        if len(commits) != 1 or not found.children(commits[0], "journal.fdatasync"):
            return None
    return found


def check_append_trace(
    found: Trace, server_span_id: str, ledger: dict[str, Any], first: int, last: int
) -> None:
    server = found.by_id[server_span_id]
    assert server["service"] == "quire-gateway" and server["kind"] == "SERVER"
    [add] = found.children(server, "ledger.add")
    assert add["service"] == "quire-gateway" and add["kind"] == "INTERNAL"
    attributes = add["attributes"]
    assert attributes["quire.ledger_id"] == ledger["ledger_id"]
    assert (attributes["quire.entry_id"], attributes["quire.last_entry_id"]) == (first, last)
    assert (attributes["quire.write_quorum"], attributes["quire.ack_quorum"]) == (3, 2)
    [acked] = [e for e in add["events"] if e["name"] == "ack quorum reached"]
    assert acked["attributes"]["quire.lac"] == last
    bookies = set(ledger["segments"][0]["bookies"])
    clients = found.children(add)
    assert {c["attributes"]["quire.bookie_id"] for c in clients} == bookies
    for client in clients:
        bookie = client["attributes"]["quire.bookie_id"]
        assert client["kind"] == "CLIENT" and client["service"] == "quire-gateway"
        assert client["name"].endswith(f".bookie.{bookie}.add")
        assert client["attributes"]["messaging.system"] == "nats"
        [journal] = found.children(client)
        assert journal["kind"] == "SERVER" and journal["service"] == "quire-journal"
        assert journal["bookie_id"] == bookie
        assert journal["name"] == client["name"].replace("send ", "process ", 1)
        # The replica's group commit: its own trace, linked both ways, with its fdatasync.
        [commit] = found.commit_of(journal)
        assert commit["trace_id"] != found.trace_id and commit["parent_span_id"] is None
        assert commit["bookie_id"] == bookie == commit["attributes"]["quire.bookie_id"]
        assert commit["attributes"]["quire.records"] >= 1
        [sync] = found.children(commit, "journal.fdatasync")
        assert commit["start_ns"] <= sync["start_ns"] <= sync["end_ns"] <= commit["end_ns"]
        assert journal["start_ns"] <= commit["start_ns"] <= commit["end_ns"] <= journal["end_ns"]
    # One trace id for the append path, from the call to every replica's journal.
    path = [server, add, *clients, *(found.children(c)[0] for c in clients)]
    assert {s["trace_id"] for s in path} == {found.trace_id}


def test_an_http_append_is_one_trace_to_every_replicas_fdatasync(cluster: QuireUp) -> None:
    with cluster.client() as client:
        ledger = create_ledger(client)
        header, trace_id, parent_id = traceparent()
        response = client.post(
            f"/v1/ledgers/{ledger['ledger_id']}/entries",
            content=b"traced",
            headers={**AUTH, "Content-Type": "application/octet-stream", "traceparent": header},
        )
    assert response.status_code == 200, response.text
    answered, server_span_id = answered_trace(response.headers.get("traceresponse"))
    assert answered == trace_id
    found = _wait(lambda: append_trace(cluster.data_dir, trace_id, server_span_id))
    assert found.by_id[server_span_id]["parent_span_id"] == parent_id
    check_append_trace(found, server_span_id, ledger, 0, 0)
    # `quire trace show` gives the user the same spans.
    shown = {s["span_id"] for s in trace_show(cluster.data_dir, trace_id)}
    assert {s["span_id"] for s in found.spans} <= shown


async def test_a_grpc_append_answers_its_trace_in_the_trailing_metadata(
    cluster: QuireUp,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cluster.grpc_port}") as channel:
        stub = pb_grpc.LedgersStub(channel)
        created = await stub.Create(
            pb.CreateRequest(ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
        )
        header, trace_id, _ = traceparent()
        call = stub.Append(
            pb.AppendRequest(ledger_id=created.ledger_id, entries=[b"a", b"b", b"c"]),
            metadata=(("quire-ledger-password", PASSWORD), ("traceparent", header)),
        )
        reply = await call
        trailers = dict(await call.trailing_metadata())
    assert (reply.first_entry_id, reply.last_entry_id) == (0, 2)
    answered, server_span_id = answered_trace(trailers.get("traceresponse"))
    assert answered == trace_id
    found = await until(
        lambda: append_trace(cluster.data_dir, trace_id, server_span_id),
        "the gRPC append's spans",
        TRACE_TIMEOUT_S,
    )
    assert found.by_id[server_span_id]["name"] == "/quire.v1.Ledgers/Append"
    with cluster.client() as client:
        ledger = client.get(f"/v1/ledgers/{created.ledger_id}").json()
    check_append_trace(found, server_span_id, ledger, 0, 2)


def test_a_recovery_shows_its_fences_and_its_metadata_cas(cluster: QuireUp) -> None:
    with cluster.client() as client:
        ledger = create_ledger(client)
        lid = ledger["ledger_id"]
        appended = client.post(
            f"/v1/ledgers/{lid}/entries",
            content=b"x",
            headers={**AUTH, "Content-Type": "application/octet-stream"},
        )
        assert appended.status_code == 200, appended.text
        header, trace_id, _ = traceparent()
        response = client.post(
            f"/v1/ledgers/{lid}/recover", headers={**AUTH, "traceparent": header}
        )
    assert response.status_code == 200, response.text
    assert response.json()["last_entry_id"] == 0
    _, server_span_id = answered_trace(response.headers.get("traceresponse"))
    bookies = ledger["segments"][0]["bookies"]

    def recovered() -> tuple[Trace, dict[str, Any]] | None:
        found = Trace(trace_id, load_trace(cluster.data_dir / "traces", trace_id))
        server = found.by_id.get(server_span_id)
        recover = found.children(server, "ledger.recover") if server else []
        if len(recover) != 1:
            return None
        fences = [s for s in found.children(recover[0]) if s["name"].endswith(".fence")]
        cases = [s for s in found.children(recover[0]) if s["name"].endswith(".ledger.update")]
        if len(fences) < len(bookies) or len(cases) < 2:  # IN_RECOVERY, then CLOSED
            return None
        if not all(found.children(s) for s in fences + cases):
            return None
        for cas in cases:
            if not any(found.children(s) for s in found.children(cas)):  # the statements
                return None
        return found, recover[0]

    found, recover = _wait(recovered)
    assert recover["attributes"]["quire.ledger_id"] == lid
    fences = [s for s in found.children(recover) if s["name"].endswith(".fence")]
    # `send <prefix>.bookie.<id>.fence`: one to each bookie of the ensemble.
    assert {s["name"].rsplit(".", 2)[-2] for s in fences} == set(bookies)
    for fence in fences:
        [journal] = found.children(fence)
        assert journal["service"] == "quire-journal" and journal["kind"] == "SERVER"
    for cas in [s for s in found.children(recover) if s["name"].endswith(".ledger.update")]:
        assert cas["kind"] == "CLIENT" and cas["service"] == "quire-gateway"
        [served] = found.children(cas)
        assert served["service"] == "quire-metadata" and served["kind"] == "SERVER"
        # The compare-and-set's SQL, by psycopg's instrumentation, under the request.
        statements = found.children(served)
        assert statements and all(s["kind"] == "CLIENT" for s in statements)
    # Beside the group commits (and their fdatasyncs) linked to it, all of it is one trace.
    ours = [s for s in found.spans if s["name"] not in ("journal.commit", "journal.fdatasync")]
    assert {s["trace_id"] for s in ours} == {trace_id}


def _wait(condition):
    """Poll `condition` (sync) until it gives something, for a synchronous test."""
    deadline = time.monotonic() + TRACE_TIMEOUT_S
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting for the trace's spans"
        time.sleep(0.1)
