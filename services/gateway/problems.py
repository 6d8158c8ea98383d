"""RFC 9457 problem details: the one shape every HTTP error of the gateway leaves in."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from shared.status import ApiCode, QuireError

PROBLEM_MEDIA_TYPE = "application/problem+json"


class Problem(BaseModel):
    """RFC 9457 problem details, with Quire's machine-readable `code`."""

    type: str
    title: str
    status: int
    detail: str
    code: str


class ResponseCut(Exception):
    """An error after the response's status went out: too late for a problem, so the
    connection is cut (the body ends incomplete, its chunked encoding unterminated) and no
    client can take the part it got for the whole answer. Carries the error, for the log
    and the metrics."""

    def __init__(self, error: QuireError) -> None:
        super().__init__(f"{error.api.code}: {error.detail}")
        self.error = error


def problem_body(status: int, code: str, title: str, detail: str, **extensions: Any) -> dict:
    return {
        "type": f"urn:quire:problem:{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        **extensions,
    }


def api_problem_body(api: ApiCode, detail: str) -> dict:
    return problem_body(api.http_status, api.code, api.title, detail)


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body = problem_body(status, code, title, detail, **extensions)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def api_problem(
    api: ApiCode, detail: str, headers: dict[str, str] | None = None, **extensions: Any
) -> JSONResponse:
    return problem(api.http_status, api.code, api.title, detail, headers, **extensions)


# Every error status the API uses, described in the OpenAPI document as problem+json.
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHORIZED: a bearer token is required (when the gateway has tokens)",
    403: "UNAUTHORIZED: missing or wrong ledger password",
    404: "NO_SUCH_LEDGER, NO_SUCH_ENTRY or NOT_FOUND",
    409: "LEDGER_CLOSED or LEDGER_FENCED",
    413: "ENTRY_TOO_LARGE",
    422: "INVALID_ARGUMENT: the request does not match its schema",
    429: "TOO_MANY_REQUESTS (see Retry-After)",
    500: "INTERNAL",
    503: "NOT_ENOUGH_BOOKIES or UNAVAILABLE",
    504: "TIMEOUT",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses (all of them by default)."""
    chosen = statuses or tuple(ERROR_DESCRIPTIONS)
    return {
        status: {
            "description": ERROR_DESCRIPTIONS[status],
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in chosen
    }
