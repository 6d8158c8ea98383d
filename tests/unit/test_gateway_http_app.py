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
from shared.models import ListUnderreplicatedReply, UnderreplicatedLedger
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


class Auditor:
    """The AuditorClient's side as the routes see it: what it was asked, and `refuse` raised
    instead of an answer (as the real client raises the auditor's documented codes)."""

    def __init__(self, refuse: QuireError | None = None) -> None:
        self.refuse = refuse
        self.calls: list[tuple] = []

    async def _answer(self, *call) -> dict:
        self.calls.append(call)
        if self.refuse is not None:
            raise self.refuse
        return {"ledgers_marked": 2}

    async def trigger_audit(self) -> dict:
        return await self._answer("trigger_audit")

    async def recover_bookie(self, bookie_ids: list[str], delete_cookie: bool) -> dict:
        return await self._answer("recover_bookie", bookie_ids, delete_cookie)

    async def decommission(self, bookie_id: str) -> dict:
        return await self._answer("decommission", bookie_id)


class Queue:
    """The metadata client's under-replication queue: one page of these rows."""

    def __init__(self, rows: dict[int, list[str]]) -> None:
        self.rows = rows

    async def list_underreplicated(self, after, limit) -> ListUnderreplicatedReply:
        return ListUnderreplicatedReply(
            ledgers=[
                UnderreplicatedLedger(
                    ledger_id=ledger_id, missing_bookies=missing, mark_version=1, marked_at=0
                )
                for ledger_id, missing in self.rows.items()
            ],
            next_after=None,
        )


class AdminLedgers:
    def __init__(self, auditor: Auditor, rows: dict[int, list[str]] | None = None) -> None:
        self.auditor = auditor
        self.meta = Queue(rows or {})


async def test_auto_recovery_commands_go_to_the_auditor_with_bookkeepers_bodies() -> None:
    auditor = Auditor()
    async with client(AdminLedgers(auditor)) as http:
        audit = await http.put("/api/v1/autorecovery/trigger_audit")
        recover = await http.put(
            "/api/v1/autorecovery/bookie",
            json={"bookie_src": ["bookie-3", "bookie-2", "bookie-3"], "delete_cookie": True},
        )
        decommission = await http.put(
            "/api/v1/autorecovery/decommission", json={"bookie_src": "bookie-2"}
        )
    assert [r.status_code for r in (audit, recover, decommission)] == [200, 200, 200]
    assert audit.json() == {"ledgers_marked": 2}
    assert auditor.calls == [
        ("trigger_audit",),
        ("recover_bookie", ["bookie-2", "bookie-3"], True),
        ("decommission", "bookie-2"),
    ]


async def test_auto_recovery_command_errors_have_their_documented_codes() -> None:
    cases = [
        (QuireError(ApiCodes.UNAVAILABLE, "no auditor is elected"), 503, "UNAVAILABLE"),
        (
            QuireError(ApiCodes.INVALID_ARGUMENT, "bookie bookie-2 is registered writable"),
            400,
            "INVALID_ARGUMENT",
        ),
    ]
    for refusal, status, code in cases:
        async with client(AdminLedgers(Auditor(refusal))) as http:
            response = await http.put(
                "/api/v1/autorecovery/decommission", json={"bookie_src": "bookie-2"}
            )
        assert (response.status_code, response.json()["code"]) == (status, code)
        assert response.json()["detail"] == refusal.detail
        assert response.headers["content-type"] == "application/problem+json"


async def test_bad_auto_recovery_bodies_never_reach_the_auditor() -> None:
    auditor = Auditor()
    bad = [
        ("/api/v1/autorecovery/decommission", {}),
        ("/api/v1/autorecovery/decommission", {"bookie_src": ["bookie-2"]}),
        ("/api/v1/autorecovery/decommission", {"bookie_src": "bookie 2; rm"}),
        ("/api/v1/autorecovery/bookie", {"bookie_src": []}),
        ("/api/v1/autorecovery/bookie", {"bookie_src": "bookie-2"}),
        ("/api/v1/autorecovery/bookie", {"bookie_src": ["bookie-2"], "delete_cookie": "maybe"}),
        ("/api/v1/autorecovery/bookie", {"bookie_src": ["bookie-2"], "delete_cookie": 0}),
        ("/api/v1/autorecovery/bookie", {"bookie_src": ["bookie-2"], "extra": 1}),
    ]
    async with client(AdminLedgers(auditor)) as http:
        for path, body in bad:
            response = await http.put(path, json=body)
            assert response.status_code == 422, (path, body, response.text)
            assert response.json()["code"] == "INVALID_ARGUMENT"
    assert auditor.calls == []


async def test_list_under_replicated_ledger_answers_as_bookkeeper() -> None:
    rows = {3: ["bookie-1"], 5: ["bookie-1", "bookie-2"], 8: ["bookie-2"]}
    path = "/api/v1/autorecovery/list_under_replicated_ledger"
    async with client(AdminLedgers(Auditor(), rows)) as http:
        ids = (await http.get(path)).json()
        missing = (await http.get(path, params={"printmissingreplica": "true"})).json()
        only = (await http.get(path, params={"missingreplica": "bookie-1"})).json()
        excluding = (await http.get(path, params={"excludingmissingreplica": "bookie-1"})).json()
        both = (
            await http.get(
                path, params={"missingreplica": "bookie-2", "excludingmissingreplica": "bookie-1"}
            )
        ).json()
    assert ids == [3, 5, 8]
    assert missing == {"3": ["bookie-1"], "5": ["bookie-1", "bookie-2"], "8": ["bookie-2"]}
    assert (only, excluding, both) == ([3, 5], [8], [8])
    async with client(AdminLedgers(Auditor(), {})) as http:
        assert (await http.get(path)).json() == []
