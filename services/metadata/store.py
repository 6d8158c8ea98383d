"""The metadata store contract: what the service needs from wherever the metadata lives.

`MetadataStore` (with `OutboxReader`) is the contract and the `StoreError`s are its
answers. Two stores keep it: `PostgresMetadataStore` (services/metadata/postgres.py) and
`InMemoryMetadataStore` (services/metadata/memory.py, for tests), and one contract suite
(tests/integration/test_metadata_contract.py) runs against both.

Rules every implementation keeps:
- Every ledger update is a compare-and-set on the row version.
- Every change writes its outbox record atomically with the change (in PostgreSQL, in the
  same statement); the outbox publisher turns the records into events, in order.
- An error that leaves the outcome unknown (a lost connection, a timeout) is
  `StoreUnavailable`: the caller must re-read, never assume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.metadata.core import LedgerChange, OutboxRecord
from shared.models import (
    BookieInfo,
    BookieState,
    ClusterSettings,
    Cookie,
    CreateLedgerRequest,
    DeleteCookieRequest,
    Leadership,
    LedgerMetadata,
    LedgerRangesReply,
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

# More bookies than this in one cluster is a misconfiguration, not a list to answer.
MAX_BOOKIES_LISTED = 10_000


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


class BookieAlive(StoreError):
    """The bookie's lease still holds: a registered live bookie is not removed."""

    code = MetaErrorCode.BOOKIE_ALIVE


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

    async def fetch(self, limit: int, published: Sequence[OutboxRecord] = ()) -> list[OutboxRecord]:
        """The next records to publish, in order; may hold some back (see OutboxCursor).
        `published` (the previous batch, acknowledged) is marked published first, in the
        same round trip: as `mark_published` then `fetch`."""
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

    async def remove_bookie(self, bookie_id: str, now_ms: int) -> None:
        """Forget the bookie's registration (a decommissioned bookie: BookKeeper removes its
        znodes). BookieAlive while its lease holds; nothing to do for an unknown bookie. A
        bookie that registers later with that id is a first registration."""
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
