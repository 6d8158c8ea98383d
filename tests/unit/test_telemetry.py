"""Tracing helpers: what is sampled, what travels in NATS headers, and what costs nothing.

Each test installs its own provider (`install_provider`) exporting into memory, with the
sampler the environment under test would pick."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from shared import telemetry
from shared.telemetry import (
    background_span,
    build_provider,
    current_span_context,
    extract_context,
    inject_headers,
    linked_span,
    nats_client_span,
    nats_server_span,
    recording,
)

SUBJECT = "quire.bookie.bookie-1.add"
SAMPLED_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def _install(environ: dict[str, str]) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = build_provider("test", instance="test-1", bookie_id="bookie-1", environ=environ)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install_provider(provider)
    return exporter


@pytest.fixture(autouse=True)
def _no_provider_after() -> Iterator[None]:
    yield
    telemetry.install_provider(None)


def _context(sampled: bool, trace_id: int = 0xABC, span_id: int = 0xDEF) -> SpanContext:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)


def test_no_span_means_no_headers_at_all() -> None:
    assert inject_headers() is None
    assert inject_headers({"x-keep": "1"}) == {"x-keep": "1"}


def test_an_active_span_travels_as_traceparent() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("append") as span:
        headers = inject_headers()
    assert headers is not None and "traceparent" in headers
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert trace_id in headers["traceparent"]
    assert extract_context(headers) is not None


def test_an_unsampled_request_costs_no_header_and_no_span() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER_ARG": "0"})
    with telemetry.tracer("test").start_as_current_span("http request") as root:
        assert not root.is_recording()
        assert not recording() and current_span_context() is None
        assert inject_headers() is None
        with nats_client_span(SUBJECT) as client:
            assert client is None
            assert inject_headers() is None
    assert inject_headers(context=root.get_span_context()) is None
    with nats_server_span(SUBJECT, {"traceparent": UNSAMPLED_PARENT}) as server:
        assert server is None
    with nats_server_span(SUBJECT, None) as server:
        assert server is None
    assert exporter.get_finished_spans() == ()


def test_a_sampled_request_carries_its_client_span_to_a_server_child() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER_ARG": "1"})
    with telemetry.tracer("test").start_as_current_span("ledger.add") as add:
        with nats_client_span(SUBJECT, attributes={"quire.ledger_id": 7}) as client:
            assert client is not None
            headers = inject_headers()
    assert headers is not None
    with nats_server_span(SUBJECT, headers) as server:
        assert server is not None and recording()
    by_name = {span.name: span for span in exporter.get_finished_spans()}
    client_span, server_span = by_name[f"send {SUBJECT}"], by_name[f"process {SUBJECT}"]
    assert client_span.kind is SpanKind.CLIENT and server_span.kind is SpanKind.SERVER
    assert client_span.parent.span_id == add.get_span_context().span_id
    assert server_span.parent.span_id == client_span.context.span_id
    assert server_span.context.trace_id == add.get_span_context().trace_id
    assert client_span.attributes["messaging.system"] == "nats"
    assert client_span.attributes["messaging.destination.name"] == SUBJECT
    assert client_span.attributes["messaging.operation.type"] == "send"
    assert client_span.attributes["quire.ledger_id"] == 7
    assert server_span.attributes["messaging.operation.name"] == "process"
    assert server_span.resource.attributes["service.name"] == "quire-test"
    assert server_span.resource.attributes["service.instance.id"] == "test-1"
    assert server_span.resource.attributes["quire.bookie_id"] == "bookie-1"


def test_a_sampled_traceparent_is_followed_whatever_the_ratio() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER_ARG": "0"})
    with nats_server_span(SUBJECT, {"traceparent": SAMPLED_PARENT}) as server:
        assert server is not None
    (span,) = exporter.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == SAMPLED_PARENT.split("-")[1]


def test_a_client_span_under_an_explicit_parent_and_a_publish_is_a_producer() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER_ARG": "0"})
    with nats_client_span(SUBJECT, parent=_context(sampled=False)) as client:
        assert client is None
    with nats_client_span("quire.events.x", operation="publish", parent=_context(True)) as p:
        assert p is not None
        headers = inject_headers()
    (span,) = exporter.get_finished_spans()
    assert span.kind is SpanKind.PRODUCER and span.name == "publish quire.events.x"
    assert span.parent.span_id == 0xDEF and span.context.trace_id == 0xABC
    assert headers is not None and f"{span.context.span_id:016x}" in headers["traceparent"]


def test_a_linked_root_is_sampled_iff_one_link_is() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER_ARG": "0"})
    with linked_span("journal.commit", [_context(False), _context(False, span_id=2)]) as none:
        assert none is None
    traced, untraced = _context(True, trace_id=1), _context(False, trace_id=2)
    with telemetry.tracer("test").start_as_current_span("unrelated current span"):
        with linked_span("journal.commit", [untraced, traced]) as commit:
            assert commit is not None
            with telemetry.tracer("test").start_as_current_span("journal.fdatasync"):
                pass
    fdatasync, commit_span = exporter.get_finished_spans()
    assert commit_span.parent is None, "a group commit is a root of its own trace"
    assert {link.context.trace_id for link in commit_span.links} == {1, 2}
    assert commit_span.context.trace_id not in (1, 2)
    assert fdatasync.parent.span_id == commit_span.context.span_id


def test_a_background_operation_is_recorded_whatever_the_ratio() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"})
    with background_span("gc.run", attributes={"quire.bookie_id": "bookie-1"}) as gc:
        assert gc is not None and recording()
        with nats_client_span("quire.metadata.list") as listing:
            assert listing is not None
    listing_span, gc_span = exporter.get_finished_spans()
    assert gc_span.parent is None and gc_span.attributes["quire.bookie_id"] == "bookie-1"
    assert listing_span.parent.span_id == gc_span.context.span_id


def test_always_off_records_nothing_not_even_background_or_followed_spans() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER": "always_off"})
    with background_span("gc.run") as gc:
        assert gc is None
    with nats_server_span(SUBJECT, {"traceparent": SAMPLED_PARENT}) as server:
        assert server is None
    with linked_span("journal.commit", [_context(True)]) as commit:
        assert commit is None
    assert exporter.get_finished_spans() == ()


def test_no_provider_means_every_helper_yields_none() -> None:
    with background_span("gc.run") as gc:
        assert gc is None
    with nats_server_span(SUBJECT, {"traceparent": SAMPLED_PARENT}) as server:
        assert server is None


def test_the_sdk_disabled_installs_no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    telemetry.setup_tracing("test")
    assert telemetry.tracer_provider() is None


@pytest.mark.parametrize(
    ("environ", "root_sampled"),
    [
        ({}, None),  # the default ratio: 0.001
        ({"OTEL_TRACES_SAMPLER": "always_on"}, True),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, True),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, False),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.0"}, True),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
            False,
        ),
        ({"OTEL_TRACES_SAMPLER": "nonsense"}, None),
        ({"OTEL_TRACES_SAMPLER_ARG": "2.5"}, None),
    ],
)
def test_the_sampler_follows_the_environment(
    environ: dict[str, str], root_sampled: bool | None
) -> None:
    sampler = telemetry.sampler_from_env(environ)
    decisions = [
        sampler.should_sample(None, trace_id, "root").decision.is_sampled()
        for trace_id in range(1, 2**64, 2**64 // 10_000)
    ]
    if root_sampled is None:
        assert 0 < sum(decisions) < 50, "about 0.1 % of 10,000 trace ids"
    else:
        assert all(d == root_sampled for d in decisions)


def test_the_trace_id_ratio_keeps_the_link_and_background_rules() -> None:
    sampler = telemetry.sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio"})
    link = trace.Link(_context(True))
    assert sampler.should_sample(None, 2**64 - 1, "commit", links=[link]).decision.is_sampled()
    background = {telemetry.BACKGROUND_ATTRIBUTE: True}
    result = sampler.should_sample(None, 2**64 - 1, "gc.run", attributes=background)
    assert result.decision.is_sampled() and result.attributes == background


def test_a_rule_sampled_trace_keeps_its_children_under_the_trace_id_ratio() -> None:
    exporter = _install({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"})
    with background_span("gc.run") as run:
        assert run is not None
        with telemetry.internal_span("gc.list_ledgers") as step:
            assert step is not None
    assert [span.name for span in exporter.get_finished_spans()] == ["gc.list_ledgers", "gc.run"]


def test_the_exporters_follow_the_environment(tmp_path) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    from shared.tracestore import SpanStoreExporter

    assert telemetry.exporters_from_env("gateway", {}) == []
    (http,) = telemetry.exporters_from_env(
        "gateway", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    )
    assert isinstance(http, Http)
    grpc, console, store = telemetry.exporters_from_env(
        "bookie-1.journal",
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_TRACES_EXPORTER": "console",
            "QUIRE_TRACES_DIR": str(tmp_path),
        },
    )
    assert isinstance(grpc, Grpc) and isinstance(console, ConsoleSpanExporter)
    assert isinstance(store, SpanStoreExporter)
    with pytest.raises(ValueError, match="http/protobuf or grpc"):
        telemetry.exporters_from_env(
            "gateway",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
        )
    for exporter in (http, grpc, console, store):
        exporter.shutdown()
