"""The gateway's HTTP API (API.md section 2), a FastAPI app over `Ledgers`.

Every error leaves as RFC 9457 `application/problem+json` with a stable `code`: the
service's own errors (QuireError), FastAPI's validation errors (422 INVALID_ARGUMENT),
unknown routes, and anything unexpected (500, logged, never a crash)."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.admin import create_admin_router
from services.gateway.admission import AdmissionControl
from services.gateway.auth import BearerAuthMiddleware, TokenAuth
from services.gateway.ledgers import (
    RESERVED_METADATA_PREFIX,
    WRITER_GRPC_KEY,
    WRITER_HTTP_KEY,
    Ledgers,
    Page,
    WriterElsewhere,
)
from services.gateway.limits import check_batch_size, check_entry_size
from services.gateway.metrics import GatewayMetrics
from services.gateway.problems import (
    PROBLEM_MEDIA_TYPE,
    Problem,
    ResponseCut,
    api_problem,
    api_problem_body,
    error_responses,
    problem,
)
from services.gateway.tracing import instrument_http
from shared import __version__
from shared.config import GatewaySettings
from shared.digest import DigestType
from shared.models import MAX_LEDGER_ID
from shared.status import ApiCodes, QuireError

log = logging.getLogger(__name__)

PASSWORD_HEADER = "Quire-Ledger-Password"
# A 307's header naming the writer's gRPC address (Location names its HTTP one).
WRITER_GRPC_HEADER = "Quire-Writer-Grpc"
NDJSON = "application/x-ndjson"
MAX_PASSWORD_CHARS = 4096

LedgerId = Annotated[int, Path(ge=0, le=MAX_LEDGER_ID, description="The ledger id")]
EntryId = Annotated[int, Path(ge=0, le=MAX_LEDGER_ID, description="The entry id")]
BookieIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]+$", max_length=128)]
Password = Annotated[str | None, Header(alias=PASSWORD_HEADER, description="The ledger password")]


ERROR_RESPONSES = error_responses()
READ_RANGE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The entries, streamed: one JSON document, or NDJSON when asked",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "entries": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "entry_id": {"type": "integer"},
                                    "data": {"type": "string", "format": "byte"},
                                },
                            },
                        },
                        "lac": {"type": "integer"},
                    },
                }
            },
            NDJSON: {"schema": {"type": "string"}},
        },
    }
}


# The answer of a gateway that does not hold an OPEN ledger's writer, where another does.
WRITER_REDIRECT_RESPONSE: dict[int | str, dict[str, Any]] = {
    307: {
        "description": (
            "WRITER_REDIRECT: another gateway holds this OPEN ledger's writer (the one it "
            f"recorded in the ledger's metadata, `{WRITER_HTTP_KEY}` and `{WRITER_GRPC_KEY}`). "
            "Repeat the request, same method and body, at `Location`; the writer never "
            "redirects, so follow at most once. The body is a problem with `writer`."
        ),
        "headers": {
            "Location": {"schema": {"type": "string"}, "description": "The same path there"},
            WRITER_GRPC_HEADER: {
                "schema": {"type": "string"},
                "description": "The writer's gRPC address, host:port",
            },
        },
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
}


# -- bodies ---------------------------------------------------------------------------------------


class CreateLedgerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ensemble_size: int = Field(default=3, ge=1, le=1000)
    write_quorum: int = Field(default=3, ge=1, le=1000)
    ack_quorum: int = Field(default=2, ge=1, le=1000)
    digest: DigestType = DigestType.CRC32C
    password: str = Field(max_length=MAX_PASSWORD_CHARS)
    metadata: dict[str, str] = Field(
        default_factory=dict,
        description=(
            f"Custom metadata. Keys under `{RESERVED_METADATA_PREFIX}` are Quire's own (400): "
            f"the creating gateway adds `{WRITER_HTTP_KEY}` and `{WRITER_GRPC_KEY}`, where its "
            "writer is."
        ),
    )


APPEND_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["entries"],
                    "additionalProperties": False,
                    "properties": {
                        "entries": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "format": "byte"},
                        }
                    },
                }
            },
        },
    }
}


def password_bytes(header: str | None) -> bytes | None:
    # Starlette decodes header bytes as latin-1: this gives the client's bytes back.
    return None if header is None else header.encode("latin-1")


async def read_body(request: Request, limit_bytes: int, what: str) -> bytes:
    """The request body, refused with 413 as soon as it grows past `limit_bytes`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise QuireError(
            ApiCodes.ENTRY_TOO_LARGE, f"{what} of {declared} bytes exceeds {limit_bytes} bytes"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise QuireError(ApiCodes.ENTRY_TOO_LARGE, f"{what} exceeds {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def entry_json(entry_id: int, payload: bytes) -> dict[str, Any]:
    return {"entry_id": entry_id, "data": base64.b64encode(payload).decode()}


def entries_json(entries: list[tuple[int, bytes]]) -> bytes:
    """A page's entries as the comma-separated items of a JSON array."""
    return b",".join(json.dumps(entry_json(e, p)).encode() for e, p in entries)


def accepts_ndjson(request: Request) -> bool:
    """Whether the client asked for the NDJSON form of a range read."""
    accept = request.headers.get("accept", "")
    return any(part.split(";")[0].strip().lower() == NDJSON for part in accept.split(","))


class RangeResponse(StreamingResponse):
    """A range read's streamed answer. However it ends (whole, failed, its client gone,
    its deadline passed) it closes its body and the pages under it, so that the read stops
    at once and asks the bookies nothing more."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        pages: AsyncGenerator[Page, None],
        media_type: str,
    ) -> None:
        super().__init__(body, media_type=media_type)
        self.generators = (body, pages)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for generator in self.generators:
                await generator.aclose()


async def page_entries(
    head: Page, pages: AsyncGenerator[Page, None], metrics: GatewayMetrics
) -> AsyncIterator[list[tuple[int, bytes]]]:
    """The entries of the head page and of each page after it, as they are read; each page
    counted (what the gateway holds of the range at once)."""
    metrics.read_stream_batches.observe(len(head.entries))
    yield head.entries
    async for page in pages:
        metrics.read_stream_batches.observe(len(page.entries))
        yield page.entries


async def json_body(
    head: Page, pages: AsyncGenerator[Page, None], metrics: GatewayMetrics
) -> AsyncGenerator[bytes, None]:
    """The documented JSON document, written as the pages come. An error after the head is
    a ResponseCut: the document stays incomplete."""
    yield b'{"entries": ['
    separator = b""
    try:
        async for entries in page_entries(head, pages, metrics):
            if entries:
                yield separator + entries_json(entries)
                separator = b","
    except QuireError as error:
        raise ResponseCut(error) from error
    # A confirmed range ends at the LAC the head saw: the one LAC of the whole document.
    yield f'], "lac": {head.lac}}}'.encode()


async def ndjson_body(
    head: Page, pages: AsyncGenerator[Page, None], metrics: GatewayMetrics
) -> AsyncGenerator[bytes, None]:
    """One JSON object a line: the entries, then `{"lac": m}` once the range is read whole,
    or `{"error": {problem}}` when it fails. A body that ends with neither was cut."""
    try:
        async for entries in page_entries(head, pages, metrics):
            if entries:
                yield b"".join(json.dumps(entry_json(e, p)).encode() + b"\n" for e, p in entries)
    except QuireError as error:
        log.warning("range read failed", extra={"code": error.api.code, "detail": error.detail})
        yield json.dumps({"error": api_problem_body(error.api, error.detail)}).encode() + b"\n"
        return
    yield json.dumps({"lac": head.lac}).encode() + b"\n"


def parse_batch(body: bytes, settings: GatewaySettings) -> list[bytes]:
    """The entries of a JSON batch; any invalid item refuses the whole batch."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise QuireError(ApiCodes.INVALID_ARGUMENT, f"the body is not JSON: {exc}") from exc
    if not isinstance(document, dict) or set(document) != {"entries"}:
        raise QuireError(ApiCodes.INVALID_ARGUMENT, 'the body must be {"entries": [...]}')
    entries = document["entries"]
    if not isinstance(entries, list) or not entries:
        raise QuireError(ApiCodes.INVALID_ARGUMENT, "entries must be a non-empty list")
    check_batch_size(len(entries), settings)
    payloads = []
    for index, item in enumerate(entries):
        if not isinstance(item, str):
            raise QuireError(ApiCodes.INVALID_ARGUMENT, f"entries[{index}] is not a string")
        try:
            payload = base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT, f"entries[{index}] is not valid base64: {exc}"
            ) from exc
        check_entry_size(len(payload), settings, f"entries[{index}]")
        payloads.append(payload)
    return payloads


# -- middleware -------------------------------------------------------------------------------


class ProblemsAndMetrics:
    """Outermost but one: counts requests by route and status, and turns any exception that
    escaped the app into a 500 problem (logged), so that nothing takes the service down."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except ResponseCut as cut:
            # Returning with the body incomplete has the server close the connection.
            log.warning("response cut after it started: %s", cut, extra={"path": scope.get("path")})
            status = cut.error.api.http_status
        except Exception:
            log.exception("request failed", extra={"path": scope.get("path")})
            if not started:
                response = api_problem(
                    ApiCodes.INTERNAL, "an unexpected error occurred; it was logged"
                )
                await response(scope, receive, send)
            status = 500
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.http_requests.labels(scope.get("method", ""), route, str(status)).inc()


# -- the app --------------------------------------------------------------------------------------


def create_app(
    ledgers: Ledgers,
    settings: GatewaySettings,
    metrics: GatewayMetrics | None = None,
    auth: TokenAuth | None = None,
) -> FastAPI:
    metrics = metrics or ledgers.metrics
    app = FastAPI(
        title="Quire gateway",
        version=__version__,
        description="A replicated, append-only ledger store (BookKeeper's model).",
        # Operation ids are the handlers' names: stable, and what generated clients call.
        generate_unique_id_function=lambda route: route.name,
    )
    # Outermost last: problems and metrics see everything, then authentication, then
    # admission control, then the routes.
    app.add_middleware(
        AdmissionControl,
        max_in_flight_per_client=settings.max_requests_in_flight_per_client,
        request_timeout_ms=settings.request_timeout_ms,
        long_poll_timeout_ms=settings.long_poll_max_timeout_ms + settings.request_timeout_ms,
    )
    app.add_middleware(BearerAuthMiddleware, auth=auth or TokenAuth(frozenset()))
    app.add_middleware(ProblemsAndMetrics, metrics=metrics)
    install_error_handlers(app)
    install_problem_schema(app)
    instrument_http(app)
    app.include_router(create_admin_router(ledgers))

    @app.post("/v1/ledgers", status_code=201, responses=ERROR_RESPONSES, tags=["ledgers"])
    async def create_ledger(body: CreateLedgerBody) -> dict[str, Any]:
        created = await ledgers.create(
            ensemble_size=body.ensemble_size,
            write_quorum=body.write_quorum,
            ack_quorum=body.ack_quorum,
            digest=body.digest,
            password=body.password.encode(),
            metadata=body.metadata,
        )
        return created.public()

    @app.get(
        "/v1/ledgers/{ledger_id}",
        responses=ERROR_RESPONSES,
        tags=["ledgers"],
        description=(
            "The ledger's metadata. `metadata` holds the custom metadata given at creation "
            f"and, under `{WRITER_HTTP_KEY}` and `{WRITER_GRPC_KEY}`, the address of the "
            "gateway that created it: the one that holds its writer, where its appends and "
            "close go."
        ),
    )
    async def get_ledger(ledger_id: LedgerId) -> dict[str, Any]:
        return (await ledgers.get(ledger_id)).public()

    @app.get("/v1/ledgers", responses=ERROR_RESPONSES, tags=["ledgers"])
    async def list_ledgers(
        after: Annotated[int | None, Query(ge=-1, le=MAX_LEDGER_ID)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        page = await ledgers.list(after, limit)
        return {"ledgers": [m.public() for m in page.ledgers], "next_after": page.next_after}

    @app.delete(
        "/v1/ledgers/{ledger_id}", status_code=204, responses=ERROR_RESPONSES, tags=["ledgers"]
    )
    async def delete_ledger(ledger_id: LedgerId, password: Password = None) -> Response:
        """Delete the ledger's metadata. Its entries stay on the bookies' disks: no garbage
        collection runs."""
        await ledgers.delete(ledger_id, password_bytes(password))
        return Response(status_code=204)

    @app.post(
        "/v1/ledgers/{ledger_id}/entries",
        responses={**ERROR_RESPONSES, **WRITER_REDIRECT_RESPONSE},
        tags=["entries"],
        openapi_extra=APPEND_BODY_DOC,
    )
    async def append(
        ledger_id: LedgerId, request: Request, password: Password = None
    ) -> dict[str, int]:
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type == "application/octet-stream":
            payload = await read_body(request, settings.max_entry_size_bytes, "the entry")
            _, last, lac = await ledgers.append(ledger_id, password_bytes(password), [payload])
            return {"entry_id": last, "lac": lac}
        if media_type == "application/json":
            body = await read_body(request, settings.max_batch_bytes, "the batch")
            payloads = parse_batch(body, settings)
            first, last, lac = await ledgers.append(ledger_id, password_bytes(password), payloads)
            return {"first_entry_id": first, "last_entry_id": last, "lac": lac}
        raise QuireError(
            ApiCodes.INVALID_ARGUMENT,
            "Content-Type must be application/octet-stream (one entry) or "
            f"application/json (a batch), not {media_type or 'missing'}",
        )

    @app.get(
        "/v1/ledgers/{ledger_id}/entries",
        responses={**ERROR_RESPONSES, **READ_RANGE_RESPONSE},
        tags=["entries"],
    )
    async def read_range(
        ledger_id: LedgerId,
        request: Request,
        first: Annotated[int, Query(alias="from", ge=0, le=MAX_LEDGER_ID)] = 0,
        last: Annotated[int | None, Query(alias="to", ge=0, le=MAX_LEDGER_ID)] = None,
        unconfirmed: bool = False,
        password: Password = None,
    ) -> RangeResponse:
        """Entries first..last (`to` omitted: up to the LAC), capped at the LAC unless
        `unconfirmed`, written out as they are read: a range of any length, never held whole.
        JSON by default, `{"entries": [...], "lac": m}`: an error after the first entries
        cuts the connection, so the document never parses. `Accept: application/x-ndjson`:
        one object a line, each entry, then `{"lac": m}`, or `{"error": {problem}}`."""
        pages = ledgers.read_stream(ledger_id, password_bytes(password), first, last, unconfirmed)
        # The first page is read before answering, so that its errors get their status.
        head = await anext(pages)
        if accepts_ndjson(request):
            return RangeResponse(ndjson_body(head, pages, metrics), pages, NDJSON)
        return RangeResponse(json_body(head, pages, metrics), pages, "application/json")

    @app.get(
        "/v1/ledgers/{ledger_id}/entries/{entry_id}",
        tags=["entries"],
        responses={
            **ERROR_RESPONSES,
            200: {"content": {"application/octet-stream": {}}, "description": "The entry's bytes"},
        },
    )
    async def read_entry(
        ledger_id: LedgerId, entry_id: EntryId, unconfirmed: bool = False, password: Password = None
    ) -> Response:
        payload, lac = await ledgers.read_entry(
            ledger_id, password_bytes(password), entry_id, unconfirmed
        )
        return Response(
            payload, media_type="application/octet-stream", headers={"Quire-LAC": str(lac)}
        )

    @app.get("/v1/ledgers/{ledger_id}/lac", responses=ERROR_RESPONSES, tags=["entries"])
    async def read_lac(
        ledger_id: LedgerId,
        after: Annotated[int | None, Query(ge=-1, le=MAX_LEDGER_ID)] = None,
        timeout_ms: Annotated[int, Query(ge=0)] = 0,
        password: Password = None,
    ) -> dict[str, int]:
        lac = await ledgers.read_lac(ledger_id, password_bytes(password), after, timeout_ms)
        return {"lac": lac}

    @app.post(
        "/v1/ledgers/{ledger_id}/close",
        responses={**ERROR_RESPONSES, **WRITER_REDIRECT_RESPONSE},
        tags=["ledgers"],
    )
    async def close_ledger(ledger_id: LedgerId, password: Password = None) -> dict[str, Any]:
        closed = await ledgers.close(ledger_id, password_bytes(password))
        return {
            "state": closed.state.value,
            "last_entry_id": closed.last_entry_id,
            "length": closed.length,
        }

    @app.post("/v1/ledgers/{ledger_id}/recover", responses=ERROR_RESPONSES, tags=["ledgers"])
    async def recover_ledger(ledger_id: LedgerId, password: Password = None) -> dict[str, Any]:
        """Fence the ledger on its bookies, recover its true last entry, close it."""
        closed = await ledgers.recover(ledger_id, password_bytes(password))
        return {
            "state": closed.state.value,
            "last_entry_id": closed.last_entry_id,
            "length": closed.length,
        }

    @app.get("/v1/bookies", responses=ERROR_RESPONSES, tags=["bookies"])
    async def list_bookies() -> dict[str, Any]:
        """Every registered bookie's registry row, with its network location (`location`:
        QUIRE_BOOKIE_LOCATION, the default for a bookie that registered none)."""
        rows = await ledgers.list_bookies()
        return {"bookies": [{**b.model_dump(mode="json"), "location": b.location} for b in rows]}

    @app.get("/v1/bookies/{bookie_id}", responses=ERROR_RESPONSES, tags=["bookies"])
    async def bookie_info(bookie_id: BookieIdPath) -> Any:
        """The bookie's registry row and what it says of itself (`info` on its journal):
        free and total space, state, last log mark, disk files."""
        return await ledgers.bookie_info(bookie_id)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], responses=error_responses(503))
    async def readyz() -> Any:
        status = await ledgers.readiness()
        if status["ready"]:
            return status
        return api_problem(
            ApiCodes.UNAVAILABLE,
            "not ready: needs NATS, the metadata service "
            f"and {settings.ready_min_writable_bookies} writable bookies",
            **status,
        )

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(QuireError)
    async def quire_error(request: Request, exc: QuireError) -> JSONResponse:
        if isinstance(exc, WriterElsewhere):
            return writer_redirect(request, exc)
        return api_problem(exc.api, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors)
        return problem(
            422,
            ApiCodes.INVALID_ARGUMENT.code,
            ApiCodes.INVALID_ARGUMENT.title,
            detail or "invalid request",
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(
            exc.status_code, "INVALID_ARGUMENT" if exc.status_code < 500 else "INTERNAL"
        )
        response = problem(exc.status_code, code, str(exc.detail), str(exc.detail))
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response


def writer_redirect(request: Request, exc: WriterElsewhere) -> JSONResponse:
    """307 to the same path and query on the writer's gateway: a 307 keeps the method and
    the body (RFC 9110), so the client repeats the very request there."""
    location = exc.writer.http.rstrip("/") + request.url.path
    if request.url.query:
        location += f"?{request.url.query}"
    headers = {"Location": location, WRITER_GRPC_HEADER: exc.writer.grpc}
    writer = {"http": exc.writer.http, "grpc": exc.writer.grpc}
    return api_problem(exc.api, exc.detail, headers, writer=writer)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_problem_schema(app: FastAPI) -> None:
    """Put the Problem schema into the OpenAPI components the error responses refer to."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components["Problem"] = Problem.model_json_schema()
            # FastAPI documents its own 422 body; ours is a problem like every error.
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            problem_content = {
                PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}
            }
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    for status, response in operation.get("responses", {}).items():
                        if status[0] in "45":
                            response["content"] = problem_content
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
