"""PostgresMetadataStore's own concerns against a real PostgreSQL: the schema and its
migrations, unreachable and restarted servers, the outbox's order. What every store does
alike is in test_metadata_contract.py."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from quire.infra import free_port, start_postgres
from services.metadata.postgres import PostgresMetadataStore, conninfo_from_url, new_pool
from services.metadata.schema import metadata
from services.metadata.store import BadVersion, StoreUnavailable
from shared.models import UpdateLedgerRequest
from tests.support.metadata import create_request


async def open_store(url: str, timeout_s: float = 5.0) -> PostgresMetadataStore:
    return await PostgresMetadataStore.open(url, pool_size=4, timeout_s=timeout_s)


async def test_migration_matches_models_and_serializes_across_instances(
    fresh_database_url: str,
) -> None:
    # Three instances starting at once: the advisory lock lets one create the schema.
    stores = await asyncio.gather(*(open_store(fresh_database_url) for _ in range(3)))
    ids = {await s.instance_id() for s in stores}
    for opened in stores:
        await opened.close()
    assert len(ids) == 1  # one cluster, one instance id, made once
    engine = create_engine(fresh_database_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata)
            sequences = conn.execute(
                text(
                    "SELECT sequence_name, start_value, minimum_value "
                    "FROM information_schema.sequences ORDER BY sequence_name"
                )
            ).all()
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    assert diffs == []
    assert [tuple(map(str, s)) for s in sequences] == [
        ("ledger_id_seq", "0", "0"),
        ("outbox_id_seq", "1", "1"),
    ]
    assert revision == "0003"


async def test_unreachable_database_is_unavailable() -> None:
    url = f"postgresql+psycopg://quire@127.0.0.1:{free_port()}/quire"
    pool = new_pool(url, size=2, timeout_s=1.0)
    await pool.open()  # not waiting: the pool keeps trying in the background
    store = PostgresMetadataStore(pool, "x")
    try:
        with pytest.raises(StoreUnavailable):
            await store.get_ledger(1)
        with pytest.raises(StoreUnavailable):
            await store.update_ledger(
                UpdateLedgerRequest(ledger_id=1, expected_version=0, length=1), 0
            )
    finally:
        await store.close()


@pytest.mark.slow
async def test_postgres_restarted_mid_cas_the_caller_only_trusts_what_it_saw(
    cluster_dir,
) -> None:
    """Writers CAS in a loop while PostgreSQL restarts under them. A CAS answered OK
    happened; UNAVAILABLE may or may not have: the writer re-reads. At the end the stored
    version counts every CAS that happened, and each set length = its version."""
    pg_dir = cluster_dir("pg-restart") / "pg"  # enterable by PostgreSQL's own user
    server = await asyncio.to_thread(start_postgres, pg_dir)
    store = await open_store(server.url, timeout_s=2.0)
    port = server.extra["port"]
    try:
        ledger = await store.create_ledger(create_request(), 0)
        outcomes = {"ok": 0, "unavailable": 0, "bad_version": 0}
        stop = asyncio.Event()

        async def writer() -> None:
            known = None
            while not stop.is_set():
                try:
                    if known is None:
                        known = (await store.get_ledger(ledger.ledger_id)).version
                    change = await store.update_ledger(
                        UpdateLedgerRequest(
                            ledger_id=ledger.ledger_id, expected_version=known, length=known + 1
                        ),
                        0,
                    )
                    known = change.metadata.version
                    outcomes["ok"] += 1
                except BadVersion as exc:
                    known = exc.current.version
                    outcomes["bad_version"] += 1
                except StoreUnavailable:
                    known = None  # never assume: re-read once it answers again
                    outcomes["unavailable"] += 1
                    await asyncio.sleep(0.05)

        writers = [asyncio.create_task(writer()) for _ in range(4)]
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(0.3)
        server = await asyncio.to_thread(start_postgres, pg_dir, port)
        ok_before = outcomes["ok"]
        deadline = asyncio.get_running_loop().time() + 30
        while outcomes["ok"] < ok_before + 20:
            assert asyncio.get_running_loop().time() < deadline, outcomes
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*writers)
        stored = await store.get_ledger(ledger.ledger_id)
        assert outcomes["unavailable"] > 0, outcomes
        assert stored.version >= outcomes["ok"]
        assert stored.length == stored.version
    finally:
        await store.close()
        await asyncio.to_thread(server.stop)


async def test_a_statement_past_the_timeout_is_unavailable_and_its_connection_replaced(
    fresh_database_url: str,
) -> None:
    """A statement cut off by the timeout leaves its connection in an unknown state: the
    caller hears UNAVAILABLE, the connection is closed, and the pool (one connection
    here) replaces it, so the store serves again once PostgreSQL answers."""
    store = await PostgresMetadataStore.open(fresh_database_url, pool_size=1, timeout_s=1.0)
    locker = await psycopg.AsyncConnection.connect(conninfo_from_url(fresh_database_url))
    try:
        ledger = await store.create_ledger(create_request(), 0)
        await locker.execute("LOCK TABLE ledgers IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailable):
            await store.get_ledger(ledger.ledger_id)
        await locker.rollback()
        assert (await store.get_ledger(ledger.ledger_id)).ledger_id == ledger.ledger_id
    finally:
        await locker.close()
        await store.close()


async def test_group_commit_keeps_each_requests_outcome(fresh_database_url: str) -> None:
    # One batch in flight at a time: what arrives meanwhile is written together.
    store = await PostgresMetadataStore.open(
        fresh_database_url, pool_size=4, timeout_s=5.0, batch_max=64, batches_in_flight=1
    )
    try:
        created = await asyncio.gather(
            *(store.create_ledger(create_request(), 0) for _ in range(40))
        )
        assert len({m.ledger_id for m in created}) == 40
        assert store.creates.stats.batches < 40  # grouped: fewer statements than creates
        # Two CAS of one ledger at one version (one wins), one at a stale version, the rest
        # fine: each answered alone.
        ids = [m.ledger_id for m in created]
        requests = [UpdateLedgerRequest(ledger_id=i, expected_version=0, length=7) for i in ids]
        requests.append(UpdateLedgerRequest(ledger_id=ids[0], expected_version=0, length=8))
        requests.append(UpdateLedgerRequest(ledger_id=ids[1], expected_version=5, length=9))
        outcomes = await asyncio.gather(
            *(store.update_ledger(r, 1) for r in requests), return_exceptions=True
        )
        assert store.updates.stats.batches < len(requests)
        first = outcomes[0], outcomes[40]
        assert sum(isinstance(o, BadVersion) for o in first) == 1
        assert isinstance(outcomes[41], BadVersion)
        assert all(not isinstance(o, BaseException) for o in outcomes[1:40])
        for ledger_id in ids[1:]:
            stored = await store.get_ledger(ledger_id)
            assert (stored.version, stored.length) == (1, 7)
        winner = next(o for o in first if not isinstance(o, BaseException))
        assert (await store.get_ledger(ids[0])).length == winner.metadata.length
    finally:
        await store.close()
