"""The gateway's edge of every trace: the official OpenTelemetry instrumentations of FastAPI
and gRPC open the request's SERVER span (where the sampling decision is made, or a sampled
`traceparent` is followed), and every answer names that span in `traceresponse`
(W3C Trace Context Level 2: `00-<trace_id>-<span_id>-<flags>`, sampled or not): an HTTP
header, gRPC trailing metadata. A user can then look up the trace of any call
(`quire trace show`).

With tracing off (`OTEL_SDK_DISABLED=true`: no provider) nothing is instrumented at all.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters
from opentelemetry.instrumentation.propagators import (
    TraceResponsePropagator,
    set_global_response_propagator,
)
from opentelemetry.trace import SpanContext

from shared.telemetry import tracer_provider

TRACERESPONSE = "traceresponse"
# Probes and scrapes are not traced (regular expressions searched in the URL).
UNTRACED_URLS = ("/healthz$", "/readyz$", "/metrics$")
FASTAPI_EXCLUDED_URLS_ENV = "OTEL_PYTHON_FASTAPI_EXCLUDED_URLS"


def traceresponse(span_context: SpanContext) -> str | None:
    """The `traceresponse` value naming `span_context`; None for no span."""
    if not span_context.is_valid:
        return None
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{int(span_context.trace_flags):02x}"
    )


def instrument_http(app: FastAPI) -> None:
    """Trace the app's requests (but probes and scrapes) and answer each with
    `traceresponse`. The instrumentation's middleware is the outermost, so every answer
    passes it: problem+json errors (the app's handlers and ProblemsAndMetrics' 500s),
    refusals by admission control and authentication, and streamed reads (the header goes
    with the response's start). Its per-message "send"/"receive" spans are left out: a
    streamed read would make one per page."""
    provider = tracer_provider()
    if provider is None:
        return
    set_global_response_propagator(TraceResponsePropagator())
    excluded = [os.environ.get(FASTAPI_EXCLUDED_URLS_ENV, ""), *UNTRACED_URLS]
    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=provider,
        excluded_urls=",".join(url for url in excluded if url),
        exclude_spans=["receive", "send"],
    )


def grpc_interceptors(service_name: str) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors that trace calls to `service_name` (health checks and reflection
    are not traced), outermost first: the official server interceptor (its span is
    current inside), then ours, which puts `traceresponse` in the trailing metadata."""
    provider = tracer_provider()
    if provider is None:
        return []
    return [
        aio_server_interceptor(
            tracer_provider=provider, filter_=filters.service_name(service_name)
        ),
        TraceResponseInterceptor(service_name),
    ]


class TraceResponseInterceptor(grpc.aio.ServerInterceptor):
    """Trailing metadata `traceresponse` of the call's current (SERVER) span, on every
    ending: set when the call starts, and added to the trailing metadata of an abort
    (which replaces what was set)."""

    def __init__(self, service_name: str) -> None:
        self._prefix = f"/{service_name}/"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefix):
            return handler
        return _answering(handler)


class _TraceResponseContext:
    """A servicer context whose aborts keep `traceresponse` in the trailing metadata."""

    def __init__(self, context: Any, value: str) -> None:
        self._context = context
        self._value = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._context.set_trailing_metadata((*metadata, (TRACERESPONSE, self._value)))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        await self._context.abort(code, details, (*trailing_metadata, (TRACERESPONSE, self._value)))

    async def abort_with_status(self, status: grpc.Status) -> None:
        # The wrapped context's own abort_with_status would call its abort, not ours.
        await self.abort(status.code, status.details, status.trailing_metadata)


def _answered(context: Any) -> Any:
    value = traceresponse(trace.get_current_span().get_span_context())
    if value is None:
        return context
    context.set_trailing_metadata(((TRACERESPONSE, value),))
    return _TraceResponseContext(context, value)


def _answering(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler` of the same streaming shape, its context answering with `traceresponse`."""
    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary or handler.stream_unary:
        behavior = handler.unary_unary or handler.stream_unary

        async def unary(request: Any, context: Any) -> Any:
            return await behavior(request, _answered(context))

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(unary, **serializers)
        return grpc.stream_unary_rpc_method_handler(unary, **serializers)
    streaming_behavior = handler.unary_stream or handler.stream_stream

    async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in streaming_behavior(request, _answered(context)):
            yield response

    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **serializers)
    return grpc.stream_stream_rpc_method_handler(streaming, **serializers)
