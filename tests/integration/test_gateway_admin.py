"""BookKeeper's admin REST API (/api/v1/...) and /v1/autorecovery/underreplicated on a real
stack: the paths and answer shapes a BookKeeper operator's scripts expect."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import pytest

from services.gateway.admin import NO_REPLICATOR, REPLICATION_OFF, REPLICATION_ON
from shared.metaclient import MetadataClient
from shared.models import PRIVATE_LEDGER_FIELDS
from tests.support.stack import Stack, running_stack, scratch_database, stack_settings

PW = {"Quire-Ledger-Password": "pw"}
LIST = "/api/v1/autorecovery/list_under_replicated_ledger"


@pytest.fixture(scope="module")
async def stack(nats_url: str, database_url: str, tmp_path_factory) -> AsyncIterator[Stack]:
    settings = stack_settings(nats_url, tmp_path_factory.mktemp("admin-stack"))
    with scratch_database(database_url) as db:
        async with running_stack(settings, db, bookies=4) as s:
            yield s


async def new_ledger(stack: Stack, entries: list[bytes]) -> int:
    created = await stack.http.post("/v1/ledgers", json={"password": "pw"})
    lid = created.json()["ledger_id"]
    batch = {"entries": [base64.b64encode(e).decode() for e in entries]}
    assert (await stack.http.post(f"/v1/ledgers/{lid}/entries", json=batch, headers=PW)).is_success
    return lid


async def test_bookie_endpoints(stack: Stack) -> None:
    rw = (await stack.http.get("/api/v1/bookie/list_bookies", params={"type": "rw"})).json()
    assert sorted(rw) == ["bookie-1", "bookie-2", "bookie-3", "bookie-4"]
    assert (await stack.http.get("/api/v1/bookie/list_bookies?type=ro")).json() == {}
    bad = await stack.http.get("/api/v1/bookie/list_bookies?type=xx")
    assert bad.status_code == 422 and bad.json()["code"] == "INVALID_ARGUMENT"
    info = (await stack.http.get("/api/v1/bookie/cluster_info")).json()
    assert info["totalBookiesCount"] == 4 and info["writableBookiesCount"] == 4
    assert info["readonlyBookiesCount"] == 0 and info["unavailableBookiesCount"] == 0
    # The auto-recovery switch, on by default (BookKeeper's isLedgerReplicationEnabled).
    assert info["ledgerReplicationEnabled"] is True
    space = (await stack.http.get("/api/v1/bookie/info", params={"bookie_id": "bookie-2"})).json()
    assert 0 < space["freeSpace"] <= space["totalSpace"]
    state = (await stack.http.get("/api/v1/bookie/state?bookie_id=bookie-3")).json()
    assert state == {
        "running": True,
        "readOnly": False,
        "shuttingDown": False,
        "availableForHighPriorityWrites": True,
    }
    unknown = await stack.http.get("/api/v1/bookie/state?bookie_id=bookie-9")
    assert unknown.status_code == 404 and unknown.json()["code"] == "NO_SUCH_BOOKIE"


async def test_ledger_endpoints(stack: Stack) -> None:
    lid = await new_ledger(stack, [b"x", b"y", b"z"])
    listed = (await stack.http.get("/api/v1/ledger/list")).json()
    assert listed[str(lid)] is None
    with_meta = (await stack.http.get("/api/v1/ledger/list?print_metadata=true")).json()
    assert with_meta[str(lid)]["ledger_id"] == lid
    assert not any(name in str(with_meta) for name in PRIVATE_LEDGER_FIELDS)
    meta = (await stack.http.get("/api/v1/ledger/metadata", params={"ledger_id": lid})).json()
    assert meta["state"] == "OPEN"
    read = await stack.http.get(
        "/api/v1/ledger/read", params={"ledger_id": lid, "end_entry_id": 2}, headers=PW
    )
    assert {k: base64.b64decode(v) for k, v in read.json().items()} == {
        "0": b"x",
        "1": b"y",
        "2": b"z",
    }
    denied = await stack.http.get("/api/v1/ledger/read", params={"ledger_id": lid})
    assert denied.status_code == 403
    missing = await stack.http.get("/api/v1/ledger/metadata", params={"ledger_id": 10**9})
    assert missing.status_code == 404 and missing.json()["code"] == "NO_SUCH_LEDGER"
    gone = await stack.http.delete("/api/v1/ledger/delete", params={"ledger_id": lid}, headers=PW)
    assert gone.status_code == 200
    assert (await stack.http.get(f"/v1/ledgers/{lid}")).status_code == 404


async def test_autorecovery_endpoints(stack: Stack) -> None:
    http = stack.http
    # `enabled` is the switch; with no replicator worker running, nothing re-replicates,
    # and the answer says so.
    status = (await http.get("/api/v1/autorecovery/status")).json()
    assert set(status) == {"enabled", "replicators", "ledgerReplicationActive", "detail"}
    assert (status["enabled"], status["replicators"]) == (True, 0)
    assert status["ledgerReplicationActive"] is False
    assert status["detail"] == NO_REPLICATOR
    off = (await http.put("/api/v1/autorecovery/status?enabled=false")).json()
    assert (off["enabled"], off["ledgerReplicationActive"], off["detail"]) == (
        False,
        False,
        REPLICATION_OFF,
    )
    stored = (await http.get("/api/v1/autorecovery/status")).json()
    assert (stored["enabled"], stored["ledgerReplicationActive"]) == (False, False)
    # cluster_info's ledgerReplicationEnabled is the switch (isLedgerReplicationEnabled).
    info = (await http.get("/api/v1/bookie/cluster_info")).json()
    assert info["ledgerReplicationEnabled"] is False
    on = (await http.put("/api/v1/autorecovery/status?enabled=true")).json()
    assert (on["enabled"], on["ledgerReplicationActive"]) == (True, False)
    info = (await http.get("/api/v1/bookie/cluster_info")).json()
    assert info["ledgerReplicationEnabled"] is True
    schema = (await http.get("/openapi.json")).json()["components"]["schemas"]
    assert set(schema["AutoRecoveryStatus"]["required"]) == set(status)
    delay = await http.put(
        "/api/v1/autorecovery/lost_bookie_recovery_delay", json={"delay_seconds": 30}
    )
    assert delay.json() == {"lostBookieRecoveryDelay": 30}
    assert (await http.get("/api/v1/autorecovery/lost_bookie_recovery_delay")).json() == {
        "lostBookieRecoveryDelay": 30
    }
    bad = await http.put(
        "/api/v1/autorecovery/lost_bookie_recovery_delay", json={"delay_seconds": -1}
    )
    assert bad.status_code == 422
    who = (await http.get("/api/v1/autorecovery/who_is_auditor")).json()
    assert set(who) == {"Auditor"}
    # No auditor runs in this stack: its commands are 503 UNAVAILABLE.
    none = await http.put("/api/v1/autorecovery/trigger_audit")
    assert none.status_code == 503 and none.json()["code"] == "UNAVAILABLE"
    assert "no auditor is elected" in none.json()["detail"]

    # A ledger marked under-replicated shows up in every listing, in BookKeeper's shapes.
    lid = await new_ledger(stack, [b"a"])
    rt = stack.runtimes["gateway"]
    meta = MetadataClient(rt.nc, rt.subjects)
    await meta.mark_underreplicated(lid, ["bookie-2"])
    path = "/api/v1/autorecovery/list_under_replicated_ledger"
    assert lid in (await http.get(path)).json()
    printed = (await http.get(path, params={"printmissingreplica": "true"})).json()
    assert printed[str(lid)] == ["bookie-2"]
    only = await http.get(path, params={"missingreplica": "bookie-3"})
    assert lid not in only.json()
    excluding = await http.get(path, params={"excludingmissingreplica": "bookie-3"})
    assert lid in excluding.json()
    public = (await http.get("/v1/autorecovery/underreplicated")).json()
    row = next(r for r in public["ledgers"] if r["ledger_id"] == lid)
    assert row["missing_bookies"] == ["bookie-2"]
    info = (await http.get("/api/v1/bookie/cluster_info")).json()
    assert info["clusterUnderReplicated"] is True


async def wait_for_auditor(http) -> str:
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        leader = (await http.get("/api/v1/autorecovery/who_is_auditor")).json()["Auditor"]
        if leader is not None:
            return leader
        assert asyncio.get_running_loop().time() < deadline, "no auditor elected"
        await asyncio.sleep(0.05)


async def test_operator_commands_through_a_real_auditor(settings, fresh_database_url) -> None:
    """trigger_audit, decommission and bookie (manual recover) reach the elected auditor
    and mark what BookKeeper's would; a live bookie is not decommissioned; a running
    replicator worker makes the status active."""
    async with running_stack(settings, fresh_database_url, bookies=4) as stack:
        http = stack.http
        await stack.start("replicator", "replicator", stack.settings)
        status = (await http.get("/api/v1/autorecovery/status")).json()
        assert (status["replicators"], status["ledgerReplicationActive"]) == (1, True)
        assert status["detail"] == REPLICATION_ON
        # Off, so that no replicator takes the marks away while this test looks at them.
        assert (await http.put("/api/v1/autorecovery/status?enabled=false")).is_success
        await stack.start("auditor", "auditor", stack.settings)
        await wait_for_auditor(http)

        created = await http.post("/v1/ledgers", json={"password": "pw"})
        lid, ensemble = created.json()["ledger_id"], created.json()["segments"][0]["bookies"]
        victim = ensemble[0]
        live = await http.put("/api/v1/autorecovery/decommission", json={"bookie_src": victim})
        assert live.status_code == 400 and live.json()["code"] == "INVALID_ARGUMENT"
        assert victim in live.json()["detail"]
        assert lid not in (await http.get(LIST)).json()

        await stack.stop(f"{victim}.journal")
        await stack.stop(f"{victim}.ledgerstore")
        decommission = await http.put(
            "/api/v1/autorecovery/decommission", json={"bookie_src": victim}
        )
        assert decommission.status_code == 200, decommission.text
        assert decommission.json()["ledgers_marked"] >= 1
        missing = (
            await http.get(LIST, params={"missingreplica": victim, "printmissingreplica": "true"})
        ).json()
        assert missing[str(lid)] == [victim]

        recover = await http.put(
            "/api/v1/autorecovery/bookie", json={"bookie_src": [victim], "delete_cookie": False}
        )
        assert recover.status_code == 200 and recover.json()["ledgers_marked"] >= 1
        audit = await http.put("/api/v1/autorecovery/trigger_audit")
        assert audit.status_code == 200 and "ledgers_marked" in audit.json()
        bad = await http.put("/api/v1/autorecovery/bookie", json={"bookie_src": victim})
        assert bad.status_code == 422 and bad.json()["code"] == "INVALID_ARGUMENT"


async def test_openapi_describes_every_error_as_a_problem(stack: Stack) -> None:
    document = (await stack.http.get("/openapi.json")).json()
    assert "Problem" in document["components"]["schemas"]
    ids = [op["operationId"] for path in document["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"create_ledger", "append", "recover_ledger", "admin_list_bookies"} <= set(ids)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert "application/problem+json" in response["content"], (method, path)


async def test_method_not_allowed_lists_every_method_of_the_path(stack: Stack) -> None:
    response = await stack.http.request("PATCH", "/v1/ledgers/1")
    assert response.status_code == 405
    assert set(response.headers["Allow"].split(", ")) == {"GET", "DELETE"}
