"""RFC 9457 problem details: the one shape every HTTP error of the gateway leaves in."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from shared.status import ApiCode

PROBLEM_MEDIA_TYPE = "application/problem+json"


class Problem(BaseModel):
    """RFC 9457 problem details, with Quire's machine-readable `code`."""

    type: str
    title: str
    status: int
    detail: str
    code: str


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body = {
        "type": f"urn:quire:problem:{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        **extensions,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def api_problem(
    api: ApiCode, detail: str, headers: dict[str, str] | None = None, **extensions: Any
) -> JSONResponse:
    return problem(api.http_status, api.code, api.title, detail, headers, **extensions)
