"""What both clients share: the values they return, the error they raise, and the ledger
handle (BookKeeper's LedgerHandle: append, read, tail, close, recover)."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# A gateway's answer that another gateway holds the OPEN ledger's writer (HTTP 307, gRPC
# FAILED_PRECONDITION with the writer in trailing metadata): the clients repeat the call
# there, once (the writer never redirects).
WRITER_REDIRECT = "WRITER_REDIRECT"
# The client's own code when no connection to the writer a gateway redirected to could be
# made (so the request was never sent): its gateway is gone, and with it the writer handle.
# Recover the ledger through any gateway (POST /v1/ledgers/{id}/recover) and write on in a
# new ledger.
WRITER_UNREACHABLE = "WRITER_UNREACHABLE"


class QuireClientError(Exception):
    """An error answer: `code` is the API's stable code (API.md), `status` the HTTP status
    (or the gRPC status name)."""

    def __init__(self, code: str, detail: str, status: int | str | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.status = status


@dataclass(frozen=True)
class Entry:
    entry_id: int
    data: bytes


@dataclass(frozen=True)
class Ledger:
    """A ledger's metadata as the API shows it."""

    ledger_id: int
    state: str
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: str
    last_entry_id: int | None
    length: int
    version: int
    ctime: int
    metadata: dict[str, str] = field(default_factory=dict)
    segments: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Ledger:
        return cls(**{name: body[name] for name in cls.__dataclass_fields__ if name in body})


class QuireClient(abc.ABC):
    """The operations both transports offer. Entry-level calls need the ledger password."""

    async def __aenter__(self) -> QuireClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    @abc.abstractmethod
    async def create(
        self,
        *,
        password: str,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        digest: str = "crc32c",
        metadata: dict[str, str] | None = None,
    ) -> Ledger: ...

    @abc.abstractmethod
    async def get(self, ledger_id: int) -> Ledger: ...

    @abc.abstractmethod
    async def list(
        self, after: int | None = None, limit: int = 100
    ) -> tuple[list[Ledger], int | None]:
        """A page of ledgers by id, and the `after` of the next page (None at the end)."""

    @abc.abstractmethod
    async def delete(self, ledger_id: int, password: str) -> None: ...

    @abc.abstractmethod
    async def append(
        self, ledger_id: int, password: str, entries: Sequence[bytes]
    ) -> tuple[int, int, int]:
        """Append in order; (first entry id, last entry id, LAC) once durable."""

    @abc.abstractmethod
    async def append_many(
        self, ledger_id: int, password: str, entries: Sequence[bytes], batch: int = 500
    ) -> tuple[int, int]:
        """Append a long sequence, pipelined; (first, last) entry ids, in the given order."""

    @abc.abstractmethod
    def read_stream(
        self,
        ledger_id: int,
        password: str,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> AsyncIterator[Entry]:
        """Entries first..last (None: up to the LAC), capped at the LAC unless `unconfirmed`,
        as they arrive: one request whatever the range's length. A failure part way, even
        after some entries, raises QuireClientError."""

    async def read(
        self,
        ledger_id: int,
        password: str,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> list[Entry]:
        """`read_stream`, gathered into a list."""
        return [e async for e in self.read_stream(ledger_id, password, first, last, unconfirmed)]

    @abc.abstractmethod
    def tail(self, ledger_id: int, password: str, first: int = 0) -> AsyncIterator[Entry]:
        """Entries from `first` on as they are confirmed; ends after a closed ledger's last."""

    @abc.abstractmethod
    async def read_lac(
        self, ledger_id: int, password: str, after: int | None = None, timeout_ms: int = 0
    ) -> int: ...

    @abc.abstractmethod
    async def close(self, ledger_id: int, password: str) -> int:
        """Close; the last entry id (-1 for an empty ledger)."""

    @abc.abstractmethod
    async def recover(self, ledger_id: int, password: str) -> int:
        """Fence, recover and close (BookKeeper's open with recovery); the last entry id."""

    async def create_ledger(self, *, password: str, **options: Any) -> LedgerHandle:
        return LedgerHandle(self, await self.create(password=password, **options), password)

    async def open_ledger(self, ledger_id: int, password: str) -> LedgerHandle:
        return LedgerHandle(self, await self.get(ledger_id), password)


class LedgerHandle:
    """One ledger and its password: the calls a writer or reader makes."""

    def __init__(self, client: QuireClient, ledger: Ledger, password: str) -> None:
        self.client = client
        self.ledger = ledger
        self.password = password

    @property
    def ledger_id(self) -> int:
        return self.ledger.ledger_id

    async def append(self, data: bytes) -> int:
        _, last, _ = await self.client.append(self.ledger_id, self.password, [data])
        return last

    async def append_many(self, entries: Sequence[bytes], batch: int = 500) -> tuple[int, int]:
        return await self.client.append_many(self.ledger_id, self.password, entries, batch)

    async def read(self, first: int, last: int | None, unconfirmed: bool = False) -> list[Entry]:
        return await self.client.read(self.ledger_id, self.password, first, last, unconfirmed)

    def read_stream(
        self, first: int, last: int | None, unconfirmed: bool = False
    ) -> AsyncIterator[Entry]:
        return self.client.read_stream(self.ledger_id, self.password, first, last, unconfirmed)

    def tail(self, first: int = 0) -> AsyncIterator[Entry]:
        return self.client.tail(self.ledger_id, self.password, first)

    async def lac(self) -> int:
        return await self.client.read_lac(self.ledger_id, self.password)

    async def close(self) -> int:
        return await self.client.close(self.ledger_id, self.password)

    async def recover(self) -> int:
        return await self.client.recover(self.ledger_id, self.password)
