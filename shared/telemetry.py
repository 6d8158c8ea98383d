"""OpenTelemetry tracing for every Quire process, with W3C trace context in NATS headers.

The sampling decision is made once, at the edge: the gateway's HTTP or gRPC request (a
trace-id ratio, 0.001 by default) or a background operation (always recorded: GC runs and
compactions are rare). Everything downstream follows the parent: a NATS request carries
`traceparent` only when the sender's span is sampled, and an endpoint opens a SERVER span
only when a sampled `traceparent` arrives. An unsampled append therefore costs no header
and no span in any process; callers check `recording()` (or get None from a helper) and
skip their span work.

A span that serves several traced operations at once (the journal's group commit) is a
new root linked to all of them (`linked_span`), sampled iff one of them is.

Configured by the standard variables: `OTEL_SDK_DISABLED=true` installs no provider (every
helper yields None); `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` pick the sampler
(`sampler_from_env`); OTLP export when `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (`OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf`,
the default, or `grpc`); the console with `OTEL_TRACES_EXPORTER=console`; and the local
span store (shared/tracestore.py) when `QUIRE_TRACES_DIR` is set.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind

from shared.tracestore import SpanStoreExporter

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_RATIO = 0.001
# The attribute by which the sampler recognises a background operation's root span
# (it sees a span's initial attributes, not the helper that opened it).
BACKGROUND_ATTRIBUTE = "quire.background"

# messaging.operation.type for each messaging.operation.name we use (semantic conventions).
_OPERATION_TYPES = {"publish": "send", "send": "send", "receive": "receive", "process": "process"}

# Returned when there is nothing to trace: one shared object, so the unsampled path
# allocates nothing.
_NOTHING: AbstractContextManager[None] = contextlib.nullcontext(None)

_provider: TracerProvider | None = None
# A second service in this process (a co-hosted bookie's ledgerstore, services.bookie): its
# own provider, for the code run in its context (`use_service_tracing`).
_service_provider: ContextVar[TracerProvider | None] = ContextVar(
    "quire_service_tracer_provider", default=None
)
_service_providers: list[TracerProvider] = []


class QuireSampler(Sampler):
    """The root sampler: a span with a sampled link (a group commit serving a traced add)
    and a background operation's span are sampled; any other root by trace-id ratio."""

    def __init__(self, rate: float, *, background: bool = True) -> None:
        self._ratio = TraceIdRatioBased(rate)
        self._background = background

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if (self._background and attributes and attributes.get(BACKGROUND_ATTRIBUTE)) or (
            links and any(link.context.trace_flags.sampled for link in links)
        ):
            parent = trace.get_current_span(parent_context).get_span_context()
            return SamplingResult(
                Decision.RECORD_AND_SAMPLE,
                attributes,
                parent.trace_state if parent.is_valid else None,
            )
        return self._ratio.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return (
            f"QuireSampler{{links,{'background,' if self._background else ''}"
            f"{self._ratio.get_description()}}}"
        )


def _ratio(arg: str | None) -> float:
    if arg is None or not arg.strip():
        return DEFAULT_SAMPLE_RATIO
    try:
        rate = float(arg)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        log.warning(
            "OTEL_TRACES_SAMPLER_ARG=%r is not a ratio in [0, 1]; using %s",
            arg,
            DEFAULT_SAMPLE_RATIO,
        )
        return DEFAULT_SAMPLE_RATIO
    return rate


def sampler_from_env(environ: Mapping[str, str] = os.environ) -> Sampler:
    """The sampler `OTEL_TRACES_SAMPLER` names; unset means `parentbased_traceidratio`.
    A ratio (`OTEL_TRACES_SAMPLER_ARG`, default 0.001 for every ratio sampler) keeps
    Quire's link and background rules; `always_off` turns off background spans too, and
    `parentbased_always_off` keeps only the link rule (a commit serving a traced add).
    `traceidratio` follows the parent too: on its own it would drop the children of a
    trace sampled by a rule (a GC run's steps, a commit's fdatasync) by their trace id."""
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_traceidratio"
    arg = environ.get("OTEL_TRACES_SAMPLER_ARG")
    if name == "always_on":
        return ALWAYS_ON
    if name == "always_off":
        return ALWAYS_OFF
    if name == "parentbased_always_on":
        return ParentBased(ALWAYS_ON)
    if name == "parentbased_always_off":
        return ParentBased(QuireSampler(0.0, background=False))
    if name not in ("parentbased_traceidratio", "traceidratio"):
        log.warning("unknown OTEL_TRACES_SAMPLER=%r; using parentbased_traceidratio", name)
    return ParentBased(QuireSampler(_ratio(arg)))


def tracing_disabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def build_provider(
    service: str,
    *,
    instance: str = "",
    bookie_id: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> TracerProvider:
    """A provider with Quire's resource and sampler, and no exporter yet. Our
    `service.name` wins over `OTEL_SERVICE_NAME`: one environment is shared by every
    process `quire up` starts, and the services must stay apart."""
    ours: dict[str, str] = {"service.name": f"quire-{service}"}
    if instance:
        ours["service.instance.id"] = instance
    if bookie_id:
        ours["quire.bookie_id"] = bookie_id
    resource = Resource.create({}).merge(Resource(ours))
    return TracerProvider(resource=resource, sampler=sampler_from_env(environ))


def exporters_from_env(
    instance: str, environ: Mapping[str, str] = os.environ
) -> list[SpanExporter]:
    """The exporters the environment asks for (see the module docstring); the local span
    store names its file after `instance`."""
    exporters: list[SpanExporter] = []
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            exporters.append(GrpcExporter())
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            exporters.append(HttpExporter())
        else:
            raise ValueError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: Quire exports http/protobuf or grpc"
            )
    wanted = {part.strip().lower() for part in environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    if "console" in wanted:
        exporters.append(ConsoleSpanExporter())
    if environ.get("QUIRE_TRACES_DIR"):
        exporters.append(SpanStoreExporter(Path(environ["QUIRE_TRACES_DIR"]), instance))
    return exporters


def install_provider(provider: TracerProvider | None) -> None:
    """Make `provider` the one the helpers use (None: no tracing). `setup_tracing` calls
    it; tests call it to trace into an in-memory exporter without the global provider,
    which OpenTelemetry lets a process set only once."""
    global _provider
    _provider = provider


def setup_tracing(service: str, *, instance: str = "", bookie_id: str | None = None) -> None:
    """Install this process's provider (once), exporting as the environment says."""
    if _provider is not None or tracing_disabled():
        return
    provider = build_provider(service, instance=instance, bookie_id=bookie_id)
    for exporter in exporters_from_env(instance or service):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install_provider(provider)
    trace.set_tracer_provider(provider)


def use_service_tracing(service: str, *, instance: str, bookie_id: str | None = None) -> None:
    """In the current context (and the tasks it starts): spans as those of `service`, with
    a provider of its own (its resource, its exporters), as if it ran in a process of its
    own. For a second service hosted in this process (a co-hosted bookie's ledgerstore);
    nothing without the process's provider (`setup_tracing`)."""
    if _provider is None or tracing_disabled():
        return
    provider = build_provider(service, instance=instance, bookie_id=bookie_id)
    for exporter in exporters_from_env(instance):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _service_providers.append(provider)
    _service_provider.set(provider)


def shutdown_tracing() -> None:
    """Export what is still queued and stop the exporters (blocks: run it off the loop)."""
    for provider in (*_service_providers, _provider):
        if provider is not None:
            provider.shutdown()


def tracer_provider() -> TracerProvider | None:
    """The installed provider, for the instrumentations' `tracer_provider=`."""
    return _provider


def tracer(name: str) -> trace.Tracer:
    provider = _service_provider.get() or _provider
    if provider is not None:
        return provider.get_tracer(name)
    return trace.get_tracer(name)


def recording() -> bool:
    """Whether the current span records: callers skip all span work when it does not."""
    return trace.get_current_span().is_recording()


def current_span_context() -> SpanContext | None:
    """The current span's context, None unless it records."""
    span = trace.get_current_span()
    return span.get_span_context() if span.is_recording() else None


def inject_headers(
    headers: dict[str, str] | None = None, context: SpanContext | None = None
) -> dict[str, str] | None:
    """NATS headers carrying `traceparent` (lowercase, as NATS is case-sensitive) of
    `context`, or of the current span, only when it is sampled; None when there is
    nothing to carry. An empty dict would still make nats-py send a header block, which
    every receiver then parses: on the add path that is one header parse per request per
    bookie for nothing."""
    if context is None:
        context = trace.get_current_span().get_span_context()
    if not context.trace_flags.sampled:
        return dict(headers) if headers else None
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(context)))
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(headers or {})


def messaging_attributes(subject: str, operation: str) -> dict[str, str]:
    """The messaging semantic conventions' attributes of one NATS operation."""
    return {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.name": operation,
        "messaging.operation.type": _OPERATION_TYPES.get(operation, operation),
    }


@contextlib.contextmanager
def _span(
    name: str,
    *,
    context: Context | None,
    kind: SpanKind,
    links: Sequence[SpanContext] = (),
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span | None]:
    span_links = [Link(link) for link in links if link is not None and link.is_valid]
    with tracer(__name__).start_as_current_span(
        name, context=context, kind=kind, links=span_links, attributes=attributes
    ) as span:
        yield span if span.is_recording() else None


def nats_client_span(
    subject: str,
    *,
    operation: str = "send",
    name: str | None = None,
    parent: SpanContext | None = None,
    links: Sequence[SpanContext] = (),
    attributes: Mapping[str, Any] | None = None,
) -> AbstractContextManager[Span | None]:
    """A CLIENT span (PRODUCER for "publish") around one NATS request or publish, child
    of `parent` or of the current span, only when that one is sampled: else None and no
    work. Inside, it is the current span, so `inject_headers()` carries it."""
    if parent is None:
        current = trace.get_current_span()
        if not current.is_recording():
            return _NOTHING
        context = None
    elif parent.trace_flags.sampled:
        context = trace.set_span_in_context(NonRecordingSpan(parent))
    else:
        return _NOTHING
    span_attributes = messaging_attributes(subject, operation)
    if attributes:
        span_attributes.update(attributes)
    return _span(
        name or f"{operation} {subject}",
        context=context,
        kind=SpanKind.PRODUCER if operation == "publish" else SpanKind.CLIENT,
        links=links,
        attributes=span_attributes,
    )


def nats_server_span(
    subject: str,
    headers: Mapping[str, str] | None,
    *,
    operation: str = "process",
    name: str | None = None,
    kind: SpanKind = SpanKind.SERVER,
) -> AbstractContextManager[Span | None]:
    """A SERVER span for one NATS request, child of the sampled `traceparent` in its
    headers; None (and no work) when none arrived: an endpoint never starts a trace."""
    if not headers or "traceparent" not in headers:
        return _NOTHING
    context = extract_context(headers)
    if not trace.get_current_span(context).get_span_context().trace_flags.sampled:
        return _NOTHING
    return _span(
        name or f"{operation} {subject}",
        context=context,
        kind=kind,
        attributes=messaging_attributes(subject, operation),
    )


def start_nats_server_span(subject: str, headers: Mapping[str, str] | None) -> Span | None:
    """`nats_server_span`, started but not made current, for a handler that answers after
    it returns (from a callback): it makes the span current around its own synchronous
    work (`trace.use_span(span, end_on_exit=False)`) and ends it once it has answered.
    None (and no work) unless a sampled `traceparent` arrived."""
    if not headers or "traceparent" not in headers:
        return None
    context = extract_context(headers)
    if not trace.get_current_span(context).get_span_context().trace_flags.sampled:
        return None
    span = tracer(__name__).start_span(
        f"process {subject}",
        context=context,
        kind=SpanKind.SERVER,
        attributes=messaging_attributes(subject, "process"),
    )
    return span if span.is_recording() else None


def nats_consumer_span(
    subject: str,
    headers: Mapping[str, str] | None,
    *,
    operation: str = "process",
    name: str | None = None,
) -> AbstractContextManager[Span | None]:
    """A CONSUMER span for one JetStream message, linked (not parented) to the PRODUCER
    span in its headers when that one is sampled, else None: a consumer may read an event
    long after it was published, and its work is not part of the producer's request."""
    if not headers or "traceparent" not in headers:
        return _NOTHING
    producer = trace.get_current_span(extract_context(headers)).get_span_context()
    return linked_span(
        name or f"{operation} {subject}",
        [producer],
        attributes=messaging_attributes(subject, operation),
        kind=SpanKind.CONSUMER,
    )


def linked_span(
    name: str,
    links: Sequence[SpanContext],
    *,
    attributes: Mapping[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> AbstractContextManager[Span | None]:
    """A new root span (its own trace) linked to `links`, sampled iff one of them is;
    None when none is. For work done once for several traced operations (a group
    commit), and for a consumer that must not pose as its producer's child."""
    if not any(link is not None and link.trace_flags.sampled for link in links):
        return _NOTHING
    return _span(name, context=Context(), kind=kind, links=links, attributes=attributes)


def internal_span(
    name: str, *, attributes: Mapping[str, Any] | None = None
) -> AbstractContextManager[Span | None]:
    """An INTERNAL child of the current span, only when that one records: a step of a
    traced operation (a GC run's ledger listing). None and no work otherwise."""
    if not trace.get_current_span().is_recording():
        return _NOTHING
    return _span(name, context=None, kind=SpanKind.INTERNAL, attributes=attributes)


def background_span(
    name: str, *, attributes: Mapping[str, Any] | None = None
) -> AbstractContextManager[Span | None]:
    """A root span for a background operation (GC run, compaction, re-replication, audit
    check): recorded whenever tracing is on, whatever the ratio."""
    if _provider is None:
        return _NOTHING
    span_attributes: dict[str, Any] = {BACKGROUND_ATTRIBUTE: True}
    if attributes:
        span_attributes.update(attributes)
    return _span(name, context=Context(), kind=SpanKind.INTERNAL, attributes=span_attributes)
