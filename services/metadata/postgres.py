"""`PostgresMetadataStore`: the store contract (services/metadata/store.py) in PostgreSQL.

Its statements are in services/metadata/sql.py, its tables in services/metadata/schema.py.

Connections, one mechanism per path:
- Requests: a psycopg_pool `AsyncConnectionPool` of `db_pool_size` connections, all opened
  at start, in autocommit mode (each change is one statement, atomic by itself: no
  BEGIN/COMMIT round trips; creates and compare-and-sets that queue share one statement,
  services/metadata/batch.py); psycopg prepares a statement after its fifth use, and
  each connection keeps its generic plans (see `configure`). An operation
  waits at most the request timeout for a connection and as long again for its statements.
  A connection whose state is unknown after an error (broken, timed out, cancelled
  mid-statement) is closed and the pool replaces it; after such an error the pool also
  tests its idle connections. The pool reconnects in the background, trying for up to the
  request timeout at a time (a waiting operation starts a new try). Connections are not
  tested each time they are handed out: that would cost a round trip per operation.
- Which server: the database URL may name a primary and its standbys
  (`conninfo_from_url`); every new connection, of the pool or not, settles on the one that
  takes writes. A statement refused as read-only (a primary fenced that way) counts like a
  broken connection, so the pool goes looking for the primary again. deploy/postgres/
  README.md is the failover runbook.
- The outbox publisher's lock: one connection of its own, outside the pool, because the
  session's advisory lock must end with it (closing the connection releases the lock).
- Migrations at start: a SQLAlchemy engine without a pool (Alembic runs on SQLAlchemy),
  disposed once the schema is current.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from services.metadata import core
from services.metadata.batch import GroupCommit
from services.metadata.core import LedgerChange, OutboxCursor, OutboxRecord
from services.metadata.migrate import migrate, traced_engine
from services.metadata.sql import (
    LEDGER_CAS_ARRAYS,
    LEDGER_CREATE_ARRAYS,
    LEDGER_FIELDS,
    SQL_CAS_COOKIE,
    SQL_CAS_LEDGER,
    SQL_CAS_LEDGERS,
    SQL_CLAIM_URQ,
    SQL_CREATE_COOKIE,
    SQL_CREATE_LEDGER,
    SQL_CREATE_LEDGERS,
    SQL_DELETE_COOKIE,
    SQL_DELETE_LEDGER,
    SQL_ELECT,
    SQL_EXPIRE_BOOKIE,
    SQL_GET_BOOKIE,
    SQL_GET_COOKIE,
    SQL_GET_LEDGER,
    SQL_GET_SETTINGS,
    SQL_INSTANCE_ID,
    SQL_LEDGER_IDS,
    SQL_LIST_BOOKIES,
    SQL_LIST_LEDGERS,
    SQL_LIST_URQ,
    SQL_MARK_URQ,
    SQL_OUTBOX_CURSOR,
    SQL_OUTBOX_FETCH,
    SQL_OUTBOX_PUBLISHED,
    SQL_OUTBOX_PUBLISHED_FETCH,
    SQL_RELEASE_URQ,
    SQL_REMOVE_BOOKIE,
    SQL_RENEW_LEADER,
    SQL_RENEW_URQ,
    SQL_REPLICATED_URQ,
    SQL_RESIGN,
    SQL_SET_SETTINGS,
    SQL_SKIP_TAKEN_IDS,
    SQL_TRY_OUTBOX_LOCK,
    SQL_UPSERT_BOOKIE,
    SQL_WHO,
)
from services.metadata.store import (
    MAX_BOOKIES_LISTED,
    BadVersion,
    BookieAlive,
    BookieRegistration,
    CookieBadVersion,
    LedgerClosedError,
    LedgerExists,
    NoSuchCookie,
    NoSuchLedger,
    StoreUnavailable,
)
from shared.models import (
    NO_VERSION,
    BookieInfo,
    BookieState,
    ClusterSettings,
    Cookie,
    CreateLedgerRequest,
    DeleteCookieRequest,
    Leadership,
    LedgerMetadata,
    LedgerRangesReply,
    LedgerState,
    ListLedgersReply,
    ListUnderreplicatedReply,
    MarkUnderreplicatedRequest,
    PutCookieRequest,
    RegisterBookieRequest,
    SetClusterSettingsRequest,
    UnderreplicatedLedger,
    UpdateLedgerRequest,
)
from shared.telemetry import tracer_provider

log = logging.getLogger(__name__)

# Attempts at a sequence id before giving up; each collision with user-chosen ids moves the
# sequence past the whole run of taken ids, so a second attempt nearly always succeeds.
MAX_ID_ATTEMPTS = 8
# How long the service waits for PostgreSQL to accept connections at start.
STARTUP_DEADLINE_S = 60.0
# Group commit (services/metadata/batch.py): most changes in one statement, and how many
# such statements of one kind run at once (each on its own pool connection).
DEFAULT_BATCH_MAX = 64
DEFAULT_BATCHES_IN_FLIGHT = 2
# Any constant all instances agree on: the outbox publisher's advisory lock ("quireout").
OUTBOX_LOCK_KEY = int.from_bytes(b"quireout", "big") & (2**63 - 1)

MetadataPool = AsyncConnectionPool[AsyncConnection[DictRow]]


# -- connections --------------------------------------------------------------------------


def conninfo_from_url(database_url: str) -> str:
    """libpq's key/value form of the SQLAlchemy URL, read as SQLAlchemy's psycopg dialect
    reads it (the migrations connect through that dialect, the pool through this), so both
    reach the same servers. Several hosts are SQLAlchemy's
    `?host=h1:p1&host=h2:p2&target_session_attrs=read-write`, which becomes libpq's
    `host=h1,h2 port=p1,p2 target_session_attrs=read-write`: each connection tries the
    hosts in order and keeps the first that takes writes, the primary.
    InvalidDatabaseUrl when several hosts do not say so (core.multi_host_problem)."""
    _, options = PGDialect_psycopg().create_connect_args(make_url(database_url))
    hosts = str(options.get("host") or "").split(",")
    problem = core.multi_host_problem(hosts, options.get("target_session_attrs"))
    if problem is not None:
        raise InvalidDatabaseUrl(problem)
    return make_conninfo(**{k: v for k, v in options.items() if v is not None})


class InvalidDatabaseUrl(ValueError):
    """QUIRE_DATABASE_URL names servers the metadata service must not use as it stands."""


def connection_kwargs(timeout_s: float, conninfo: str = "") -> dict[str, Any]:
    """How every connection is made; `conninfo`'s own TCP settings are kept."""
    given = conninfo_to_dict(conninfo)
    return {
        "autocommit": True,
        "row_factory": dict_row,
        "connect_timeout": max(1, int(timeout_s)),
        **{k: v for k, v in dead_server_settings(timeout_s).items() if k not in given},
    }


def dead_server_settings(timeout_s: float) -> dict[str, int]:
    """libpq's TCP settings that notice a server gone silent (its host lost, cut off by a
    partition: nothing refuses, packets vanish) in about `timeout_s`, not in the kernel's
    ~15 minutes of retransmissions. It matters after a failover: the pool's check of its
    idle connections (after any broken one) tests them one at a time and holds them all
    meanwhile, so one check hanging on the lost primary kept all but one connection out
    of use (seen: a pool of 4 served through 1 while the old primary's host was
    black-holed)."""
    return {
        "tcp_user_timeout": int(timeout_s * 1000),  # sent, unacknowledged this long: dead
        "keepalives": 1,  # an idle connection is probed too
        "keepalives_idle": max(1, int(timeout_s)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }


async def trace_statements(conn: AsyncConnection[DictRow]) -> None:
    """OpenTelemetry's psycopg instrumentation on one pool connection: each statement of
    a traced request is a CLIENT span under the request's SERVER span (of an untraced
    one, a non-recording span and nothing more)."""
    PsycopgInstrumentor.instrument_connection(conn, tracer_provider=tracer_provider())


class ServerLog:
    """Says in the log which server the pool's connections reach, when that changes: at
    start, and after a failover, the new primary (with several hosts in the URL, which one
    is the pool's finding, not the operator's)."""

    def __init__(self) -> None:
        self.server: str | None = None

    def seen(self, conn: AsyncConnection[Any]) -> None:
        server = f"{conn.info.host}:{conn.info.port}"
        if server != self.server:
            log.info("connected to PostgreSQL", extra={"server": server, "before": self.server})
            self.server = server


def new_pool(database_url: str, size: int, timeout_s: float) -> MetadataPool:
    """The request path's pool, not yet open: `size` connections (the metadata service's
    `db_pool_size`), `timeout_s` (its request timeout) to wait for one, and as long to keep
    trying to reconnect before a waiting operation has to start a new try. Its connections
    are instrumented when this process traces, and the server they reach is logged when
    it changes."""
    conninfo = conninfo_from_url(database_url)
    return AsyncConnectionPool(
        conninfo,
        connection_class=AsyncConnection[DictRow],
        kwargs=connection_kwargs(timeout_s, conninfo),
        min_size=size,
        max_size=size,
        timeout=timeout_s,
        reconnect_timeout=timeout_s,
        open=False,
        name="metadata",
        configure=functools.partial(configure, ServerLog(), tracer_provider() is not None),
    )


async def configure(servers: ServerLog, traced: bool, conn: AsyncConnection[DictRow]) -> None:
    """Each new connection of the pool: logged where it is a change of server, made to
    keep the generic plan of each prepared statement, and instrumented when this process
    traces.

    Generic plans: every statement here looks rows up by key (or pages by key), so the
    generic plan is the custom one; but the group commits' statements take arrays, whose
    size the planner cannot see, so under the default `plan_cache_mode` it judged the
    generic plan dearer and planned each execution afresh (~0.3 ms of the backend's CPU
    a statement, more than executing it)."""
    servers.seen(conn)
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    if traced:
        await trace_statements(conn)


async def connect(conninfo: str, timeout_s: float) -> AsyncConnection[DictRow]:
    return await AsyncConnection.connect(conninfo, **connection_kwargs(timeout_s, conninfo))


async def close_quietly(conn: AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:
        pass  # already broken: nothing to close cleanly


# -- rows <-> models ----------------------------------------------------------------------


def ledger_from_row(row: dict[str, Any]) -> LedgerMetadata:
    return LedgerMetadata.model_validate({f: row[c] for f, c in LEDGER_FIELDS.items()})


def bookie_from_row(row: dict[str, Any], now_ms: int) -> BookieInfo:
    return BookieInfo(
        bookie_id=row["bookie_id"],
        state=core.bookie_state(BookieState(row["state"]), row["lease_expires_at"], now_ms),
        last_seen=row["last_seen"],
        lease_expires_at=row["lease_expires_at"],
        info=row["info"],
    )


def urq_from_row(row: dict[str, Any]) -> UnderreplicatedLedger:
    return UnderreplicatedLedger(
        ledger_id=row["ledger_id"],
        missing_bookies=row["missing_bookies"],
        mark_version=row["mark_version"],
        marked_at=row["marked_at"],
        claimed_by=row["claimed_by"],
        claim_expires_at=row["claim_expires_at"],
    )


# -- errors -------------------------------------------------------------------------------


def is_unavailable(exc: BaseException) -> bool:
    """Errors after which nobody knows whether the statement took effect."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(
        exc,
        psycopg.OperationalError
        | psycopg.InterfaceError
        # A server that stopped taking writes (a fenced or demoted primary, or a standby):
        # nothing was written; the connection is dropped so that the pool finds the primary.
        | psycopg.errors.ReadOnlySqlTransaction
        | sa_exc.OperationalError
        | sa_exc.InterfaceError
        | sa_exc.TimeoutError
        | TimeoutError
        | OSError,
    )


def unavailable(exc: BaseException) -> StoreUnavailable:
    first_line = (str(exc).splitlines() or [""])[0]
    return StoreUnavailable(f"PostgreSQL: {exc.__class__.__name__}: {first_line}")


# -- the store ---------------------------------------------------------------------------


Params = dict[str, Any]


def array_params(columns: dict[str, str], items: Sequence[Params]) -> Params:
    """One array a column, one element an item: a group commit's parameters."""
    return {c: [item[c] for item in items] for c in columns}


class PostgresMetadataStore:
    def __init__(
        self,
        pool: MetadataPool,
        instance_id: str,
        *,
        batch_max: int = DEFAULT_BATCH_MAX,
        batches_in_flight: int = DEFAULT_BATCHES_IN_FLIGHT,
    ) -> None:
        self._pool = pool
        self._instance_id = instance_id
        self._pool_check: asyncio.Task[None] | None = None
        # Creates with a sequence id and ledger compare-and-sets, grouped when they queue
        # (creates never clash: each is its own key).
        self.creates: GroupCommit[Params, Params | None] = GroupCommit(
            self._create_ledgers, id, max_items=batch_max, in_flight=batches_in_flight
        )
        self.updates: GroupCommit[Params, Params | None] = GroupCommit(
            self._cas_ledgers,
            lambda params: params["id"],
            max_items=batch_max,
            in_flight=batches_in_flight,
        )

    @classmethod
    async def open(
        cls,
        database_url: str,
        *,
        pool_size: int,
        timeout_s: float,
        startup_deadline_s: float = STARTUP_DEADLINE_S,
        batch_max: int = DEFAULT_BATCH_MAX,
        batches_in_flight: int = DEFAULT_BATCHES_IN_FLIGHT,
    ) -> PostgresMetadataStore:
        """Connect, bring the schema to the newest migration, and serve."""
        pool = new_pool(database_url, pool_size, timeout_s)  # refuses a bad URL at once
        await migrate_when_reachable(database_url, startup_deadline_s)
        try:
            await pool.open(wait=True, timeout=timeout_s)
            async with pool.connection() as conn:
                row = await (await conn.execute(SQL_INSTANCE_ID)).fetchone()
        except BaseException as exc:
            await pool.close()
            if is_unavailable(exc):
                raise unavailable(exc) from exc
            raise
        assert row is not None, "the migration makes the cluster row"
        return cls(
            pool, row["instance_id"], batch_max=batch_max, batches_in_flight=batches_in_flight
        )

    async def close(self) -> None:
        await self.creates.close()
        await self.updates.close()
        if self._pool_check is not None:
            self._pool_check.cancel()
            await asyncio.wait([self._pool_check])
        await self._pool.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[DictRow]]:
        """A pooled connection for one operation, which must end within the pool's timeout;
        errors that leave the outcome unknown (and running out of time) come out as
        StoreUnavailable."""
        try:
            async with self._pool.connection() as conn:
                try:
                    async with asyncio.timeout(self._pool.timeout):
                        yield conn
                except BaseException as exc:
                    if is_unavailable(exc) or not isinstance(exc, Exception):
                        # Broken, timed out or cancelled mid-statement: its state is
                        # unknown. Closed, it goes back to the pool, which replaces it.
                        await conn.close()
                    raise
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self._check_idle_connections()
            raise unavailable(exc) from exc

    def _check_idle_connections(self) -> None:
        """After a PostgreSQL restart every idle connection is dead: have the pool test them
        (it replaces the dead ones), so that the next operations do not fail on them too.
        In the background, one check at a time: a cancelled check would lose connections."""
        if self._pool_check is None or self._pool_check.done():
            self._pool_check = asyncio.create_task(self._pool.check(), name="pool-check")

    async def _dedicated(self) -> AsyncConnection[DictRow]:
        """A connection outside the pool (the outbox publisher holds its lock on one)."""
        try:
            return await connect(self._conninfo(), self._pool.timeout)
        except Exception as exc:
            if is_unavailable(exc):
                raise unavailable(exc) from exc
            raise

    def _conninfo(self) -> str:
        assert isinstance(self._pool.conninfo, str), "new_pool gives the pool a plain string"
        return self._pool.conninfo

    async def _one(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        async with self._connection() as conn:
            return await (await conn.execute(sql, params)).fetchone()

    async def _all(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        async with self._connection() as conn:
            return await (await conn.execute(sql, params)).fetchall()

    # -- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, request: CreateLedgerRequest, ctime_ms: int) -> LedgerMetadata:
        meta = core.new_ledger(request, request.ledger_id or 0, ctime_ms)
        params = {
            "ledger_id": request.ledger_id,
            "state": meta.state.value,
            "ensemble_size": meta.ensemble_size,
            "write_quorum": meta.write_quorum,
            "ack_quorum": meta.ack_quorum,
            "digest": meta.digest.value,
            "ctime": meta.ctime,
            "custom_metadata": Jsonb(meta.metadata),
            "segments": Jsonb([s.model_dump(mode="json") for s in meta.segments]),
            "password_salt": meta.password_salt,
            "password_hash": meta.password_hash,
            "format_version": meta.format_version,
            "creator_token": meta.creator_token,
            "master_key": meta.master_key,
            "mac_key": meta.mac_key,
            "now": ctime_ms,
        }
        if request.ledger_id is None:
            row = await self.creates.submit(params)
            if row is not None:
                return ledger_from_row(row)
            # Its sequence id was taken by a user-chosen one: again, alone.
        async with self._connection() as conn:
            for _ in range(MAX_ID_ATTEMPTS):
                row = await (await conn.execute(SQL_CREATE_LEDGER, params)).fetchone()
                if row is not None:
                    return ledger_from_row(row)
                if request.ledger_id is not None:
                    existing = await (
                        await conn.execute(SQL_GET_LEDGER, {"id": request.ledger_id})
                    ).fetchone()
                    if existing is not None and core.is_own_create(
                        ledger_from_row(existing), request
                    ):
                        return ledger_from_row(existing)
                    raise LedgerExists(f"ledger {request.ledger_id} exists")
                await conn.execute(SQL_SKIP_TAKEN_IDS)
        raise StoreUnavailable(f"no free ledger id after {MAX_ID_ATTEMPTS} attempts")

    async def _create_ledgers(self, batch: list[Params]) -> list[Params | None]:
        """Creates with sequence ids, in one statement: each its row, or None where the
        id it drew was taken (SQL_CREATE_LEDGERS)."""
        if len(batch) == 1:  # the plain statement is cheaper for PostgreSQL
            row = await self._one(SQL_CREATE_LEDGER, {**batch[0], "ledger_id": None})
            return [row]
        params = array_params(LEDGER_CREATE_ARRAYS, batch)
        async with self._connection() as conn:
            rows = await (await conn.execute(SQL_CREATE_LEDGERS, params)).fetchall()
        by_index = {r["batch_index"]: r for r in rows}
        return [
            row if (row := by_index.get(n)) and row["ledger_id"] is not None else None
            for n in range(1, len(batch) + 1)
        ]

    async def _cas_ledgers(self, batch: list[Params]) -> list[Params | None]:
        """Compare-and-sets of different ledgers, in one statement: each its updated row,
        or None where it did not apply (SQL_CAS_LEDGERS)."""
        if len(batch) == 1:
            return [await self._one(SQL_CAS_LEDGER, batch[0])]
        params = array_params(LEDGER_CAS_ARRAYS, batch)
        async with self._connection() as conn:
            rows = await (await conn.execute(SQL_CAS_LEDGERS, params)).fetchall()
        by_id = {r["ledger_id"]: r for r in rows}
        return [by_id.get(item["id"]) for item in batch]

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata:
        row = await self._one(SQL_GET_LEDGER, {"id": ledger_id})
        if row is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")
        return ledger_from_row(row)

    async def list_ledgers(self, after: int | None, limit: int) -> ListLedgersReply:
        params = {"after": core.list_start(after), "fetch_limit": core.list_fetch_limit(limit)}
        rows = await self._all(SQL_LIST_LEDGERS, params)
        page, next_after = core.list_page(rows, limit, key=lambda r: r["ledger_id"])
        return ListLedgersReply(ledgers=[ledger_from_row(r) for r in page], next_after=next_after)

    async def ledger_ranges(self, after: int | None, limit: int) -> LedgerRangesReply:
        params = {"after": core.list_start(after), "fetch_limit": core.list_fetch_limit(limit)}
        rows = await self._all(SQL_LEDGER_IDS, params)
        page, next_after = core.list_page([r["ledger_id"] for r in rows], limit, key=int)
        return LedgerRangesReply(ranges=core.id_runs(page), next_after=next_after)

    async def update_ledger(self, request: UpdateLedgerRequest, now_ms: int) -> LedgerChange:
        segments = request.segments
        params = {
            "id": request.ledger_id,
            "expected": request.expected_version,
            "state": request.state.value if request.state is not None else None,
            "last_entry_id": request.last_entry_id,
            "length": request.length,
            "segments": (
                None if segments is None else Jsonb([s.model_dump(mode="json") for s in segments])
            ),
            "now": now_ms,
        }
        row = await self.updates.submit(params)
        if row is not None:
            return LedgerChange(
                metadata=ledger_from_row(row),
                previous_state=LedgerState(row["previous_state"]),
                segments_changed=bool(row["segments_changed"]),
            )
        current = await self._one(SQL_GET_LEDGER, {"id": request.ledger_id})
        if current is None:
            raise NoSuchLedger(f"no ledger {request.ledger_id}")
        stored = ledger_from_row(current)
        violation = core.closed_ledger_violation(stored, request)
        if stored.version == request.expected_version and violation:
            raise LedgerClosedError(violation)
        raise BadVersion(
            f"ledger {request.ledger_id} is at version {stored.version}, "
            f"not {request.expected_version}",
            stored,
        )

    async def delete_ledger(self, ledger_id: int, now_ms: int) -> None:
        if await self._one(SQL_DELETE_LEDGER, {"id": ledger_id, "now": now_ms}) is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")

    # -- bookies --------------------------------------------------------------------------

    async def register_bookie(
        self, request: RegisterBookieRequest, now_ms: int, lease_ms: int
    ) -> BookieRegistration:
        params = {
            "id": request.bookie_id,
            "state": request.state.value,
            "now": now_ms,
            "expires": core.lease_expiry_ms(now_ms, lease_ms),
            "info": Jsonb(request.info),
        }
        row = await self._one(SQL_UPSERT_BOOKIE, params)
        assert row is not None
        previous = None
        if row["previous_state"] is not None:
            previous = core.bookie_state(
                BookieState(row["previous_state"]), row["previous_lease_expires_at"], now_ms
            )
        return BookieRegistration(info=bookie_from_row(row, now_ms), previous_state=previous)

    async def unregister_bookie(self, bookie_id: str, now_ms: int) -> BookieInfo | None:
        row = await self._one(SQL_EXPIRE_BOOKIE, {"id": bookie_id, "now": now_ms})
        return None if row is None else bookie_from_row(row, now_ms)

    async def remove_bookie(self, bookie_id: str, now_ms: int) -> None:
        if await self._one(SQL_REMOVE_BOOKIE, {"id": bookie_id, "now": now_ms}) is not None:
            return
        row = await self._one(SQL_GET_BOOKIE, {"id": bookie_id})
        if row is not None:
            raise BookieAlive(
                f"bookie {bookie_id} is registered {row['state']} until "
                f"{row['lease_expires_at']}: stop it before removing it"
            )

    async def list_bookies(self, now_ms: int) -> list[BookieInfo]:
        rows = await self._all(SQL_LIST_BOOKIES, {"limit": MAX_BOOKIES_LISTED})
        return [bookie_from_row(r, now_ms) for r in rows]

    async def get_cookie(self, bookie_id: str) -> Cookie:
        row = await self._one(SQL_GET_COOKIE, {"id": bookie_id})
        if row is None:
            return Cookie(bookie_id=bookie_id, data=None, version=NO_VERSION)
        return Cookie(bookie_id=bookie_id, data=row["data"], version=row["version"])

    async def put_cookie(self, request: PutCookieRequest, now_ms: int) -> Cookie:
        params = {
            "id": request.bookie_id,
            "data": request.data,
            "expected": request.expected_version,
            "now": now_ms,
        }
        sql = SQL_CREATE_COOKIE if request.expected_version == NO_VERSION else SQL_CAS_COOKIE
        row = await self._one(sql, params)
        if row is not None:
            return Cookie(bookie_id=request.bookie_id, data=row["data"], version=row["version"])
        current = await self.get_cookie(request.bookie_id)
        raise CookieBadVersion(
            f"cookie of {request.bookie_id} is at version {current.version}, "
            f"not {request.expected_version}",
            current,
        )

    async def delete_cookie(self, request: DeleteCookieRequest, now_ms: int) -> None:
        params = {"id": request.bookie_id, "expected": request.expected_version, "now": now_ms}
        if await self._one(SQL_DELETE_COOKIE, params) is not None:
            return
        current = await self.get_cookie(request.bookie_id)
        if current.data is None:
            raise NoSuchCookie(f"no cookie for {request.bookie_id}")
        raise CookieBadVersion(
            f"cookie of {request.bookie_id} is at version {current.version}, "
            f"not {request.expected_version}",
            current,
        )

    # -- cluster --------------------------------------------------------------------------

    async def instance_id(self) -> str:
        return self._instance_id

    async def get_cluster_settings(self) -> ClusterSettings:
        rows = await self._all(SQL_GET_SETTINGS)
        return core.cluster_settings({r["name"]: r["value"] for r in rows})

    async def set_cluster_settings(
        self, request: SetClusterSettingsRequest, now_ms: int
    ) -> ClusterSettings:
        changes = core.settings_changes(request)
        if changes:
            await self._one(SQL_SET_SETTINGS, {"changes": Jsonb(changes), "now": now_ms})
        return await self.get_cluster_settings()

    # -- under-replication ----------------------------------------------------------------

    async def mark_underreplicated(
        self, request: MarkUnderreplicatedRequest, now_ms: int
    ) -> UnderreplicatedLedger:
        params = {
            "id": request.ledger_id,
            "missing": Jsonb(core.missing_bookies(request.missing_bookies)),
            "now": now_ms,
        }
        try:
            row = await self._one(SQL_MARK_URQ, params)
        except psycopg.errors.ForeignKeyViolation as exc:
            raise NoSuchLedger(f"no ledger {request.ledger_id}") from exc
        assert row is not None
        return urq_from_row(row)

    async def claim_underreplicated(
        self, worker_id: str, lease_ms: int, now_ms: int
    ) -> UnderreplicatedLedger | None:
        params = {"worker": worker_id, "now": now_ms, "expires": now_ms + lease_ms}
        row = await self._one(SQL_CLAIM_URQ, params)
        return None if row is None else urq_from_row(row)

    async def renew_underreplicated(
        self, ledger_id: int, worker_id: str, lease_ms: int, now_ms: int
    ) -> bool:
        params = {"id": ledger_id, "worker": worker_id, "expires": now_ms + lease_ms}
        return await self._one(SQL_RENEW_URQ, params) is not None

    async def release_underreplicated(self, ledger_id: int, worker_id: str) -> bool:
        return await self._one(SQL_RELEASE_URQ, {"id": ledger_id, "worker": worker_id}) is not None

    async def mark_replicated(
        self, ledger_id: int, worker_id: str, mark_version: int | None, now_ms: int
    ) -> bool:
        params = {"id": ledger_id, "worker": worker_id, "mv": mark_version, "now": now_ms}
        row = await self._one(SQL_REPLICATED_URQ, params)
        return bool(row and row["deleted"])

    async def list_underreplicated(self, after: int | None, limit: int) -> ListUnderreplicatedReply:
        params = {"after": core.list_start(after), "fetch_limit": core.list_fetch_limit(limit)}
        rows = await self._all(SQL_LIST_URQ, params)
        page, next_after = core.list_page(rows, limit, key=lambda r: r["ledger_id"])
        return ListUnderreplicatedReply(
            ledgers=[urq_from_row(r) for r in page], next_after=next_after
        )

    # -- auditor election -----------------------------------------------------------------

    async def _leadership(
        self, sql: str, candidate_id: str | None, now_ms: int, lease_ms: int = 0
    ) -> Leadership:
        params = {"c": candidate_id, "now": now_ms, "expires": now_ms + lease_ms}
        row = await self._one(sql, params if candidate_id is not None else None)
        assert row is not None, "the migration makes the election row"
        held = Leadership(
            leader_id=row["leader_id"], term=row["term"], lease_expires_at=row["lease_expires_at"]
        )
        return core.leadership_seen_by(held, candidate_id, now_ms)

    async def elect_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership:
        return await self._leadership(SQL_ELECT, candidate_id, now_ms, lease_ms)

    async def renew_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership:
        return await self._leadership(SQL_RENEW_LEADER, candidate_id, now_ms, lease_ms)

    async def resign_auditor(self, candidate_id: str, now_ms: int) -> Leadership:
        return await self._leadership(SQL_RESIGN, candidate_id, now_ms)

    async def who_is_auditor(self, now_ms: int) -> Leadership:
        return await self._leadership(SQL_WHO, None, now_ms)

    # -- outbox ---------------------------------------------------------------------------

    @asynccontextmanager
    async def outbox(self) -> AsyncIterator[PostgresOutboxReader | None]:
        conn = await self._dedicated()
        try:
            # Marking published need not wait for its WAL flush: lost in a crash, the
            # batch is published again with the same ids and JetStream drops the copies.
            await conn.execute("SET synchronous_commit = off")
            row = await (
                await conn.execute(SQL_TRY_OUTBOX_LOCK, {"key": OUTBOX_LOCK_KEY})
            ).fetchone()
            if row is None or not row["locked"]:
                yield None
                return
            cursor = await (await conn.execute(SQL_OUTBOX_CURSOR)).fetchone()
            assert cursor is not None, "the migration makes the cursor row"
            yield PostgresOutboxReader(
                conn, self._instance_id, OutboxCursor(cursor["last_published_id"])
            )
        except Exception as exc:
            if is_unavailable(exc):
                raise unavailable(exc) from exc
            raise
        finally:
            # Closing the session releases the advisory lock.
            await close_quietly(conn)


class PostgresOutboxReader:
    def __init__(
        self, conn: AsyncConnection[DictRow], instance_id: str, cursor: OutboxCursor
    ) -> None:
        self._conn = conn
        self.instance_id = instance_id
        self._cursor = cursor

    async def fetch(self, limit: int, published: Sequence[OutboxRecord] = ()) -> list[OutboxRecord]:
        if published:
            # One statement marks the previous batch and reads the next (one round trip
            # a publishing round, not two).
            ids = [r.outbox_id for r in published]
            params = {"ids": ids, "last": max(ids), "limit": limit}
            rows = await (await self._conn.execute(SQL_OUTBOX_PUBLISHED_FETCH, params)).fetchall()
            self._cursor.published(ids)
        else:
            params = {"limit": limit}
            rows = await (await self._conn.execute(SQL_OUTBOX_FETCH, params)).fetchall()
        if not rows:
            return []
        in_progress = core.snapshot_in_progress(rows[0]["snapshot"])
        count = self._cursor.publishable([r["id"] for r in rows], in_progress)
        return [
            OutboxRecord(
                outbox_id=r["id"],
                kind=r["kind"],
                ledger_id=r["ledger_id"],
                bookie_id=r["bookie_id"],
                data=r["data"],
                ts_ms=r["ts_ms"],
            )
            for r in rows[:count]
        ]

    async def mark_published(self, records: Sequence[OutboxRecord]) -> None:
        ids = [r.outbox_id for r in records]
        await self._conn.execute(SQL_OUTBOX_PUBLISHED, {"ids": ids, "last": max(ids)})
        self._cursor.published(ids)


async def migrate_when_reachable(database_url: str, deadline_s: float) -> None:
    """Run the migrations, waiting for PostgreSQL to accept connections (a cluster starts
    its parts at once)."""
    engine = traced_engine(create_async_engine(database_url, poolclass=NullPool))
    give_up_at = time.monotonic() + deadline_s
    try:
        while True:
            try:
                await migrate(engine)
                return
            except Exception as exc:
                if not is_unavailable(exc) or time.monotonic() > give_up_at:
                    raise
                log.info("waiting for PostgreSQL", extra={"err": repr(exc)})
                await asyncio.sleep(0.3)
    finally:
        await engine.dispose()
