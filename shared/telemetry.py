"""OpenTelemetry tracing, with W3C trace context carried in NATS headers.

Spans are exported only when `OTEL_TRACES_EXPORTER=console` is set (an OTLP exporter
comes with the deployment work); the context still propagates, so that one trace id
follows an entry from the HTTP call through the journal.
"""

from __future__ import annotations

import os

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_configured = False


def setup_tracing(service: str) -> None:
    global _configured
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"quire-{service}"}))
    if os.environ.get("OTEL_TRACES_EXPORTER", "").lower() == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    _configured = True


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """NATS headers carrying the current span's `traceparent` (lowercase, as NATS is
    case-sensitive); None when there is nothing to carry. An empty dict would still make
    nats-py send a header block, which every receiver then parses: on the add path that
    is one header parse per request per bookie for nothing."""
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier or None


def extract_context(headers: dict[str, str] | None):  # -> opentelemetry Context
    return propagate.extract(headers or {})
