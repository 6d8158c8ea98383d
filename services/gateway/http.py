"""The gateway's HTTP API (API.md section 2), a FastAPI app over `Ledgers`.

Every error leaves as RFC 9457 `application/problem+json` with a stable `code`: the
service's own errors (QuireError), FastAPI's validation errors (422 INVALID_ARGUMENT),
unknown routes, and anything unexpected (500, logged, never a crash)."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.ledgers import Ledgers
from services.gateway.metrics import GatewayMetrics
from shared import __version__
from shared.config import GatewaySettings
from shared.digest import DigestType
from shared.models import MAX_LEDGER_ID
from shared.status import ApiCode, ApiCodes, QuireError
from shared.subjects import Subjects

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
PASSWORD_HEADER = "Quire-Ledger-Password"
MAX_PASSWORD_CHARS = 4096

LedgerId = Annotated[int, Path(ge=0, le=MAX_LEDGER_ID, description="The ledger id")]
EntryId = Annotated[int, Path(ge=0, le=MAX_LEDGER_ID, description="The entry id")]
Password = Annotated[str | None, Header(alias=PASSWORD_HEADER, description="The ledger password")]


# -- problems -----------------------------------------------------------------------------------


class Problem(BaseModel):
    """RFC 9457 problem details, with Quire's machine-readable `code`."""

    type: str
    title: str
    status: int
    detail: str
    code: str


BOOKIE_INFO_TIMEOUT_S = 2.0


def problem(status: int, code: str, title: str, detail: str, **extensions: Any) -> JSONResponse:
    body = {
        "type": f"urn:quire:problem:{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        **extensions,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE)


def api_problem(api: ApiCode, detail: str, **extensions: Any) -> JSONResponse:
    return problem(api.http_status, api.code, api.title, detail, **extensions)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": description}
    for status, description in [
        (400, "INVALID_ARGUMENT"),
        (403, "UNAUTHORIZED: missing or wrong ledger password"),
        (404, "NO_SUCH_LEDGER or NO_SUCH_ENTRY"),
        (409, "LEDGER_CLOSED or LEDGER_FENCED"),
        (413, "ENTRY_TOO_LARGE"),
        (503, "NOT_ENOUGH_BOOKIES or UNAVAILABLE"),
        (504, "TIMEOUT"),
    ]
}


# -- bodies ---------------------------------------------------------------------------------------


class CreateLedgerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ensemble_size: int = Field(default=3, ge=1, le=1000)
    write_quorum: int = Field(default=3, ge=1, le=1000)
    ack_quorum: int = Field(default=2, ge=1, le=1000)
    digest: DigestType = DigestType.CRC32C
    password: str = Field(max_length=MAX_PASSWORD_CHARS)
    metadata: dict[str, str] = Field(default_factory=dict)


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
    if len(entries) > settings.max_batch_entries:
        raise QuireError(
            ApiCodes.INVALID_ARGUMENT,
            f"{len(entries)} entries exceed the batch limit of {settings.max_batch_entries}",
        )
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
        if len(payload) > settings.max_entry_size_bytes:
            raise QuireError(
                ApiCodes.ENTRY_TOO_LARGE,
                f"entries[{index}] is {len(payload)} bytes, more than "
                f"{settings.max_entry_size_bytes}",
            )
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
    ledgers: Ledgers, settings: GatewaySettings, metrics: GatewayMetrics | None = None
) -> FastAPI:
    metrics = metrics or ledgers.metrics
    app = FastAPI(
        title="Quire gateway",
        version=__version__,
        description="A replicated, append-only ledger store (BookKeeper's model).",
    )
    app.add_middleware(ProblemsAndMetrics, metrics=metrics)
    install_error_handlers(app)

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

    @app.get("/v1/ledgers/{ledger_id}", responses=ERROR_RESPONSES, tags=["ledgers"])
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
        await ledgers.delete(ledger_id, password_bytes(password))
        return Response(status_code=204)

    @app.post(
        "/v1/ledgers/{ledger_id}/entries",
        responses=ERROR_RESPONSES,
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

    @app.get("/v1/ledgers/{ledger_id}/entries", responses=ERROR_RESPONSES, tags=["entries"])
    async def read_range(
        ledger_id: LedgerId,
        first: Annotated[int, Query(alias="from", ge=0, le=MAX_LEDGER_ID)] = 0,
        last: Annotated[int | None, Query(alias="to", ge=0, le=MAX_LEDGER_ID)] = None,
        unconfirmed: bool = False,
        password: Password = None,
    ) -> dict[str, Any]:
        entries, lac = await ledgers.read_range(
            ledger_id, password_bytes(password), first, last, unconfirmed
        )
        return {
            "entries": [{"entry_id": e, "data": base64.b64encode(p).decode()} for e, p in entries],
            "lac": lac,
        }

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

    @app.post("/v1/ledgers/{ledger_id}/close", responses=ERROR_RESPONSES, tags=["ledgers"])
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
        return {"bookies": [b.model_dump(mode="json") for b in await ledgers.list_bookies()]}

    @app.get("/v1/bookies/{bookie_id}", responses=ERROR_RESPONSES, tags=["bookies"])
    async def bookie_info(
        bookie_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]+$", max_length=128)],
    ) -> Any:
        """The bookie's registry row and what it says of itself (`info` on its journal):
        free and total space, state, last log mark, disk files."""
        registered = {b.bookie_id: b for b in await ledgers.list_bookies()}
        subject = Subjects(ledgers.settings.subject_prefix).bookie(bookie_id, "info")
        try:
            reply = await ledgers.nc.request(subject, b"", timeout=BOOKIE_INFO_TIMEOUT_S)
            info: dict[str, Any] | None = json.loads(reply.data)
        except Exception:  # not running, or not answering: the registry row is all we have
            info = None
        row = registered.get(bookie_id)
        if row is None and info is None:
            return problem(404, "NO_SUCH_BOOKIE", "No such bookie", f"no bookie {bookie_id}")
        body: dict[str, Any] = {"bookie_id": bookie_id, **(info or {})}
        body["state"] = row.state.value if row else body.get("state")
        body["registry"] = row.model_dump(mode="json") if row else None
        body["reachable"] = info is not None
        return body

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], responses={503: {"model": Problem}})
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
    async def quire_error(_: Request, exc: QuireError) -> JSONResponse:
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
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(
            exc.status_code, "INVALID_ARGUMENT" if exc.status_code < 500 else "INTERNAL"
        )
        response = problem(exc.status_code, code, str(exc.detail), str(exc.detail))
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response
