"""The bookies' garbage collection as an operator drives it, on a real stack (NATS,
PostgreSQL, three bookies' journals and ledgerstores, the gateway): BookKeeper's
`/api/v1/bookie/gc...` paths and `quire bookie gc...`, including a bad body, an unknown
bookie and a bookie that does not answer.

The bookies' own GC runs only when asked here (gcWaitTime of an hour): what the commands
show is what the test did. Entry logs are small (4 KiB), so the two ledgers' entries fill
sealed logs, which the explain lists with the ledgers that pin them."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import pytest
from click.testing import Result
from typer.testing import CliRunner

from quire.cli import app as cli_app
from shared.config import QuireSettings
from tests.support.stack import Stack, running_stack, scratch_database, stack_settings
from tests.support.wait import until

PW = {"Quire-Ledger-Password": "pw"}
GC = "/api/v1/bookie/gc"
DETAILS = "/api/v1/bookie/gc_details"
EXPLAIN = "/api/v1/bookie/gc/explain"
SUSPEND = "/api/v1/bookie/gc/suspend_compaction"
RESUME = "/api/v1/bookie/gc/resume_compaction"
BOOKIES = ["bookie-1", "bookie-2", "bookie-3"]
ENTRY = b"e" * 900
STATUS_KEYS = {
    "forceCompacting",
    "majorCompacting",
    "minorCompacting",
    "lastMajorCompactionTime",
    "lastMinorCompactionTime",
    "majorCompactionCounter",
    "minorCompactionCounter",
    "gcRunning",
    "lastGcTime",
    "gcRuns",
    "suspendMajor",
    "suspendMinor",
    "entryLogs",
    "entryLogBytes",
    "liveBytes",
    "deletedLedgers",
    "reclaimedByDeletionBytes",
    "reclaimedByCompactionBytes",
    "lastSkipped",
}
RUN_KEYS = {
    "started_ms",
    "duration_ms",
    "ledgers_deleted",
    "entry_logs_deleted",
    "entry_logs_compacted",
    "reclaimed_by_deletion_bytes",
    "reclaimed_by_compaction_bytes",
    "major",
    "minor",
    "skipped",
}


def gc_settings(settings: QuireSettings) -> QuireSettings:
    ledgerstore = settings.ledgerstore.model_copy(
        update={
            "gc_wait_time_ms": 3_600_000,
            "flush_interval_ms": 50,
            "log_size_limit_bytes": 4096,
        }
    )
    return settings.model_copy(update={"ledgerstore": ledgerstore})


@pytest.fixture(scope="module")
async def stack(nats_url: str, database_url: str, tmp_path_factory) -> AsyncIterator[Stack]:
    settings = gc_settings(stack_settings(nats_url, tmp_path_factory.mktemp("gc-admin")))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db, bookies=3) as s:
            yield s


async def interleaved_ledgers(stack: Stack, count: int, entries: int) -> list[int]:
    """`count` ledgers on all three bookies, their entries written in turns."""
    ids = []
    for _ in range(count):
        body = {"password": "pw", "ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2}
        ids.append((await stack.http.post("/v1/ledgers", json=body)).json()["ledger_id"])
    batch = {"entries": [base64.b64encode(ENTRY).decode()]}
    for _ in range(entries):
        for lid in ids:
            added = await stack.http.post(f"/v1/ledgers/{lid}/entries", json=batch, headers=PW)
            assert added.is_success, added.text
    return ids


def pinning(explain: dict) -> set[int]:
    return {pin["ledger_id"] for log in explain["logs"] for pin in log["ledgers"]}


def cli(stack: Stack, *args: str) -> Result:
    return CliRunner().invoke(cli_app, ["bookie", *args, "--gateway", stack.url])


async def cli_json(stack: Stack, *args: str):
    done = await asyncio.to_thread(cli, stack, *args, "-o", "json")
    assert done.exit_code == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


async def test_gc_forgets_a_deleted_ledger_and_the_explain_shows_why_space_stays(
    stack: Stack,
) -> None:
    http = stack.http
    kept, deleted = await interleaved_ledgers(stack, count=2, entries=20)
    await until(lambda: explained_pins(http, {kept, deleted}), "both ledgers pinning entry logs")
    assert (await http.delete(f"/v1/ledgers/{deleted}", headers=PW)).status_code == 204

    # Before GC: the deleted ledger still pins logs; the CLI says the metadata lost it.
    shown = await cli_json(stack, "gc-explain", "--bookie", "bookie-1")
    pins = {p["ledger_id"]: p for log in shown["bookie-1"]["logs"] for p in log["ledgers"]}
    assert pins[deleted]["state"] == "DELETED" and pins[deleted]["age_s"] is None
    assert pins[kept]["state"] == "OPEN" and pins[kept]["age_s"] >= 0
    for log in shown["bookie-1"]["logs"]:
        assert {"next_minor", "next_major", "usage", "size_bytes"} <= set(log)

    # A forced run on every bookie, waited for: each forgets the deleted ledger.
    before = (await http.get(DETAILS)).json()
    ran = await http.put(GC, params={"wait": "true"}, json={"forceMinor": True})
    assert ran.status_code == 200, ran.text
    assert sorted(ran.json()) == BOOKIES
    for bookie_id in BOOKIES:
        run = ran.json()[bookie_id]["run"]
        assert set(run) >= RUN_KEYS and run["minor"] is True and run["skipped"] == ""
    after = (await http.get(DETAILS)).json()
    for bookie_id in BOOKIES:
        (status,) = after[bookie_id]
        assert set(status) >= STATUS_KEYS
        assert status["gcRuns"] > before[bookie_id][0]["gcRuns"]
        assert status["deletedLedgers"] >= before[bookie_id][0]["deletedLedgers"] + 1
    # The deleted ledger pins nothing any more; the live one still reads back whole.
    await until(lambda: gone_from_explain(http, deleted), "the deleted ledger gone from every log")
    read = await http.get(f"/v1/ledgers/{kept}/entries", params={"from": 0, "to": 19}, headers=PW)
    assert [base64.b64decode(e["data"]) for e in read.json()["entries"]] == [ENTRY] * 20


async def explained_pins(http, wanted: set[int]) -> bool:
    return wanted <= pinning((await http.get(EXPLAIN, params={"bookie_id": "bookie-1"})).json())


async def gone_from_explain(http, ledger_id: int) -> bool:
    answers = (await http.get(EXPLAIN)).json()
    return all(ledger_id not in pinning(answers[b]) for b in BOOKIES)


async def test_suspend_and_resume_compaction_over_http_and_the_cli(stack: Stack) -> None:
    http = stack.http
    suspended = await http.put(SUSPEND, json={"suspendMajor": True})
    assert suspended.json() == {
        b: {"isMajorGcSuspended": True, "isMinorGcSuspended": False} for b in BOOKIES
    }
    state = await http.get(SUSPEND, params={"bookie_id": "bookie-2"})
    assert state.json() == {"isMajorGcSuspended": True, "isMinorGcSuspended": False}
    (status,) = (await http.get(DETAILS, params={"bookie_id": "bookie-2"})).json()
    assert (status["suspendMajor"], status["suspendMinor"]) == (True, False)
    explain = (await http.get(EXPLAIN, params={"bookie_id": "bookie-2"})).json()
    assert (explain["suspendMajor"], explain["suspendMinor"]) == (True, False)
    # The kept ledger's sealed logs: a major compaction would leave them alone.
    words = {log["next_major"] for log in explain["logs"] if not log["current"]}
    assert "suspended" in words
    assert words <= {"suspended", "delete: no live ledger"}

    one = await http.put(RESUME, params={"bookie_id": "bookie-2"}, json={"resumeMajor": True})
    assert one.json() == {"isMajorGcSuspended": False, "isMinorGcSuspended": False}
    rows = await cli_json(stack, "gc-resume", "--major", "--minor")
    assert rows == [
        {"bookie_id": b, "isMajorGcSuspended": False, "isMinorGcSuspended": False} for b in BOOKIES
    ]
    rows = await cli_json(stack, "gc-suspend", "--minor", "--bookie", "bookie-3")
    assert rows == [
        {"bookie_id": "bookie-3", "isMajorGcSuspended": False, "isMinorGcSuspended": True}
    ]
    await cli_json(stack, "gc-resume", "--minor")


async def test_the_cli_runs_gc_and_shows_details(stack: Stack) -> None:
    rows = await cli_json(stack, "gc", "--major")
    assert [r["bookie_id"] for r in rows] == BOOKIES
    assert all(set(r) >= RUN_KEYS and r["major"] is True for r in rows)
    rows = await cli_json(stack, "gc", "--no-wait", "--bookie", "bookie-2")
    assert rows == [{"bookie_id": "bookie-2", "triggered": True}]
    rows = await cli_json(stack, "gc-details")
    assert [r["bookie_id"] for r in rows] == BOOKIES
    assert all(set(r) >= STATUS_KEYS and r["gcRuns"] >= 1 for r in rows)
    table = await asyncio.to_thread(cli, stack, "gc-explain")
    assert table.exit_code == 0, table.stderr
    assert all(f"{b}: minor below 0.2, major below 0.8" in table.stdout for b in BOOKIES)


async def test_bad_bodies_and_unknown_bookies(stack: Stack) -> None:
    http = stack.http
    for path, body in [
        (GC, {"forceMajor": "yes"}),
        (GC, {"forceMajor": True, "now": True}),
        (SUSPEND, {}),
        (RESUME, {"suspendMajor": True}),
    ]:
        refused = await http.put(path, json=body)
        assert refused.status_code == 422, (path, body, refused.text)
        assert refused.json()["code"] == "INVALID_ARGUMENT"
    for method, path in [("PUT", GC), ("GET", DETAILS), ("GET", EXPLAIN)]:
        unknown = await http.request(method, path, params={"bookie_id": "bookie-9"})
        assert unknown.status_code == 404 and unknown.json()["code"] == "NO_SUCH_BOOKIE"
    done = await asyncio.to_thread(cli, stack, "gc-details", "--bookie", "bookie-9")
    assert done.exit_code == 1 and "NO_SUCH_BOOKIE" in done.stderr
    done = await asyncio.to_thread(cli, stack, "gc-suspend")
    assert done.exit_code == 2


async def test_a_bookie_that_does_not_answer_fails_only_its_own_entry(
    nats_url: str, database_url: str, tmp_path
) -> None:
    settings = gc_settings(stack_settings(nats_url, tmp_path))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db, bookies=3) as stack:
            # Its journal keeps it registered (not lost); its ledgerstore, which serves the
            # gc calls, is gone.
            await stack.stop("bookie-3.ledgerstore")
            answers = (await stack.http.get(DETAILS)).json()
            assert sorted(answers) == BOOKIES
            assert answers["bookie-3"]["error"]["code"] == "UNAVAILABLE"
            assert all(set(answers[b][0]) >= STATUS_KEYS for b in ("bookie-1", "bookie-2"))
            one = await stack.http.put(GC, params={"bookie_id": "bookie-3"})
            assert one.status_code == 503 and one.json()["code"] == "UNAVAILABLE"
            done = await asyncio.to_thread(cli, stack, "gc", "-o", "json")
            assert done.exit_code == 1 and "bookie-3" in done.stderr
            rows = json.loads(done.stdout)
            assert rows[2]["bookie_id"] == "bookie-3" and rows[2]["error"].startswith("UNAVAILABLE")
            assert all(set(r) >= RUN_KEYS for r in rows[:2])
