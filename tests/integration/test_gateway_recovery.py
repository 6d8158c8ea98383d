"""Ensemble change, fencing and recovery over HTTP against a real in-process stack (real
NATS, PostgreSQL, journals and ledgerstores): POST /v1/ledgers/{id}/recover as API.md says,
and a writer that keeps appending through a bookie failure."""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx

from shared.subjects import Subjects
from tests.integration.test_gateway_http import (
    PW,
    append_batch,
    append_raw,
    create,
    gateway_settings,
    payloads_of,
    read_all,
    running_stack,
)


async def test_recover_fences_the_writer_and_closes_at_its_last_entry(
    settings, fresh_database_url
) -> None:
    async with running_stack(settings, fresh_database_url, explicit_lac_interval_ms=100) as stack:
        http = stack.http
        lid = (await create(http))["ledger_id"]
        stored = [os.urandom(50 + i) for i in range(5)]
        assert (await append_batch(http, lid, stored)).status_code == 200
        # A second gateway holds no writer handle: recovering the OPEN ledger is its job.
        other = gateway_settings(stack.settings)
        await stack.start("gateway-2", "gateway", other)
        url = f"http://127.0.0.1:{other.gateway.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as http2:
            # The idle writer's explicit LAC reaches the bookies: the other gateway sees it.
            for _ in range(100):
                lac = (await http2.get(f"/v1/ledgers/{lid}/lac", headers=PW)).json()["lac"]
                if lac == 4:
                    break
                await asyncio.sleep(0.05)
            assert lac == 4
            wrong = await http2.post(
                f"/v1/ledgers/{lid}/recover", headers={"Quire-Ledger-Password": "x"}
            )
            assert wrong.status_code == 403
            recovered = await http2.post(f"/v1/ledgers/{lid}/recover", headers=PW)
            assert recovered.status_code == 200, recovered.text
            body = recovered.json()
            assert body["state"] == "CLOSED" and body["last_entry_id"] == 4
            assert body["length"] == sum(map(len, stored))
            # Concurrent and later recoveries agree.
            again = await asyncio.gather(
                *(http2.post(f"/v1/ledgers/{lid}/recover", headers=PW) for _ in range(3))
            )
            assert {r.json()["last_entry_id"] for r in again} == {4}
            assert payloads_of(await read_all(http2, lid)) == stored
        # The old writer is fenced: 409 LEDGER_FENCED, and nothing changes.
        refused = await append_raw(http, lid, b"zombie")
        assert refused.status_code == 409 and refused.json()["code"] == "LEDGER_FENCED"
        meta = (await http.get(f"/v1/ledgers/{lid}")).json()
        assert meta["state"] == "CLOSED" and meta["last_entry_id"] == 4
        assert payloads_of(await read_all(http, lid)) == stored
        # Its close finds the ledger closed where it would have closed it: that is a success
        # (BookKeeper's doAsyncCloseInternal), and it changes nothing.
        closing = await http.post(f"/v1/ledgers/{lid}/close", headers=PW)
        assert closing.status_code == 200 and closing.json()["last_entry_id"] == 4
        assert (await http.get(f"/v1/ledgers/{lid}")).json()["version"] == meta["version"]


async def test_recover_of_an_empty_and_of_a_closed_ledger(settings, fresh_database_url, nc) -> None:
    async with running_stack(settings, fresh_database_url) as stack:
        http = stack.http
        subject = Subjects(stack.settings.subject_prefix).event("ledger.recovered")
        recovered = await nc.subscribe(subject)
        closed = (await create(http))["ledger_id"]
        await append_raw(http, closed, b"x")
        await http.post(f"/v1/ledgers/{closed}/close", headers=PW)
        response = await http.post(f"/v1/ledgers/{closed}/recover", headers=PW)
        assert response.json() == {"state": "CLOSED", "last_entry_id": 0, "length": 1}
        empty = (await create(http))["ledger_id"]
        before_ms = int(time.time() * 1000)
        response = await http.post(f"/v1/ledgers/{empty}/recover", headers=PW)
        assert response.json()["last_entry_id"] == -1
        missing = await http.post("/v1/ledgers/987654321/recover", headers=PW)
        assert missing.status_code == 404 and missing.json()["code"] == "NO_SUCH_LEDGER"
        # The empty ledger's recovery fenced it and recovered nothing: an event all the same.
        # The closed ledger's changed nothing: none (the gateway publishes in emit order,
        # so it would have come first).
        event = json.loads((await recovered.next_msg(timeout=10)).data)
        await recovered.unsubscribe()
        assert event["ledger_id"] == empty and event["source"].startswith("gateway")
        data = event["data"]
        assert data["last_entry_id"] == -1 and data["recovered_entries"] == 0
        assert before_ms <= data["started_ts_ms"] <= event["ts_ms"]
        assert 0 <= data["duration_ms"] <= event["ts_ms"] - data["started_ts_ms"] + 1


async def test_a_stopped_bookie_is_replaced_and_appends_go_on(settings, fresh_database_url) -> None:
    async with running_stack(settings, fresh_database_url, bookies=4) as stack:
        http = stack.http
        ledger = await create(http, ensemble_size=3, write_quorum=3, ack_quorum=3)
        lid = ledger["ledger_id"]
        ensemble = ledger["segments"][0]["bookies"]
        stored = [b"before-%d" % i for i in range(3)]
        assert (await append_batch(http, lid, stored)).status_code == 200
        victim = ensemble[1]
        await stack.stop(f"{victim}.journal")
        after = [b"after-%d" % i for i in range(3)]
        for payload in after:
            response = await append_raw(http, lid, payload)
            assert response.status_code == 200, response.text
        meta = (await http.get(f"/v1/ledgers/{lid}")).json()
        assert len(meta["segments"]) == 2
        assert meta["segments"][1]["first_entry_id"] == 3
        assert victim not in meta["segments"][1]["bookies"]
        assert payloads_of(await read_all(http, lid)) == stored + after
        # With no bookie left to spare, Qw = Qa cannot go on: NOT_ENOUGH_BOOKIES, and the
        # metadata shows nothing half-done.
        spare = meta["segments"][1]["bookies"][0]
        await stack.stop(f"{spare}.journal")
        response = await append_raw(http, lid, b"no")
        assert response.status_code == 503 and response.json()["code"] == "NOT_ENOUGH_BOOKIES"
        assert (await http.get(f"/v1/ledgers/{lid}")).json()["segments"] == meta["segments"]


async def test_a_stopped_bookie_is_replaced_at_its_first_failed_write(
    settings, fresh_database_url
) -> None:
    """Qa=2 of Qw=3 would let adds complete without a stopped bookie, on two replicas
    (Qw-1), until its replacement. Its "no responders" is a failed write at once (it
    registered long enough ago), and the ensemble change starts at that first failed
    write, as BookKeeper's: at most the one entry whose two acks beat the "no responders"
    answer is acknowledged on Qw-1 bookies, none after it. (With retries and the delayed
    change, a client appending every 2 ms saw ~60.)"""
    # Every bookie counts as registered long enough ago (no grace for new ones).
    async with running_stack(
        settings, fresh_database_url, bookies=4, new_bookie_grace_ms=0
    ) as stack:
        http = stack.http
        lid = (await create(http, ensemble_size=3, write_quorum=3, ack_quorum=2))["ledger_id"]
        meta = (await http.get(f"/v1/ledgers/{lid}")).json()
        victim = meta["segments"][0]["bookies"][1]
        for i in range(20):
            assert (await append_raw(http, lid, b"before-%d" % i)).status_code == 200
        await stack.stop(f"{victim}.journal")
        acked: list[int] = []
        while len(meta["segments"]) < 2:
            assert len(acked) < 1_000, "no ensemble change after 1,000 appends"
            response = await append_raw(http, lid, b"after-%d" % len(acked))
            assert response.status_code == 200, response.text
            acked.append(response.json()["entry_id"])
            meta = (await http.get(f"/v1/ledgers/{lid}")).json()
        assert victim not in meta["segments"][1]["bookies"]
        exposed = meta["segments"][1]["first_entry_id"] - 20
        assert exposed <= 1, meta
        assert acked == list(range(20, 20 + len(acked)))
