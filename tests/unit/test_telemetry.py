"""Trace context on NATS headers: carried when a span is active, no header block else."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from shared.telemetry import extract_context, inject_headers


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
