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
from tests.support.wait import until

LEASE_MS = 900


def audit_settings(settings: QuireSettings, database_url: str) -> QuireSettings:
    return settings.model_copy(
        update={
            "database_url": database_url,
            "metadata": settings.metadata.model_copy(
                update={"auditor_lease_ms": LEASE_MS, "bookie_lease_ms": 120_000}
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
        for bookie_id in ("b1", "b2", "b3", "b4"):
            await meta.register_bookie(bookie_id)

        async with (
            running_service("auditor", settings, "auditor-1") as one,
            running_service("auditor", settings, "auditor-2") as two,
        ):
            leader = await wait_for_leader([one, two])
            standby = two.auditor if leader is one.auditor else one.auditor  # type: ignore[attr-defined]
            # The bookie check of the new term ran (and found nothing): what follows is
            # the commands' doing.
            await until(lambda: leader.checks["bookie_check"].runs >= 1, "the bookie check")

            on_b1 = await closed_ledger(meta, ["b1", "b2", "b3"], last_entry_id=10)
            on_b5 = await closed_ledger(meta, ["b2", "b3", "b5"], last_entry_id=10)
            # One entry, E=3, Qw=2: written to ensemble indexes 0 and 1 only; b1 holds
            # nothing, but the ledger names it: marked all the same (BookKeeper's rule), so
            # that the replicator replaces it there.
            b1_empty = await closed_ledger(meta, ["b2", "b3", "b1"], last_entry_id=0)

            # A standby addressed directly refuses to act.
            reply = await nc.request(
                subjects.auditor_command(standby.candidate_id, "trigger_audit"), b"{}", 5
            )
            assert json.loads(reply.data)["error"]["code"] == "UNAVAILABLE"

            assert await client.recover_bookie(["b1"], delete_cookie=False) == {"ledgers_marked": 2}
            assert await marked(meta) == {on_b1.ledger_id: ["b1"], b1_empty.ledger_id: ["b1"]}

            # b4 is alive: decommission refuses it and marks nothing.
            with pytest.raises(QuireError) as alive:
                await client.decommission("b4")
            assert alive.value.api is ApiCodes.INVALID_ARGUMENT
            with pytest.raises(QuireError) as bad:
                await client.recover_bookie(["not a bookie id"], delete_cookie=False)
            assert bad.value.api is ApiCodes.INVALID_ARGUMENT

            # b5 is not registered: decommission marks its ledger.
            assert await client.decommission("b5") == {"ledgers_marked": 1}
            assert (await marked(meta))[on_b5.ledger_id] == ["b5"]
            assert (await marked(meta))[b1_empty.ledger_id] == ["b1"]  # b5 not in it

            # trigger_audit runs every check now. No bookie process runs here: the reads of
            # the check-all-ledgers find them unreachable, which marks nothing.
            reply = await client.trigger_audit()
            assert reply["bookie_check"] == {"ledgers_marked": 1}  # on_b5 names b5
            assert reply["check_all_ledgers"]["ledgers_checked"] == 3
            assert reply["check_all_ledgers"]["ledgers_marked"] == 0
            assert reply["check_all_ledgers"]["unreachable"] > 0
            assert reply["placement_policy_check"] == {
                "ledgers_not_adhering": 1,
                "ledgers_softly_adhering": 0,
                "segments_not_adhering": 1,
                "marked": False,
            }
            assert reply["ledgers_marked"] == 1

            assert standby.commands == 0 and standby.marks == 0
            assert leader.commands == 3 and leader.marks == 4  # 2 recover, 1 decommission, 1 audit

            # recover_bookie with delete_cookie of a bookie registered alive: no ledger
            # needs it, but its registration stays (only a lapsed one is removed). b5 stays
            # pending: on_b5 still names it.
            assert await client.recover_bookie(["b4"], delete_cookie=True) == {"ledgers_marked": 0}
            await until(lambda: "b4" not in leader.pending_cookie_removals, "the removal look")
            assert leader.pending_cookie_removals == {"b5"}
            assert "b4" in {b.bookie_id for b in await meta.list_bookies()}


async def test_entry_corrupt_events_mark_and_malformed_ones_are_dropped(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    settings = audit_settings(settings, fresh_database_url)
    subjects = Subjects(settings.subject_prefix)
    meta = MetadataClient(nc, subjects)
    js = nc.jetstream()
    async with running_service("metadata", settings):
        await wait_until_serving(meta)
        for bookie_id in ("b1", "b2", "b3"):
            await meta.register_bookie(bookie_id)
        ledger = await closed_ledger(meta, ["b1", "b2", "b3"], last_entry_id=10)
        subject = subjects.event("entry.corrupt")
        # Published before any auditor runs: the durable consumer still gets them.
        for body in (
            b"not json",
            json.dumps({"kind": "entry.corrupt", "ledger_id": "x", "bookie_id": "b2"}).encode(),
            json.dumps({"kind": "entry.corrupt", "ledger_id": 999_999, "bookie_id": "b2"}).encode(),
            json.dumps(
                {
                    "kind": "entry.corrupt",
                    "ledger_id": ledger.ledger_id,
                    "bookie_id": "b2",
                    "source": "b2.ledgerstore",
                    "data": {"entry_id": 4},
                }
            ).encode(),
        ):
            await js.publish(subject, body)
        async with (
            running_service("auditor", settings, "auditor-1") as one,
            running_service("auditor", settings, "auditor-2") as two,
        ):
            leader = await wait_for_leader([one, two])
            standby = two.auditor if leader is one.auditor else one.auditor  # type: ignore[attr-defined]
            await until(lambda: leader.corrupt_events == 2, "the events consumed")
            assert leader.malformed_events == 2
            assert await marked(meta) == {ledger.ledger_id: ["b2"]}
            assert leader.marks_by_reason == {"entry_corrupt": 1}
            assert standby.corrupt_events == standby.malformed_events == standby.marks == 0


async def test_with_autorecovery_disabled_nothing_is_audited_until_it_is_enabled(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    settings = audit_settings(settings, fresh_database_url)
    subjects = Subjects(settings.subject_prefix)
    meta = MetadataClient(nc, subjects)
    client = AuditorClient(nc, subjects, meta, timeout_s=10)
    async with running_service("metadata", settings):
        await wait_until_serving(meta)
        for bookie_id in ("b1", "b2", "b3", "b4"):
            await meta.register_bookie(bookie_id)
        ledger = await closed_ledger(meta, ["b1", "b2", "b4"], last_entry_id=10)
        async with running_service("auditor", settings, "auditor-1") as one:
            auditor = await wait_for_leader([one])
            await until(lambda: auditor.checks["bookie_check"].runs >= 1, "the bookie check")
            await meta.set_cluster_settings(autorecovery_enabled=False)
            await until(lambda: not auditor.autorecovery_enabled, "the switch read")

            await meta.unregister_bookie("b4")
            looks = auditor.audits
            await until(lambda: auditor.audits >= looks + 3, "three looks at the registry")
            reply = await client.trigger_audit()
            assert reply["ledgers_marked"] == 0
            assert reply["replicas_check"] == {"skipped": "autorecovery disabled"}
            assert await marked(meta) == {} and auditor.marks == 0

            # Enabled again: the registry is compared again, b4 is lost (delay 0).
            await meta.set_cluster_settings(autorecovery_enabled=True)
            await until(lambda: auditor.last_lost_bookie_audit, "the lost-bookie audit")
            assert await marked(meta) == {ledger.ledger_id: ["b4"]}
            assert auditor.marks_by_reason == {"lost_bookie": 1}
