"""The auditor over a real in-process cluster (metadata, four bookies, a gateway, two
auditors): lost bookies after lostBookieRecoveryDelay, the replicas check finding a damaged
entry, a wiped bookie's limbo, decommission; the standby never acts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from shared import wire
from shared.auditor_client import AuditorClient
from shared.autorecovery import bookies_to_mark
from shared.bookie_client import BookieClient
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.models import LedgerMetadata, Segment, UpdateLedgerRequest
from shared.status import BookieStatus
from shared.subjects import Subjects
from tests.integration.test_gateway_http import PW, append_batch, create
from tests.support.stack import Stack, running_stack
from tests.support.wait import until

BOOKIES = [f"bookie-{i}" for i in range(1, 5)]


def cluster_settings(settings: QuireSettings, data_dir: Path) -> QuireSettings:
    return settings.model_copy(
        update={
            "data_dir": data_dir,
            "metadata": settings.metadata.model_copy(update={"auditor_lease_ms": 3_000}),
            "ledgerstore": settings.ledgerstore.model_copy(update={"flush_interval_ms": 50}),
            "auditor": settings.auditor.model_copy(
                update={
                    "auditor_bookie_registry_poll_interval_ms": 50,
                    "auditor_repair_wait_check_interval_ms": 100,
                }
            ),
        }
    )


class Cluster:
    def __init__(self, stack: Stack, nc) -> None:
        self.stack = stack
        self.subjects = Subjects(stack.settings.subject_prefix)
        self.meta = MetadataClient(nc, self.subjects)
        self.client = AuditorClient(nc, self.subjects, self.meta, timeout_s=30)
        self.bookies = BookieClient(nc, self.subjects, add_timeout_ms=2000, read_timeout_ms=2000)

    def bookie_settings(self, bookie_id: str) -> QuireSettings:
        return self.stack.settings.model_copy(update={"bookie_id": bookie_id})

    async def stop_bookie(self, bookie_id: str) -> None:
        await self.stack.stop(f"{bookie_id}.ledgerstore")
        await self.stack.stop(f"{bookie_id}.journal")

    async def start_bookie(self, bookie_id: str) -> None:
        settings = self.bookie_settings(bookie_id)
        await self.stack.start(f"{bookie_id}.journal", "journal", settings)
        await self.stack.start(f"{bookie_id}.ledgerstore", "ledgerstore", settings)

    def auditors(self) -> list:
        return [self.stack.runtimes[n].auditor for n in ("auditor-1", "auditor-2")]  # type: ignore[attr-defined]

    def leader(self):
        leaders = [a for a in self.auditors() if a.is_leader]
        return leaders[0] if leaders else None

    def standby(self):
        return next(a for a in self.auditors() if a is not self.leader())

    async def marked(self) -> dict[int, list[str]]:
        page = await self.meta.list_underreplicated(limit=1000)
        return {u.ledger_id: u.missing_bookies for u in page.ledgers}

    async def ledgers(self) -> list[LedgerMetadata]:
        return (await self.meta.list_ledgers(limit=1000)).ledgers


@contextlib.asynccontextmanager
async def cluster(
    settings: QuireSettings, database_url: str, nc, **stack_options
) -> AsyncIterator[Cluster]:
    async with running_stack(
        settings, database_url, bookies=len(BOOKIES), **stack_options
    ) as stack:
        await stack.start("auditor-1", "auditor", stack.settings)
        await stack.start("auditor-2", "auditor", stack.settings)
        c = Cluster(stack, nc)
        await until(lambda: c.leader() is not None, "an elected auditor")
        # The new term's bookie check ran over the healthy cluster.
        await until(lambda: c.leader().checks["bookie_check"].runs >= 1, "the bookie check")
        first = c.leader()
        yield c
        # Only the leader acted (and it stayed leader throughout).
        assert c.leader() is first
        assert c.standby().marks == 0 and c.standby().commands == 0


async def closed_ledgers(
    c: Cluster, count: int, entries: int = 8, **body
) -> dict[int, list[bytes]]:
    """`count` closed ledgers, each with the payloads written to it (each payload names its
    ledger and entry, for `flip_payload_bit` to find it on disk)."""
    http = c.stack.http
    written = {}
    for _ in range(count):
        lid = (await create(http, digest="crc32c", **body))["ledger_id"]
        payloads = [
            f"ledger {lid} entry {e} {os.urandom(8).hex()}".encode() for e in range(entries)
        ]
        assert (await append_batch(http, lid, payloads)).status_code == 200
        assert (await http.post(f"/v1/ledgers/{lid}/close", headers=PW)).status_code == 200
        written[lid] = payloads
    return written


def flip_payload_bit(data_dir: Path, metadata: LedgerMetadata, entry_id: int) -> str | None:
    """Flip one bit of the entry's payload (of a `closed_ledgers` ledger) in the first entry
    log of a bookie of its first segment that holds it; that bookie, or None while no entry
    log holds it yet (the ledgerstore flushes it there a little later)."""
    needle = f"ledger {metadata.ledger_id} entry {entry_id} ".encode()
    for bookie_id in metadata.segments[0].bookies:
        for log in (data_dir / bookie_id / "ledgers").glob("entrylog-*.log"):
            at = log.read_bytes().find(needle)
            if at >= 0:
                with open(log, "r+b") as f:
                    f.seek(at + len(needle))
                    byte = f.read(1)
                    f.seek(at + len(needle))
                    f.write(bytes([byte[0] ^ 0x01]))
                return bookie_id
    return None


def holders(ledgers: list[LedgerMetadata], bookie_id: str) -> set[int]:
    return {m.ledger_id for m in ledgers if bookies_to_mark(m, {bookie_id})}


def busiest_bookie(ledgers: list[LedgerMetadata]) -> str:
    return max(BOOKIES, key=lambda b: (len(holders(ledgers, b)), b))


async def test_a_lost_bookie_is_marked_after_the_delay_and_not_if_it_returns_within_it(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    async with cluster(cluster_settings(settings, tmp_path), fresh_database_url, nc) as c:
        await closed_ledgers(c, 6)
        ledgers = await c.ledgers()
        lost = busiest_bookie(ledgers)
        expected = holders(ledgers, lost)
        assert expected
        await c.meta.set_cluster_settings(lost_bookie_recovery_delay_s=600)

        # Lost and back within the delay: its audit waited, then was cancelled.
        await c.stop_bookie(lost)
        await until(lambda: c.leader().lost.waiting == {lost}, "the delayed audit")
        await c.start_bookie(lost)
        await until(lambda: not c.leader().lost.waiting, "the audit cancelled")
        assert await c.marked() == {} and c.leader().marks == 0

        # Lost for good: marked once the (now shorter) delay has passed.
        await c.stop_bookie(lost)
        await until(lambda: c.leader().lost.waiting == {lost}, "the delayed audit")
        assert await c.marked() == {}
        await c.meta.set_cluster_settings(lost_bookie_recovery_delay_s=1)
        await until(lambda: c.leader().last_lost_bookie_audit, "the lost-bookie audit")
        assert await c.marked() == {lid: [lost] for lid in expected}
        assert c.leader().marks_by_reason == {"lost_bookie": len(expected)}
        audit = c.leader().last_lost_bookie_audit
        assert (audit["bookies"], audit["ledgers_marked"]) == ([lost], len(expected))


async def test_replicas_check_finds_a_damaged_entry_and_names_its_bookie(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    async with cluster(cluster_settings(settings, tmp_path), fresh_database_url, nc) as c:
        (lid,) = await closed_ledgers(c, 1, entries=5)
        (metadata,) = await c.ledgers()
        # Damage one replica of entry 3 in its bookie's entry log (one payload bit).
        victim = await until(
            lambda: flip_payload_bit(tmp_path, metadata, 3), "the entry in an entry log"
        )

        reply = await c.client.trigger_audit()
        assert reply["replicas_check"]["ledgers_checked"] == 1
        assert reply["replicas_check"]["ledgers_marked"] == 1
        assert reply["replicas_check"]["digest_unverified_ledgers"] == 0
        assert reply["check_all_ledgers"]["ledgers_checked"] == 1
        assert reply["bookie_check"] == {"ledgers_marked": 0}
        assert await c.marked() == {lid: [victim]}
        assert c.leader().marks_by_reason["replicas_check"] == 1
        # The bookie reported the bad read itself (entry.corrupt): the auditor marks that
        # too, naming the same bookie.
        await until(lambda: c.leader().corrupt_events >= 1, "the entry.corrupt event")
        assert await c.marked() == {lid: [victim]}

        # The leader's status (the standby answers the same subject: ask until the leader
        # does) has each check's last run and findings.
        async def leader_status() -> dict | None:
            reply = await nc.request(c.subjects.service("auditor", "status"), b"", 5)
            status = json.loads(reply.data)
            return status if status["leader"] else None

        status = await until(leader_status, "the leader's status")
        replicas = status["checks"]["replicas_check"]
        assert replicas["runs"] == 1 and replicas["last_findings"]["ledgers_marked"] == 1
        assert replicas["last_duration_ms"] >= 0 and replicas["last_error"] is None
        assert status["ledgers_marked_by_reason"]["replicas_check"] == 1


async def wipe_the_busiest_bookie(c, data_dir: Path) -> tuple[str, set[int]]:
    """Stop the bookie that holds the most ledgers, remove its disk and start it again (its
    cookie then says limbo); once the auditor has marked each ledger it held (reason limbo,
    and nothing else: the lost-bookie delay is set long), the bookie and those ledgers."""
    ledgers = await c.ledgers()
    wiped = busiest_bookie(ledgers)
    expected = holders(ledgers, wiped)
    await c.meta.set_cluster_settings(lost_bookie_recovery_delay_s=600)
    await c.stop_bookie(wiped)
    shutil.rmtree(data_dir / wiped)
    await c.start_bookie(wiped)
    await until(lambda: c.leader().limbo_marked == {wiped}, "the limbo marks")
    assert await c.marked() == {lid: [wiped] for lid in expected}
    assert c.leader().marks_by_reason == {"limbo": len(expected)}
    return wiped, expected


async def test_a_wiped_bookie_is_marked_in_limbo_and_its_limbo_cleared_once_repaired(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    async with cluster(cluster_settings(settings, tmp_path), fresh_database_url, nc) as c:
        await closed_ledgers(c, 4)
        wiped, expected = await wipe_the_busiest_bookie(c, tmp_path)
        lid = min(expected)
        status, answers = await c.bookies.read(wiped, [wire.ReadItem(lid, 0)])
        assert answers[0].status is BookieStatus.UNKNOWN_LEDGER_STATE

        # What a replicator does once it has repaired each ledger (copied the wiped
        # bookie's fragments elsewhere): the queue empties, and the limbo is cleared.
        while claimed := await c.meta.claim_underreplicated("test-worker", 60_000):
            assert await c.meta.mark_replicated(
                claimed.ledger_id, "test-worker", claimed.mark_version
            )
        await until(lambda: not c.leader().limbo_marked, "the limbo cleared")
        await until(lambda: registered_limbo(c, wiped, False), "the registration without limbo")
        await until(lambda: _answers_no_ledger(c, wiped, lid), "NO_LEDGER answers")


async def registered_limbo(c: Cluster, bookie_id: str, limbo: bool) -> bool:
    infos = {b.bookie_id: b.info for b in await c.meta.list_bookies()}
    return infos[bookie_id].get("limbo") is limbo


async def _answers_no_ledger(c: Cluster, bookie_id: str, lid: int) -> bool:
    _, answers = await c.bookies.read(bookie_id, [wire.ReadItem(lid, 0)])
    return answers[0].status is BookieStatus.NO_LEDGER


async def test_decommission_marks_then_removes_cookie_and_registration_once_no_ledger_needs_it(
    settings: QuireSettings, fresh_database_url: str, nc, tmp_path: Path
) -> None:
    async with cluster(cluster_settings(settings, tmp_path), fresh_database_url, nc) as c:
        await closed_ledgers(c, 4)
        ledgers = await c.ledgers()
        gone = busiest_bookie(ledgers)
        expected = holders(ledgers, gone)
        await c.meta.set_cluster_settings(lost_bookie_recovery_delay_s=600)
        assert (await c.meta.get_cookie(gone)).data is not None
        await c.stop_bookie(gone)
        assert await c.client.decommission(gone) == {"ledgers_marked": len(expected)}
        assert await c.marked() == {lid: [gone] for lid in expected}
        assert c.leader().pending_cookie_removals == {gone}

        # A replicator's work, by hand: each segment's `gone` replaced by a bookie the
        # segment lacks. The cookie goes once the last ledger no longer needs `gone`.
        for metadata in ledgers:
            if metadata.ledger_id not in expected:
                continue
            assert (await c.meta.get_cookie(gone)).data is not None
            segments = []
            for segment in metadata.segments:
                spare = next(b for b in BOOKIES if b not in segment.bookies)
                bookies = [spare if b == gone else b for b in segment.bookies]
                segments.append(Segment(first_entry_id=segment.first_entry_id, bookies=bookies))
            await c.meta.update_ledger(
                UpdateLedgerRequest(
                    ledger_id=metadata.ledger_id,
                    expected_version=metadata.version,
                    segments=segments,
                )
            )
        await until(lambda: not c.leader().pending_cookie_removals, "the cookie removal")
        assert (await c.meta.get_cookie(gone)).data is None
        # Its registration went after the cookie: no listing shows it, and the auditor
        # neither waits to audit it nor counts its absence as a loss.
        assert gone not in {b.bookie_id for b in await c.meta.list_bookies()}
        assert gone not in c.leader().lost.waiting and gone not in c.leader().known
        reply = await c.client.trigger_audit()
        assert reply["bookie_check"] == {"ledgers_marked": 0}
        assert reply["placement_policy_check"]["ledgers_not_adhering"] == 0
