"""Span stores written by the real exporter, for the tests of the store and of `quire
trace`."""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind

from shared.tracestore import SpanStoreExporter


def store_provider(directory: Path, instance: str, **exporter_options: int) -> TracerProvider:
    """A provider writing every span at once into the store at `directory`."""
    service = instance.rsplit(".", 1)[-1]
    resource = Resource(
        {
            "service.name": f"quire-{service}",
            "service.instance.id": instance,
            "quire.bookie_id": "b1",
        }
    )
    provider = TracerProvider(resource=resource)
    exporter = SpanStoreExporter(directory, instance, **exporter_options)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def append_traces(directory: Path) -> tuple[str, str, str]:
    """Two appends' traces served by one group commit (and its fdatasync), linked both
    ways as the journal links them, and a third trace nobody links to."""
    gateway = store_provider(directory, "gateway").get_tracer("test")
    journal = store_provider(directory, "bookie-1.journal").get_tracer("test")
    adds = []
    for name in ("first", "second"):
        with gateway.start_as_current_span(f"ledger.add {name}"):
            server = journal.start_span(f"process add {name}", kind=SpanKind.SERVER)
            adds.append(server)
    commit = journal.start_span("journal.commit", links=[Link(s.get_span_context()) for s in adds])
    with journal.start_as_current_span(
        "journal.fdatasync", context=trace.set_span_in_context(commit), kind=SpanKind.INTERNAL
    ):
        pass
    commit.end()
    for server in adds:
        server.add_link(commit.get_span_context())
        server.end()
    with gateway.start_as_current_span("ledger.add unrelated") as unrelated:
        pass
    first, second = (f"{s.get_span_context().trace_id:032x}" for s in adds)
    return first, second, f"{unrelated.get_span_context().trace_id:032x}"
