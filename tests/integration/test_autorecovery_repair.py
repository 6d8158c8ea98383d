"""Auto-recovery end to end, both halves for real: the elected auditor finds the damage and
marks the ledger, the replicator copies it to a healthy bookie, and every replica of the
new ensemble then serves every entry as it was written (asked of each bookie directly, its
digest checked). Over the in-process cluster of test_auditor_cluster (metadata, four
bookies, a gateway, two auditors) plus a replicator."""

from __future__ import annotations

from pathlib import Path

from shared import wire
from shared.config import QuireSettings
from shared.digest import DigestManager, LedgerKeys
from shared.models import LedgerMetadata
from shared.status import BookieStatus
from tests.integration.test_auditor_cluster import (
    BOOKIES,
    Cluster,
    closed_ledgers,
    cluster,
    cluster_settings,
    flip_payload_bit,
    registered_limbo,
    wipe_the_busiest_bookie,
)
from tests.integration.test_replicator import (
    autorecovery_events,
    kinds,
    queue_empty,
    replicator_settings,
)
from tests.support.wait import until


async def each_replica_serves(c: Cluster, metadata: LedgerMetadata, written: list[bytes]) -> None:
    """Every bookie of every segment answers every entry of its segment, digest intact and
    payload as written (Qw = E: the whole ensemble is each entry's write set)."""
    assert metadata.write_quorum == metadata.ensemble_size
    keys = LedgerKeys.of(metadata)
    assert keys is not None, "the ledger's keys are stored"
    digest = DigestManager.for_keys(metadata.digest, keys)
    last = metadata.last_entry_id
    assert last == len(written) - 1
    bounds = [s.first_entry_id for s in metadata.segments[1:]] + [last + 1]
    for segment, end in zip(metadata.segments, bounds, strict=True):
        items = [wire.ReadItem(metadata.ledger_id, e) for e in range(segment.first_entry_id, end)]
        for bookie_id in segment.bookies:
            status, answers = await c.bookies.read(bookie_id, items)
            assert status is BookieStatus.OK, (bookie_id, status)
            for item, answer in zip(items, answers, strict=True):
                assert answer.status is BookieStatus.OK, (bookie_id, item, answer.status)
                entry = digest.verify(answer.frame, item.ledger_id, item.entry_id)
                assert entry.payload == written[item.entry_id], (bookie_id, item)


def ensemble_bookies(metadata: LedgerMetadata) -> set[str]:
    return {b for segment in metadata.segments for b in segment.bookies}


async def ledger_with_a_flipped_bit(c, data_dir: Path):
    """A closed ledger of 6 entries, entry 3's payload with one bit flipped in one bookie's
    entry log: its id, what was written, its metadata and that bookie."""
    ((lid, written),) = (await closed_ledgers(c, 1, entries=6)).items()
    before = await c.meta.get_ledger(lid)
    victim = await until(lambda: flip_payload_bit(data_dir, before, 3), "the entry in an entry log")
    return lid, written, before, victim


async def test_an_entry_log_bitflip_is_found_by_the_replicas_check_and_repaired(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    async with cluster(cluster_settings(settings, tmp_path), fresh_database_url, nc) as c:
        lid, written, before, victim = await ledger_with_a_flipped_bit(c, tmp_path)

        reply = await c.client.trigger_audit()
        assert reply["replicas_check"]["ledgers_marked"] == 1
        # The bad read also made the bookie emit entry.corrupt, which the auditor marks too
        # (the same bookie): let both marks land before the replicator starts.
        await until(lambda: c.leader().corrupt_events >= 1, "the entry.corrupt event")
        assert await c.marked() == {lid: [victim]}

        async with autorecovery_events(nc, c.subjects) as events:
            await c.stack.start("replicator", "replicator", replicator_settings(c.stack))
            await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
            await until(lambda: queue_empty(c.meta), "the queue to empty")
        # One claim, one copy: the two marks were one entry of the queue. (The replicator's
        # own check of the marked bookie reads the damaged entry too: the bookie says so
        # again, and that mark merges into the same entry.)
        done = [k for k in kinds(events, lid) if k != "marked"]
        assert done[:3] == ["claimed", "fragment_replicated", "replicated"]
        assert done.count("fragment_replicated") == 1
        claimed = next(e for e in events if e.kind == "autorecovery.claimed")
        assert claimed.data["missing_bookies"] == [victim]

        after = await c.meta.get_ledger(lid)
        (spare,) = set(BOOKIES) - set(before.segments[0].bookies)
        # The victim's place in the segment is taken by the one bookie the ledger lacked.
        assert [s.bookies for s in after.segments] == [
            [spare if b == victim else b for b in before.segments[0].bookies]
        ]
        await each_replica_serves(c, after, written)


async def test_a_wiped_bookie_in_limbo_is_repaired_and_its_limbo_cleared(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    async with cluster(cluster_settings(settings, tmp_path), fresh_database_url, nc) as c:
        ledgers = await closed_ledgers(c, 4)
        wiped, expected = await wipe_the_busiest_bookie(c, tmp_path)

        async with autorecovery_events(nc, c.subjects) as events:
            await c.stack.start("replicator", "replicator", replicator_settings(c.stack))
            await until(
                lambda: all("replicated" in kinds(events, lid) for lid in expected),
                "every marked ledger replicated",
            )
            await until(lambda: queue_empty(c.meta), "the queue to empty")
        claims = [e for e in events if e.kind == "autorecovery.claimed"]
        assert {e.ledger_id for e in claims} == expected
        assert all(e.data["missing_bookies"] == [wiped] for e in claims)
        await until(lambda: not c.leader().limbo_marked, "the limbo cleared")
        await until(lambda: registered_limbo(c, wiped, False), "the registration without limbo")

        # The replicator moves the wiped bookie's fragments to other bookies: no segment
        # names it any more (it does not refill the wiped bookie itself).
        for metadata in await c.ledgers():
            assert wiped not in ensemble_bookies(metadata), metadata
            await each_replica_serves(c, metadata, ledgers[metadata.ledger_id])


async def test_a_read_that_finds_a_corrupt_entry_leads_to_a_repaired_ledger(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    async with cluster(cluster_settings(settings, tmp_path), fresh_database_url, nc) as c:
        lid, written, before, victim = await ledger_with_a_flipped_bit(c, tmp_path)
        async with autorecovery_events(nc, c.subjects) as events:
            await c.stack.start("replicator", "replicator", replicator_settings(c.stack))
            # No audit: a reader asks the damaged bookie for the entry, the ledgerstore finds
            # the frame failing its digest and says so (entry.corrupt) instead of serving it.
            _, [answer] = await c.bookies.read(victim, [wire.ReadItem(lid, 3)])
            assert answer.status is not BookieStatus.OK
            await until(lambda: "replicated" in kinds(events, lid), "the replicated event")
            await until(lambda: queue_empty(c.meta), "the queue to empty")
        # Marked for the damaged entry alone (the replicator's check of the bookie reads it
        # again, which the bookie reports again).
        assert set(c.leader().marks_by_reason) == {"entry_corrupt"}
        claimed = next(e for e in events if e.kind == "autorecovery.claimed")
        assert claimed.data["missing_bookies"] == [victim]
        after = await c.meta.get_ledger(lid)
        assert victim not in ensemble_bookies(after)
        await each_replica_serves(c, after, written)
