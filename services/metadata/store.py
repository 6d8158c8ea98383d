"""Where ledger metadata and the bookie registry live.

`MetadataStore` is the contract the service needs; `PostgresMetadataStore` keeps it in
PostgreSQL. Every ledger update is a compare-and-set on the row version. An error that
leaves the outcome unknown (a lost connection, a timeout) is `StoreUnavailable`: the
caller must re-read, never assume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Insert,
    Row,
    Text,
    Update,
    bindparam,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from services.metadata import core
from services.metadata.core import LedgerChange
from services.metadata.db import bookies, ledger_id_seq, ledgers
from services.metadata.migrate import migrate
from shared.models import (
    BookieInfo,
    BookieState,
    CreateLedgerRequest,
    LedgerMetadata,
    LedgerState,
    ListLedgersReply,
    MetaErrorCode,
    RegisterBookieRequest,
    UpdateLedgerRequest,
)

log = logging.getLogger(__name__)

# Attempts at a sequence id before giving up; each collision with user-chosen ids moves the
# sequence past the whole run of taken ids, so a second attempt nearly always succeeds.
MAX_ID_ATTEMPTS = 8
# More bookies than this in one cluster is a misconfiguration, not a list to answer.
MAX_BOOKIES_LISTED = 10_000
# How long the service waits for PostgreSQL to accept connections at start.
STARTUP_DEADLINE_S = 60.0


class StoreError(Exception):
    code: MetaErrorCode = MetaErrorCode.INTERNAL


class NoSuchLedger(StoreError):
    code = MetaErrorCode.NO_SUCH_LEDGER


class LedgerExists(StoreError):
    code = MetaErrorCode.LEDGER_EXISTS


class BadVersion(StoreError):
    """The compare-and-set lost (BookKeeper's BadVersion): `current` is what is stored."""

    code = MetaErrorCode.BAD_VERSION

    def __init__(self, message: str, current: LedgerMetadata) -> None:
        super().__init__(message)
        self.current = current


class StoreUnavailable(StoreError):
    """PostgreSQL did not answer: whatever was asked may or may not have happened."""

    code = MetaErrorCode.UNAVAILABLE


@dataclass(frozen=True)
class BookieRegistration:
    info: BookieInfo
    previous_state: BookieState | None  # None: first registration


class MetadataStore(Protocol):
    async def create_ledger(self, request: CreateLedgerRequest, ctime_ms: int) -> LedgerMetadata:
        """A new OPEN ledger: the chosen id (LedgerExists if taken) or a fresh one."""
        ...

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata: ...

    async def list_ledgers(self, after: int | None, limit: int) -> ListLedgersReply: ...

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerChange:
        """Compare-and-set: NoSuchLedger, BadVersion (with the current metadata) or the
        change."""
        ...

    async def delete_ledger(self, ledger_id: int) -> None: ...

    async def register_bookie(
        self, request: RegisterBookieRequest, now_ms: int, lease_ms: int
    ) -> BookieRegistration: ...

    async def unregister_bookie(self, bookie_id: str, now_ms: int) -> BookieInfo | None:
        """Expire the bookie's lease now; None if it never registered."""
        ...

    async def list_bookies(self, now_ms: int) -> list[BookieInfo]: ...

    async def close(self) -> None: ...


# -- rows <-> models ----------------------------------------------------------------------


def ledger_row(meta: LedgerMetadata) -> dict[str, Any]:
    return {
        "ledger_id": meta.ledger_id,
        "version": meta.version,
        "state": meta.state.value,
        "ensemble_size": meta.ensemble_size,
        "write_quorum": meta.write_quorum,
        "ack_quorum": meta.ack_quorum,
        "digest": meta.digest.value,
        "last_entry_id": meta.last_entry_id,
        "length": meta.length,
        "ctime": meta.ctime,
        "custom_metadata": meta.metadata,
        "segments": [s.model_dump(mode="json") for s in meta.segments],
        "password_salt": meta.password_salt,
        "password_hash": meta.password_hash,
        "format_version": meta.format_version,
    }


def ledger_from_row(row: Row[Any]) -> LedgerMetadata:
    m = row._mapping
    return LedgerMetadata.model_validate(
        {
            "ledger_id": m["ledger_id"],
            "version": m["version"],
            "state": m["state"],
            "ensemble_size": m["ensemble_size"],
            "write_quorum": m["write_quorum"],
            "ack_quorum": m["ack_quorum"],
            "digest": m["digest"],
            "last_entry_id": m["last_entry_id"],
            "length": m["length"],
            "ctime": m["ctime"],
            "metadata": m["custom_metadata"],
            "segments": m["segments"],
            "password_salt": m["password_salt"],
            "password_hash": m["password_hash"],
            "format_version": m["format_version"],
        }
    )


def bookie_from_row(row: Row[Any], now_ms: int) -> BookieInfo:
    m = row._mapping
    return BookieInfo(
        bookie_id=m["bookie_id"],
        state=core.bookie_state(BookieState(m["state"]), m["lease_expires_at"], now_ms),
        last_seen=m["last_seen"],
        lease_expires_at=m["lease_expires_at"],
        info=m["info"],
    )


def is_unavailable(exc: BaseException) -> bool:
    """Errors after which nobody knows whether the statement took effect."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(
        exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError | OSError
    )


# -- PostgreSQL ---------------------------------------------------------------------------


class PostgresMetadataStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._base_engine = engine
        # Every operation is one statement, atomic by itself: autocommit saves the BEGIN and
        # COMMIT round trips. Shares the base engine's pool.
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")

    @classmethod
    async def open(
        cls,
        database_url: str,
        *,
        pool_size: int,
        timeout_s: float,
        startup_deadline_s: float = STARTUP_DEADLINE_S,
    ) -> PostgresMetadataStore:
        """Connect, bring the schema to the newest migration, and serve."""
        engine = create_async_engine(
            database_url,
            pool_size=pool_size,
            max_overflow=0,
            # A request waits this long for a connection, then answers UNAVAILABLE.
            pool_timeout=timeout_s,
            connect_args={"connect_timeout": max(1, int(timeout_s))},
        )
        try:
            await migrate_when_reachable(engine, startup_deadline_s)
        except BaseException:
            await engine.dispose()
            raise
        return cls(engine)

    async def close(self) -> None:
        await self._base_engine.dispose()

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self._engine.connect() as conn:
                yield conn
        except StoreError:
            raise
        except Exception as exc:
            if is_unavailable(exc):
                raise StoreUnavailable(
                    f"PostgreSQL: {exc.__class__.__name__}: {str(exc).splitlines()[0]}"
                ) from exc
            raise

    # -- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, request: CreateLedgerRequest, ctime_ms: int) -> LedgerMetadata:
        values = ledger_row(core.new_ledger(request, request.ledger_id or 0, ctime_ms))
        async with self._connect() as conn:
            if request.ledger_id is not None:
                row = (await conn.execute(INSERT_LEDGER, values)).first()
                if row is None:
                    raise LedgerExists(f"ledger {request.ledger_id} exists")
                return ledger_from_row(row)
            del values["ledger_id"]
            for _ in range(MAX_ID_ATTEMPTS):
                row = (await conn.execute(INSERT_LEDGER_NEXT_ID, values)).first()
                if row is not None:
                    return ledger_from_row(row)
                await self._skip_taken_ids(conn)
        raise StoreUnavailable(f"no free ledger id after {MAX_ID_ATTEMPTS} attempts")

    @staticmethod
    async def _skip_taken_ids(conn: AsyncConnection) -> None:
        """The sequence ran into user-chosen ids: move it past that run of taken ids, only
        ever forward (an id it gave out must never come back)."""
        taken = (await conn.execute(text("SELECT currval('ledger_id_seq')"))).scalar_one()
        await conn.execute(
            text("""
            SELECT count(nextval('ledger_id_seq')) FROM generate_series(1, (
                SELECT min(l.ledger_id) FROM ledgers l
                WHERE l.ledger_id >= :taken
                  AND NOT EXISTS (SELECT 1 FROM ledgers m WHERE m.ledger_id = l.ledger_id + 1)
            ) - :taken)"""),
            {"taken": taken},
        )

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata:
        async with self._connect() as conn:
            meta = await self._read_ledger(conn, ledger_id)
        if meta is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")
        return meta

    @staticmethod
    async def _read_ledger(conn: AsyncConnection, ledger_id: int) -> LedgerMetadata | None:
        row = (await conn.execute(SELECT_LEDGER, {"id": ledger_id})).first()
        return None if row is None else ledger_from_row(row)

    async def list_ledgers(self, after: int | None, limit: int) -> ListLedgersReply:
        params = {"after": core.list_start(after), "fetch_limit": core.list_fetch_limit(limit)}
        async with self._connect() as conn:
            rows = (await conn.execute(LIST_LEDGERS, params)).all()
        page, next_after = core.list_page(rows, limit, key=lambda r: r.ledger_id)
        return ListLedgersReply(ledgers=[ledger_from_row(r) for r in page], next_after=next_after)

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerChange:
        segments = request.segments
        params = {
            "id": request.ledger_id,
            "expected": request.expected_version,
            "new_state": request.state.value if request.state is not None else None,
            "new_last_entry_id": request.last_entry_id,
            "new_length": request.length,
            "new_segments": (
                None if segments is None else [s.model_dump(mode="json") for s in segments]
            ),
        }
        async with self._connect() as conn:
            row = (await conn.execute(CAS_LEDGER, params)).first()
            if row is not None:
                return LedgerChange(
                    metadata=ledger_from_row(row),
                    previous_state=LedgerState(row.previous_state),
                    segments_changed=bool(row.segments_changed),
                )
            current = await self._read_ledger(conn, request.ledger_id)
        if current is None:
            raise NoSuchLedger(f"no ledger {request.ledger_id}")
        raise BadVersion(
            f"ledger {request.ledger_id} is at version {current.version}, "
            f"not {request.expected_version}",
            current,
        )

    async def delete_ledger(self, ledger_id: int) -> None:
        async with self._connect() as conn:
            row = (await conn.execute(DELETE_LEDGER, {"id": ledger_id})).first()
        if row is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")

    # -- bookies --------------------------------------------------------------------------

    async def register_bookie(
        self, request: RegisterBookieRequest, now_ms: int, lease_ms: int
    ) -> BookieRegistration:
        params = {
            "b_bookie_id": request.bookie_id,
            "b_state": request.state.value,
            "b_last_seen": now_ms,
            "b_lease_expires_at": core.lease_expiry_ms(now_ms, lease_ms),
            "b_info": request.info,
        }
        async with self._connect() as conn:
            row = (await conn.execute(UPSERT_BOOKIE, params)).one()
        previous = None
        if row.previous_state is not None:
            previous = core.bookie_state(
                BookieState(row.previous_state), row.previous_lease_expires_at, now_ms
            )
        return BookieRegistration(info=bookie_from_row(row, now_ms), previous_state=previous)

    async def unregister_bookie(self, bookie_id: str, now_ms: int) -> BookieInfo | None:
        async with self._connect() as conn:
            row = (await conn.execute(EXPIRE_BOOKIE, {"id": bookie_id, "now": now_ms})).first()
        return None if row is None else bookie_from_row(row, now_ms)

    async def list_bookies(self, now_ms: int) -> list[BookieInfo]:
        async with self._connect() as conn:
            rows = (await conn.execute(LIST_BOOKIES)).all()
        return [bookie_from_row(r, now_ms) for r in rows]


# -- statements, built once: per call only parameters change ------------------------------

INSERT_LEDGER = (
    pg_insert(ledgers)
    .on_conflict_do_nothing(index_elements=[ledgers.c.ledger_id])
    .returning(*ledgers.c)
)
INSERT_LEDGER_NEXT_ID = (
    pg_insert(ledgers)
    .values(ledger_id=ledger_id_seq.next_value())
    .on_conflict_do_nothing(index_elements=[ledgers.c.ledger_id])
    .returning(*ledgers.c)
)
SELECT_LEDGER = select(ledgers).where(ledgers.c.ledger_id == bindparam("id"))
LIST_LEDGERS = (
    select(ledgers)
    .where(ledgers.c.ledger_id > bindparam("after"))
    .order_by(ledgers.c.ledger_id)
    .limit(bindparam("fetch_limit"))
)
DELETE_LEDGER = (
    delete(ledgers).where(ledgers.c.ledger_id == bindparam("id")).returning(ledgers.c.ledger_id)
)


def _cas_ledger() -> Update:
    """The compare-and-set. The CTE locks the row at the expected version and keeps its old
    values, so one statement both sets and tells what it replaced. A None parameter leaves
    its field as it is."""
    old = (
        select(ledgers.c.ledger_id, ledgers.c.state, ledgers.c.segments)
        .where(ledgers.c.ledger_id == bindparam("id"), ledgers.c.version == bindparam("expected"))
        .with_for_update()
        .cte("old")
    )

    def unless_none(name: str, column: Any, type_: Any) -> Any:
        return func.coalesce(bindparam(name, type_=type_), column)

    return (
        update(ledgers)
        .where(ledgers.c.ledger_id == old.c.ledger_id, ledgers.c.version == bindparam("expected"))
        .values(
            version=ledgers.c.version + 1,
            state=unless_none("new_state", ledgers.c.state, Text()),
            last_entry_id=unless_none("new_last_entry_id", ledgers.c.last_entry_id, BigInteger()),
            length=unless_none("new_length", ledgers.c.length, BigInteger()),
            # none_as_null: None must be SQL NULL here, not the JSON value null.
            segments=unless_none("new_segments", ledgers.c.segments, JSONB(none_as_null=True)),
        )
        .returning(
            *ledgers.c,
            old.c.state.label("previous_state"),
            ledgers.c.segments.is_distinct_from(old.c.segments).label("segments_changed"),
        )
    )


def _upsert_bookie() -> Insert:
    """Register or renew, returning the row as it was before (for "is this news?")."""
    old = (
        select(bookies.c.state, bookies.c.lease_expires_at)
        .where(bookies.c.bookie_id == bindparam("b_bookie_id"))
        .cte("old")
    )
    insert = pg_insert(bookies).values(
        {c: bindparam(f"b_{c}", type_=bookies.c[c].type) for c in bookies.c.keys()}
    )
    return (
        insert.on_conflict_do_update(
            index_elements=[bookies.c.bookie_id],
            set_={
                c: insert.excluded[c] for c in ("state", "last_seen", "lease_expires_at", "info")
            },
        )
        .returning(
            *bookies.c,
            select(old.c.state).scalar_subquery().label("previous_state"),
            select(old.c.lease_expires_at).scalar_subquery().label("previous_lease_expires_at"),
        )
        .add_cte(old)
    )


CAS_LEDGER = _cas_ledger()
UPSERT_BOOKIE = _upsert_bookie()
EXPIRE_BOOKIE = (
    update(bookies)
    .where(bookies.c.bookie_id == bindparam("id"))
    .values(
        lease_expires_at=func.least(
            bookies.c.lease_expires_at, bindparam("now", type_=BigInteger())
        )
    )
    .returning(*bookies.c)
)
LIST_BOOKIES = select(bookies).order_by(bookies.c.bookie_id).limit(MAX_BOOKIES_LISTED)


async def migrate_when_reachable(engine: AsyncEngine, deadline_s: float) -> None:
    """Run the migrations, waiting for PostgreSQL to accept connections (a cluster starts
    its parts at once)."""
    give_up_at = time.monotonic() + deadline_s
    while True:
        try:
            await migrate(engine)
            return
        except Exception as exc:
            if not is_unavailable(exc) or time.monotonic() > give_up_at:
                raise
            log.info("waiting for PostgreSQL", extra={"err": repr(exc)})
            await asyncio.sleep(0.3)
