"""The replicator over a real in-process stack (real NATS, PostgreSQL, journals,
ledgerstores, gateway): a ledger marked under-replicated by `urq.mark` (no auditor) is
copied off the marked bookie, its ensemble updated, the queue emptied, every step an event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.bookie_client import BookieClient
from shared.config import QuireSettings, ReplicatorSettings
from shared.events import Event
from shared.metaclient import MetadataClient
from shared.models import CreateLedgerRequest
from shared.status import BookieStatus
from shared.subjects import Subjects
from shared.wire import ReadItem
from tests.integration.test_gateway_http import PW, append_batch, append_raw, create, payloads_of
from tests.support.inprocess import running_service
from tests.support.stack import Stack, running_stack
from tests.support.wait import until

ENTRY_BYTES = 1_000


def replicator_settings(stack: Stack, **replicator: Any) -> QuireSettings:
    values = {"claim_poll_interval_ms": 50, "underreplicated_lease_ms": 1_500, **replicator}
    return stack.settings.model_copy(update={"replicator": ReplicatorSettings(**values)})


async def start_bookie(stack: Stack, bookie_id: str) -> None:
    bookie = stack.settings.model_copy(update={"bookie_id": bookie_id})
    await stack.start(f"{bookie_id}.journal", "journal", bookie)
    await stack.start(f"{bookie_id}.ledgerstore", "ledgerstore", bookie)


async def stop_bookie(stack: Stack, bookie_id: str) -> None:
    await stack.stop(f"{bookie_id}.ledgerstore")
    await stack.stop(f"{bookie_id}.journal")


@asynccontextmanager
async def autorecovery_events(
    nc, subjects: Subjects, kinds: str = "autorecovery.>"
) -> AsyncIterator[list[Event]]:
    """Every event of `kinds` (a subject wildcard) published while inside, in arrival order."""
    seen: list[Event] = []

    async def collect(msg) -> None:
        seen.append(Event.model_validate_json(msg.data))

    sub = await nc.subscribe(subjects.event(kinds), cb=collect)
    try:
        yield seen
    finally:
        await sub.unsubscribe()


def kinds(events: list[Event], ledger_id: int) -> list[str]:
    return [e.kind.removeprefix("autorecovery.") for e in events if e.ledger_id == ledger_id]


async def append(http: httpx.AsyncClient, ledger_id: int, entries: int) -> list[bytes]:
    stored = [os.urandom(ENTRY_BYTES) for _ in range(entries)]
    for start in range(0, entries, 50):
        response = await append_batch(http, ledger_id, stored[start : start + 50])
        assert response.status_code == 200, response.text
    return stored


async def keyed_ledger(http: httpx.AsyncClient, meta: MetadataClient) -> dict:
    """A ledger on the stack's three bookies (E3 Qw3 Qa2), open, with its keys stored."""
    ledger = await create(http)
    stored = await meta.get_ledger(ledger["ledger_id"])
    # Without them the replicator can copy nothing: say so at once, not by a timeout.
    assert stored.master_key and stored.mac_key, "ledger keys not stored (metadata format 3)"
    return ledger


async def closed_ledger(
    http: httpx.AsyncClient, meta: MetadataClient, entries: int
) -> tuple[dict, list[bytes]]:
    """A keyed ledger (`keyed_ledger`), `entries` long, closed."""
    ledger = await keyed_ledger(http, meta)
    stored = await append(http, ledger["ledger_id"], entries)
    closing = await http.post(f"/v1/ledgers/{ledger['ledger_id']}/close", headers=PW)
    assert closing.status_code == 200
    return ledger, stored


async def read_all(http: httpx.AsyncClient, ledger_id: int) -> list[bytes]:
    response = await http.get(f"/v1/ledgers/{ledger_id}/entries", headers=PW, timeout=60)
    assert response.status_code == 200, response.text
    return payloads_of(response.json())


async def queue_empty(meta: MetadataClient) -> bool:
    return not (await meta.list_underreplicated()).ledgers


async def append_until_segments(
    http: httpx.AsyncClient, meta: MetadataClient, ledger_id: int, stored: list, count: int
):
    """Append an entry at a time (adding it to `stored`) until the writer's ensemble changes
    have made `count` segments (a failed bookie is replaced as the writer notices it)."""

    async def appended_and_changed():
        stored.extend(await append(http, ledger_id, 1))
        metadata = await meta.get_ledger(ledger_id)
        return metadata if len(metadata.segments) >= count else None

    return await until(appended_and_changed, f"{count} segments")


async def holds(bookies: BookieClient, ledger_id: int, entry_id: int) -> bool:
    """bookie-4 stores that entry."""
    _, [result] = await bookies.read("bookie-4", [ReadItem(ledger_id, entry_id)])
    return result.status is BookieStatus.OK


def bookies_of(metadata) -> set[str]:
    return {b for segment in metadata.segments for b in segment.bookies}


async def swap_bookie_2_for_a_spare(stack) -> None:
    """bookie-4 joins and bookie-2 stops for good: ledgers on bookies 1-3 are to be repaired
    onto bookie-4."""
    await start_bookie(stack, "bookie-4")
    await stop_bookie(stack, "bookie-2")


async def read_from_the_spare_alone(stack, ledger_id: int) -> list[bytes]:
    """Every entry of the ledger, with bookies 1 and 3 stopped: what bookie-4 holds."""
    await stop_bookie(stack, "bookie-1")
    await stop_bookie(stack, "bookie-3")
    return await read_all(stack.http, ledger_id)


async def test_a_closed_ledger_is_copied_off_a_lost_bookie(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        ledger, stored = await closed_ledger(stack.http, meta, 120)
        lid, ensemble = ledger["ledger_id"], ledger["segments"][0]["bookies"]
        await swap_bookie_2_for_a_spare(stack)
        async with autorecovery_events(nc, subjects) as events:
            marked = await meta.mark_underreplicated(lid, ["bookie-2"])
            rt = await stack.start("replicator", "replicator", replicator_settings(stack))
            await until(lambda: queue_empty(meta), "the queue to empty")
            await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
        after = await meta.get_ledger(lid)
        assert after.state.value == "CLOSED" and after.last_entry_id == 119
        # bookie-4 takes bookie-2's place in the ensemble (the write sets stay as they were).
        assert [s.bookies for s in after.segments] == [
            ["bookie-4" if b == "bookie-2" else b for b in ensemble]
        ]
        assert kinds(events, lid) == ["claimed", "fragment_replicated", "replicated"]
        claimed, fragment, done = (e for e in events if e.ledger_id == lid)
        assert claimed.data["missing_bookies"] == ["bookie-2"]
        assert claimed.data["mark_version"] == marked.mark_version
        assert fragment.data["entries"] == 120 and fragment.data["bytes"] >= 120 * ENTRY_BYTES
        assert done.data["duration_ms"] >= 0 and done.data["worker_id"] == claimed.data["worker_id"]
        status = json.loads(
            (await nc.request(subjects.service("replicator", "status"), b"", timeout=5)).data
        )
        assert status["autorecovery_enabled"] is True
        assert (status["claimed"], status["replicated"], status["failed"]) == (1, 1, 0)
        assert (status["fragments"], status["entries"]) == (1, 120)
        assert status["in_progress"] == [] and status["workers"] == [
            w.worker_id for w in rt.replicator.workers
        ]  # type: ignore[attr-defined]
        # Every entry is on bookie-4 now: it alone (with the others stopped) serves them all.
        assert await read_from_the_spare_alone(stack, lid) == stored


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "open"])
async def test_a_bookie_marked_with_the_lost_one_but_back_is_not_replaced(
    settings, fresh_database_url, nc, closed: bool
) -> None:
    """A registration that lapsed for a moment (a stalled process on a loaded machine) has
    the auditor mark the bookie's ledgers; marked again with a bookie lost for good, a
    ledger names both. Its live bookie keeps its replicas: only the lost one is replaced.
    Replacing both needed two spares where there is one: the ledger failed with
    NOT_ENOUGH_BOOKIES at every claim, queued and naming the lost bookie for good (the
    autorecovery smoke test's CI failure). Open (left by a quiet writer, as the bench's):
    the same once it is fenced and closed."""
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        http = stack.http
        meta = MetadataClient(nc, Subjects(stack.settings.subject_prefix))
        if closed:
            ledger, stored = await closed_ledger(http, meta, 30)
        else:
            ledger = await keyed_ledger(http, meta)  # this gateway holds its quiet writer
            stored = await append(http, ledger["ledger_id"], 30)
        lid, ensemble = ledger["ledger_id"], ledger["segments"][0]["bookies"]
        back = next(b for b in ensemble if b != "bookie-2")
        await swap_bookie_2_for_a_spare(stack)
        await meta.mark_underreplicated(lid, [back, "bookie-2"])
        replicator = replicator_settings(stack, open_ledger_rereplication_grace_period_ms=500)
        await stack.start("replicator", "replicator", replicator)
        await until(lambda: queue_empty(meta), "the queue to empty")
        after = await meta.get_ledger(lid)
        assert after.state.value == "CLOSED" and after.last_entry_id == 29
        assert [s.bookies for s in after.segments] == [
            ["bookie-4" if b == "bookie-2" else b for b in ensemble]
        ]
        assert await read_all(http, lid) == stored


async def test_a_ledger_without_keys_backs_off_and_the_switch_stops_claims(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        # A ledger as created before its keys were stored: nothing can copy it.
        keyless = await meta.create_ledger(
            CreateLedgerRequest(
                ensemble_size=3,
                write_quorum=3,
                ack_quorum=2,
                digest="crc32c",
                ensemble=["bookie-1", "bookie-2", "bookie-3"],
            )
        )
        ledger, stored = await closed_ledger(stack.http, meta, 20)
        lid = ledger["ledger_id"]
        await swap_bookie_2_for_a_spare(stack)
        await meta.set_cluster_settings(autorecovery_enabled=False)
        # Failed ledgers back off 100, 200, 400 ms ... (1/32 of 3.2 s, doubling).
        quick = replicator_settings(stack, lock_release_of_failed_ledger_grace_period_ms=3_200)
        async with autorecovery_events(nc, subjects) as events:
            rt = await stack.start("replicator", "replicator", quick)
            stats = rt.replicator.stats  # type: ignore[attr-defined]
            await meta.mark_underreplicated(keyless.ledger_id, ["bookie-2"])
            await meta.mark_underreplicated(lid, ["bookie-2"])
            status = json.loads(
                (await nc.request(subjects.service("replicator", "status"), b"", timeout=5)).data
            )
            assert status["autorecovery_enabled"] is False
            # Disabled: the worker keeps asking and the queue hands out nothing.
            polls = stats.idle_polls
            await until(lambda: stats.idle_polls >= polls + 3, "three idle polls")
            assert stats.claimed == 0 and events == []
            await meta.set_cluster_settings(autorecovery_enabled=True)
            await until(lambda: "replicated" in kinds(events, lid), "the keyed ledger replicated")
            await until(
                lambda: kinds(events, keyless.ledger_id).count("released") >= 3,
                "three backoffs of the keyless ledger",
            )
        released = [
            e for e in events if e.ledger_id == keyless.ledger_id and e.kind.endswith("released")
        ]
        assert [e.data["reason"] for e in released[:3]] == ["no_keys"] * 3
        assert [e.data["failures"] for e in released[:3]] == [1, 2, 3]
        assert [e.data["claimable_in_ms"] for e in released[:3]] == [100, 200, 400]
        assert "no stored keys" in released[0].data["error"]
        assert "bookie-2" not in bookies_of(await meta.get_ledger(lid))
        assert await read_all(stack.http, lid) == stored
        # The keyless ledger stays queued, no worker stopped over it.
        queued = (await meta.list_underreplicated()).ledgers
        assert [u.ledger_id for u in queued] == [keyless.ledger_id]
        assert not rt.stopping  # a background task that dies stops the service


async def test_two_replicators_never_work_on_one_ledger_at_once(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        ledgers = [await closed_ledger(stack.http, meta, 30) for _ in range(6)]
        ids = [ledger["ledger_id"] for ledger, _ in ledgers]
        await swap_bookie_2_for_a_spare(stack)
        both = replicator_settings(stack, num_workers=2)
        async with autorecovery_events(nc, subjects) as events:
            for lid in ids:
                await meta.mark_underreplicated(lid, ["bookie-2"])
            runtimes = [await stack.start(f"replicator-{n}", "replicator", both) for n in (1, 2)]
            workers = [rt.replicator.stats.in_progress for rt in runtimes]  # type: ignore[attr-defined]
            overlaps = 0

            def all_done() -> bool:
                nonlocal overlaps
                working = [lid for progress in workers for lid, _ in progress.values()]
                overlaps += len(working) - len(set(working))
                return all("replicated" in kinds(events, lid) for lid in ids)

            await until(all_done, "every ledger replicated")
        assert overlaps == 0
        # Each ledger was claimed once, by one worker, and copied once.
        for lid in ids:
            assert kinds(events, lid) == ["claimed", "fragment_replicated", "replicated"]
        statuses = [rt.replicator.stats for rt in runtimes]  # type: ignore[attr-defined]
        assert sum(s.claimed for s in statuses) == sum(s.replicated for s in statuses) == 6
        assert sum(s.fragments for s in statuses) == 6
        assert await queue_empty(meta)
        for (_, stored), lid in zip(ledgers, ids, strict=True):
            after = await meta.get_ledger(lid)
            assert "bookie-2" not in bookies_of(after)
            assert await read_all(stack.http, lid) == stored


async def test_an_open_ledger_is_fenced_and_recovered_after_its_grace_period(
    settings, fresh_database_url, nc
) -> None:
    grace_ms = 2_000
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        http = stack.http
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        ledger = await keyed_ledger(http, meta)  # this gateway holds its writer: it stays OPEN
        lid, ensemble = ledger["ledger_id"], ledger["segments"][0]["bookies"]
        stored = await append(http, lid, 30)
        await swap_bookie_2_for_a_spare(stack)
        async with (
            autorecovery_events(nc, subjects) as events,
            autorecovery_events(nc, subjects, "ledger.recovered") as recoveries,
        ):
            await meta.mark_underreplicated(lid, ["bookie-2"])
            await stack.start(
                "replicator",
                "replicator",
                replicator_settings(stack, open_ledger_rereplication_grace_period_ms=grace_ms),
            )
            await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
            # The replicator's recovery is timed for the SLA jobs as a gateway's is.
            [recovered] = await until(lambda: recoveries, "the ledger.recovered event")
        assert recovered.ledger_id == lid and recovered.source.startswith("replicator")
        assert recovered.data["last_entry_id"] == 29 and recovered.data["duration_ms"] >= 0
        assert recovered.data["started_ts_ms"] <= recovered.ts_ms
        # First claim: inside the grace period, nothing closed to copy, held until it ends;
        # the next claim fences and recovers it, then copies.
        assert kinds(events, lid) == [
            "claimed",
            "released",
            "claimed",
            "fragment_replicated",
            "replicated",
        ]
        released = next(e for e in events if e.kind == "autorecovery.released")
        assert released.data["reason"] == "open_ledger_grace_period"
        assert 0 < released.data["claimable_in_ms"] <= grace_ms
        done = next(e for e in events if e.kind == "autorecovery.replicated")
        assert done.data["recovered"] is True and done.data["since_mark_ms"] >= grace_ms
        after = await meta.get_ledger(lid)
        assert after.state.value == "CLOSED" and after.last_entry_id == 29
        assert [s.bookies for s in after.segments] == [
            ["bookie-4" if b == "bookie-2" else b for b in ensemble]
        ]
        assert await queue_empty(meta)
        # The writer was fenced: its next append is refused, nothing changes.
        refused = await append_raw(http, lid, b"zombie")
        assert refused.status_code == 409 and refused.json()["code"] == "LEDGER_FENCED"
        assert await read_all(http, lid) == stored


async def test_a_writers_ensemble_change_during_the_copy_loses_no_entry(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        http = stack.http
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        ledger = await keyed_ledger(http, meta)
        lid = ledger["ledger_id"]
        stored = await append(http, lid, 100)
        await swap_bookie_2_for_a_spare(stack)
        # The writer replaces bookie-2 itself: later entries go to a segment without it.
        before = await append_until_segments(http, meta, lid, stored, 2)
        assert "bookie-2" not in before.segments[1].bookies
        await start_bookie(stack, "bookie-5")
        async with autorecovery_events(nc, subjects) as events:
            await meta.mark_underreplicated(lid, ["bookie-2"])
            # Throttled so that the copy of the first segment (100 KB) takes ten seconds.
            throttled = replicator_settings(stack, replication_rate_by_bytes=10_000)
            await stack.start("replicator", "replicator", throttled)
            await until(lambda: "claimed" in kinds(events, lid), "the claim")
            # Meanwhile the writer loses bookie-3 too and changes its ensemble again.
            await stop_bookie(stack, "bookie-3")
            changed = await append_until_segments(http, meta, lid, stored, 3)
            # ... before the copy was done: its compare-and-set meets the writer's change.
            assert "replicated" not in kinds(events, lid)
            assert "bookie-2" in changed.segments[0].bookies
            stored += await append(http, lid, 10)
            await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
        after = await meta.get_ledger(lid)
        assert after.state.value == "OPEN"
        assert after.segments[1:] == changed.segments[1:]  # the writer's segments kept
        assert "bookie-2" not in bookies_of(after)
        assert await queue_empty(meta)
        assert (await http.post(f"/v1/ledgers/{lid}/close", headers=PW)).status_code == 200
        closed = await meta.get_ledger(lid)
        assert closed.last_entry_id == len(stored) - 1
        # The first segment's entries now come from its new bookie alone.
        await stop_bookie(stack, "bookie-1")
        assert await read_all(http, lid) == stored


def spawn_replicator(settings: QuireSettings, log_path: Path) -> subprocess.Popen:
    replicator = settings.replicator
    env = dict(
        os.environ,
        QUIRE_NATS_URL=settings.nats_url,
        QUIRE_SUBJECT_PREFIX=settings.subject_prefix,
        QUIRE_REPLICATOR__CLAIM_POLL_INTERVAL_MS=str(replicator.claim_poll_interval_ms),
        QUIRE_REPLICATOR__UNDERREPLICATED_LEASE_MS=str(replicator.underreplicated_lease_ms),
        QUIRE_REPLICATOR__REPLICATION_RATE_BY_BYTES=str(replicator.replication_rate_by_bytes),
    )
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "services.replicator"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
            start_new_session=True,
        )


async def test_kill_9_of_a_worker_mid_copy_leaves_the_ledger_to_another(
    settings, fresh_database_url, nc, tmp_path
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        ledger, stored = await closed_ledger(stack.http, meta, 100)
        lid = ledger["ledger_id"]
        await swap_bookie_2_for_a_spare(stack)
        bookie4 = BookieClient(nc, subjects, add_timeout_ms=2_000, read_timeout_ms=2_000)
        # 100 KB at 20 KB/s: the first worker is killed seconds before it could finish.
        throttled = replicator_settings(stack, replication_rate_by_bytes=20_000)
        proc = spawn_replicator(throttled, tmp_path / "replicator.log")
        try:
            async with autorecovery_events(nc, subjects) as events:
                await meta.mark_underreplicated(lid, ["bookie-2"])
                await until(lambda: "claimed" in kinds(events, lid), "the first claim")
                # Mid-copy: bookie-4 has the first entries, not yet the last.
                await until(lambda: holds(bookie4, lid, 0), "the copy under way")
                assert not await holds(bookie4, lid, 99)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                first = next(e for e in events if e.ledger_id == lid).data["worker_id"]
                assert first.startswith(f"replicator-{proc.pid}-")
                # The other worker gets it once the dead one's lease lapses, and finishes.
                unthrottled = replicator_settings(stack)
                rt = await stack.start("replicator-2", "replicator", unthrottled)
                await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "replicated" not in kinds(events, lid)[:-1]
        done = next(e for e in events if e.kind == "autorecovery.replicated")
        second = rt.replicator.workers[0].worker_id  # type: ignore[attr-defined]
        assert done.data["worker_id"] == second != first
        assert await queue_empty(meta)
        assert "bookie-2" not in bookies_of(await meta.get_ledger(lid))
        assert await read_from_the_spare_alone(stack, lid) == stored


async def test_a_worker_that_loses_its_claim_stops_before_its_compare_and_set(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        ledger, stored = await closed_ledger(stack.http, meta, 100)
        lid = ledger["ledger_id"]
        await swap_bookie_2_for_a_spare(stack)
        bookie4 = BookieClient(nc, subjects, add_timeout_ms=2_000, read_timeout_ms=2_000)
        throttled = replicator_settings(stack, replication_rate_by_bytes=20_000)
        async with autorecovery_events(nc, subjects) as events:
            await meta.mark_underreplicated(lid, ["bookie-2"])
            rt = await stack.start("replicator", "replicator", throttled)
            [worker] = rt.replicator.workers  # type: ignore[attr-defined]
            await until(lambda: holds(bookie4, lid, 0), "the copy under way")
            # The claim goes to someone else (as when a lease lapsed unrenewed).
            assert await meta.release_underreplicated(lid, worker.worker_id)
            assert (await meta.claim_underreplicated("intruder", 60_000)) is not None
            await until(lambda: "released" in kinds(events, lid), "the worker to give up")
            released = next(e for e in events if e.kind == "autorecovery.released")
            assert released.data["reason"] == "claim_lost"
            assert worker.current is None and rt.replicator.stats.in_progress == {}  # type: ignore[attr-defined]
            # It stopped before its compare-and-set: the ensemble still names bookie-2.
            assert "bookie-2" in bookies_of(await meta.get_ledger(lid))
            assert not await holds(bookie4, lid, 99)
            # Given back, the ledger is claimed again and finished.
            assert await meta.release_underreplicated(lid, "intruder")
            await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
        assert kinds(events, lid) == [
            "claimed",
            "released",
            "claimed",
            "fragment_replicated",
            "replicated",
        ]
        assert "bookie-2" not in bookies_of(await meta.get_ledger(lid))
        assert await read_from_the_spare_alone(stack, lid) == stored


async def test_a_stopped_replicator_gives_its_claim_back_at_once(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=3) as stack:
        subjects = Subjects(stack.settings.subject_prefix)
        meta = MetadataClient(nc, subjects)
        ledger, stored = await closed_ledger(stack.http, meta, 100)
        lid = ledger["ledger_id"]
        await swap_bookie_2_for_a_spare(stack)
        bookie4 = BookieClient(nc, subjects, add_timeout_ms=2_000, read_timeout_ms=2_000)
        # A lease far longer than the test: only the release can free the ledger in time.
        slow = replicator_settings(
            stack, replication_rate_by_bytes=20_000, underreplicated_lease_ms=600_000
        )
        async with autorecovery_events(nc, subjects) as events:
            await meta.mark_underreplicated(lid, ["bookie-2"])
            await stack.start("replicator", "replicator", slow)
            await until(lambda: holds(bookie4, lid, 0), "the copy under way")
            await stack.stop("replicator")
            [queued] = (await meta.list_underreplicated()).ledgers
            assert queued.claimed_by is None
            await stack.start("replicator-2", "replicator", replicator_settings(stack))
            await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
        assert kinds(events, lid) == [
            "claimed",
            "released",
            "claimed",
            "fragment_replicated",
            "replicated",
        ]
        released = next(e for e in events if e.kind == "autorecovery.released")
        assert released.data["reason"] == "shutdown"
        assert await read_all(stack.http, lid) == stored


async def test_malformed_answers_of_the_queue_never_stop_a_worker(settings, nc) -> None:
    """No metadata service: a peer on its subjects answers nonsense, then a claim that names
    no bookie of a ledger it cannot describe. The worker counts, backs off, goes on."""
    subjects = Subjects(settings.subject_prefix)
    claims = 0

    async def odd_metadata(msg) -> None:
        nonlocal claims
        if msg.subject == subjects.meta("urq.claim"):
            claims += 1
            if claims > 2:  # then: a claim with no missing bookie
                ledger = {"ledger_id": 5, "missing_bookies": [], "mark_version": 1, "marked_at": 0}
                await msg.respond(json.dumps({"ok": True, "result": {"ledger": ledger}}).encode())
                return
        await msg.respond(b"not json")

    sub = await nc.subscribe(f"{settings.subject_prefix}.meta.>", cb=odd_metadata)
    replicator = ReplicatorSettings(claim_poll_interval_ms=50, rw_rereplicate_backoff_ms=50)
    try:
        async with running_service(
            "replicator", settings.model_copy(update={"replicator": replicator})
        ) as rt:
            stats = rt.replicator.stats  # type: ignore[attr-defined]
            await until(lambda: stats.claim_errors >= 2 and stats.failed >= 2, "odd turns")
            assert not rt.stopping  # a background task that dies stops the service
            status = json.loads(
                (await nc.request(subjects.service("replicator", "status"), b"", timeout=5)).data
            )
            assert status["autorecovery_enabled"] is None  # unknown: the answer was nonsense
            assert status["claim_errors"] >= 2 and status["failed"] >= 2
    finally:
        await sub.unsubscribe()
