"""Garbage collection on real bookies (journal + ledgerstore) with real NATS and real
metadata (PostgreSQL), ledgers written through the gateway: ledgers deleted in metadata
leave every bookie on a forced `gc`, the others stay whole; metadata out of reach during a
run deletes nothing and says why; suspend/resume and bad input on the endpoints."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from shared import wire
from shared.config import QuireSettings
from shared.requests import request
from shared.status import BookieStatus
from shared.subjects import Subjects
from tests.integration.test_gateway_http import PW, append_batch, create, payloads_of, read_all
from tests.support.stack import Stack, running_stack

BOOKIES = ["bookie-1", "bookie-2", "bookie-3"]


@pytest.fixture
async def stack(settings: QuireSettings, fresh_database_url: str) -> AsyncIterator[Stack]:
    # Runs only when asked (gc with wait): the test counts what each run did.
    settings = settings.model_copy(
        update={
            "ledgerstore": settings.ledgerstore.model_copy(
                update={"gc_wait_time_ms": 3_600_000, "flush_interval_ms": 50}
            )
        }
    )
    async with running_stack(settings, fresh_database_url) as s:
        yield s


async def bookie_call(nc, stack: Stack, bookie_id: str, op: str, body: object = b"") -> dict:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    subject = Subjects(stack.settings.subject_prefix).bookie(bookie_id, op)
    msg = await request(nc, subject, data, timeout_s=30)
    return json.loads(msg.data)


async def bookie_read(nc, stack: Stack, bookie_id: str, ledger_id: int) -> BookieStatus:
    subject = Subjects(stack.settings.subject_prefix).bookie(bookie_id, "read")
    data = wire.encode_read_request([wire.ReadItem(ledger_id, 0)])
    status, [result] = wire.decode_read_reply((await request(nc, subject, data, timeout_s=10)).data)
    assert status is BookieStatus.OK
    return result.status


async def write_ledgers(stack: Stack, count: int) -> dict[int, list[bytes]]:
    written = {}
    for _ in range(count):
        lid = (await create(stack.http))["ledger_id"]
        payloads = [f"ledger {lid} entry {e}".encode() * 20 for e in range(20)]
        assert (await append_batch(stack.http, lid, payloads)).status_code == 200
        assert (await stack.http.post(f"/v1/ledgers/{lid}/close", headers=PW)).status_code == 200
        written[lid] = payloads
    return written


async def test_deleted_ledgers_leave_every_bookie_and_the_others_stay(nc, stack: Stack) -> None:
    written = await write_ledgers(stack, 6)
    deleted = sorted(written)[::2]
    events = await nc.subscribe(Subjects(stack.settings.subject_prefix).event("gc.ledger_deleted"))
    for lid in deleted:
        response = await stack.http.delete(f"/v1/ledgers/{lid}", headers=PW)
        assert response.status_code in (200, 204), response.text
    for bookie_id in BOOKIES:
        assert await bookie_read(nc, stack, bookie_id, deleted[0]) is BookieStatus.OK
        reply = await bookie_call(nc, stack, bookie_id, "gc", {"wait": True})
        assert reply["ok"], reply
        run = reply["run"]
        assert (run["ledgers_deleted"], run["skipped"]) == (len(deleted), ""), run
        for lid in deleted:
            assert await bookie_read(nc, stack, bookie_id, lid) is BookieStatus.NO_LEDGER
        metrics = stack.runtimes[f"{bookie_id}.ledgerstore"].metrics.scrape()  # type: ignore[attr-defined]
        assert metrics.value("bookie_DELETED_LEDGER_TOTAL") == len(deleted)
        assert metrics.value("quire_ledgerstore_gc_runs_total") >= 1
        details = (await bookie_call(nc, stack, bookie_id, "gc.details"))["details"]
        assert details["deletedLedgers"] == len(deleted) and details["lastGcTime"] > 0
    published = []
    while len(published) < len(deleted) * len(BOOKIES):
        published.append(json.loads((await events.next_msg(timeout=10)).data))
    await events.unsubscribe()
    assert {(e["bookie_id"], e["ledger_id"]) for e in published} == {
        (b, lid) for b in BOOKIES for lid in deleted
    }
    for lid, payloads in written.items():
        if lid not in deleted:
            assert payloads_of(await read_all(stack.http, lid)) == payloads
    # Nothing more to delete at the next run.
    reply = await bookie_call(nc, stack, "bookie-1", "gc", {"wait": True})
    assert reply["run"]["ledgers_deleted"] == 0


async def test_metadata_out_of_reach_deletes_nothing_and_says_why(nc, stack: Stack) -> None:
    written = await write_ledgers(stack, 2)
    await stack.stop("metadata")
    reply = await bookie_call(nc, stack, "bookie-1", "gc", {"wait": True})
    assert reply["ok"], reply
    assert reply["run"]["ledgers_deleted"] == 0
    # The first question a run asks metadata (which cluster instance it is) finds no one.
    assert reply["run"]["skipped"].startswith("metadata instance check failed"), reply
    details = (await bookie_call(nc, stack, "bookie-1", "gc.details"))["details"]
    assert details["lastSkipped"] == reply["run"]["skipped"]
    for lid in written:
        assert await bookie_read(nc, stack, "bookie-1", lid) is BookieStatus.OK


async def test_suspend_resume_and_explain(nc, stack: Stack) -> None:
    await write_ledgers(stack, 1)
    reply = await bookie_call(nc, stack, "bookie-2", "gc.suspend", {"major": True})
    assert reply == {"ok": True, "suspendMajor": True, "suspendMinor": False}
    reply = await bookie_call(nc, stack, "bookie-2", "gc.suspend", {"minor": True})
    assert reply == {"ok": True, "suspendMajor": True, "suspendMinor": True}
    details = (await bookie_call(nc, stack, "bookie-2", "gc.details"))["details"]
    assert details["suspendMajor"] and details["suspendMinor"]
    reply = await bookie_call(nc, stack, "bookie-2", "gc.resume", {"major": True})
    assert reply == {"ok": True, "suspendMajor": False, "suspendMinor": True}
    explained = await bookie_call(nc, stack, "bookie-2", "gc.explain")
    assert explained["ok"] and explained["suspendMinor"] and not explained["suspendMajor"]
    assert explained["logs"], explained  # at least the current log
    for log in explained["logs"]:
        if log["current"]:
            assert log["next_minor"] == log["next_major"] == "current log: never compacted"
        elif log["ledgers"]:
            assert log["next_minor"] == "suspended"


@pytest.mark.parametrize(
    ("op", "body"),
    [
        ("gc", b"nope"),
        ("gc", {"force_major": "yes"}),
        ("gc", {"forceMajor": True}),
        ("gc.suspend", [1]),
        ("gc.resume", {"major": 1}),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(nc, stack: Stack, op, body) -> None:
    before = (await bookie_call(nc, stack, "bookie-3", "gc.details"))["details"]
    reply = await bookie_call(nc, stack, "bookie-3", op, body)
    assert reply["ok"] is False and reply["error"] == "BAD_REQUEST" and reply["message"]
    after = (await bookie_call(nc, stack, "bookie-3", "gc.details"))["details"]
    assert (after["gcRuns"], after["suspendMajor"], after["suspendMinor"]) == (
        before["gcRuns"],
        before["suspendMajor"],
        before["suspendMinor"],
    )


async def test_deleted_data_gives_its_space_back(nc, settings, fresh_database_url) -> None:
    """Interleaved ledgers in small entry logs, most deleted: a forced major GC deletes
    the logs left with nothing live and compacts the rest; what is live reads back whole."""
    settings = settings.model_copy(
        update={
            "ledgerstore": settings.ledgerstore.model_copy(
                update={
                    "gc_wait_time_ms": 3_600_000,
                    "flush_interval_ms": 50,
                    "log_size_limit_bytes": 64 * 1024,
                }
            )
        }
    )
    async with running_stack(settings, fresh_database_url) as stack:
        ids = [(await create(stack.http))["ledger_id"] for _ in range(10)]
        written: dict[int, list[bytes]] = {lid: [] for lid in ids}
        for round_ in range(20):  # interleaved: every log holds every ledger
            for lid in ids:
                payload = f"{lid}:{round_}:".encode() + bytes(1000)
                assert (await append_batch(stack.http, lid, [payload])).status_code == 200
                written[lid].append(payload)
        for lid in ids:
            assert (
                await stack.http.post(f"/v1/ledgers/{lid}/close", headers=PW)
            ).status_code == 200
        kept = ids[:1]
        for lid in ids[1:]:
            assert (await stack.http.delete(f"/v1/ledgers/{lid}", headers=PW)).status_code in (
                200,
                204,
            )
        subjects = Subjects(stack.settings.subject_prefix)
        reclaims = await nc.subscribe(subjects.event("gc.>"))
        expected_events = 0
        for bookie_id in BOOKIES:
            reply = await bookie_call(
                nc, stack, bookie_id, "gc", {"wait": True, "force_major": True}
            )
            run = reply["run"]
            assert run["ledgers_deleted"] == 9 and run["major"], run
            assert run["entry_logs_deleted"] + run["entry_logs_compacted"] > 0, run
            # gc.ledger_deleted each, gc.entrylog_deleted each log, gc.compacted each compacted
            expected_events += 9 + run["entry_logs_deleted"] + 2 * run["entry_logs_compacted"]
            assert run["reclaimed_by_deletion_bytes"] + run["reclaimed_by_compaction_bytes"] > 0
            details = (await bookie_call(nc, stack, bookie_id, "gc.details"))["details"]
            # What sealed logs remain is mostly live (within 1.5x of the live bytes).
            assert 0 < details["entryLogBytes"] <= 1.5 * details["liveBytes"], details
            assert details["majorCompactionCounter"] == 1
        for lid in kept:
            assert payloads_of(await read_all(stack.http, lid)) == written[lid]
        published = []
        while len(published) < expected_events:
            published.append(json.loads((await reclaims.next_msg(timeout=10)).data))
        await reclaims.unsubscribe()
    # Every log deleted or compacted names the deleted ledgers whose bytes it gave back (each
    # ledger is in every log), once: a compacted log's deletion leaves them to its gc.compacted.
    deleted = {str(lid) for lid in ids[1:]}
    for bookie_id in BOOKIES:
        mine = [e for e in published if e["bookie_id"] == bookie_id]
        listing = [e for e in mine if e["kind"] in ("gc.compacted", "gc.entrylog_deleted")]
        for event in listing:
            data = event["data"]
            assert not data["ledgers_truncated"]
            if event["kind"] == "gc.entrylog_deleted" and data["reason"] == "compacted":
                assert data["ledgers"] == {}
                continue
            assert set(data["ledgers"]) == deleted, event
            sizes = list(data["ledgers"].values())
            assert sizes == sorted(sizes, reverse=True) and min(sizes) > 0
            reclaimed = (
                data["bytes"]
                if event["kind"] == "gc.entrylog_deleted"
                else (data["bytes_reclaimed"])
            )
            assert sum(sizes) == reclaimed, event
