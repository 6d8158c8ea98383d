"""Garbage collection and compaction end to end with `quire up`: 200 ledgers written
interleaved over small entry logs, 9 in 10 deleted through the HTTP API, GC with forced major
compaction triggered through the admin API. Each bookie's entry-log bytes fall to within 1.5x
of the live data it holds; every entry of every kept ledger reads back identical, also while
the compaction runs (a reader keeps reading the kept ledgers all along and every read must
succeed); the deleted ledgers answer 404 and their entries are gone from the bookies (a bookie
read answers NO_LEDGER). And `quire bench gc` runs at a tiny size, checking that its figures
add up (not how fast anything is)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from quire.bench.autorecovery import payload
from quire.bench.gc import compacting, entry_log_bytes, record_size
from shared import wire
from shared.bookie_client import BookieClient
from shared.status import BookieStatus
from shared.subjects import Subjects
from tests.support.cluster import QuireUp, quire_executable
from tests.support.wait import until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PASSWORD = "e2e-gc"
AUTH = {"Quire-Ledger-Password": PASSWORD}
LEDGERS = 200
ROUNDS = 4  # each ledger gets BATCH entries in each round, every ledger in turn
BATCH = 5
ENTRIES = ROUNDS * BATCH
ENTRY_SIZE = 1024
LOG_SIZE_LIMIT_BYTES = 64 * 1024  # about 60 sealed logs per bookie, each holding ~every ledger
CONCURRENCY = 16  # HTTP requests at once
GC_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    parent = cluster_dir("e2e-gc")
    up = QuireUp(
        parent / "quire-data",
        bookies=3,  # E3 of 3: every bookie holds every ledger
        env={
            "QUIRE_LEDGERSTORE__LOG_SIZE_LIMIT_BYTES": str(LOG_SIZE_LIMIT_BYTES),
            # Only the run the test triggers: no periodic one in between.
            "QUIRE_LEDGERSTORE__GC_WAIT_TIME_MS": "3600000",
            # About 4 s of copying per bookie (400 live entries each): the reader has time
            # to read while the compaction runs.
            "QUIRE_LEDGERSTORE__COMPACTION_RATE_BY_ENTRIES": "100",
        },
    )
    with up.running():
        yield up


def bookie_ids(cluster: QuireUp) -> list[str]:
    return sorted(
        row["bookie_id"]
        for row in cluster.cluster_json()["services"]
        if row["kind"] == "ledgerstore"
    )


async def gather_limited(calls, limit: int = CONCURRENCY) -> list:
    semaphore = asyncio.Semaphore(limit)

    async def one(call):
        async with semaphore:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def create(http: httpx.AsyncClient) -> int:
    body = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "password": PASSWORD}
    response = await http.post("/v1/ledgers", json=body)
    assert response.status_code == 201, response.text
    return response.json()["ledger_id"]


async def append(http: httpx.AsyncClient, lid: int, first: int) -> None:
    data = [base64.b64encode(payload(lid, first + i, ENTRY_SIZE)).decode() for i in range(BATCH)]
    response = await http.post(f"/v1/ledgers/{lid}/entries", json={"entries": data}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["first_entry_id"] == first, response.text


async def read_all(http: httpx.AsyncClient, lid: int) -> str | None:
    """Why the ledger does not read back whole and identical, or None."""
    response = await http.get(
        f"/v1/ledgers/{lid}/entries", params={"from": 0, "to": ENTRIES - 1}, headers=AUTH
    )
    if response.status_code != 200:
        return f"ledger {lid}: {response.status_code} {response.text}"
    entries = response.json()["entries"]
    if [e["entry_id"] for e in entries] != list(range(ENTRIES)):
        return f"ledger {lid}: entry ids {[e['entry_id'] for e in entries]}"
    for entry in entries:
        if base64.b64decode(entry["data"]) != payload(lid, entry["entry_id"], ENTRY_SIZE):
            return f"ledger {lid} entry {entry['entry_id']} differs"
    return None


@dataclass
class Reader:
    """Reads the kept ledgers whole, one after the other, until stopped."""

    http: httpx.AsyncClient
    ledgers: list[int]
    reads: int = 0
    failures: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        while not self.stop.is_set():
            for lid in self.ledgers:
                try:
                    problem = await read_all(self.http, lid)
                except httpx.HTTPError as exc:
                    problem = f"ledger {lid}: {type(exc).__name__}: {exc}"
                if problem is not None:
                    self.failures.append(problem)
                self.reads += 1


def disk(cluster: QuireUp, bookies: list[str]) -> dict[str, int]:
    return {b: entry_log_bytes(cluster.data_dir / b)[0] for b in bookies}


async def gc_details(http: httpx.AsyncClient) -> dict[str, dict]:
    """Each bookie's GarbageCollectionStatus (a list of one per bookie, as BookKeeper's)."""
    response = await http.get("/api/v1/bookie/gc_details")
    assert response.status_code == 200, response.text
    answers = response.json()
    assert not [a for a in answers.values() if "error" in a], answers
    return {b: answer[0] for b, answer in answers.items()}


async def no_ledger_on(bookies: BookieClient, bookie_id: str, lids: list[int]) -> list[int]:
    """Of `lids`, those the bookie does not answer NO_LEDGER for."""
    _, answers = await bookies.read(bookie_id, [wire.ReadItem(lid, 0) for lid in lids])
    return [a.ledger_id for a in answers if a.status is not BookieStatus.NO_LEDGER]


async def test_gc_gives_back_the_space_of_deleted_ledgers_and_keeps_every_live_entry(
    cluster: QuireUp,
) -> None:
    bookies = bookie_ids(cluster)
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30.0) as http:
        ids = await gather_limited([lambda: create(http) for _ in range(LEDGERS)])
        for r in range(ROUNDS):  # interleaved: every ledger gets a batch before the next round
            await gather_limited(
                [lambda lid=lid, r=r: append(http, lid, r * BATCH) for lid in ids]  # type: ignore[misc]
            )

        async def close(lid: int) -> None:
            response = await http.post(f"/v1/ledgers/{lid}/close", headers=AUTH)
            assert response.status_code == 200, response.text

        await gather_limited([lambda lid=lid: close(lid) for lid in ids])  # type: ignore[misc]
        # Everything written is in the entry logs (flushed) before anything is deleted.
        written = LEDGERS * ENTRIES * record_size(ENTRY_SIZE)
        await until(
            lambda: all(size >= written for size in disk(cluster, bookies).values()),
            "every entry flushed to the entry logs",
        )
        kept, deleted = ids[::10], [lid for n, lid in enumerate(ids) if n % 10]

        async def delete(lid: int) -> None:
            response = await http.delete(f"/v1/ledgers/{lid}", headers=AUTH)
            assert response.status_code == 204, response.text

        await gather_limited([lambda lid=lid: delete(lid) for lid in deleted])  # type: ignore[misc]
        before = await gc_details(http)
        reader = Reader(http, kept)
        reading = asyncio.create_task(reader.run())

        response = await http.put(
            "/api/v1/bookie/gc", json={"forceMajor": True, "forceMinor": False}
        )
        assert response.status_code == 200, response.text
        # The reads done so far, at each poll that saw some bookie's major compaction running.
        reads_seen_compacting: list[int] = []

        async def runs_over() -> bool:
            details = await gc_details(http)
            if any(details[b]["majorCompacting"] for b in bookies):
                reads_seen_compacting.append(reader.reads)
            return all(
                details[b]["gcRuns"] > before[b]["gcRuns"] and not compacting(details[b])
                for b in bookies
            )

        await until(runs_over, "the forced GC run over on every bookie", GC_TIMEOUT_S)
        reader.stop.set()
        await reading
        assert reader.failures == []
        assert reads_seen_compacting, "no poll saw a major compaction running"
        assert reads_seen_compacting[-1] > reads_seen_compacting[0], (
            "no read completed while compaction ran"
        )

        live = len(kept) * ENTRIES * record_size(ENTRY_SIZE)  # E3 of 3: all on each bookie
        after = disk(cluster, bookies)
        assert all(size <= 1.5 * live for size in after.values()), (after, live)
        details = await gc_details(http)
        for b in bookies:
            assert details[b]["deletedLedgers"] - before[b]["deletedLedgers"] == len(deleted)
            assert details[b]["reclaimedByCompactionBytes"] > 0, details[b]

        assert [p for lid in kept if (p := await read_all(http, lid))] == []
        for lid in deleted:
            response = await http.get(f"/v1/ledgers/{lid}")
            assert response.status_code == 404, response.text
            assert response.json()["code"] == "NO_SUCH_LEDGER"

    nc = await cluster.nats_connect()
    try:
        client = BookieClient(nc, Subjects("quire"), add_timeout_ms=5000, read_timeout_ms=5000)
        for b in bookies:
            assert await no_ledger_on(client, b, deleted) == [], b
    finally:
        await nc.drain()


def quire_trace(cluster: QuireUp, *args: str) -> object:
    done = subprocess.run(
        [quire_executable(), "trace", *args, "--data-dir", str(cluster.data_dir), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


async def test_a_gc_run_is_one_trace_across_the_ledgerstore_and_the_metadata_service(
    cluster: QuireUp,
) -> None:
    """Background runs are recorded whatever the sampling ratio; the metadata requests a
    run makes carry its trace to the metadata service and its statements, and every
    process's spans reach the local span store (`quire trace`)."""
    bookies = bookie_ids(cluster)
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30.0) as http:
        response = await http.put("/api/v1/bookie/gc", json={})
        assert response.status_code == 200, response.text

    def gc_traces() -> dict[str, list[dict]]:
        """bookie id -> the spans of its newest GC run, once all its spans are stored."""
        found: dict[str, list[dict]] = {}
        for row in quire_trace(cluster, "list", "--limit", "200"):  # type: ignore[union-attr]
            if row["root"] != "gc.run":
                continue
            spans = quire_trace(cluster, "show", row["trace_id"])["spans"]  # type: ignore[index]
            (run,) = [s for s in spans if s["name"] == "gc.run"]
            if run["bookie_id"] not in found and any(s["name"] == "gc.list_ledgers" for s in spans):
                found[run["bookie_id"]] = spans
        return found if set(found) >= set(bookies) else {}

    traces = await until(gc_traces, "a stored gc.run trace from every bookie", GC_TIMEOUT_S)
    for bookie_id in bookies:
        spans = traces[bookie_id]
        by_id = {s["span_id"]: s for s in spans}
        (listing,) = [s for s in spans if s["name"] == "gc.list_ledgers"]
        assert listing["service"] == "quire-ledgerstore"
        assert listing["instance"] == f"{bookie_id}.ledgerstore"
        servers = [s for s in spans if s["kind"] == "SERVER" and s["service"] == "quire-metadata"]
        assert servers, [s["name"] for s in spans]
        for server in servers:
            client = by_id[server["parent_span_id"]]
            assert client["kind"] == "CLIENT" and client["service"] == "quire-ledgerstore"
            assert client["name"] == server["name"].replace("process ", "send ", 1)
        statements = [s for s in spans if s["attributes"].get("db.system") == "postgresql"]
        assert statements and all(by_id[s["parent_span_id"]] in servers for s in statements)


def test_bench_gc_smoke(cluster_dir) -> None:
    parent = cluster_dir("bench-gc")
    report_path = parent / "gc.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    env["TMPDIR"] = str(parent)
    done = subprocess.run(
        [
            quire_executable(),
            "bench", "gc",
            "--ledgers", "20",
            "--entries", "20",
            "--batch", "5",
            "--log-size-limit", "16384",
            "--compaction-rate", "10000",
            "--foreground-rate", "200",
            "--duration", "2",
            "--bookies", "3",
            "--json", str(report_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    figures = json.loads(Path(report_path).read_text())["gc"]
    reclaim = figures["reclaim"]
    assert reclaim["ledgers_deleted"] == 18 and reclaim["ledgers_kept"] == 2
    assert reclaim["check"]["problems"] == [] and reclaim["check"]["entries_read"] == 2 * 20
    assert reclaim["live_bytes"] == 3 * 2 * 20 * record_size(1024)
    assert reclaim["entry_log_bytes_after"] < reclaim["entry_log_bytes_before"]
    for row in reclaim["bookies"].values():
        assert row["deleted_ledgers"] == 18
    cost = figures["cost"]
    assert cost["without_compaction"]["adds"] > 0 and cost["without_compaction"]["errors"] == 0
    assert cost["with_compaction_whole_run"]["errors"] == 0
