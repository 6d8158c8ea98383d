"""Bookie info: the journal's `info` endpoint through the gateway (GET /v1/bookies/{id}):
free and total space, state, last log mark, disk files."""

from __future__ import annotations

import asyncio

from shared.config import QuireSettings
from tests.integration.test_gateway_http import append_raw, create, running_stack


async def test_bookie_info_through_the_gateway(settings: QuireSettings, fresh_database_url) -> None:
    settings = settings.model_copy(
        update={
            "ledgerstore": settings.ledgerstore.model_copy(update={"flush_interval_ms": 50}),
        }
    )
    async with running_stack(settings, fresh_database_url) as stack:
        http = stack.http
        lid = (await create(stack.http))["ledger_id"]
        assert (await append_raw(http, lid, b"hello")).status_code == 200
        for _ in range(200):
            body = (await http.get("/v1/bookies/bookie-1")).json()
            if body["last_log_mark"] is not None:
                break
            await asyncio.sleep(0.05)
        assert body["bookie_id"] == "bookie-1" and body["state"] == "writable"
        assert body["reachable"] and body["registry"]["state"] == "writable"
        assert 0 < body["free_bytes"] <= body["total_bytes"]
        assert body["last_log_mark"]["file"] >= 1
        names = {f["path"].rsplit("/", 1)[-1] for f in body["files"]}
        assert "journal-000001.log" in names and "index.sqlite" in names
        assert any(n.startswith("entrylog-") for n in names)
        missing = await http.get("/v1/bookies/bookie-99")
        assert missing.status_code == 404
        assert missing.json()["code"] == "NO_SUCH_BOOKIE"
        # A stopped bookie: its registry row, marked unreachable.
        await stack.stop("bookie-3.journal")
        body = (await http.get("/v1/bookies/bookie-3")).json()
        assert body["reachable"] is False
