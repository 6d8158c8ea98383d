"""AutoRecovery end to end with `quire up`: a bookie killed for good (SIGKILL, never
restarted) while writers append to several ledgers through HTTP. The auditor marks every
ledger that names it, the replicator copies their fragments to the other bookies, open
ledgers left by a quiet writer are fenced and closed after the grace period, and nothing
acknowledged is lost. Then the dead bookie is decommissioned: its cookie and registration
go. And `quire bench autorecovery` runs at a tiny size, checking that its counts add up (not
how fast anything is)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quire.cluster import nats_credentials
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.service import connect_nats
from shared.subjects import Subjects
from tests.e2e.test_recovery import AUTH, Appender, create, kill_bookie, read_range
from tests.support.cluster import QuireUp, quire_executable

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RAW = {**AUTH, "Content-Type": "application/octet-stream"}
REPAIR_TIMEOUT_S = 180.0
KEPT_LOG_LINES = 100  # of each log a failed bench kept, in the failure's message


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    parent = cluster_dir("e2e-autorecovery")
    up = QuireUp(
        parent / "quire-data",
        bookies=4,
        restart=False,  # a killed bookie stays lost (quire up --no-restart)
        env={
            "QUIRE_METADATA__BOOKIE_LEASE_MS": "3000",
            "QUIRE_METADATA__BOOKIE_HEARTBEAT_MS": "500",
            "QUIRE_GATEWAY__ADD_BOOKIE_TIMEOUT_MS": "2000",
            "QUIRE_REPLICATOR__OPEN_LEDGER_REREPLICATION_GRACE_PERIOD_MS": "3000",
        },
    )
    with up.running():
        yield up


def segments_naming(client: httpx.Client, ledger_ids: list[int], bookie_id: str) -> list[int]:
    return [
        lid
        for lid in ledger_ids
        if any(
            bookie_id in s["bookies"] for s in client.get(f"/v1/ledgers/{lid}").json()["segments"]
        )
    ]


def under_replicated(client: httpx.Client) -> list[dict]:
    response = client.get("/v1/autorecovery/underreplicated")
    assert response.status_code == 200, response.text
    return response.json()["ledgers"]


def test_a_bookie_lost_for_good_is_re_replicated_while_writers_append(cluster: QuireUp) -> None:
    with cluster.client() as client:
        # Six ledgers whose ensemble holds the victim (E3 of 4 bookies: most of them).
        victim = "bookie-2"
        ids: list[int] = []
        while len(ids) < 6:
            ledger = create(client)
            if victim in ledger["segments"][0]["bookies"]:
                ids.append(ledger["ledger_id"])
            else:
                client.post(f"/v1/ledgers/{ledger['ledger_id']}/close", headers=AUTH)
        # Two ledgers written and closed, two left open by a writer that goes quiet, two
        # appended to through the loss.
        written: dict[int, dict[int, bytes]] = {}
        for lid in ids[:4]:
            written[lid] = {}
            for i in range(40):
                data = b"%d-%d" % (lid, i) + os.urandom(16)
                response = client.post(f"/v1/ledgers/{lid}/entries", content=data, headers=RAW)
                assert response.status_code == 200, response.text
                written[lid][response.json()["entry_id"]] = data
        for lid in ids[:2]:
            assert client.post(f"/v1/ledgers/{lid}/close", headers=AUTH).status_code == 200
        appenders = [Appender(cluster.url, lid) for lid in ids[4:]]
        for appender in appenders:
            appender.start()
        for appender in appenders:
            appender.wait_for(30)

        kill_bookie(cluster, victim)
        for appender in appenders:
            appender.wait_for(len(appender.acked) + 40)  # the appends go on

        # Every ledger stops naming the lost bookie and the queue empties: the closed ones by
        # re-replication, the quiet open ones after being fenced and closed, the appended
        # ones by their writer's ensemble change plus re-replication of the older segments.
        deadline = time.monotonic() + REPAIR_TIMEOUT_S
        while segments_naming(client, ids, victim) or under_replicated(client):
            assert time.monotonic() < deadline, (
                f"still naming {victim}: {segments_naming(client, ids, victim)}; "
                f"queued: {under_replicated(client)}"
            )
            time.sleep(0.5)
        for appender in appenders:
            appender.wait_for(len(appender.acked) + 10)  # not disturbed by the repair
            appender.stop_flag.set()
            appender.join(timeout=60)
            written[appender.lid] = appender.acked

        live = {
            b["bookie_id"]
            for b in client.get("/v1/bookies").json()["bookies"]
            if b["state"] != "lost"
        }
        assert victim not in live
        for lid in ids:
            meta = client.get(f"/v1/ledgers/{lid}").json()
            for segment in meta["segments"]:
                assert len(set(segment["bookies"]) & live) == 3, meta  # full write quorum
            if lid in ids[2:4]:
                # Left open by a quiet writer: fenced and closed by the replicator.
                assert meta["state"] == "CLOSED", meta
            last = max(written[lid])
            assert sorted(written[lid]) == list(range(last + 1))  # dense, each once
            if meta["state"] == "CLOSED":
                assert meta["last_entry_id"] == last, meta
            assert read_range(client, lid, last) == written[lid]  # nothing lost

        # The dead bookie holds nothing any ledger needs: decommission removes its cookie,
        # then its registration (the bookie list shows it lost until then).
        assert victim in {b["bookie_id"] for b in client.get("/v1/bookies").json()["bookies"]}
        response = client.put("/api/v1/autorecovery/decommission", json={"bookie_src": victim})
        assert response.status_code == 200, response.text
        deadline = time.monotonic() + 60
        while has_cookie(cluster, victim) or victim in {
            b["bookie_id"] for b in client.get("/v1/bookies").json()["bookies"]
        }:
            assert time.monotonic() < deadline, "the decommissioned bookie stayed registered"
            time.sleep(0.5)


def has_cookie(cluster: QuireUp, bookie_id: str) -> bool:
    """Whether the metadata store still holds the bookie's cookie (asked over NATS)."""

    async def ask() -> bool:
        user, password = nats_credentials(cluster.data_dir) or ("", "")
        settings = QuireSettings(
            nats_url=cluster.cluster_json()["nats_url"], nats_user=user, nats_password=password
        )
        nc = await connect_nats(settings, name="e2e-autorecovery")
        try:
            meta = MetadataClient(nc, Subjects(settings.subject_prefix), 5.0)
            return (await meta.get_cookie(bookie_id)).data is not None
        finally:
            await nc.drain()

    return asyncio.run(ask())


def test_bench_autorecovery_smoke(cluster_dir) -> None:
    parent = cluster_dir("bench-autorecovery")
    report_path = parent / "autorecovery.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    env["TMPDIR"] = str(parent)
    done = subprocess.run(
        [
            quire_executable(),
            "bench", "autorecovery",
            "--ledgers", "12",
            "--entries", "50",
            "--open-ledgers", "2",
            "--grace-ms", "2000",
            "--timeout", "150",
            "--json", str(report_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout + kept_logs(parent)
    figures = json.loads(report_path.read_text())["autorecovery"]
    assert figures["ledgers_on_victim"] >= 1 and figures["entries_on_victim"] >= 50
    assert 0 < figures["first_mark_after_s"] <= figures["repaired_after_s"]
    assert figures["check"]["problems"] == []
    assert figures["check"]["entries_read"] == 12 * 50
    assert figures["check"]["states"] == {"CLOSED": 12}


def kept_logs(parent: Path, services: tuple[str, ...] = ("replicator", "auditor")) -> str:
    """What a failed bench left (it keeps its cluster's data dir under TMPDIR, which the
    session removes at its end): the last lines of each service's log, for the failure's
    message."""
    parts = []
    for log_path in sorted(parent.glob("quire-bench-*/quire-data/logs/*.log")):
        if log_path.stem in services:
            tail = log_path.read_text(errors="replace").splitlines()[-KEPT_LOG_LINES:]
            parts.append("\n".join([f"\n--- {log_path} (last {len(tail)} lines)", *tail]))
    return "".join(parts)
