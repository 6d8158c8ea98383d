"""The metadata service over PostgreSQL with a synchronous standby, through a failover:
the primary is killed (-9, every backend with it), the standby promoted, and the service,
whose QUIRE_DATABASE_URL names both, finds the new primary by itself. Nothing it
acknowledged is lost, no answer was wrong, and every error in between was UNAVAILABLE
(retry after a re-read). deploy/postgres/README.md is the runbook this test follows."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quire.infra import ManagedProcess, start_postgres
from quire.pgstandby import (
    connect,
    is_primary,
    kill_hard,
    promote,
    rejoin_as_standby,
    replication_status,
    start_standby,
)
from services.metadata.postgres import InvalidDatabaseUrl, conninfo_from_url
from shared.config import QuireSettings
from shared.metaclient import MetadataClient, MetadataError
from shared.models import MetaErrorCode, UpdateLedgerRequest
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving
from tests.support.metadata import create_request
from tests.support.wait import until

WORKERS = 4
ACKS_BEFORE_KILL = 100  # acknowledged operations before the primary dies
ACKS_AFTER_PROMOTION = 100  # and after the promotion: the service has recovered
REQUEST_TIMEOUT_MS = 2_000


def failover_url(*servers: ManagedProcess) -> str:
    """The documented form (deploy/postgres/README.md): every server, the primary taken."""
    hosts = "&".join(f"host=127.0.0.1:{s.extra['port']}" for s in servers)
    return f"postgresql+psycopg://quire@/quire?{hosts}&target_session_attrs=read-write"


def test_the_failover_url_reaches_every_host_and_only_a_primary() -> None:
    conninfo = conninfo_from_url(
        "postgresql+psycopg://quire:s%40cret@/quire"
        "?host=pg-a:5432&host=pg-b:5433&target_session_attrs=read-write"
    )
    assert set(conninfo.split()) == {
        "host=pg-a,pg-b",
        "port=5432,5433",
        "target_session_attrs=read-write",
        "user=quire",
        "password=s@cret",
        "dbname=quire",
    }
    with pytest.raises(InvalidDatabaseUrl, match="target_session_attrs=read-write"):
        conninfo_from_url("postgresql+psycopg://quire@/quire?host=pg-a:5432&host=pg-b:5433")


def replayed_version(server: ManagedProcess, ledger_id: int) -> int | None:
    with connect(server) as conn:
        row = conn.execute("SELECT version FROM ledgers WHERE ledger_id = %s", (ledger_id,))
        found = row.fetchone()
    return None if found is None else found[0]


@dataclass
class Ledger:
    """What a worker was told about one of its ledgers (only it updates them)."""

    ledger_id: int
    seen: int  # the newest version an answer showed
    # A CAS from `seen` whose answer was lost: the stored version may be seen + 1.
    unknown: bool = False


@dataclass
class Record:
    acks: int = 0
    unavailable: int = 0
    wrong: list[str] = field(default_factory=list)
    ledgers: list[Ledger] = field(default_factory=list)


async def worker(client: MetadataClient, record: Record, stop: asyncio.Event) -> None:
    """Creates a ledger, then CASes it (length = the new version) a few times; repeats.
    After an UNAVAILABLE it re-reads before it CASes again (what the writer does)."""
    ledger: Ledger | None = None
    stale = False  # the last CAS's answer was lost: re-read first
    while not stop.is_set():
        cas = False
        try:
            if ledger is None or ledger.seen >= 5:
                created = await client.create_ledger(create_request())
                if created.version != 0:
                    record.wrong.append(f"create answered {created}")
                ledger = Ledger(created.ledger_id, created.version)
                record.ledgers.append(ledger)
            elif stale:
                stored = await client.get_ledger(ledger.ledger_id)
                if not ledger.seen <= stored.version <= ledger.seen + ledger.unknown:
                    record.wrong.append(f"read {stored.version} after {ledger}")
                ledger.seen, ledger.unknown, stale = stored.version, False, False
            else:
                cas, expected = True, ledger.seen
                updated = await client.update_ledger(
                    UpdateLedgerRequest(
                        ledger_id=ledger.ledger_id, expected_version=expected, length=expected + 1
                    )
                )
                if (updated.version, updated.length) != (expected + 1, expected + 1):
                    record.wrong.append(f"CAS from {expected} answered {updated}")
                ledger.seen = updated.version
            record.acks += 1
        except MetadataError as exc:
            if exc.code is not MetaErrorCode.UNAVAILABLE:
                record.wrong.append(f"{exc.code}: {exc.message}")
                return
            record.unavailable += 1
            # A create's lost answer leaves at most an empty ledger no one knows of.
            if cas:
                assert ledger is not None
                ledger.unknown = stale = True
            await asyncio.sleep(0.05)  # a client's back-off before its retry


async def test_metadata_service_survives_a_primary_killed_and_its_standby_promoted(
    cluster_dir, settings: QuireSettings, nc
) -> None:
    base = Path(cluster_dir("pg-failover"))
    primary = await asyncio.to_thread(start_postgres, base / "primary")
    standby: ManagedProcess | None = None
    try:
        standby = await asyncio.to_thread(start_standby, primary, base / "standby", name="sb1")
        [row] = await asyncio.to_thread(replication_status, primary)
        assert (row["application_name"], row["sync_state"]) == ("sb1", "sync")
        meta_settings = settings.model_copy(
            update={
                "database_url": failover_url(primary, standby),
                "request_timeout_ms": REQUEST_TIMEOUT_MS,
            }
        )
        async with running_service("metadata", meta_settings):
            subjects = Subjects(settings.subject_prefix)
            client = MetadataClient(nc, subjects, timeout_s=5.0)
            published: set[int | None] = set()

            async def collect(msg) -> None:
                published.add(json.loads(msg.data).get("ledger_id"))

            await nc.subscribe(subjects.events_wildcard, cb=collect)
            await wait_until_serving(client)
            record = Record()
            stop = asyncio.Event()
            workers = [asyncio.create_task(worker(client, record, stop)) for _ in range(WORKERS)]
            try:
                await until(lambda: record.acks >= ACKS_BEFORE_KILL or record.wrong, "acks")
                await asyncio.to_thread(kill_hard, primary)
                await asyncio.to_thread(promote, standby)
                promoted_at = record.acks
                await until(
                    lambda: record.acks >= promoted_at + ACKS_AFTER_PROMOTION or record.wrong,
                    "the metadata service to serve from the promoted standby",
                )
            finally:
                stop.set()
                await asyncio.gather(*workers)
            assert record.wrong == []
            assert record.unavailable > 0, "the failover went unseen: nothing was tested"
            assert await asyncio.to_thread(is_primary, standby)
            for ledger in record.ledgers:
                stored = await client.get_ledger(ledger.ledger_id)
                assert ledger.seen <= stored.version <= ledger.seen + ledger.unknown, ledger
                assert stored.length == stored.version
            # The outbox publisher found the new primary too: the newest ledger's events.
            newest = record.ledgers[-1]
            await until(lambda: newest.ledger_id in published, "events from the new primary")

            # The old primary, rewound, comes back as the new primary's synchronous standby.
            primary = await asyncio.to_thread(
                rejoin_as_standby, standby, base / "primary", name="old_primary"
            )
            [row] = await asyncio.to_thread(replication_status, standby)
            assert (row["application_name"], row["sync_state"]) == ("old_primary", "sync")
            stored = await client.get_ledger(newest.ledger_id)
            updated = await client.update_ledger(
                UpdateLedgerRequest(
                    ledger_id=stored.ledger_id,
                    expected_version=stored.version,
                    length=stored.version + 1,
                )
            )
            await until(
                lambda: replayed_version(primary, updated.ledger_id) == updated.version,
                "the rejoined standby to replay the newest CAS",
            )
    finally:
        if standby is not None:
            await asyncio.to_thread(standby.stop)
        await asyncio.to_thread(primary.stop)
