"""The gateway app's error envelope, in process (httpx's ASGI transport): whatever goes
wrong inside, the caller gets RFC 9457 problem+json and the app keeps serving."""

from __future__ import annotations

import base64
import json

import httpx

from services.gateway.http import create_app
from services.gateway.ledgers import Page
from services.gateway.metrics import GatewayMetrics
from shared.config import GatewaySettings
from shared.status import ApiCodes, QuireError


class ExplodingLedgers:
    """Only what these requests reach: `get` fails as a programmer error would."""

    def __init__(self) -> None:
        self.calls = 0

    async def get(self, ledger_id: int):
        self.calls += 1
        if ledger_id == 1:
            raise QuireError(ApiCodes.NO_SUCH_LEDGER, "no ledger 1")
        raise RuntimeError("a bug")


def client(ledgers) -> httpx.AsyncClient:
    app = create_app(ledgers, GatewaySettings(), GatewayMetrics())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


async def test_an_unexpected_exception_is_a_500_problem_and_the_app_keeps_serving() -> None:
    ledgers = ExplodingLedgers()
    async with client(ledgers) as http:
        response = await http.get("/v1/ledgers/2")
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "INTERNAL" and "a bug" not in response.text
        response = await http.get("/v1/ledgers/1")
        assert response.status_code == 404 and response.json()["code"] == "NO_SUCH_LEDGER"
        metrics = (await http.get("/metrics")).text
    assert ledgers.calls == 2
    assert 'route="/v1/ledgers/{ledger_id}",status="500"' in metrics


async def test_validation_errors_are_invalid_argument_problems() -> None:
    async with client(ExplodingLedgers()) as http:
        response = await http.post("/v1/ledgers", json={"ensemble_size": "three"})
    problem = response.json()
    assert response.status_code == 422 and problem["code"] == "INVALID_ARGUMENT"
    assert response.headers["content-type"] == "application/problem+json"
    assert {e["loc"][-1] for e in problem["errors"]} == {"ensemble_size", "password"}


class PagedLedgers:
    """`read_stream` over fixed pages; `fail_after` pages, the next raises (a read that
    fails part way); `refuse` fails before the first page (as a wrong password does)."""

    def __init__(self, pages: list[list[int]], fail_after: int | None = None, refuse=None):
        self.pages, self.fail_after, self.refuse = pages, fail_after, refuse
        self.closed = False

    async def read_stream(self, ledger_id, password, first, last, unconfirmed=False):
        try:
            if self.refuse is not None:
                raise self.refuse
            for index, ids in enumerate(self.pages):
                if index == self.fail_after:
                    raise QuireError(ApiCodes.UNAVAILABLE, f"entry {ids[0]}: no replica")
                yield Page(
                    [(i, b"e%d" % i) for i in ids], lac=9, final=index == len(self.pages) - 1
                )
        finally:
            self.closed = True


PAGES = [[0, 1, 2], [3, 4], [], [5, 6, 7]]
NDJSON = {"Accept": "application/x-ndjson"}


async def test_a_range_streams_in_either_format() -> None:
    ledgers = PagedLedgers(PAGES)
    async with client(ledgers) as http:
        document = await http.get("/v1/ledgers/1/entries")
        lines = await http.get("/v1/ledgers/1/entries", headers=NDJSON)
    entries = [{"entry_id": i, "data": base64.b64encode(b"e%d" % i).decode()} for i in range(8)]
    assert document.headers["content-type"] == "application/json"
    assert document.json() == {"entries": entries, "lac": 9}
    assert lines.headers["content-type"] == "application/x-ndjson"
    assert [json.loads(line) for line in lines.text.splitlines()] == [*entries, {"lac": 9}]
    assert ledgers.closed


async def test_an_error_before_the_first_page_has_its_status() -> None:
    refused = QuireError(ApiCodes.UNAUTHORIZED, "wrong password for ledger 1")
    async with client(PagedLedgers(PAGES, refuse=refused)) as http:
        for headers in ({}, NDJSON):
            response = await http.get("/v1/ledgers/1/entries", headers=headers)
            assert response.status_code == 403 and response.json()["code"] == "UNAUTHORIZED"


async def test_a_late_error_is_the_last_ndjson_line() -> None:
    """(The JSON form cuts the connection instead: tests/integration/test_read_stream.py,
    since httpx's ASGI transport wants every response complete.)"""
    ledgers = PagedLedgers(PAGES, fail_after=3)
    async with client(ledgers) as http:
        lines = await http.get("/v1/ledgers/1/entries", headers=NDJSON)
    *entries, last = [json.loads(line) for line in lines.text.splitlines()]
    assert [e["entry_id"] for e in entries] == [0, 1, 2, 3, 4]
    assert last["error"]["code"] == "UNAVAILABLE" and last["error"]["status"] == 503
    assert last["error"]["detail"] == "entry 5: no replica"
    assert ledgers.closed
