"""What a driver of the protocol needs of the world, as interfaces (`typing.Protocol`): the
bookie client (`shared.bookie_client.BookieClient` over NATS) and the metadata client
(`shared.metaclient.MetadataClient`). A test or a benchmark may pass any object that has
these methods; the cores themselves never see a transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from opentelemetry.trace import SpanContext

from shared.models import BookieInfo, CreateLedgerRequest, LedgerMetadata, UpdateLedgerRequest
from shared.status import BookieStatus
from shared.wire import AddItem, AddResult, LacReply, ReadItem, ReadResult


class BookieUnreachable(Exception):
    """No usable answer: the outcome on the bookie is unknown. `timed_out` tells a slow
    bookie from one that could not be reached at all."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class BookieTransport(Protocol):
    """Requests to one bookie. Every failure to get an answer raises BookieUnreachable,
    which the cores treat as "this replica did not answer"."""

    @property
    def max_send_bytes(self) -> int:
        """The most item bytes one request may carry."""
        ...

    async def add(
        self, bookie_id: str, items: list[AddItem], traced: Sequence[SpanContext] = ()
    ) -> tuple[BookieStatus, list[AddResult]]:
        """`traced`: the span contexts of the traced appends among `items` (the driver
        passes it only when there are some: a transport that traces nothing may omit it)."""
        ...

    async def read(
        self, bookie_id: str, items: list[ReadItem]
    ) -> tuple[BookieStatus, list[ReadResult]]: ...

    async def fence(self, bookie_id: str, ledger_id: int, master_key: bytes) -> LacReply: ...

    async def write_lac(
        self, bookie_id: str, items: list[tuple[int, bytes, int]]
    ) -> list[BookieStatus]:
        """Explicit LACs (ledger id, master key, LAC) of one or more ledgers."""
        ...

    async def read_lac(self, bookie_id: str, ledger_id: int) -> LacReply: ...

    async def has_responder(self, bookie_id: str) -> bool:
        """Whether a request to the bookie's journal would be delivered at all (False only
        when it certainly would not: the bookie is gone)."""
        ...

    def bookies_listed(self, bookies: list[BookieInfo]) -> None:
        """The bookies' registrations as the metadata last listed them (a transport may
        tell a bookie that just registered from one that is gone by them)."""
        ...


class MetadataTransport(Protocol):
    """The ledger metadata operations a driver needs. Each raises
    `shared.metaclient.MetadataError` on a refusal (carrying the stored metadata when a
    compare-and-set lost) or when the metadata service cannot be reached."""

    async def create_ledger(self, request: CreateLedgerRequest) -> LedgerMetadata: ...

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata: ...

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata: ...

    async def list_bookies(self) -> list[BookieInfo]: ...
