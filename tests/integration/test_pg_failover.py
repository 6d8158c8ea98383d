"""The metadata service over PostgreSQL with a synchronous standby, through a failover:
the primary is killed (-9, every backend with it), the standby promoted, and the service,
whose QUIRE_DATABASE_URL names both, finds the new primary by itself. Nothing it
acknowledged is lost, no answer was wrong, and every error in between was UNAVAILABLE
(retry after a re-read); then the old primary, rewound, rejoins as the new one's standby.
Also: the URL forms and TCP settings, the fence of a primary still up (read-only), and
`quire up --postgres-standby`'s standby. deploy/postgres/README.md is the runbook these
follow."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quire.cluster import STANDBY_DIR, STANDBY_NAME, Cluster, ClusterConfig, postgres_credentials
from quire.infra import InfraError, ManagedProcess, free_port, start_postgres
from quire.pgstandby import (
    connect,
    failover_url,
    is_primary,
    kill_hard,
    promote,
    rejoin_as_standby,
    replication_status,
    start_standby,
)
from services.metadata.postgres import (
    InvalidDatabaseUrl,
    PostgresMetadataStore,
    connection_kwargs,
    conninfo_from_url,
)
from services.metadata.store import StoreUnavailable
from shared.config import QuireSettings
from shared.metaclient import MetadataClient, MetadataError
from shared.models import MetaErrorCode, UpdateLedgerRequest
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving
from tests.support.metadata import create_request
from tests.support.wait import until
from tests.unit.test_cluster_supervision import ScriptCluster

DATABASE = "postgresql+psycopg://quire@pg-a:5432/quire"
WORKERS = 4
ACKS_BEFORE_KILL = 100  # acknowledged operations before the primary dies
ACKS_AFTER_PROMOTION = 100  # and after the promotion: the service has recovered
REQUEST_TIMEOUT_MS = 2_000


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


def test_a_server_gone_silent_is_noticed_within_the_timeout_unless_the_url_says() -> None:
    """Measured by hand (deploy/postgres/README.md): without these, a check of the pool's
    idle connections hung on a black-holed primary and kept them out of use."""
    settings = connection_kwargs(2.0)
    assert settings["tcp_user_timeout"] == 2000
    assert (settings["keepalives"], settings["keepalives_idle"]) == (1, 2)
    own = connection_kwargs(2.0, conninfo_from_url(f"{DATABASE}?tcp_user_timeout=30000"))
    assert "tcp_user_timeout" not in own  # the URL's 30000 stands
    assert own["keepalives_idle"] == 2


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
    cluster_dir, settings: QuireSettings, nc, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="services.metadata.postgres")
    base = Path(cluster_dir("pg-failover"))
    primary = await asyncio.to_thread(start_postgres, base / "primary")
    standby: ManagedProcess | None = None
    try:
        standby = await asyncio.to_thread(start_standby, primary, base / "standby", name="sb1")
        [row] = await asyncio.to_thread(replication_status, primary)
        assert (row["application_name"], row["sync_state"]) == ("sb1", "sync")
        meta_settings = settings.model_copy(
            update={
                "database_url": failover_url(primary.url, [primary, standby]),
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
            servers = [
                r.server for r in caplog.records if r.getMessage() == "connected to PostgreSQL"
            ]
            assert servers == [f"127.0.0.1:{s.extra['port']}" for s in (primary, standby)]
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


async def test_a_primary_fenced_read_only_sends_the_store_to_the_promoted_standby(
    cluster_dir,
) -> None:
    """The runbook's fence for a primary still up: default_transaction_read_only. Its
    connections' writes fail (UNAVAILABLE, nothing written), are dropped, and no new one
    settles on it; once the standby is promoted, the store writes there."""
    base = Path(cluster_dir("pg-fence"))
    primary = await asyncio.to_thread(start_postgres, base / "primary")
    standby: ManagedProcess | None = None
    store: PostgresMetadataStore | None = None
    try:
        standby = await asyncio.to_thread(start_standby, primary, base / "standby", name="sb1")
        store = await PostgresMetadataStore.open(
            failover_url(primary.url, [primary, standby]), pool_size=2, timeout_s=2.0
        )
        ledger = await store.create_ledger(create_request(), 0)

        def cas(version: int) -> UpdateLedgerRequest:
            return UpdateLedgerRequest(
                ledger_id=ledger.ledger_id, expected_version=version, length=version + 1
            )

        await asyncio.to_thread(fence_read_only, primary)
        # A pooled connection's backend takes the reload at its next statement, or, if
        # the signal comes a moment late, at the one after: CAS until one is refused.
        known = 0

        async def refused() -> bool:
            nonlocal known
            try:
                known = (await store.update_ledger(cas(known), 0)).metadata.version
            except StoreUnavailable as exc:
                assert "read-only" in str(exc)
                return True
            return False

        await until(refused, "the fenced primary to refuse a write")
        await asyncio.to_thread(promote, standby)

        async def written() -> bool:
            try:
                return (await store.update_ledger(cas(known), 0)).metadata.version == known + 1
            except StoreUnavailable:
                return False

        await until(written, "a CAS on the promoted standby")
        assert await asyncio.to_thread(replayed_version, primary, ledger.ledger_id) == known
        assert await asyncio.to_thread(replayed_version, standby, ledger.ledger_id) == known + 1
    finally:
        if store is not None:
            await store.close()
        if standby is not None:
            await asyncio.to_thread(standby.stop)
        await asyncio.to_thread(primary.stop)


def fence_read_only(server: ManagedProcess) -> None:
    with connect(server) as conn:
        conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        conn.execute("SELECT pg_reload_conf()")


def test_quire_up_runs_its_postgres_with_a_supervised_synchronous_standby(cluster_dir) -> None:
    """`quire up --postgres-standby` (its supervision with script stand-ins for the
    services, as tests/unit/test_cluster_supervision.py runs it; PostgreSQL real): the
    metadata service is given both servers, the standby is synchronous, comes back
    synchronous when killed, and is resumed, not rebuilt, by the next `quire up`. Without
    the flag, a data dir with a standby is refused; with its standby removed, a new one is
    made, or without the flag the primary runs alone."""
    base = Path(cluster_dir("up-standby"))
    out = base / "out"
    out.mkdir()

    def cluster(standby: bool) -> Cluster:
        config = ClusterConfig(
            data_dir=base / "data",
            bookies=1,
            http_port=free_port(),
            grpc_port=free_port(),
            nats_url="nats://127.0.0.1:4222",  # set, so that only PostgreSQL is real
            postgres_standby=standby,
            env_for=lambda name: {"SUP_OUT": str(out), "SUP_NAME": name},
        )
        return ScriptCluster(config, out=io.StringIO(), err=io.StringIO())

    def synchronous(up: Cluster) -> bool:
        assert up.postgres is not None
        _, password = postgres_credentials(up.data_dir) or ("", "")
        rows = replication_status(up.postgres, password)
        return [(r["application_name"], r["sync_state"]) for r in rows] == [(STANDBY_NAME, "sync")]

    up = cluster(standby=True)
    up.start()
    try:
        assert up.postgres is not None and up.postgres_standby is not None
        assert synchronous(up)
        given = conninfo_from_url(up.database_url).split()
        ports = f"port={up.postgres.extra['port']},{up.postgres_standby.extra['port']}"
        assert {ports, "target_session_attrs=read-write"} <= set(given)
        old = up.pid(STANDBY_DIR)
        kill_hard(up.postgres_standby)
        asyncio.run(
            until(
                lambda: up.pid(STANDBY_DIR) not in (None, old) and synchronous(up),
                "the standby restarted and synchronous again",
            )
        )
    finally:
        up.stop()
    up = cluster(standby=True)
    up.start()
    try:
        assert synchronous(up)
    finally:
        up.stop()
    with pytest.raises(InfraError, match="--postgres-standby"):
        cluster(standby=False).start()
    # The standby's dir removed: a new standby is made, though the primary still names the
    # old one (it must not wait for it meanwhile: it would wait forever) ...
    shutil.rmtree(base / "data" / STANDBY_DIR)
    up = cluster(standby=True)
    up.start()
    try:
        assert synchronous(up)
    finally:
        up.stop()
    # ... or, without the flag, the primary is set to run alone.
    shutil.rmtree(base / "data" / STANDBY_DIR)
    up = cluster(standby=False)
    up.start()
    try:
        assert up.postgres is not None
        _, password = postgres_credentials(up.data_dir) or ("", "")
        with connect(up.postgres, password) as conn:
            assert conn.execute("SHOW synchronous_standby_names").fetchone() == ("",)
            assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
    finally:
        up.stop()
