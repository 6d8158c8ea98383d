"""PostgresMetadataStore against a real PostgreSQL: schema, ids, compare-and-set, leases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from quire.infra import free_port
from services.metadata.db import metadata
from services.metadata.store import (
    BadVersion,
    LedgerExists,
    NoSuchLedger,
    PostgresMetadataStore,
    StoreUnavailable,
)
from shared.models import (
    BookieState,
    CreateLedgerRequest,
    LedgerState,
    RegisterBookieRequest,
    Segment,
    UpdateLedgerRequest,
)

ENSEMBLE = ["bookie-1", "bookie-2", "bookie-3"]


def create_request(ledger_id: int | None = None, **extra) -> CreateLedgerRequest:
    return CreateLedgerRequest(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        digest="crc32c",
        ensemble=ENSEMBLE,
        password_salt="salt",
        password_hash="hash",
        **extra,
    )


async def open_store(url: str) -> PostgresMetadataStore:
    return await PostgresMetadataStore.open(url, pool_size=4, timeout_s=5.0)


@pytest.fixture
async def store(fresh_database_url: str) -> AsyncIterator[PostgresMetadataStore]:
    opened = await open_store(fresh_database_url)
    yield opened
    await opened.close()


async def test_migration_matches_models_and_serializes_across_instances(
    fresh_database_url: str,
) -> None:
    # Three instances starting at once: the advisory lock lets one create the schema.
    stores = await asyncio.gather(*(open_store(fresh_database_url) for _ in range(3)))
    for opened in stores:
        await opened.close()
    engine = create_engine(fresh_database_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata)
            sequences = conn.execute(
                text(
                    "SELECT sequence_name, start_value, minimum_value "
                    "FROM information_schema.sequences"
                )
            ).all()
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    assert diffs == []
    assert [tuple(map(str, s)) for s in sequences] == [("ledger_id_seq", "0", "0")]
    assert revision == "0001"


async def test_create_and_get(store: PostgresMetadataStore) -> None:
    created = await store.create_ledger(create_request(metadata={"k": "v"}), ctime_ms=1234)
    assert created.ledger_id == 0
    assert created.state is LedgerState.OPEN
    assert created.version == 0
    assert created.ctime == 1234
    assert created.segments == [Segment(first_entry_id=0, bookies=ENSEMBLE)]
    assert created.last_entry_id is None and created.length == 0
    assert (created.password_salt, created.password_hash) == ("salt", "hash")
    assert await store.get_ledger(0) == created
    second = await store.create_ledger(create_request(), ctime_ms=1)
    assert second.ledger_id == 1
    with pytest.raises(NoSuchLedger):
        await store.get_ledger(99)


async def test_user_chosen_ids_and_sequence_skips_them(store: PostgresMetadataStore) -> None:
    for chosen in (0, 1, 2, 5):
        assert (await store.create_ledger(create_request(chosen), 0)).ledger_id == chosen
    with pytest.raises(LedgerExists):
        await store.create_ledger(create_request(5), 0)
    allocated = [(await store.create_ledger(create_request(), 0)).ledger_id for _ in range(3)]
    assert allocated == [3, 4, 6]


async def test_list_pages_in_id_order(store: PostgresMetadataStore) -> None:
    for chosen in (7, 3, 11, 5, 9):
        await store.create_ledger(create_request(chosen), 0)
    first = await store.list_ledgers(after=None, limit=2)
    assert [m.ledger_id for m in first.ledgers] == [3, 5]
    assert first.next_after == 5
    second = await store.list_ledgers(after=5, limit=2)
    assert [m.ledger_id for m in second.ledgers] == [7, 9]
    last = await store.list_ledgers(after=second.next_after, limit=2)
    assert [m.ledger_id for m in last.ledgers] == [11]
    assert last.next_after is None
    exact = await store.list_ledgers(after=None, limit=5)
    assert len(exact.ledgers) == 5 and exact.next_after is None


async def test_update_is_compare_and_set(store: PostgresMetadataStore) -> None:
    ledger = await store.create_ledger(create_request(), 0)
    new_segments = [
        Segment(first_entry_id=0, bookies=ENSEMBLE),
        Segment(first_entry_id=10, bookies=["bookie-1", "bookie-4", "bookie-3"]),
    ]
    change = await store.update_ledger(
        UpdateLedgerRequest(ledger_id=ledger.ledger_id, expected_version=0, segments=new_segments)
    )
    assert change.metadata.version == 1
    assert change.metadata.segments == new_segments
    assert change.segments_changed and change.previous_state is LedgerState.OPEN

    with pytest.raises(BadVersion) as lost:
        await store.update_ledger(
            UpdateLedgerRequest(
                ledger_id=ledger.ledger_id, expected_version=0, state=LedgerState.CLOSED
            )
        )
    assert lost.value.current == change.metadata

    closed = await store.update_ledger(
        UpdateLedgerRequest(
            ledger_id=ledger.ledger_id,
            expected_version=1,
            state=LedgerState.CLOSED,
            last_entry_id=41,
            length=4200,
        )
    )
    assert closed.metadata.version == 2
    assert (closed.metadata.state, closed.metadata.last_entry_id, closed.metadata.length) == (
        LedgerState.CLOSED,
        41,
        4200,
    )
    assert closed.metadata.segments == new_segments  # untouched fields stay
    assert not closed.segments_changed and closed.previous_state is LedgerState.OPEN
    assert await store.get_ledger(ledger.ledger_id) == closed.metadata

    with pytest.raises(NoSuchLedger):
        await store.update_ledger(UpdateLedgerRequest(ledger_id=999, expected_version=0, length=1))


async def test_concurrent_cas_has_exactly_one_winner_per_version(
    store: PostgresMetadataStore,
) -> None:
    ledger = await store.create_ledger(create_request(), 0)
    for version in range(3):

        async def attempt(length: int, expected: int = version):
            return await store.update_ledger(
                UpdateLedgerRequest(
                    ledger_id=ledger.ledger_id, expected_version=expected, length=length
                )
            )

        outcomes = await asyncio.gather(*(attempt(i) for i in range(20)), return_exceptions=True)
        winners = [o for o in outcomes if not isinstance(o, BaseException)]
        losers = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(winners) == 1
        assert all(isinstance(o, BadVersion) for o in losers), losers
        stored = await store.get_ledger(ledger.ledger_id)
        assert stored.version == version + 1
        assert stored.length == winners[0].metadata.length
        assert all(o.current.version >= version + 1 for o in losers)


async def test_delete(store: PostgresMetadataStore) -> None:
    ledger = await store.create_ledger(create_request(), 0)
    await store.delete_ledger(ledger.ledger_id)
    with pytest.raises(NoSuchLedger):
        await store.get_ledger(ledger.ledger_id)
    with pytest.raises(NoSuchLedger):
        await store.delete_ledger(ledger.ledger_id)
    # A deleted id is not handed out again.
    assert (await store.create_ledger(create_request(), 0)).ledger_id == ledger.ledger_id + 1


async def test_bookie_leases(store: PostgresMetadataStore) -> None:
    lease_ms = 100
    first = await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-1", info={"host": "a"}), 1_000, lease_ms
    )
    assert first.previous_state is None
    assert first.info.state is BookieState.WRITABLE
    assert (first.info.last_seen, first.info.lease_expires_at) == (1_000, 1_100)
    await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-2", state=BookieState.READONLY), 1_000, 500
    )

    assert [(b.bookie_id, b.state) for b in await store.list_bookies(1_099)] == [
        ("bookie-1", BookieState.WRITABLE),
        ("bookie-2", BookieState.READONLY),
    ]
    assert [b.state for b in await store.list_bookies(1_100)] == [
        BookieState.LOST,
        BookieState.READONLY,
    ]

    # A heartbeat after the lease ran out brings it back, and says it had been lost.
    back = await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-1", info={"host": "b"}), 1_200, lease_ms
    )
    assert back.previous_state is BookieState.LOST
    assert back.info.state is BookieState.WRITABLE and back.info.info == {"host": "b"}
    renewed = await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-1"), 1_250, lease_ms
    )
    assert renewed.previous_state is BookieState.WRITABLE

    gone = await store.unregister_bookie("bookie-2", 1_300)
    assert gone is not None and gone.state is BookieState.LOST
    assert [b.state for b in await store.list_bookies(1_300)] == [
        BookieState.WRITABLE,
        BookieState.LOST,
    ]
    assert await store.unregister_bookie("bookie-9", 1_300) is None


async def test_unreachable_database_is_unavailable() -> None:
    engine = create_async_engine(
        f"postgresql+psycopg://quire@127.0.0.1:{free_port()}/quire",
        connect_args={"connect_timeout": 1},
    )
    store = PostgresMetadataStore(engine)
    try:
        with pytest.raises(StoreUnavailable):
            await store.get_ledger(1)
        with pytest.raises(StoreUnavailable):
            await store.update_ledger(
                UpdateLedgerRequest(ledger_id=1, expected_version=0, length=1)
            )
    finally:
        await store.close()
