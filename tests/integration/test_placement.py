"""Rack-aware placement over real services (docs/placement.md): bookies register their
location, the gateway places new ledgers and ensemble changes so that every write quorum
spans two racks, refuses (503 NOT_ENOUGH_BOOKIES, enforced) when one rack is left; and a
bookie moved to another rack makes the auditor's placement check mark the ledgers it broke,
which the replicator moves back into adherence."""

from __future__ import annotations

from pathlib import Path

from shared import clock
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.models import BookieState, LedgerMetadata
from shared.protocol.placement import Adherence, PlacementPolicy, PlacementRules
from shared.subjects import Subjects
from tests.integration.test_auditor_cluster import cluster, cluster_settings
from tests.integration.test_autorecovery_repair import each_replica_serves
from tests.integration.test_gateway_http import PW, append_batch, create
from tests.integration.test_replicator import queue_empty, replicator_settings
from tests.support.stack import Stack, running_stack
from tests.support.wait import until

TWO_RACKS = {
    "bookie-1": "/zone-a/rack-1",
    "bookie-2": "/zone-a/rack-1",
    "bookie-3": "/zone-a/rack-2",
    "bookie-4": "/zone-a/rack-2",
}
RACKAWARE = PlacementRules(policy="rackaware", enforce_min_num_racks_per_write_quorum=True)


def with_placement(settings: QuireSettings, rules: PlacementRules) -> QuireSettings:
    placement = settings.placement.model_copy(
        update={
            "policy": rules.policy,
            "enforce_min_num_racks_per_write_quorum": rules.enforce_min_num_racks_per_write_quorum,
        }
    )
    return settings.model_copy(update={"placement": placement})


async def locations(meta: MetadataClient) -> dict[str, str]:
    return {b.bookie_id: b.location for b in await meta.list_bookies()}


def adheres(metadata: LedgerMetadata, located: dict[str, str]) -> bool:
    policy = PlacementPolicy(RACKAWARE)
    return all(
        policy.check(s.bookies, metadata.write_quorum, located).adherence is Adherence.MEETS_STRICT
        for s in metadata.segments
    )


async def stop_bookie(stack: Stack, bookie_id: str) -> None:
    await stack.stop(f"{bookie_id}.ledgerstore")
    await stack.stop(f"{bookie_id}.journal")


async def test_rackaware_ledgers_and_ensemble_changes_span_two_racks_or_fail_503(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    racks = {**TWO_RACKS, "bookie-5": "/zone-a/rack-2"}
    config = with_placement(settings, RACKAWARE)
    async with running_stack(config, fresh_database_url, 5, bookie_locations=racks) as stack:
        meta = MetadataClient(nc, Subjects(config.subject_prefix))
        await until(lambda: _all_registered(meta, racks), "every bookie with its location")
        listed = (await stack.http.get("/v1/bookies")).json()
        assert {b["bookie_id"]: b["location"] for b in listed["bookies"]} == racks

        ledgers = []
        for quorum in [(2, 2, 2), (4, 2, 2), (3, 3, 2), (2, 2, 2), (4, 2, 2)]:
            e, w, a = quorum
            body = await create(stack.http, ensemble_size=e, write_quorum=w, ack_quorum=a)
            ledgers.append(body["ledger_id"])
        for lid in ledgers:
            assert adheres(await meta.get_ledger(lid), racks), lid

        # A bookie of rack-2 stops: every ledger written after it is replaced by the other
        # rack-2 bookies, never a rack-1 one that would put a write quorum on one rack.
        # (With Qa < Qw the add is acknowledged first and the change follows: waited for.)
        await stop_bookie(stack, "bookie-3")
        for lid in ledgers:
            # Four entries: with E up to 4 every position is some entry's write quorum.
            response = await append_batch(stack.http, lid, [b"after bookie-3 stopped"] * 4)
            assert response.status_code == 200, response.text

            async def replaced(lid: int = lid) -> bool:
                return "bookie-3" not in (await meta.get_ledger(lid)).segments[-1].bookies

            await until(replaced, f"ledger {lid} off bookie-3")
            metadata = await meta.get_ledger(lid)
            assert adheres(metadata, racks), metadata

        # Rack-2 gone: enforced, no ledger can have two racks per write quorum.
        await stop_bookie(stack, "bookie-4")
        await stop_bookie(stack, "bookie-5")
        await until(lambda: _writable_racks(meta, {"/zone-a/rack-1"}), "only rack-1 writable")
        response = await stack.http.post(
            "/v1/ledgers",
            json={"ensemble_size": 2, "write_quorum": 2, "ack_quorum": 2, "password": "s3cret"},
        )
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "NOT_ENOUGH_BOOKIES"
        assert "no rackaware placement" in response.text


async def _all_registered(meta, racks: dict[str, str]) -> bool:
    return await locations(meta) == racks


async def _writable_racks(meta, wanted: set[str]) -> bool:
    """The racks of the bookies a gateway would take as writable now."""
    now_ms = clock.wall_ms()
    bookies = await meta.list_bookies()
    writable = {
        b.location
        for b in bookies
        if b.state is BookieState.WRITABLE and b.lease_expires_at > now_ms
    }
    return writable == wanted


async def test_a_bookie_moved_to_another_rack_is_repaired_by_auditor_and_replicator(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    config = cluster_settings(with_placement(settings, RACKAWARE), tmp_path)
    config = config.model_copy(
        update={
            "auditor": config.auditor.model_copy(
                update={"repaired_placement_policy_not_adhering_bookie_enable": True}
            )
        }
    )
    async with cluster(config, fresh_database_url, nc, bookie_locations=TWO_RACKS) as c:
        await until(lambda: _all_registered(c.meta, TWO_RACKS), "the bookies' locations")
        written: dict[int, list[bytes]] = {}
        for n in range(4):
            lid = (await create(c.stack.http, ensemble_size=2, write_quorum=2, ack_quorum=2))[
                "ledger_id"
            ]
            payloads = [f"ledger {lid} entry {e}".encode() for e in range(5 + n)]
            assert (await append_batch(c.stack.http, lid, payloads)).status_code == 200
            assert (await c.stack.http.post(f"/v1/ledgers/{lid}/close", headers=PW)).is_success
            written[lid] = payloads
        assert (await c.client.trigger_audit())["placement_policy_check"] == {
            "ledgers_not_adhering": 0,
            "ledgers_softly_adhering": 0,
            "segments_not_adhering": 0,
            "marked": True,
        }

        # The operator moves bookie-3 into rack-1 (restarted with its new location): every
        # ledger on bookie-3 with a rack-1 bookie now has a write quorum on one rack.
        moved = {**TWO_RACKS, "bookie-3": "/zone-a/rack-1"}
        await stop_bookie(c.stack, "bookie-3")
        bookie_3 = c.stack.settings.model_copy(
            update={"bookie_id": "bookie-3", "bookie_location": moved["bookie-3"]}
        )
        await c.stack.start("bookie-3.journal", "journal", bookie_3)
        await c.stack.start("bookie-3.ledgerstore", "ledgerstore", bookie_3)
        await until(lambda: _all_registered(c.meta, moved), "bookie-3 in rack-1")
        broken = {m.ledger_id for m in await c.ledgers() if not adheres(m, moved)}
        assert broken, "some ledger had bookie-3 with a rack-1 bookie"

        found = (await c.client.trigger_audit())["placement_policy_check"]
        assert found["ledgers_not_adhering"] == len(broken) and found["marked"]
        assert set(await c.marked()) == broken
        assert c.leader().periodic.ledgers_not_adhering == len(broken)

        await c.stack.start("replicator", "replicator", replicator_settings(c.stack))
        await until(lambda: queue_empty(c.meta), "the marked ledgers repaired")
        for metadata in await c.ledgers():
            assert adheres(metadata, moved), metadata
            await each_replica_serves(c, metadata, written[metadata.ledger_id])
        found = (await c.client.trigger_audit())["placement_policy_check"]
        assert found["ledgers_not_adhering"] == 0
