"""The auditor's operator commands through AuditorClient, over the real metadata service:
only the elected auditor acts, and each command marks the ledgers it should."""

from __future__ import annotations

import asyncio
import json

import pytest

from shared.auditor_client import AuditorClient
from shared.config import QuireSettings
from shared.digest import DigestType
from shared.metaclient import MetadataClient
from shared.models import CreateLedgerRequest, LedgerMetadata, LedgerState, UpdateLedgerRequest
from shared.status import ApiCodes, QuireError
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving

LEASE_MS = 900


def audit_settings(settings: QuireSettings, database_url: str) -> QuireSettings:
    return settings.model_copy(
        update={
            "database_url": database_url,
            "metadata": settings.metadata.model_copy(
                update={"auditor_lease_ms": LEASE_MS, "bookie_lease_ms": 300}
            ),
        }
    )


async def closed_ledger(
    meta: MetadataClient, ensemble: list[str], last_entry_id: int, write_quorum: int = 2
) -> LedgerMetadata:
    created = await meta.create_ledger(
        CreateLedgerRequest(
            ensemble_size=len(ensemble),
            write_quorum=write_quorum,
            ack_quorum=write_quorum,
            digest=DigestType.CRC32C,
            ensemble=ensemble,
        )
    )
    return await meta.update_ledger(
        UpdateLedgerRequest(
            ledger_id=created.ledger_id,
            expected_version=created.version,
            state=LedgerState.CLOSED,
            last_entry_id=last_entry_id,
        )
    )


async def marked(meta: MetadataClient) -> dict[int, list[str]]:
    page = await meta.list_underreplicated(limit=1000)
    return {u.ledger_id: u.missing_bookies for u in page.ledgers}


async def wait_for_leader(auditors: list) -> object:
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        leaders = [rt.auditor for rt in auditors if rt.auditor.is_leader]
        if leaders:
            return leaders[0]
        assert asyncio.get_running_loop().time() < deadline, "no auditor elected"
        await asyncio.sleep(0.02)


async def test_commands_reach_the_leader_only_and_mark_what_they_should(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    settings = audit_settings(settings, fresh_database_url)
    subjects = Subjects(settings.subject_prefix)
    meta = MetadataClient(nc, subjects)
    client = AuditorClient(nc, subjects, meta, timeout_s=10)
    async with running_service("metadata", settings):
        await wait_until_serving(meta)
        with pytest.raises(QuireError) as none_elected:
            await client.trigger_audit()
        assert none_elected.value.api is ApiCodes.UNAVAILABLE

        on_b1 = await closed_ledger(meta, ["b1", "b2", "b3"], last_entry_id=10)
        elsewhere = await closed_ledger(meta, ["b2", "b3", "b4"], last_entry_id=10)
        # One entry, E=3, Qw=2: written to ensemble indexes 0 and 1 only; b1 holds nothing.
        b1_empty = await closed_ledger(meta, ["b2", "b3", "b1"], last_entry_id=0)
        await meta.register_bookie("b4")

        async with (
            running_service("auditor", settings, "auditor-1") as one,
            running_service("auditor", settings, "auditor-2") as two,
        ):
            leader = await wait_for_leader([one, two])
            standby = two.auditor if leader is one.auditor else one.auditor  # type: ignore[attr-defined]

            # A standby addressed directly refuses to act.
            reply = await nc.request(
                subjects.auditor_command(standby.candidate_id, "trigger_audit"), b"{}", 5
            )
            assert json.loads(reply.data)["error"]["code"] == "UNAVAILABLE"

            assert await client.recover_bookie(["b1"], delete_cookie=False) == {"ledgers_marked": 1}
            assert await marked(meta) == {on_b1.ledger_id: ["b1"]}

            # b4 is alive: decommission refuses it and marks nothing.
            with pytest.raises(QuireError) as alive:
                await client.decommission("b4")
            assert alive.value.api is ApiCodes.INVALID_ARGUMENT
            with pytest.raises(QuireError) as bad:
                await client.recover_bookie(["not a bookie id"], delete_cookie=False)
            assert bad.value.api is ApiCodes.INVALID_ARGUMENT

            # Once b4's lease lapses it is lost: decommission marks its ledger.
            deadline = asyncio.get_running_loop().time() + 10
            while any(b.state.value != "lost" for b in await meta.list_bookies()):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            assert await client.decommission("b4") == {"ledgers_marked": 1}
            assert (await marked(meta))[elsewhere.ledger_id] == ["b4"]
            assert b1_empty.ledger_id not in await marked(meta)

            assert standby.commands == 0 and standby.marks == 0
            assert leader.commands == 2 and leader.marks == 2
