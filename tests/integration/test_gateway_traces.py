"""The append path's spans and `traceresponse` over a real in-process stack (metadata on
PostgreSQL, four bookies, the gateway, real NATS), traced into an in-memory exporter: the
sampling ratio is 0, so only a request that arrives with a sampled `traceparent` (or a
background operation) is traced, and an unsampled one must leave no span and carry no
header anywhere."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator

import grpc
import httpx
import nats
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from shared import telemetry
from tests.integration.test_gateway_http import PW, WRONG_PW, append_raw, create
from tests.support.gateway import create_ledgers, in_process_ledgers
from tests.support.stack import Stack, running_stack, scratch_database, stack_settings
from tests.support.wait import until

# W3C Trace Context Level 2: the flags' bit 0 is "sampled" (bit 1, "random", is set by
# the SDK for the trace ids it makes).
TRACERESPONSE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
GRPC_AUTH = (("quire-ledger-password", "s3cret"),)


@pytest.fixture(scope="module")
def spans(nats_server, postgres_server) -> Iterator[InMemorySpanExporter]:
    # NATS and PostgreSQL first: a process that forks with a preexec function (as
    # quire.infra starts them) while an SDK TracerProvider exists runs the provider's
    # at-fork hook in the child, which hung there for good (opentelemetry-sdk 1.45.1).
    exporter = InMemorySpanExporter()
    provider = telemetry.build_provider("test", environ={"OTEL_TRACES_SAMPLER_ARG": "0"})
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install_provider(provider)
    yield exporter
    telemetry.install_provider(None)
    # The stack's metadata service instrumented SQLAlchemy (a process-wide singleton that
    # instruments once, services/metadata/migrate.py) with this provider: undone, so that
    # the modules after this one trace their own migrations.
    instrumentor = SQLAlchemyInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


@pytest.fixture(scope="module")
async def stack(
    spans: InMemorySpanExporter, nats_url: str, database_url: str, tmp_path_factory
) -> AsyncIterator[Stack]:
    settings = stack_settings(nats_url, tmp_path_factory.mktemp("traces-stack"))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db, bookies=4) as s:
            yield s


@pytest.fixture
async def add_headers(stack: Stack) -> AsyncIterator[list[dict[str, str] | None]]:
    """The headers of every add request to any bookie, as a second subscriber sees them."""
    seen: list[dict[str, str] | None] = []
    nc = await nats.connect(stack.settings.nats_url)

    async def note(msg) -> None:
        seen.append(msg.headers)

    await nc.subscribe(f"{stack.settings.subject_prefix}.bookie.*.add", cb=note)
    await nc.flush()
    try:
        yield seen
    finally:
        await nc.close()


def traceparent() -> tuple[str, str, str]:
    """A sampled `traceparent` of our own: (header, trace id, span id)."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def parse_traceresponse(value: str | None) -> tuple[str, str, bool]:
    """(trace id, span id, sampled)"""
    assert value is not None, "no traceresponse"
    match = TRACERESPONSE.match(value)
    assert match, value
    return match.group(1), match.group(2), bool(int(match.group(3), 16) & 1)


def hex_id(value: int, width: int) -> str:
    return f"{value:0{width}x}"


class Spans:
    """The finished spans, by their ids."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.all: tuple[ReadableSpan, ...] = exporter.get_finished_spans()

    def of_trace(self, trace_id: str) -> list[ReadableSpan]:
        return [s for s in self.all if hex_id(s.context.trace_id, 32) == trace_id]

    def by_id(self, span_id: str) -> ReadableSpan | None:
        return next((s for s in self.all if hex_id(s.context.span_id, 16) == span_id), None)

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        return [
            s
            for s in self.all
            if s.parent is not None
            and s.parent.span_id == parent.context.span_id
            and (name is None or s.name == name)
        ]

    def linking(self, span: ReadableSpan, name: str) -> list[ReadableSpan]:
        """The spans called `name` with a link to `span`."""
        return [
            s
            for s in self.all
            if s.name == name and any(link.context == span.context for link in s.links)
        ]


def append_path_complete(
    exporter: InMemorySpanExporter, server_span_id: str, write_quorum: int, prefix: str
) -> Spans | None:
    """The spans once every replica's part of the append has finished: the request's
    server span -> ledger.add -> one CLIENT span per bookie -> its journal SERVER span ->
    the commit linked to it, with its fdatasync. None until then."""
    spans = Spans(exporter)
    server = spans.by_id(server_span_id)
    if server is None:
        return None
    adds = spans.children(server, "ledger.add")
    if len(adds) != 1:
        return None
    clients = [
        s
        for s in spans.children(adds[0])
        if re.fullmatch(rf"send {re.escape(prefix)}\.bookie\.[\w-]+\.add", s.name)
    ]
    if len(clients) != write_quorum:
        return None
    for client in clients:
        journals = spans.children(client)
        if len(journals) != 1 or not spans.linking(journals[0], "journal.commit"):
            return None
        for commit in spans.linking(journals[0], "journal.commit"):
            if not spans.children(commit, "journal.fdatasync"):
                return None
    return spans


def check_append_path(
    spans: Spans, server_span_id: str, trace_id: str, ledger: dict, entry_id: int
) -> None:
    server = spans.by_id(server_span_id)
    assert server is not None and server.kind is SpanKind.SERVER
    [add] = spans.children(server, "ledger.add")
    assert add.attributes is not None
    assert add.attributes["quire.ledger_id"] == ledger["ledger_id"]
    assert add.attributes["quire.entry_id"] == entry_id
    assert add.attributes["quire.last_entry_id"] == entry_id
    assert add.attributes["quire.write_quorum"] == ledger["write_quorum"]
    assert add.attributes["quire.ack_quorum"] == ledger["ack_quorum"]
    [acked] = [e for e in add.events if e.name == "ack quorum reached"]
    assert acked.attributes is not None and acked.attributes["quire.lac"] == entry_id
    clients = spans.children(add)
    assert all(c.kind is SpanKind.CLIENT for c in clients)
    bookies = {c.attributes["quire.bookie_id"] for c in clients if c.attributes}
    assert bookies == set(ledger["segments"][-1]["bookies"])
    for client in clients:
        assert client.attributes is not None
        assert client.attributes["messaging.system"] == "nats"
        [journal] = spans.children(client)
        assert journal.kind is SpanKind.SERVER
        assert journal.name == client.name.replace("send ", "process ", 1)
        # The group commit is a root of its own, linked both ways with the add it served.
        [commit] = spans.linking(journal, "journal.commit")
        assert commit.parent is None and commit.context.trace_id != journal.context.trace_id
        assert any(link.context == commit.context for link in journal.links)
        assert commit.attributes is not None and commit.attributes["quire.records"] >= 1
        assert commit.attributes["quire.bytes"] > 0
        [sync] = spans.children(commit, "journal.fdatasync")
        assert commit.start_time <= sync.start_time <= sync.end_time <= commit.end_time
    # One trace id for the whole append path, the request's.
    path = [server, add, *clients, *(spans.children(c)[0] for c in clients)]
    assert {hex_id(s.context.trace_id, 32) for s in path} == {trace_id}


# -- HTTP -------------------------------------------------------------------------------------


async def test_an_unsampled_append_leaves_no_span_and_sends_no_header(
    stack: Stack, spans: InMemorySpanExporter, add_headers: list
) -> None:
    ledger = await create(stack.http)
    response = await append_raw(stack.http, ledger["ledger_id"], b"quiet")
    assert response.status_code == 200, response.text
    trace_id, _, sampled = parse_traceresponse(response.headers.get("traceresponse"))
    assert not sampled
    await until(lambda: len(add_headers) == 3, "the add request to each bookie")
    assert add_headers == [None, None, None]
    assert not Spans(spans).of_trace(trace_id)
    assert not [s for s in Spans(spans).all if s.name in ("ledger.add", "journal.commit")]


async def test_an_append_with_a_sampled_traceparent_is_one_trace_to_every_fsync(
    stack: Stack, spans: InMemorySpanExporter, add_headers: list
) -> None:
    ledger = await create(stack.http)
    header, trace_id, parent_id = traceparent()
    response = await append_raw(
        stack.http, ledger["ledger_id"], b"traced", {**PW, "traceparent": header}
    )
    assert response.status_code == 200, response.text
    returned_trace_id, server_span_id, sampled = parse_traceresponse(
        response.headers.get("traceresponse")
    )
    assert (returned_trace_id, sampled) == (trace_id, True)
    prefix = stack.settings.subject_prefix
    done = await until(
        lambda: append_path_complete(spans, server_span_id, 3, prefix), "the append's spans"
    )
    server = done.by_id(server_span_id)
    assert server is not None and server.parent is not None
    assert hex_id(server.parent.span_id, 16) == parent_id
    check_append_path(done, server_span_id, trace_id, ledger, 0)
    # Each bookie's request carried the trace: its CLIENT span's traceparent.
    assert len(add_headers) == 3
    assert all(h and h["traceparent"].startswith(f"00-{trace_id}-") for h in add_headers)


async def test_every_answer_carries_a_traceresponse(stack: Stack) -> None:
    http = stack.http
    lid = (await create(http))["ledger_id"]
    assert (await append_raw(http, lid, b"x")).status_code == 200
    answers = {
        "problem": await append_raw(http, lid, b"x", WRONG_PW),
        "validation": await http.post("/v1/ledgers", json={"ensemble_size": 0}),
        "no route": await http.get("/v1/nowhere"),
        "stream": await http.get(f"/v1/ledgers/{lid}/entries", headers=PW),
        "ndjson": await http.get(
            f"/v1/ledgers/{lid}/entries", headers={**PW, "Accept": "application/x-ndjson"}
        ),
    }
    assert answers["problem"].status_code == 403
    assert answers["problem"].headers["content-type"] == "application/problem+json"
    assert answers["validation"].status_code == 422
    assert answers["no route"].status_code == 404
    assert answers["stream"].status_code == answers["ndjson"].status_code == 200
    trace_ids = set()
    for what, answer in answers.items():
        trace_id, _, sampled = parse_traceresponse(answer.headers.get("traceresponse"))
        assert not sampled, what
        trace_ids.add(trace_id)
    assert len(trace_ids) == len(answers)  # each request is a trace of its own
    # Probes and scrapes are not traced.
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "traceresponse" not in (await http.get(path)).headers


async def test_a_traced_recovery_fences_and_closes_in_its_trace(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    http = stack.http
    ledger = await create(http)
    lid = ledger["ledger_id"]
    assert (await append_raw(http, lid, b"to recover")).status_code == 200
    header, trace_id, _ = traceparent()
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        response = await client.post(
            f"/v1/ledgers/{lid}/recover", headers={**PW, "traceparent": header}
        )
    assert response.status_code == 200, response.text
    _, server_span_id, _ = parse_traceresponse(response.headers.get("traceresponse"))
    prefix = stack.settings.subject_prefix

    def recovered() -> Spans | None:
        found = Spans(spans)
        server = found.by_id(server_span_id)
        recover = found.children(server, "ledger.recover") if server else []
        return found if recover else None

    found = await until(recovered, "the recovery's spans")
    server = found.by_id(server_span_id)
    assert server is not None
    [recover] = found.children(server, "ledger.recover")
    assert recover.attributes is not None and recover.attributes["quire.ledger_id"] == lid
    names = [s.name for s in found.children(recover)]
    bookies = ledger["segments"][0]["bookies"]
    fences = {f"send {prefix}.bookie.{b}.fence" for b in bookies}
    assert fences <= set(names), names
    assert f"send {prefix}.meta.ledger.update" in names, names
    # The metadata service served the CASes (IN_RECOVERY, then CLOSED) in the same trace.
    for cas in [s for s in found.children(recover) if s.name.endswith(".meta.ledger.update")]:
        served = await until(lambda cas=cas: Spans(spans).children(cas), "the metadata's span")
        assert [s.kind for s in served] == [SpanKind.SERVER]
    assert {hex_id(s.context.trace_id, 32) for s in found.children(recover)} == {trace_id}


async def test_a_bookie_request_for_several_traced_appends_is_linked_to_the_others(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """Two traced appends of one turn go to each bookie in one request: its CLIENT span is
    the child of the first's ledger.add and links to the second's."""
    rt = stack.runtimes["gateway"]
    ledgers = in_process_ledgers(rt.nc, stack.settings)
    try:
        [metadata] = await create_ledgers(ledgers, 1)
        handle = ledgers.writers[metadata.ledger_id]
        traces, requests, appends = [], [], []
        for payload in (b"first", b"second"):
            # A sampled remote parent, as a request with a traceparent has.
            parent = SpanContext(
                int.from_bytes(os.urandom(16)),
                int.from_bytes(os.urandom(8)),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            traces.append(parent.trace_id)
            context = trace.set_span_in_context(NonRecordingSpan(parent))
            request = telemetry.tracer("test").start_span(payload.decode(), context=context)
            requests.append(request)
            # The task runs in a copy of the current context: the request's span in it.
            with trace.use_span(request):
                appends.append(asyncio.ensure_future(handle.append([payload])))
        assert [first for first, _, _ in await asyncio.gather(*appends)] == [0, 1]
        for request in requests:
            request.end()

        def adds() -> list[ReadableSpan]:
            found = Spans(spans)
            return [s for s in found.all if s.name == "ledger.add" and s.context.trace_id in traces]

        first, second = sorted(
            await until(lambda: len(adds()) == 2 and adds(), "the two ledger.add spans"),
            key=lambda s: s.attributes["quire.entry_id"] if s.attributes else -1,
        )
        clients = await until(
            lambda: len(Spans(spans).children(first)) == 3 and Spans(spans).children(first),
            "a request to each bookie",
        )
        for client in clients:
            assert [link.context for link in client.links] == [second.context]
        assert not Spans(spans).children(second)
    finally:
        await ledgers.stop()


# -- gRPC -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def stub(stack: Stack) -> AsyncIterator[pb_grpc.LedgersStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.settings.gateway.grpc_port}") as ch:
        yield pb_grpc.LedgersStub(ch)


async def test_a_traced_grpc_append_answers_with_its_trace(
    stack: Stack, spans: InMemorySpanExporter, stub: pb_grpc.LedgersStub
) -> None:
    ledger = await stub.Create(
        pb.CreateRequest(ensemble_size=3, write_quorum=3, ack_quorum=2, password="s3cret")
    )
    header, trace_id, _ = traceparent()
    call = stub.Append(
        pb.AppendRequest(ledger_id=ledger.ledger_id, entries=[b"one", b"two"]),
        metadata=(*GRPC_AUTH, ("traceparent", header)),
    )
    reply = await call
    assert (reply.first_entry_id, reply.last_entry_id) == (0, 1)
    trailers = dict(await call.trailing_metadata())
    returned_trace_id, server_span_id, sampled = parse_traceresponse(trailers.get("traceresponse"))
    assert (returned_trace_id, sampled) == (trace_id, True)
    prefix = stack.settings.subject_prefix
    done = await until(
        lambda: append_path_complete(spans, server_span_id, 3, prefix), "the append's spans"
    )
    server = done.by_id(server_span_id)
    assert server is not None and server.name == "/quire.v1.Ledgers/Append"
    [add] = done.children(server, "ledger.add")
    assert add.attributes is not None and add.attributes["quire.entries"] == 2


async def test_every_grpc_answer_carries_a_traceresponse(stub: pb_grpc.LedgersStub) -> None:
    ledger = await stub.Create(
        pb.CreateRequest(ensemble_size=3, write_quorum=3, ack_quorum=2, password="s3cret")
    )
    await stub.Append(
        pb.AppendRequest(ledger_id=ledger.ledger_id, entries=[b"x"]), metadata=GRPC_AUTH
    )
    read = stub.Read(pb.ReadRequest(ledger_id=ledger.ledger_id), metadata=GRPC_AUTH)
    assert [entry.data async for entry in read] == [b"x"]
    parse_traceresponse(dict(await read.trailing_metadata()).get("traceresponse"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Append(
            pb.AppendRequest(ledger_id=ledger.ledger_id, entries=[b"x"]),
            metadata=(("quire-ledger-password", "wrong"),),
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    trailers = dict(refused.value.trailing_metadata() or ())
    assert trailers["quire-error-code"] == "UNAUTHORIZED"  # the error's own trailers stay
    _, _, sampled = parse_traceresponse(trailers.get("traceresponse"))
    assert not sampled


# -- ensemble change (last: it stops a bookie) --------------------------------------------


async def test_an_ensemble_change_is_traced_and_linked_to_the_appends_it_held(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    http = stack.http
    ledger = await create(http, ensemble_size=3, write_quorum=3, ack_quorum=3)
    lid = ledger["ledger_id"]
    assert (await append_raw(http, lid, b"before")).status_code == 200
    victim = ledger["segments"][0]["bookies"][1]
    await stack.stop(f"{victim}.journal")
    header, trace_id, _ = traceparent()
    response = await append_raw(http, lid, b"after", {**PW, "traceparent": header})
    assert response.status_code == 200, response.text

    def changed() -> ReadableSpan | None:
        return next(
            (
                s
                for s in Spans(spans).all
                if s.name == "ledger.ensemble_change"
                and s.attributes is not None
                and s.attributes["quire.ledger_id"] == lid
            ),
            None,
        )

    change = await until(changed, "the ensemble change's span")
    assert change is not None
    assert change.parent is None and change.attributes is not None
    assert change.attributes["quire.ledger_id"] == lid
    assert list(change.attributes["quire.failed_bookies"]) == [victim]
    [replacement] = change.attributes["quire.replacements"]
    assert replacement not in ledger["segments"][0]["bookies"]
    # Linked to the traced append that waited for it; its CAS is its child.
    found = Spans(spans)
    [add] = [s for s in found.of_trace(trace_id) if s.name == "ledger.add"]
    assert [link.context for link in change.links] == [add.context]
    prefix = stack.settings.subject_prefix
    assert f"send {prefix}.meta.ledger.update" in [s.name for s in found.children(change)]
