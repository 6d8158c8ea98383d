"""The gateway's garbage-collection admin paths in process (httpx's ASGI transport), over a
stand-in for the bookie client: which bodies are refused (422, nothing sent to a bookie),
which bookies a call goes to, and the shape of a fan-out with a bookie that does not answer.
The same paths against real bookies: tests/integration/test_gc_admin.py."""

from __future__ import annotations

import json

import httpx
import pytest

from services.gateway.http import create_app
from services.gateway.metrics import GatewayMetrics
from shared.bookie_client import BookieAdminError, BookieUnreachable, admin_answer
from shared.config import GatewaySettings, QuireSettings
from shared.models import BookieInfo, BookieState

DETAILS = {"gcRunning": False, "gcRuns": 3, "suspendMajor": False, "suspendMinor": True}


class Bookies:
    """The bookie client's gc calls: each recorded; `down` do not answer, `slow` time out."""

    def __init__(self, down=(), slow=()) -> None:
        self.down, self.slow = set(down), set(slow)
        self.calls: list[tuple] = []

    def _reach(self, bookie_id: str, *call) -> None:
        self.calls.append((bookie_id, *call))
        if bookie_id in self.down:
            raise BookieUnreachable(f"gc to {bookie_id}: NoRespondersError")
        if bookie_id in self.slow:
            raise BookieUnreachable(f"gc to {bookie_id}: timed out", timed_out=True)

    async def gc(self, bookie_id, force_major, force_minor, wait, timeout_s):
        self._reach(bookie_id, "gc", force_major, force_minor, wait, timeout_s)
        return {"run": {"ledgers_deleted": 2}} if wait else {"triggered": True}

    async def gc_details(self, bookie_id, timeout_s):
        self._reach(bookie_id, "details")
        return dict(DETAILS)

    async def gc_suspend(self, bookie_id, major, minor, timeout_s):
        self._reach(bookie_id, "suspend", major, minor)
        return {"suspendMajor": major, "suspendMinor": True}

    async def gc_resume(self, bookie_id, major, minor, timeout_s):
        self._reach(bookie_id, "resume", major, minor)
        if major and minor:
            raise BookieAdminError(bookie_id, "gc.resume", "BAD_REQUEST", "refused")
        return {"suspendMajor": False, "suspendMinor": not minor}

    async def gc_explain(self, bookie_id, timeout_s):
        self._reach(bookie_id, "explain")
        return {"logs": [], "minor_threshold": 0.2, "major_threshold": 0.8}


class Ledgers:
    """What the gc paths use of the gateway's Ledgers: the registry, the bookie client and
    the settings."""

    def __init__(self, bookies: Bookies, states: dict[str, BookieState]) -> None:
        self.bookies = bookies
        self.settings = QuireSettings(request_timeout_ms=2_000)
        self.registry = [
            BookieInfo(bookie_id=b, state=s, last_seen=0, lease_expires_at=0)
            for b, s in states.items()
        ]

    async def list_bookies(self) -> list[BookieInfo]:
        return self.registry


THREE = {
    "bookie-1": BookieState.WRITABLE,
    "bookie-2": BookieState.READONLY,
    "bookie-3": BookieState.LOST,
}


def client(ledgers: Ledgers) -> httpx.AsyncClient:
    app = create_app(ledgers, GatewaySettings(), GatewayMetrics())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/bookie/gc", {"forceMajor": "true"}),  # strict: a string is not a bool
        ("/api/v1/bookie/gc", {"forceMajor": True, "force": True}),  # unknown key
        ("/api/v1/bookie/gc", [True]),
        ("/api/v1/bookie/gc/suspend_compaction", {}),  # neither: BookKeeper refuses it too
        ("/api/v1/bookie/gc/suspend_compaction", {"resumeMajor": True}),
        ("/api/v1/bookie/gc/suspend_compaction", {"suspendMinor": 1}),
        ("/api/v1/bookie/gc/resume_compaction", {}),
        ("/api/v1/bookie/gc/resume_compaction", {"suspendMajor": True}),
        ("/api/v1/bookie/gc/resume_compaction", {"resumeMajor": None, "resumeMinor": None}),
    ],
)
async def test_a_bad_body_is_invalid_argument_and_reaches_no_bookie(path, body) -> None:
    bookies = Bookies()
    async with client(Ledgers(bookies, THREE)) as http:
        response = await http.put(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "INVALID_ARGUMENT"
    assert bookies.calls == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/api/v1/bookie/gc"),
        ("GET", "/api/v1/bookie/gc_details"),
        ("GET", "/api/v1/bookie/gc/explain"),
    ],
)
async def test_a_bad_bookie_id_is_refused_and_an_unknown_one_is_no_such_bookie(
    method, path
) -> None:
    bookies = Bookies()
    async with client(Ledgers(bookies, THREE)) as http:
        bad = await http.request(method, path, params={"bookie_id": "bookie.1"})
        unknown = await http.request(method, path, params={"bookie_id": "bookie-9"})
    assert bad.status_code == 422 and bad.json()["code"] == "INVALID_ARGUMENT"
    assert unknown.status_code == 404 and unknown.json()["code"] == "NO_SUCH_BOOKIE"
    assert bookies.calls == []


async def test_without_bookie_id_every_bookie_not_lost_answers_under_its_id() -> None:
    bookies = Bookies(down={"bookie-2"})
    async with client(Ledgers(bookies, THREE)) as http:
        triggered = await http.put("/api/v1/bookie/gc", json={"forceMinor": True})
        details = await http.get("/api/v1/bookie/gc_details")
    # bookie-3 is lost: not asked. bookie-2 does not answer: its entry says so, the other
    # bookie's answer stands.
    assert triggered.status_code == 200
    answer = triggered.json()
    assert sorted(answer) == ["bookie-1", "bookie-2"]
    assert answer["bookie-1"] == {"triggered": True}
    assert answer["bookie-2"]["error"]["code"] == "UNAVAILABLE"
    assert "bookie-2" in answer["bookie-2"]["error"]["detail"]
    assert details.json()["bookie-1"] == [DETAILS]  # BookKeeper's list of statuses
    assert details.json()["bookie-2"]["error"]["code"] == "UNAVAILABLE"
    gc_calls = [c for c in bookies.calls if c[1] == "gc"]
    assert [c[:5] for c in gc_calls] == [
        ("bookie-1", "gc", False, True, False),
        ("bookie-2", "gc", False, True, False),
    ]


async def test_one_bookie_answers_its_own_answer_or_the_error_as_a_problem() -> None:
    bookies = Bookies(down={"bookie-2"}, slow={"bookie-3"})
    async with client(Ledgers(bookies, THREE)) as http:
        run = await http.put("/api/v1/bookie/gc?bookie_id=bookie-1&wait=true")  # no body
        down = await http.put("/api/v1/bookie/gc?bookie_id=bookie-2")
        # A lost bookie named on purpose is still asked: it may be back.
        slow = await http.get("/api/v1/bookie/gc_details?bookie_id=bookie-3")
        refused = await http.put(
            "/api/v1/bookie/gc/resume_compaction?bookie_id=bookie-1",
            json={"resumeMajor": True, "resumeMinor": True},
        )
    assert run.json() == {"run": {"ledgers_deleted": 2}}
    # A waiting run may take up to the gateway's request deadline, less a margin.
    wait_timeout_s = GatewaySettings().request_timeout_ms / 1000 - 1
    assert bookies.calls[0] == ("bookie-1", "gc", False, False, True, wait_timeout_s)
    assert (down.status_code, down.json()["code"]) == (503, "UNAVAILABLE")
    assert (slow.status_code, slow.json()["code"]) == (504, "TIMEOUT")
    assert (refused.status_code, refused.json()["code"]) == (400, "INVALID_ARGUMENT")


async def test_suspend_and_resume_answer_the_state_under_bookkeepers_names() -> None:
    bookies = Bookies()
    async with client(Ledgers(bookies, THREE)) as http:
        suspended = await http.put(
            "/api/v1/bookie/gc/suspend_compaction", json={"suspendMajor": True}
        )
        resumed = await http.put(
            "/api/v1/bookie/gc/resume_compaction?bookie_id=bookie-2", json={"resumeMinor": True}
        )
        # The stand-in's details say minor is suspended (DETAILS).
        state = await http.get("/api/v1/bookie/gc/suspend_compaction?bookie_id=bookie-1")
    assert suspended.json() == {
        b: {"isMajorGcSuspended": True, "isMinorGcSuspended": True}
        for b in ("bookie-1", "bookie-2")
    }
    assert resumed.json() == {"isMajorGcSuspended": False, "isMinorGcSuspended": False}
    assert state.json() == {"isMajorGcSuspended": False, "isMinorGcSuspended": True}
    assert ("bookie-1", "suspend", True, False) in bookies.calls
    assert ("bookie-2", "resume", False, True) in bookies.calls


async def test_no_bookie_registered_is_an_empty_answer() -> None:
    async with client(Ledgers(Bookies(), {})) as http:
        assert (await http.get("/api/v1/bookie/gc/explain")).json() == {}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"not json", BookieUnreachable),
        (b"[1, 2]", BookieUnreachable),
        (b'{"triggered": true}', BookieUnreachable),  # no "ok"
        (b'{"ok": "yes"}', BookieUnreachable),
        (b'{"ok": false, "error": "BAD_REQUEST", "message": "major?"}', BookieAdminError),
    ],
)
def test_a_bookie_answer_that_is_not_ok_raises(data, error) -> None:
    with pytest.raises(error) as raised:
        admin_answer("bookie-1", "gc", data)
    assert "bookie-1" in str(raised.value)
    if error is BookieAdminError:
        assert (raised.value.code, raised.value.message) == ("BAD_REQUEST", "major?")


def test_an_ok_answer_is_returned_without_ok() -> None:
    answer = admin_answer("bookie-1", "gc", json.dumps({"ok": True, "triggered": True}).encode())
    assert answer == {"triggered": True}
