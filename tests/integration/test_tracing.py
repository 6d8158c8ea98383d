"""Trace context over a real NATS server: a sampled request is followed through two
ServiceRuntime endpoints (CLIENT -> SERVER -> CLIENT -> SERVER, one trace); an unsampled
one reaches the handlers without a header and leaves no span; an event emitted in a
sampled span is published in a PRODUCER span that its consumer links to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.micro.request import Request
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from shared import telemetry
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.requests import request
from shared.service import ServiceRuntime
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving
from tests.support.metadata import create_request
from tests.support.wait import until


def _traced(environ: dict[str, str]) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = telemetry.build_provider("test", environ=environ)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install_provider(provider)
    yield exporter
    telemetry.install_provider(None)


@pytest.fixture
def sampled() -> Iterator[InMemorySpanExporter]:
    yield from _traced({"OTEL_TRACES_SAMPLER": "parentbased_always_on"})


@pytest.fixture
def unsampled() -> Iterator[InMemorySpanExporter]:
    yield from _traced({"OTEL_TRACES_SAMPLER_ARG": "0"})


class Chain:
    """`front` answers by asking `back`; both note the headers they received."""

    def __init__(self, rt: ServiceRuntime) -> None:
        self.rt = rt
        self.front = f"{rt.settings.subject_prefix}.test.front"
        self.back = f"{rt.settings.subject_prefix}.test.back"
        self.headers: dict[str, dict[str, str] | None] = {}

    async def serve(self) -> None:
        await self.rt.add_endpoint("front", self.front, self._front)
        await self.rt.add_inline_endpoint("back", self.back, self._back)

    async def _front(self, req: Request) -> None:
        self.headers["front"] = req.headers
        reply = await request(self.rt.nc, self.back, req.data, timeout_s=5)
        await req.respond(reply.data)

    async def _back(self, req: Request) -> None:
        self.headers["back"] = req.headers
        await req.respond(b"ok:" + req.data)


@pytest.fixture
async def chain(settings: QuireSettings) -> AsyncIterator[Chain]:
    rt = ServiceRuntime("test", settings, "test-1")
    await rt.start()
    chain = Chain(rt)
    await chain.serve()
    try:
        yield chain
    finally:
        rt.stop()
        await rt.shutdown()


async def test_a_sampled_request_is_one_trace_through_both_endpoints(
    chain: Chain, sampled: InMemorySpanExporter
) -> None:
    with telemetry.tracer("test").start_as_current_span("ledger.add") as root:
        reply = await request(chain.rt.nc, chain.front, b"x", timeout_s=5)
    assert reply.data == b"ok:x"
    # The front's SERVER span ends after its reply is sent: wait for it.
    await until(lambda: len(sampled.get_finished_spans()) == 5, "five spans")
    spans = sampled.get_finished_spans()
    by_name = {(span.name, span.kind): span for span in spans}
    trace_id = root.get_span_context().trace_id
    assert {span.context.trace_id for span in spans} == {trace_id}
    chain_of_parents = [
        ("ledger.add", SpanKind.INTERNAL),
        (f"send {chain.front}", SpanKind.CLIENT),
        (f"process {chain.front}", SpanKind.SERVER),
        (f"send {chain.back}", SpanKind.CLIENT),
        (f"process {chain.back}", SpanKind.SERVER),
    ]
    assert set(by_name) == set(chain_of_parents)
    for parent_key, child_key in zip(chain_of_parents, chain_of_parents[1:], strict=False):
        child, parent = by_name[child_key], by_name[parent_key]
        assert child.parent is not None and child.parent.span_id == parent.context.span_id
        assert child.attributes["messaging.system"] == "nats"
        assert child.attributes["messaging.destination.name"] in (chain.front, chain.back)
    server = by_name[(f"process {chain.back}", SpanKind.SERVER)]
    assert server.attributes["messaging.operation.type"] == "process"
    assert chain.headers["back"] is not None and "traceparent" in chain.headers["back"]


async def test_an_unsampled_request_carries_no_header_and_leaves_no_span(
    chain: Chain, unsampled: InMemorySpanExporter
) -> None:
    with telemetry.tracer("test").start_as_current_span("ledger.add") as root:
        assert not root.is_recording()
        reply = await request(chain.rt.nc, chain.front, b"y", timeout_s=5)
    assert reply.data == b"ok:y"
    assert chain.headers == {"front": None, "back": None}
    assert unsampled.get_finished_spans() == ()


async def test_a_handler_that_fails_ends_its_server_span_in_error(
    settings: QuireSettings, sampled: InMemorySpanExporter
) -> None:
    rt = ServiceRuntime("test", settings, "test-1")
    await rt.start()
    subject = f"{settings.subject_prefix}.test.broken"

    async def broken(_: Request) -> None:
        raise RuntimeError("broken handler")

    await rt.add_endpoint("broken", subject, broken)
    try:
        with telemetry.tracer("test").start_as_current_span("caller"):
            reply = await request(rt.nc, subject, b"", timeout_s=5)
        assert reply.headers is not None and reply.headers.get("Nats-Service-Error-Code")
    finally:
        rt.stop()
        await rt.shutdown()
    (server,) = [s for s in sampled.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert not server.status.is_ok
    assert any(event.name == "exception" for event in server.events)


async def test_an_event_is_published_in_a_producer_span_its_consumer_links_to(
    settings: QuireSettings, sampled: InMemorySpanExporter
) -> None:
    rt = ServiceRuntime("test", settings, "test-1")
    await rt.start()
    try:
        js = rt.nc.jetstream()
        subject = rt.subjects.event("entry.corrupt")
        sub = await js.pull_subscribe(
            subject,
            durable="tracing-test",
            stream=rt.subjects.event_stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL),
        )
        rt.events.emit("entry.corrupt", ledger_id=1)  # outside any span: no header
        with telemetry.tracer("test").start_as_current_span("ledger.read") as read:
            rt.events.emit("entry.corrupt", ledger_id=2)
        messages: list = []

        async def both_fetched() -> bool:
            messages.extend(await sub.fetch(2 - len(messages), timeout=10))
            return len(messages) == 2

        await until(both_fetched, "both events")
        untraced, traced = messages
        assert "traceparent" not in (untraced.headers or {})
        for msg in messages:
            with telemetry.nats_consumer_span(msg.subject, msg.headers):
                await msg.ack()
    finally:
        rt.stop()
        await rt.shutdown()
    spans = sampled.get_finished_spans()
    (producer,) = [s for s in spans if s.kind is SpanKind.PRODUCER]
    (consumer,) = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert producer.name == f"publish {subject}"
    assert producer.parent.span_id == read.get_span_context().span_id
    assert consumer.name == f"process {subject}"
    assert consumer.parent is None, "linked to the producer, not its child"
    assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
    assert traced.headers["traceparent"].split("-")[2] == f"{producer.context.span_id:016x}"


async def test_a_metadata_request_shows_its_statements_under_its_server_span(
    settings: QuireSettings, fresh_database_url: str, nc, sampled: InMemorySpanExporter
) -> None:
    meta_settings = settings.model_copy(update={"database_url": fresh_database_url})
    async with running_service("metadata", meta_settings):
        client = MetadataClient(nc, Subjects(meta_settings.subject_prefix))
        await wait_until_serving(client)
        started = sampled.get_finished_spans()
        sampled.clear()
        with telemetry.tracer("test").start_as_current_span("ledger.create") as root:
            ledger = await client.create_ledger(create_request())
        assert ledger.ledger_id is not None
        await until(
            lambda: any(s.kind is SpanKind.SERVER for s in sampled.get_finished_spans()),
            "the metadata service's SERVER span",
        )
    spans = [s for s in sampled.get_finished_spans() if s.context.trace_id == root.context.trace_id]
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    statements = [s for s in spans if s.attributes.get("db.system") == "postgresql"]
    assert statements, [s.name for s in spans]
    assert all(s.parent.span_id == server.context.span_id for s in statements)
    assert server.name.startswith("process ") and server.name.endswith("ledger.create")
    # The migration at start is a background operation: traced, with its statements.
    (migration,) = [s for s in started if s.name == "metadata.migrate"]
    assert migration.parent is None and migration.attributes["quire.background"]
    assert any(s.parent and s.parent.span_id == migration.context.span_id for s in started)
