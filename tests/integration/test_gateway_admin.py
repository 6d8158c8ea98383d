"""BookKeeper's admin REST API (/api/v1/...) and /v1/autorecovery/underreplicated on a real
stack: the paths and answer shapes a BookKeeper operator's scripts expect."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest

from shared.metaclient import MetadataClient
from shared.models import PRIVATE_LEDGER_FIELDS
from tests.support.stack import Stack, running_stack, scratch_database, stack_settings

PW = {"Quire-Ledger-Password": "pw"}


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
    # Nothing re-replicates, so cluster_info does not say replication is enabled.
    assert info["ledgerReplicationEnabled"] is False
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
    # `enabled` is the stored switch; whatever it says, no ledger is re-replicated, and
    # the answer says that too.
    status = (await http.get("/api/v1/autorecovery/status")).json()
    assert set(status) == {"enabled", "ledgerReplicationActive", "detail"}
    assert status["enabled"] is True and status["ledgerReplicationActive"] is False
    assert "No ledger is re-replicated" in status["detail"]
    off = (await http.put("/api/v1/autorecovery/status?enabled=false")).json()
    assert (off["enabled"], off["ledgerReplicationActive"]) == (False, False)
    stored = (await http.get("/api/v1/autorecovery/status")).json()
    assert (stored["enabled"], stored["ledgerReplicationActive"]) == (False, False)
    on = (await http.put("/api/v1/autorecovery/status?enabled=true")).json()
    assert (on["enabled"], on["ledgerReplicationActive"]) == (True, False)
    info = (await http.get("/api/v1/bookie/cluster_info")).json()
    assert info["ledgerReplicationEnabled"] is False
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

    # A ledger marked under-replicated shows up in both listings.
    lid = await new_ledger(stack, [b"a"])
    rt = stack.runtimes["gateway"]
    meta = MetadataClient(rt.nc, rt.subjects)
    await meta.mark_underreplicated(lid, ["bookie-2"])
    listed = (await http.get("/api/v1/autorecovery/list_under_replicated_ledger")).json()
    assert listed[str(lid)] == ["bookie-2"]
    only = await http.get(
        "/api/v1/autorecovery/list_under_replicated_ledger", params={"missingreplica": "bookie-3"}
    )
    assert str(lid) not in only.json()
    public = (await http.get("/v1/autorecovery/underreplicated")).json()
    row = next(r for r in public["ledgers"] if r["ledger_id"] == lid)
    assert row["missing_bookies"] == ["bookie-2"]
    info = (await http.get("/api/v1/bookie/cluster_info")).json()
    assert info["clusterUnderReplicated"] is True


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
