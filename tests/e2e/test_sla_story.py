"""The SLA job end to end: a real `quire up` driven through a known story (writes to several
ledgers, a bookie killed and left dead while one ledger is appended to, re-replication to
the end, a recovery of a ledger its writer left open, deletes and a forced GC), then the real
CLI, `quire analytics sla --data-dir DIR --output OUT`, as a user runs it. Every table is
checked twice: against the plain-Python oracles (tests/support/sla_oracle) over the raw events
the job read, and against what the test itself did and saw (entries acknowledged, which
ledgers held the killed bookie, what was recovered and deleted)."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from analytics.sla.options import SlaOptions
from analytics.sla.report import read_table
from shared.subjects import Subjects
from tests.analytics.test_sla_report import parse
from tests.e2e.test_recovery import AUTH, Appender, kill_bookie
from tests.support.cluster import QuireUp, quire_executable
from tests.support.events import stream_events
from tests.support.sla import assert_same_rows
from tests.support.sla_oracle.tables import ORACLES
from tests.support.wait import until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PASSWORD = AUTH["Quire-Ledger-Password"]  # the Appender's
ENTRIES = 30  # per written ledger, in batches of 10
ENTRY_SIZE = 512
VICTIM = "bookie-2"
REPAIR_TIMEOUT_S = 120.0
JOB_TIMEOUT_S = 600.0


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    parent = cluster_dir("e2e-sla")
    up = QuireUp(
        parent / "quire-data",
        bookies=4,
        restart=False,  # a killed bookie stays lost (quire up --no-restart)
        env={
            "QUIRE_METADATA__BOOKIE_LEASE_MS": "3000",
            "QUIRE_METADATA__BOOKIE_HEARTBEAT_MS": "500",
            "QUIRE_GATEWAY__ADD_BOOKIE_TIMEOUT_MS": "2000",
            # The victim's "no responders" is a failed write at once: the appender's writer
            # changes its ensemble well inside the replicator's grace for open ledgers, so the
            # only recovery of the story is the one the test asks for.
            "QUIRE_GATEWAY__NEW_BOOKIE_GRACE_MS": "0",
            "QUIRE_REPLICATOR__OPEN_LEDGER_REREPLICATION_GRACE_PERIOD_MS": "20000",
            # Small entry logs (the deleted ledgers' bytes can be reclaimed) and only the GC
            # run the test triggers.
            "QUIRE_LEDGERSTORE__LOG_SIZE_LIMIT_BYTES": str(16 * 1024),
            "QUIRE_LEDGERSTORE__GC_WAIT_TIME_MS": "3600000",
        },
    )
    with up.running():
        yield up


def create(client: httpx.Client, write_quorum: int = 3) -> dict:
    body = {"ensemble_size": 3, "write_quorum": write_quorum, "ack_quorum": 2, "password": PASSWORD}
    response = client.post("/v1/ledgers", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def create_holding(
    client: httpx.Client, bookie: str, written: dict[int, list[dict]], write_quorum: int = 3
) -> int:
    """A ledger whose first ensemble holds `bookie` (ensembles are chosen at random); its
    segments as created go to `written`."""
    while True:
        ledger = create(client, write_quorum)
        if bookie in ledger["segments"][0]["bookies"]:
            written[ledger["ledger_id"]] = ledger["segments"]
            return ledger["ledger_id"]
        assert client.post(f"/v1/ledgers/{ledger['ledger_id']}/close", headers=AUTH).is_success


def write(client: httpx.Client, lid: int, entries: int) -> list[int]:
    """`entries` entries of ENTRY_SIZE bytes, in batches of 10; the entry ids acknowledged."""
    acked: list[int] = []
    for _batch in range(entries // 10):
        batch = [base64.b64encode(os.urandom(ENTRY_SIZE)).decode() for _ in range(10)]
        response = client.post(f"/v1/ledgers/{lid}/entries", json={"entries": batch}, headers=AUTH)
        assert response.status_code == 200, response.text
        answer = response.json()
        acked.extend(range(answer["first_entry_id"], answer["last_entry_id"] + 1))
    return acked


def close(client: httpx.Client, lid: int) -> dict:
    response = client.post(f"/v1/ledgers/{lid}/close", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def meta(client: httpx.Client, lid: int) -> dict:
    response = client.get(f"/v1/ledgers/{lid}")
    assert response.status_code == 200, response.text
    return response.json()


def holding(client: httpx.Client, lids: list[int], bookie: str) -> list[int]:
    return [
        lid for lid in lids if any(bookie in s["bookies"] for s in meta(client, lid)["segments"])
    ]


def exposed_by(segments: list[dict], write_quorum: int, acked: list[int], bookie: str) -> int:
    """How many of `acked` have `bookie` in their write set (BookKeeper's round robin: entry
    e of a segment of ensemble size E goes to the bookies at (e + i) % E, i < Qw)."""
    count = 0
    for entry_id in acked:
        bookies = [s for s in segments if s["first_entry_id"] <= entry_id][-1]["bookies"]
        count += bookie in {bookies[(entry_id + i) % len(bookies)] for i in range(write_quorum)}
    return count


def ms(value: datetime | None) -> int | None:
    return None if value is None else round(value.timestamp() * 1000)


def table_rows(out: Path, name: str) -> list[dict]:
    """A table the job wrote, timestamps as epoch milliseconds (as the oracles give them)."""
    rows = read_table(out, name)
    assert rows is not None, f"the job wrote no {name} table"
    return [{k: ms(v) if isinstance(v, datetime) else v for k, v in r.items()} for r in rows]


def job_input(events: list[dict], publishers: list[dict]) -> list[dict]:
    """The events the job read: the stream's first L messages (the job's batch read ends at the
    stream's last message when it started), L found from the job's own completeness counts
    per publisher instance; what came after is left out."""
    wanted = Counter({(r["source"], r["boot_id"]): r["events"] for r in publishers})
    seen: Counter = Counter()
    ids: set[str] = set()
    for n, event in enumerate(events):
        if event["event_id"] not in ids:
            ids.add(event["event_id"])
            seen[(event["source"], event.get("boot_id"))] += 1
        if seen == wanted:
            return events[: n + 1]
    raise AssertionError(f"the stream holds no prefix the job read: {seen} != {wanted}")


def deduplicated(events: list[dict]) -> list[dict]:
    seen: set[str] = set()
    kept = []
    for event in events:
        if event["event_id"] not in seen:
            seen.add(event["event_id"])
            kept.append(event)
    return kept


async def test_the_sla_tables_tell_the_story_the_cluster_went_through(cluster, tmp_path) -> None:
    with cluster.client() as client:
        # -- writes: three ledgers holding the victim (two E3/Qw3, one striped E3/Qw2),
        # written and closed; one appended to through the loss.
        # The segments each entry was written to (the ensembles the writers chose; re-
        # replication later replaces the victim in the metadata, not in the ack events).
        written: dict[int, list[dict]] = {}
        qw3 = [create_holding(client, VICTIM, written) for _ in range(2)]
        qw2 = create_holding(client, VICTIM, written, write_quorum=2)
        acked = {lid: write(client, lid, ENTRIES) for lid in [*qw3, qw2]}
        for lid in [*qw3, qw2]:
            close(client, lid)
        appended = create_holding(client, VICTIM, written)
        appender = Appender(cluster.url, appended)
        appender.start()
        appender.wait_for(20)

        # -- the victim killed for good; the writer replaces it.
        killed_ms = int(time.time() * 1000)
        kill_bookie(cluster, VICTIM)

        def ensemble_changed() -> bool:
            # The writer replaces the victim when a write to it fails: only while it appends.
            assert appender.is_alive(), f"the appender stopped: {appender.why_stopped()}"
            return len(meta(client, appended)["segments"]) >= 2

        await until(ensemble_changed, "the writer's ensemble change", 60)
        appender.wait_for(len(appender.acked) + 10)  # appends go on after the change
        appender.stop_flag.set()
        appender.join(timeout=60)
        acked[appended] = sorted(appender.acked)
        close(client, appended)
        victim_ledgers = [*qw3, qw2, appended]
        # The writer's new segments: re-replication replaces bookies in a segment, in place.
        written[appended] += meta(client, appended)["segments"][1:]

        # -- re-replication to the end: no ledger names the victim, nothing is queued.
        def repaired() -> bool:
            queued = client.get("/v1/autorecovery/underreplicated").json()["ledgers"]
            return not holding(client, victim_ledgers, VICTIM) and not queued

        await until(repaired, "re-replication of the victim's ledgers", REPAIR_TIMEOUT_S)

        # -- a recovery: a ledger its writer left open, recovered by another client.
        recovered_ledger = create(client)
        recovered = recovered_ledger["ledger_id"]
        written[recovered] = recovered_ledger["segments"]
        acked[recovered] = write(client, recovered, 20)
        with cluster.client() as other:
            response = other.post(f"/v1/ledgers/{recovered}/recover", headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["last_entry_id"] == max(acked[recovered])

        # -- deletes, then a forced GC on every live bookie, answered once each run ended.
        deleted = [qw3[0], qw2]
        gc_pairs = {
            (lid, b) for lid in deleted for s in meta(client, lid)["segments"] for b in s["bookies"]
        }
        for lid in deleted:
            response = client.delete(f"/v1/ledgers/{lid}", headers=AUTH)
            assert response.status_code == 204, response.text
        response = client.put(
            "/api/v1/bookie/gc", params={"wait": "true"}, json={"forceMajor": True}
        )
        assert response.status_code == 200, response.text

    nc = await cluster.nats_connect()
    try:
        js = nc.jetstream()

        async def gc_seen() -> bool:
            events = await stream_events(js, Subjects("quire"))
            seen = {
                (e["ledger_id"], e["bookie_id"]) for e in events if e["kind"] == "gc.ledger_deleted"
            }
            return gc_pairs <= seen

        await until(gc_seen, "a gc.ledger_deleted for every deleted copy", timeout_s=60)

        # -- the job, as a user runs it.
        out = tmp_path / "sla"
        done = subprocess.run(
            [
                quire_executable(),
                "analytics", "sla",
                "--data-dir", str(cluster.data_dir),
                "--output", str(out),
                "--master", "local[2]",
            ],
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-5000:] + done.stdout
        events = await stream_events(js, Subjects("quire"))
    finally:
        await nc.drain()

    # (a) Every table against its oracle, over the events the job read.
    publishers = table_rows(out, "completeness")
    read = deduplicated(job_input(events, publishers))
    options = SlaOptions(end_ms=max(e["ts_ms"] for e in read))
    tables = {name: table_rows(out, name) for name in ORACLES}
    for name, oracle in ORACLES.items():
        assert_same_rows(tables[name], oracle(read, options), rel=1e-6)

    # (b) Against what the test did.
    overall = [r for r in tables["ack_latency"] if r["group"] == "all"]
    assert sum(r["count"] for r in overall) == sum(len(ids) for ids in acked.values())
    by_shape: Counter = Counter()
    for r in tables["ack_latency"]:
        if r["group"] == "shape":
            by_shape[(r["ensemble_size"], r["write_quorum"], r["ack_quorum"])] += r["count"]
    assert by_shape == {
        (3, 2, 2): len(acked[qw2]),
        (3, 3, 2): sum(len(ids) for lid, ids in acked.items() if lid != qw2),
    }
    by_bookie: Counter = Counter()
    for r in tables["ack_latency"]:
        if r["group"] == "bookie":
            by_bookie[r["bookie_id"]] += r["count"]
    held: Counter = Counter()
    for lid, ids in acked.items():
        for entry_id in ids:
            segment = [s for s in written[lid] if s["first_entry_id"] <= entry_id][-1]
            held.update(segment["bookies"])
    assert by_bookie == held

    (incident,) = tables["exposure"]
    assert incident["bookie_id"] == VICTIM and incident["lost_at"] >= killed_ms
    assert incident["ledgers_exposed"] == len(victim_ledgers)
    assert incident["worst_ledger_id"] in victim_ledgers
    assert incident["entries_exposed"] == sum(
        exposed_by(written[lid], 2 if lid == qw2 else 3, acked[lid], VICTIM)
        for lid in victim_ledgers
    )
    assert incident["repaired_at"] is not None and incident["still_exposed_entries"] == 0

    (recovery,) = [r for r in tables["recoveries"] if r["ledger_id"] == recovered]
    assert recovery["closed_at"] is not None and recovery["fence_to_close_s"] >= 0
    assert recovery["last_entry_id"] == max(acked[recovered])
    assert recovery["bookies_fenced"] == 3

    replaced_out = sum(
        r["replaced_out"] for r in tables["ensemble_changes"] if r["bookie_id"] == VICTIM
    )
    assert replaced_out == 1  # by the appender's writer, once

    intervals: dict[str, list[dict]] = {}
    for r in sorted(tables["bookie_availability"], key=lambda r: r["start"]):
        intervals.setdefault(r["bookie_id"], []).append(r)
    last = intervals[VICTIM][-1]
    assert (last["state"], last["open"]) == ("lost", True) and last["start"] >= killed_ms
    for bookie, rows in intervals.items():
        if bookie != VICTIM:
            assert [r["state"] for r in rows] == ["up"], (bookie, rows)

    assert {(r["ledger_id"], r["bookie_id"]) for r in tables["gc_reclaim"]} == gc_pairs
    assert all(r["deleted_at"] is not None for r in tables["gc_reclaim"])

    for r in publishers:
        assert r["dropped_reported"] == 0 and r["missing"] in (0, None), r

    page = parse(out / "report.html")
    incidents = page.sections["Exposure per bookie loss"]["tables"][0]
    assert [row[0] for row in incidents[1:]] == [VICTIM]
