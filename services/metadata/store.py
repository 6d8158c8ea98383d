"""Where ledger metadata and the cluster's state live.

`MetadataStore` is the contract the service needs. `PostgresMetadataStore` keeps it in
PostgreSQL; `InMemoryMetadataStore` keeps it in memory for simulations and tests, and one
contract suite (tests/integration/test_metadata_contract.py) proves the two behave alike.

Rules every implementation keeps:
- Every ledger update is a compare-and-set on the row version.
- Every change writes its outbox record in the same transaction (the same statement, in
  PostgreSQL); the outbox publisher turns the records into events, in order.
- An error that leaves the outcome unknown (a lost connection, a timeout) is
  `StoreUnavailable`: the caller must re-read, never assume.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from services.metadata import core
from services.metadata.core import LedgerChange, OutboxCursor, OutboxRecord
from services.metadata.migrate import migrate
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
    MetaErrorCode,
    PutCookieRequest,
    RegisterBookieRequest,
    SetClusterSettingsRequest,
    UnderreplicatedLedger,
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
# Any constant all instances agree on: the outbox publisher's advisory lock ("quireout").
OUTBOX_LOCK_KEY = int.from_bytes(b"quireout", "big") & (2**63 - 1)


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


class CookieBadVersion(StoreError):
    """A cookie compare-and-set lost: `current` is the stored cookie."""

    code = MetaErrorCode.BAD_VERSION

    def __init__(self, message: str, current: Cookie) -> None:
        super().__init__(message)
        self.current = current


class LedgerClosedError(StoreError):
    """The update would change what a closed ledger fixed for good (state, last entry,
    length)."""

    code = MetaErrorCode.LEDGER_CLOSED


class NoSuchCookie(StoreError):
    code = MetaErrorCode.NO_SUCH_COOKIE


class StoreUnavailable(StoreError):
    """PostgreSQL did not answer: whatever was asked may or may not have happened."""

    code = MetaErrorCode.UNAVAILABLE


@dataclass(frozen=True)
class BookieRegistration:
    info: BookieInfo
    previous_state: BookieState | None  # None: first registration


class OutboxReader(Protocol):
    """The outbox as its one publisher sees it (while it holds the publisher's lock)."""

    instance_id: str

    async def fetch(self, limit: int) -> list[OutboxRecord]:
        """The next records to publish, in order; may hold some back (see OutboxCursor)."""
        ...

    async def mark_published(self, records: Sequence[OutboxRecord]) -> None: ...


class MetadataStore(Protocol):
    # -- ledgers
    async def create_ledger(self, request: CreateLedgerRequest, ctime_ms: int) -> LedgerMetadata:
        """A new OPEN ledger: the chosen id (LedgerExists if taken, unless it is this
        creator's own retry) or a fresh one."""
        ...

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata: ...

    async def list_ledgers(self, after: int | None, limit: int) -> ListLedgersReply: ...

    async def ledger_ranges(self, after: int | None, limit: int) -> LedgerRangesReply: ...

    async def update_ledger(self, request: UpdateLedgerRequest, now_ms: int) -> LedgerChange:
        """Compare-and-set: NoSuchLedger, BadVersion (with the current metadata) or the
        change."""
        ...

    async def delete_ledger(self, ledger_id: int, now_ms: int) -> None: ...

    # -- bookies
    async def register_bookie(
        self, request: RegisterBookieRequest, now_ms: int, lease_ms: int
    ) -> BookieRegistration: ...

    async def unregister_bookie(self, bookie_id: str, now_ms: int) -> BookieInfo | None:
        """Expire the bookie's lease now; None if it never registered."""
        ...

    async def list_bookies(self, now_ms: int) -> list[BookieInfo]: ...

    async def get_cookie(self, bookie_id: str) -> Cookie: ...

    async def put_cookie(self, request: PutCookieRequest, now_ms: int) -> Cookie: ...

    async def delete_cookie(self, request: DeleteCookieRequest, now_ms: int) -> None: ...

    # -- cluster
    async def instance_id(self) -> str: ...

    async def get_cluster_settings(self) -> ClusterSettings: ...

    async def set_cluster_settings(
        self, request: SetClusterSettingsRequest, now_ms: int
    ) -> ClusterSettings: ...

    # -- under-replication
    async def mark_underreplicated(
        self, request: MarkUnderreplicatedRequest, now_ms: int
    ) -> UnderreplicatedLedger: ...

    async def claim_underreplicated(
        self, worker_id: str, lease_ms: int, now_ms: int
    ) -> UnderreplicatedLedger | None:
        """The oldest unclaimed (or lapsed) mark, now leased to `worker_id`; None if there
        is none or autorecovery is disabled."""
        ...

    async def renew_underreplicated(
        self, ledger_id: int, worker_id: str, lease_ms: int, now_ms: int
    ) -> bool: ...

    async def release_underreplicated(self, ledger_id: int, worker_id: str) -> bool: ...

    async def mark_replicated(
        self, ledger_id: int, worker_id: str, mark_version: int | None, now_ms: int
    ) -> bool:
        """Remove the mark if `worker_id` holds it and no bookie was added since
        `mark_version` (None: whatever it is); a newer mark is only released."""
        ...

    async def list_underreplicated(
        self, after: int | None, limit: int
    ) -> ListUnderreplicatedReply: ...

    # -- auditor election
    async def elect_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership: ...

    async def renew_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership:
        """Extends the lease only while it still holds; a lapsed leader must elect again."""
        ...

    async def resign_auditor(self, candidate_id: str, now_ms: int) -> Leadership: ...

    async def who_is_auditor(self, now_ms: int) -> Leadership: ...

    # -- outbox
    def outbox(self) -> Any:
        """An async context manager: the OutboxReader while this caller holds the single
        publisher's lock, or None if another holds it."""
        ...

    async def close(self) -> None: ...


# -- rows <-> models ----------------------------------------------------------------------

# Model field -> column, for the ledger JSON PostgreSQL builds for the outbox.
LEDGER_FIELDS = {
    "ledger_id": "ledger_id",
    "version": "version",
    "state": "state",
    "ensemble_size": "ensemble_size",
    "write_quorum": "write_quorum",
    "ack_quorum": "ack_quorum",
    "digest": "digest",
    "last_entry_id": "last_entry_id",
    "length": "length",
    "ctime": "ctime",
    "metadata": "custom_metadata",
    "segments": "segments",
    "password_salt": "password_salt",
    "password_hash": "password_hash",
    "format_version": "format_version",
    "creator_token": "creator_token",
}


def ledger_from_row(row: dict[str, Any]) -> LedgerMetadata:
    return LedgerMetadata.model_validate({f: row[c] for f, c in LEDGER_FIELDS.items()})


def ledger_json_sql(alias: str) -> str:
    """SQL for the model's JSON of a ledger row (what the outbox record carries)."""
    pairs = ", ".join(f"'{f}', {alias}.{c}" for f, c in LEDGER_FIELDS.items())
    return f"jsonb_build_object({pairs})"


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


def is_unavailable(exc: BaseException) -> bool:
    """Errors after which nobody knows whether the statement took effect."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(
        exc,
        psycopg.OperationalError
        | psycopg.InterfaceError
        | sa_exc.OperationalError
        | sa_exc.InterfaceError
        | sa_exc.TimeoutError
        | TimeoutError
        | OSError,
    )


def unavailable(exc: BaseException) -> StoreUnavailable:
    first_line = (str(exc).splitlines() or [""])[0]
    return StoreUnavailable(f"PostgreSQL: {exc.__class__.__name__}: {first_line}")


# -- PostgreSQL ---------------------------------------------------------------------------


class ConnectionPool:
    """At most `size` psycopg connections, made on demand, in autocommit mode (every
    operation is one statement, atomic by itself: no BEGIN/COMMIT round trips). psycopg
    prepares a statement after its fifth use, so the hot ones run as prepared statements.

    A connection that failed in a way that leaves it unknown is closed, and so is every
    idle one (after a PostgreSQL restart they are all dead)."""

    def __init__(self, conninfo: str, size: int, timeout_s: float) -> None:
        self._conninfo = conninfo
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(size)
        self._idle: list[AsyncConnection[dict[str, Any]]] = []
        self._closed = False

    async def _connect(self) -> AsyncConnection[dict[str, Any]]:
        return await AsyncConnection.connect(
            self._conninfo,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=max(1, int(self._timeout_s)),
        )

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[dict[str, Any]]]:
        """A connection for one operation; PostgreSQL errors that leave the outcome
        unknown (and a timeout) come out as StoreUnavailable."""
        if self._closed:
            raise StoreUnavailable("the store is closed")
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise StoreUnavailable("no PostgreSQL connection free in time") from exc
        conn: AsyncConnection[dict[str, Any]] | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                conn = self._idle.pop() if self._idle else await self._connect()
                yield conn
        except BaseException as exc:
            if conn is not None and (is_unavailable(exc) or not isinstance(exc, Exception)):
                # Broken, timed out or cancelled mid-statement: its state is unknown.
                await self._discard(conn)
                conn = None
                if is_unavailable(exc):
                    await self._discard_idle()
            if isinstance(exc, StoreError) or not is_unavailable(exc):
                raise
            raise unavailable(exc) from exc
        finally:
            if conn is not None:
                if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    await self._discard(conn)
                else:
                    self._idle.append(conn)
            self._slots.release()

    @staticmethod
    async def _discard(conn: AsyncConnection[Any]) -> None:
        try:
            await conn.close()
        except Exception:
            pass  # already broken: nothing to close cleanly

    async def _discard_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._discard(conn)

    async def dedicated(self) -> AsyncConnection[dict[str, Any]]:
        """A connection outside the pool (the outbox publisher holds its lock on one)."""
        try:
            return await self._connect()
        except Exception as exc:
            if is_unavailable(exc):
                raise unavailable(exc) from exc
            raise

    async def close(self) -> None:
        self._closed = True
        await self._discard_idle()


def conninfo_from_url(database_url: str) -> str:
    """psycopg's form of the SQLAlchemy URL (postgresql+psycopg://... -> postgresql://...)."""
    url = make_url(database_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class PostgresMetadataStore:
    def __init__(self, pool: ConnectionPool, instance_id: str) -> None:
        self._pool = pool
        self._instance_id = instance_id

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
        await migrate_when_reachable(database_url, startup_deadline_s)
        pool = ConnectionPool(conninfo_from_url(database_url), pool_size, timeout_s)
        try:
            async with pool.connection() as conn:
                row = await (await conn.execute(SQL_INSTANCE_ID)).fetchone()
        except BaseException:
            await pool.close()
            raise
        assert row is not None, "the migration makes the cluster row"
        return cls(pool, row["instance_id"])

    async def close(self) -> None:
        await self._pool.close()

    async def _one(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        async with self._pool.connection() as conn:
            return await (await conn.execute(sql, params)).fetchone()

    async def _all(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        async with self._pool.connection() as conn:
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
            "now": ctime_ms,
        }
        async with self._pool.connection() as conn:
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
        async with self._pool.connection() as conn:
            row = await (await conn.execute(SQL_CAS_LEDGER, params)).fetchone()
            if row is not None:
                return LedgerChange(
                    metadata=ledger_from_row(row),
                    previous_state=LedgerState(row["previous_state"]),
                    segments_changed=bool(row["segments_changed"]),
                )
            current = await (
                await conn.execute(SQL_GET_LEDGER, {"id": request.ledger_id})
            ).fetchone()
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
        conn = await self._pool.dedicated()
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
            await ConnectionPool._discard(conn)


class PostgresOutboxReader:
    def __init__(
        self, conn: AsyncConnection[dict[str, Any]], instance_id: str, cursor: OutboxCursor
    ) -> None:
        self._conn = conn
        self.instance_id = instance_id
        self._cursor = cursor

    async def fetch(self, limit: int) -> list[OutboxRecord]:
        rows = await (await self._conn.execute(SQL_OUTBOX_FETCH, {"limit": limit})).fetchall()
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


# -- in memory ----------------------------------------------------------------------------


class InMemoryMetadataStore:
    """The same contract in memory: for the simulator and fast tests. Each operation runs
    without awaiting between its read and its write, so it is atomic like a PostgreSQL
    statement; it yields once first, so that concurrent callers interleave."""

    def __init__(self, instance_id: str | None = None) -> None:
        self._instance_id = instance_id or str(uuid.uuid4())
        self._ledgers: dict[int, LedgerMetadata] = {}
        self._next_ledger_id = 0  # the sequence: only moves forward
        self._bookies: dict[str, tuple[BookieState, int, int, dict[str, Any]]] = {}
        self._cookies: dict[str, Cookie] = {}
        self._settings: dict[str, Any] = {}
        self._urq: dict[int, UnderreplicatedLedger] = {}
        self._election = Leadership(leader_id=None, term=0, lease_expires_at=0)
        self._outbox: list[OutboxRecord] = []
        self._next_outbox_id = 1
        self._outbox_lock = asyncio.Lock()
        self.unavailable = False  # a test sets it to see StoreUnavailable everywhere

    async def _enter(self) -> None:
        await asyncio.sleep(0)
        if self.unavailable:
            raise StoreUnavailable("in-memory store set unavailable")

    def _record(
        self,
        kind: str,
        data: dict[str, Any],
        now_ms: int,
        ledger_id: int | None = None,
        bookie_id: str | None = None,
    ) -> None:
        self._outbox.append(
            OutboxRecord(self._next_outbox_id, kind, ledger_id, bookie_id, data, now_ms)
        )
        self._next_outbox_id += 1

    async def close(self) -> None:
        pass

    # -- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, request: CreateLedgerRequest, ctime_ms: int) -> LedgerMetadata:
        await self._enter()
        if request.ledger_id is not None:
            existing = self._ledgers.get(request.ledger_id)
            if existing is not None:
                if core.is_own_create(existing, request):
                    return existing
                raise LedgerExists(f"ledger {request.ledger_id} exists")
            ledger_id = request.ledger_id
        else:
            while self._next_ledger_id in self._ledgers:
                self._next_ledger_id += 1
            ledger_id = self._next_ledger_id
            self._next_ledger_id += 1
        meta = core.new_ledger(request, ledger_id, ctime_ms)
        self._ledgers[ledger_id] = meta
        self._record(
            core.LEDGER_CREATED, {"metadata": meta.model_dump(mode="json")}, ctime_ms, ledger_id
        )
        return meta

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata:
        await self._enter()
        meta = self._ledgers.get(ledger_id)
        if meta is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")
        return meta

    def _ids_after(self, after: int | None, limit: int) -> list[int]:
        start = core.list_start(after)
        return sorted(i for i in self._ledgers if i > start)[: core.list_fetch_limit(limit)]

    async def list_ledgers(self, after: int | None, limit: int) -> ListLedgersReply:
        await self._enter()
        page, next_after = core.list_page(self._ids_after(after, limit), limit, key=int)
        return ListLedgersReply(ledgers=[self._ledgers[i] for i in page], next_after=next_after)

    async def ledger_ranges(self, after: int | None, limit: int) -> LedgerRangesReply:
        await self._enter()
        page, next_after = core.list_page(self._ids_after(after, limit), limit, key=int)
        return LedgerRangesReply(ranges=core.id_runs(page), next_after=next_after)

    async def update_ledger(self, request: UpdateLedgerRequest, now_ms: int) -> LedgerChange:
        await self._enter()
        current = self._ledgers.get(request.ledger_id)
        if current is None:
            raise NoSuchLedger(f"no ledger {request.ledger_id}")
        if current.version != request.expected_version:
            raise BadVersion(
                f"ledger {request.ledger_id} is at version {current.version}, "
                f"not {request.expected_version}",
                current,
            )
        violation = core.closed_ledger_violation(current, request)
        if violation:
            raise LedgerClosedError(violation)
        changes: dict[str, Any] = {"version": current.version + 1}
        for name in ("state", "last_entry_id", "length", "segments"):
            value = getattr(request, name)
            if value is not None:
                changes[name] = value
        updated = current.model_copy(update=changes)
        self._ledgers[request.ledger_id] = updated
        change = LedgerChange(
            metadata=updated,
            previous_state=current.state,
            segments_changed=updated.segments != current.segments,
        )
        self._record(
            core.LEDGER_CHANGED,
            {
                "metadata": updated.model_dump(mode="json"),
                "previous_state": current.state.value,
                "segments_changed": change.segments_changed,
            },
            now_ms,
            request.ledger_id,
        )
        return change

    async def delete_ledger(self, ledger_id: int, now_ms: int) -> None:
        await self._enter()
        if self._ledgers.pop(ledger_id, None) is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")
        self._urq.pop(ledger_id, None)  # as the foreign key cascades
        self._record(core.LEDGER_DELETED, {}, now_ms, ledger_id)

    # -- bookies --------------------------------------------------------------------------

    def _bookie(self, bookie_id: str, now_ms: int) -> BookieInfo:
        state, last_seen, expires, info = self._bookies[bookie_id]
        return BookieInfo(
            bookie_id=bookie_id,
            state=core.bookie_state(state, expires, now_ms),
            last_seen=last_seen,
            lease_expires_at=expires,
            info=info,
        )

    async def register_bookie(
        self, request: RegisterBookieRequest, now_ms: int, lease_ms: int
    ) -> BookieRegistration:
        await self._enter()
        previous = None
        if request.bookie_id in self._bookies:
            previous = self._bookie(request.bookie_id, now_ms).state
        expires = core.lease_expiry_ms(now_ms, lease_ms)
        self._bookies[request.bookie_id] = (request.state, now_ms, expires, dict(request.info))
        info = self._bookie(request.bookie_id, now_ms)
        for event in core.bookie_events(info, previous):
            self._record(event.kind, event.data, now_ms, bookie_id=request.bookie_id)
        return BookieRegistration(info=info, previous_state=previous)

    async def unregister_bookie(self, bookie_id: str, now_ms: int) -> BookieInfo | None:
        await self._enter()
        if bookie_id not in self._bookies:
            return None
        state, last_seen, expires, info = self._bookies[bookie_id]
        self._bookies[bookie_id] = (state, last_seen, min(expires, now_ms), info)
        self._record("bookie.unregistered", {}, now_ms, bookie_id=bookie_id)
        return self._bookie(bookie_id, now_ms)

    async def list_bookies(self, now_ms: int) -> list[BookieInfo]:
        await self._enter()
        return [self._bookie(b, now_ms) for b in sorted(self._bookies)[:MAX_BOOKIES_LISTED]]

    async def get_cookie(self, bookie_id: str) -> Cookie:
        await self._enter()
        return self._cookies.get(
            bookie_id, Cookie(bookie_id=bookie_id, data=None, version=NO_VERSION)
        )

    def _cookie_bad_version(self, bookie_id: str, expected: int) -> CookieBadVersion:
        current = self._cookies.get(
            bookie_id, Cookie(bookie_id=bookie_id, data=None, version=NO_VERSION)
        )
        return CookieBadVersion(
            f"cookie of {bookie_id} is at version {current.version}, not {expected}", current
        )

    async def put_cookie(self, request: PutCookieRequest, now_ms: int) -> Cookie:
        await self._enter()
        current = self._cookies.get(request.bookie_id)
        stored_version = NO_VERSION if current is None else current.version
        if stored_version != request.expected_version:
            raise self._cookie_bad_version(request.bookie_id, request.expected_version)
        cookie = Cookie(bookie_id=request.bookie_id, data=request.data, version=stored_version + 1)
        self._cookies[request.bookie_id] = cookie
        self._record(
            "bookie.cookie_written",
            {"version": cookie.version},
            now_ms,
            bookie_id=request.bookie_id,
        )
        return cookie

    async def delete_cookie(self, request: DeleteCookieRequest, now_ms: int) -> None:
        await self._enter()
        current = self._cookies.get(request.bookie_id)
        if current is None:
            raise NoSuchCookie(f"no cookie for {request.bookie_id}")
        if current.version != request.expected_version:
            raise self._cookie_bad_version(request.bookie_id, request.expected_version)
        del self._cookies[request.bookie_id]
        self._record(
            "bookie.cookie_deleted",
            {"version": current.version},
            now_ms,
            bookie_id=request.bookie_id,
        )

    # -- cluster --------------------------------------------------------------------------

    async def instance_id(self) -> str:
        await self._enter()
        return self._instance_id

    async def get_cluster_settings(self) -> ClusterSettings:
        await self._enter()
        return core.cluster_settings(self._settings)

    async def set_cluster_settings(
        self, request: SetClusterSettingsRequest, now_ms: int
    ) -> ClusterSettings:
        await self._enter()
        changes = core.settings_changes(request)
        if changes:
            self._settings.update(changes)
            self._record("cluster.settings_changed", changes, now_ms)
        return core.cluster_settings(self._settings)

    # -- under-replication ----------------------------------------------------------------

    async def mark_underreplicated(
        self, request: MarkUnderreplicatedRequest, now_ms: int
    ) -> UnderreplicatedLedger:
        await self._enter()
        if request.ledger_id not in self._ledgers:
            raise NoSuchLedger(f"no ledger {request.ledger_id}")
        current = self._urq.get(request.ledger_id)
        if current is None:
            marked = UnderreplicatedLedger(
                ledger_id=request.ledger_id,
                missing_bookies=core.missing_bookies(request.missing_bookies),
                mark_version=1,
                marked_at=now_ms,
            )
        else:
            marked = core.merge_mark(current, request.missing_bookies)
        self._urq[request.ledger_id] = marked
        if current is None or marked.mark_version != current.mark_version:
            self._record(
                "ledger.underreplicated",
                {"missing_bookies": marked.missing_bookies, "mark_version": marked.mark_version},
                now_ms,
                request.ledger_id,
            )
        return marked

    async def claim_underreplicated(
        self, worker_id: str, lease_ms: int, now_ms: int
    ) -> UnderreplicatedLedger | None:
        await self._enter()
        if not core.cluster_settings(self._settings).autorecovery_enabled:
            return None
        candidates = [u for u in self._urq.values() if core.claimable(u, now_ms)]
        if not candidates:
            return None
        chosen = min(candidates, key=lambda u: (u.marked_at, u.ledger_id))
        claimed = chosen.model_copy(
            update={"claimed_by": worker_id, "claim_expires_at": now_ms + lease_ms}
        )
        self._urq[chosen.ledger_id] = claimed
        return claimed

    def _held_by(self, ledger_id: int, worker_id: str) -> UnderreplicatedLedger | None:
        current = self._urq.get(ledger_id)
        return current if current is not None and current.claimed_by == worker_id else None

    async def renew_underreplicated(
        self, ledger_id: int, worker_id: str, lease_ms: int, now_ms: int
    ) -> bool:
        await self._enter()
        held = self._held_by(ledger_id, worker_id)
        if held is None:
            return False
        self._urq[ledger_id] = held.model_copy(update={"claim_expires_at": now_ms + lease_ms})
        return True

    async def release_underreplicated(self, ledger_id: int, worker_id: str) -> bool:
        await self._enter()
        held = self._held_by(ledger_id, worker_id)
        if held is None:
            return False
        self._urq[ledger_id] = held.model_copy(
            update={"claimed_by": None, "claim_expires_at": None}
        )
        return True

    async def mark_replicated(
        self, ledger_id: int, worker_id: str, mark_version: int | None, now_ms: int
    ) -> bool:
        await self._enter()
        held = self._held_by(ledger_id, worker_id)
        if held is None:
            return False
        if mark_version is not None and mark_version != held.mark_version:
            self._urq[ledger_id] = held.model_copy(
                update={"claimed_by": None, "claim_expires_at": None}
            )
            return False
        del self._urq[ledger_id]
        self._record("ledger.replicated", {"mark_version": held.mark_version}, now_ms, ledger_id)
        return True

    async def list_underreplicated(self, after: int | None, limit: int) -> ListUnderreplicatedReply:
        await self._enter()
        start = core.list_start(after)
        ids = sorted(i for i in self._urq if i > start)[: core.list_fetch_limit(limit)]
        page, next_after = core.list_page(ids, limit, key=int)
        return ListUnderreplicatedReply(ledgers=[self._urq[i] for i in page], next_after=next_after)

    # -- auditor election -----------------------------------------------------------------

    async def elect_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership:
        await self._enter()
        won = core.elect(self._election, candidate_id, now_ms, lease_ms)
        if won is not None:
            if won.term != self._election.term:
                self._record(
                    "auditor.elected", {"leader_id": candidate_id, "term": won.term}, now_ms
                )
            self._election = won.model_copy(update={"is_leader": False})
        return core.leadership_seen_by(self._election, candidate_id, now_ms)

    async def renew_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership:
        await self._enter()
        held = self._election
        if held.leader_id == candidate_id and not core.lease_expired(held.lease_expires_at, now_ms):
            self._election = held.model_copy(
                update={"lease_expires_at": core.lease_expiry_ms(now_ms, lease_ms)}
            )
        return core.leadership_seen_by(self._election, candidate_id, now_ms)

    async def resign_auditor(self, candidate_id: str, now_ms: int) -> Leadership:
        await self._enter()
        held = self._election
        if held.leader_id == candidate_id:
            self._election = held.model_copy(
                update={"lease_expires_at": min(held.lease_expires_at, now_ms)}
            )
        return core.leadership_seen_by(self._election, candidate_id, now_ms)

    async def who_is_auditor(self, now_ms: int) -> Leadership:
        await self._enter()
        return core.leadership_seen_by(self._election, None, now_ms)

    # -- outbox ---------------------------------------------------------------------------

    @asynccontextmanager
    async def outbox(self) -> AsyncIterator[InMemoryOutboxReader | None]:
        if self._outbox_lock.locked():
            yield None
            return
        async with self._outbox_lock:
            yield InMemoryOutboxReader(self)


class InMemoryOutboxReader:
    def __init__(self, store: InMemoryMetadataStore) -> None:
        self._store = store
        self.instance_id = store._instance_id

    async def fetch(self, limit: int) -> list[OutboxRecord]:
        await self._store._enter()
        return list(self._store._outbox[:limit])

    async def mark_published(self, records: Sequence[OutboxRecord]) -> None:
        await self._store._enter()
        done = {r.outbox_id for r in records}
        self._store._outbox = [r for r in self._store._outbox if r.outbox_id not in done]


# -- statements: built once, prepared by psycopg after a few uses -------------------------


def _outbox_insert(kind: str, source: str, data_sql: str, where: str = "true") -> str:
    """The outbox row of a change, inserted by the statement that makes the change."""
    return f"""
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    SELECT '{kind}', {source}.ledger_id, NULL, {data_sql}, %(now)s FROM {source} WHERE {where}"""


def _outbox_insert_bookie(kind: str, source: str, data_sql: str, where: str = "true") -> str:
    return f"""
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    SELECT '{kind}', NULL, {source}.bookie_id, {data_sql}, %(now)s FROM {source} WHERE {where}"""


SQL_INSTANCE_ID = "SELECT instance_id FROM cluster WHERE id = 1"

_CREATED_DATA = f"jsonb_build_object('metadata', {ledger_json_sql('ins')})"
# COALESCE evaluates nextval only when no id was chosen.
SQL_CREATE_LEDGER = f"""
WITH ins AS (
    INSERT INTO ledgers (ledger_id, version, state, ensemble_size, write_quorum, ack_quorum,
        digest, last_entry_id, length, ctime, custom_metadata, segments, password_salt,
        password_hash, format_version, creator_token)
    VALUES (COALESCE(%(ledger_id)s::bigint, nextval('ledger_id_seq')), 0, %(state)s,
        %(ensemble_size)s, %(write_quorum)s, %(ack_quorum)s, %(digest)s, NULL, 0, %(ctime)s,
        %(custom_metadata)s, %(segments)s, %(password_salt)s, %(password_hash)s,
        %(format_version)s, %(creator_token)s)
    ON CONFLICT (ledger_id) DO NOTHING
    RETURNING *
), ev AS ({_outbox_insert(core.LEDGER_CREATED, "ins", _CREATED_DATA)})
SELECT * FROM ins"""

# The sequence ran into user-chosen ids: move it past that run of taken ids, only ever
# forward (an id it gave out must never come back). currval is this session's last id.
SQL_SKIP_TAKEN_IDS = """
SELECT count(nextval('ledger_id_seq')) FROM generate_series(1, (
    SELECT min(l.ledger_id) FROM ledgers l
    WHERE l.ledger_id >= currval('ledger_id_seq')
      AND NOT EXISTS (SELECT 1 FROM ledgers m WHERE m.ledger_id = l.ledger_id + 1)
) - currval('ledger_id_seq'))"""

SQL_GET_LEDGER = "SELECT * FROM ledgers WHERE ledger_id = %(id)s"
SQL_LIST_LEDGERS = """
SELECT * FROM ledgers WHERE ledger_id > %(after)s ORDER BY ledger_id LIMIT %(fetch_limit)s"""
SQL_LEDGER_IDS = """
SELECT ledger_id FROM ledgers WHERE ledger_id > %(after)s ORDER BY ledger_id
LIMIT %(fetch_limit)s"""

# The compare-and-set. `old` locks the row at the expected version and keeps its old
# values, so one statement sets, tells what it replaced, and writes the outbox row.
# A NULL parameter leaves its field as it is.
SQL_CAS_LEDGER = f"""
WITH old AS (
    SELECT ledger_id, state, segments FROM ledgers
    WHERE ledger_id = %(id)s AND version = %(expected)s
        -- A closed ledger never reopens; its last entry and length never change.
        AND (state <> 'CLOSED' OR (
            COALESCE(%(state)s::text, 'CLOSED') = 'CLOSED'
            AND (%(last_entry_id)s::bigint IS NULL
                 OR %(last_entry_id)s::bigint IS NOT DISTINCT FROM last_entry_id)
            AND (%(length)s::bigint IS NULL OR %(length)s::bigint = length)))
    FOR UPDATE
), upd AS (
    UPDATE ledgers l SET
        version = l.version + 1,
        state = COALESCE(%(state)s::text, l.state),
        last_entry_id = COALESCE(%(last_entry_id)s::bigint, l.last_entry_id),
        length = COALESCE(%(length)s::bigint, l.length),
        segments = COALESCE(%(segments)s::jsonb, l.segments)
    FROM old
    WHERE l.ledger_id = old.ledger_id AND l.version = %(expected)s
    RETURNING l.*, old.state AS previous_state,
        l.segments IS DISTINCT FROM old.segments AS segments_changed
), ev AS ({
    _outbox_insert(
        core.LEDGER_CHANGED,
        "upd",
        f"jsonb_build_object('metadata', {ledger_json_sql('upd')}, "
        "'previous_state', upd.previous_state, 'segments_changed', upd.segments_changed)",
    )
})
SELECT * FROM upd"""

SQL_DELETE_LEDGER = f"""
WITH del AS (
    DELETE FROM ledgers WHERE ledger_id = %(id)s RETURNING ledger_id
), ev AS ({_outbox_insert(core.LEDGER_DELETED, "del", "jsonb_build_object()")})
SELECT ledger_id FROM del"""

# Register or renew, returning the row as it was before. The outbox row only for news:
# a first registration or a change of the effective state (lost once the lease lapsed),
# as core.registration_is_news decides it.
SQL_UPSERT_BOOKIE = f"""
WITH old AS (
    SELECT state, lease_expires_at,
        CASE WHEN lease_expires_at <= %(now)s THEN 'lost' ELSE state END AS effective
    FROM bookies WHERE bookie_id = %(id)s
), up AS (
    INSERT INTO bookies (bookie_id, state, last_seen, lease_expires_at, info)
    VALUES (%(id)s, %(state)s, %(now)s, %(expires)s, %(info)s)
    ON CONFLICT (bookie_id) DO UPDATE SET state = excluded.state,
        last_seen = excluded.last_seen, lease_expires_at = excluded.lease_expires_at,
        info = excluded.info
    RETURNING *
), news AS (
    SELECT up.bookie_id, up.state, up.lease_expires_at,
        (SELECT effective FROM old) AS previous_state
    FROM up
), ev AS ({
    _outbox_insert_bookie(
        "bookie.registered",
        "news",
        "jsonb_build_object('state', news.state, 'previous_state', news.previous_state, "
        "'lease_expires_at', news.lease_expires_at)",
        "news.previous_state IS DISTINCT FROM news.state",
    )
})
SELECT up.*, (SELECT state FROM old) AS previous_state,
    (SELECT lease_expires_at FROM old) AS previous_lease_expires_at
FROM up"""

SQL_EXPIRE_BOOKIE = f"""
WITH up AS (
    UPDATE bookies SET lease_expires_at = LEAST(lease_expires_at, %(now)s)
    WHERE bookie_id = %(id)s RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.unregistered", "up", "jsonb_build_object()")})
SELECT * FROM up"""

SQL_LIST_BOOKIES = "SELECT * FROM bookies ORDER BY bookie_id LIMIT %(limit)s"

SQL_GET_COOKIE = "SELECT data, version FROM cookies WHERE bookie_id = %(id)s"
_COOKIE_EVENT = "jsonb_build_object('version', c.version)"
SQL_CREATE_COOKIE = f"""
WITH c AS (
    INSERT INTO cookies (bookie_id, data, version) VALUES (%(id)s, %(data)s, 0)
    ON CONFLICT (bookie_id) DO NOTHING RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.cookie_written", "c", _COOKIE_EVENT)})
SELECT * FROM c"""
SQL_CAS_COOKIE = f"""
WITH c AS (
    UPDATE cookies SET data = %(data)s, version = version + 1
    WHERE bookie_id = %(id)s AND version = %(expected)s RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.cookie_written", "c", _COOKIE_EVENT)})
SELECT * FROM c"""
SQL_DELETE_COOKIE = f"""
WITH c AS (
    DELETE FROM cookies WHERE bookie_id = %(id)s AND version = %(expected)s RETURNING *
), ev AS ({_outbox_insert_bookie("bookie.cookie_deleted", "c", _COOKIE_EVENT)})
SELECT * FROM c"""

SQL_GET_SETTINGS = "SELECT name, value FROM cluster_settings"
SQL_SET_SETTINGS = """
WITH up AS (
    INSERT INTO cluster_settings (name, value)
    SELECT key, value FROM jsonb_each(%(changes)s::jsonb)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value
    RETURNING name
), ev AS (
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    VALUES ('cluster.settings_changed', NULL, NULL, %(changes)s::jsonb, %(now)s)
)
SELECT count(*) AS changed FROM up"""

# Adding to an existing mark: the union of missing bookies; the mark version moves only
# when a bookie was added (core.merge_mark), and only then is there an event. `old` is
# the statement's snapshot (it cannot lock: the row is updated by this very statement),
# so two racing marks adding the same bookie may both publish an event; the queue itself
# is exact.
SQL_MARK_URQ = f"""
WITH old AS (
    SELECT mark_version FROM underreplicated_ledgers WHERE ledger_id = %(id)s
), up AS (
    INSERT INTO underreplicated_ledgers AS u
        (ledger_id, missing_bookies, mark_version, marked_at, claimed_by, claim_expires_at)
    VALUES (%(id)s, %(missing)s, 1, %(now)s, NULL, NULL)
    ON CONFLICT (ledger_id) DO UPDATE SET
        missing_bookies = (
            SELECT jsonb_agg(DISTINCT b ORDER BY b)
            FROM jsonb_array_elements_text(u.missing_bookies || excluded.missing_bookies) b
        ),
        mark_version = u.mark_version
            + CASE WHEN excluded.missing_bookies <@ u.missing_bookies THEN 0 ELSE 1 END
    RETURNING u.*
), ev AS ({
    _outbox_insert(
        "ledger.underreplicated",
        "up",
        "jsonb_build_object('missing_bookies', up.missing_bookies, "
        "'mark_version', up.mark_version)",
        "up.mark_version IS DISTINCT FROM (SELECT mark_version FROM old)",
    )
})
SELECT * FROM up"""

# SKIP LOCKED: racing workers each take a different row; a row a committed claim holds is
# re-checked against the WHERE (lease still running) and passed over.
SQL_CLAIM_URQ = """
WITH pick AS (
    SELECT ledger_id FROM underreplicated_ledgers
    WHERE (claimed_by IS NULL OR claim_expires_at <= %(now)s)
      AND COALESCE(
        (SELECT value FROM cluster_settings WHERE name = 'autorecovery_enabled'),
        'true'::jsonb) = 'true'::jsonb
    ORDER BY marked_at, ledger_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE underreplicated_ledgers u
SET claimed_by = %(worker)s, claim_expires_at = %(expires)s
FROM pick WHERE u.ledger_id = pick.ledger_id
RETURNING u.*"""

SQL_RENEW_URQ = """
UPDATE underreplicated_ledgers SET claim_expires_at = %(expires)s
WHERE ledger_id = %(id)s AND claimed_by = %(worker)s RETURNING ledger_id"""
SQL_RELEASE_URQ = """
UPDATE underreplicated_ledgers SET claimed_by = NULL, claim_expires_at = NULL
WHERE ledger_id = %(id)s AND claimed_by = %(worker)s RETURNING ledger_id"""
# The two branches exclude each other (same mark version or not), so one row is touched
# at most once.
SQL_REPLICATED_URQ = f"""
WITH del AS (
    DELETE FROM underreplicated_ledgers
    WHERE ledger_id = %(id)s AND claimed_by = %(worker)s
      AND (%(mv)s::int IS NULL OR mark_version = %(mv)s::int)
    RETURNING ledger_id, mark_version
), rel AS (
    UPDATE underreplicated_ledgers SET claimed_by = NULL, claim_expires_at = NULL
    WHERE ledger_id = %(id)s AND claimed_by = %(worker)s
      AND %(mv)s::int IS NOT NULL AND mark_version <> %(mv)s::int
    RETURNING ledger_id
), ev AS ({
    _outbox_insert(
        "ledger.replicated", "del", "jsonb_build_object('mark_version', del.mark_version)"
    )
})
SELECT (SELECT count(*) FROM del) AS deleted, (SELECT count(*) FROM rel) AS released"""
SQL_LIST_URQ = """
SELECT * FROM underreplicated_ledgers WHERE ledger_id > %(after)s ORDER BY ledger_id
LIMIT %(fetch_limit)s"""

# Election: the one row, locked and read as it is now by `old`. Each statement answers
# the row as it is after it (one that changed nothing answers it as it was). A new term
# when another candidate wins or the lease had lapsed (core.elect decides alike).
_ELECTION_OLD = "SELECT * FROM auditor_election WHERE id = 1 FOR UPDATE"
_ELECTION_ANSWER = """
SELECT leader_id, term, lease_expires_at FROM upd
UNION ALL
SELECT leader_id, term, lease_expires_at FROM old WHERE NOT EXISTS (SELECT 1 FROM upd)"""
SQL_ELECT = f"""
WITH old AS ({_ELECTION_OLD}), upd AS (
    UPDATE auditor_election e SET
        term = CASE WHEN old.leader_id = %(c)s AND old.lease_expires_at > %(now)s
            THEN old.term ELSE old.term + 1 END,
        leader_id = %(c)s,
        lease_expires_at = %(expires)s
    FROM old
    WHERE e.id = 1 AND (old.leader_id IS NULL OR old.lease_expires_at <= %(now)s
        OR old.leader_id = %(c)s)
    RETURNING e.leader_id, e.term, e.lease_expires_at, e.term <> old.term AS new_term
), ev AS (
    INSERT INTO outbox (kind, ledger_id, bookie_id, data, ts_ms)
    SELECT 'auditor.elected', NULL, NULL,
        jsonb_build_object('leader_id', upd.leader_id, 'term', upd.term), %(now)s
    FROM upd WHERE upd.new_term
)
{_ELECTION_ANSWER}"""
SQL_RENEW_LEADER = f"""
WITH old AS ({_ELECTION_OLD}), upd AS (
    UPDATE auditor_election e SET lease_expires_at = %(expires)s
    FROM old
    WHERE e.id = 1 AND old.leader_id = %(c)s AND old.lease_expires_at > %(now)s
    RETURNING e.leader_id, e.term, e.lease_expires_at
)
{_ELECTION_ANSWER}"""
SQL_RESIGN = f"""
WITH old AS ({_ELECTION_OLD}), upd AS (
    UPDATE auditor_election e SET lease_expires_at = LEAST(old.lease_expires_at, %(now)s)
    FROM old
    WHERE e.id = 1 AND old.leader_id = %(c)s
    RETURNING e.leader_id, e.term, e.lease_expires_at
)
{_ELECTION_ANSWER}"""
SQL_WHO = "SELECT leader_id, term, lease_expires_at FROM auditor_election WHERE id = 1"

SQL_TRY_OUTBOX_LOCK = "SELECT pg_try_advisory_lock(%(key)s) AS locked"
SQL_OUTBOX_CURSOR = "SELECT last_published_id FROM outbox_cursor WHERE id = 1"
SQL_OUTBOX_FETCH = """
SELECT o.*, pg_current_snapshot()::text AS snapshot FROM outbox o ORDER BY o.id
LIMIT %(limit)s"""
SQL_OUTBOX_PUBLISHED = """
WITH gone AS (DELETE FROM outbox WHERE id = ANY(%(ids)s))
UPDATE outbox_cursor SET last_published_id = GREATEST(last_published_id, %(last)s)
WHERE id = 1"""


async def migrate_when_reachable(database_url: str, deadline_s: float) -> None:
    """Run the migrations, waiting for PostgreSQL to accept connections (a cluster starts
    its parts at once)."""
    engine = create_async_engine(database_url, poolclass=None, pool_size=1, max_overflow=0)
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
