"""The caller's side of the metadata service: typed requests over NATS.

`METADATA_OPS` is the whole protocol: operation name -> (request model, result model).
The metadata service serves exactly these on `<prefix>.meta.<op>`.
"""

from __future__ import annotations

import json
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import BaseModel

from shared.models import (
    BookieIdRequest,
    BookieInfo,
    BookieState,
    CreateLedgerRequest,
    Empty,
    LedgerIdRequest,
    LedgerMetadata,
    ListBookiesReply,
    ListLedgersReply,
    ListLedgersRequest,
    MetaError,
    MetaErrorCode,
    MetaReply,
    RegisterBookieRequest,
    UpdateLedgerRequest,
)
from shared.subjects import Subjects

METADATA_OPS: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    "ledger.create": (CreateLedgerRequest, LedgerMetadata),
    "ledger.get": (LedgerIdRequest, LedgerMetadata),
    "ledger.list": (ListLedgersRequest, ListLedgersReply),
    "ledger.update": (UpdateLedgerRequest, LedgerMetadata),
    "ledger.delete": (LedgerIdRequest, Empty),
    "bookie.register": (RegisterBookieRequest, BookieInfo),
    "bookie.unregister": (BookieIdRequest, Empty),
    "bookie.list": (Empty, ListBookiesReply),
}


class MetadataError(Exception):
    def __init__(self, error: MetaError) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code
        self.message = error.message
        self.current = error.current


class MetadataClient:
    def __init__(self, nc: NatsClient, subjects: Subjects, timeout_s: float = 5.0) -> None:
        self._nc = nc
        self._subjects = subjects
        self._timeout_s = timeout_s

    async def call(self, op: str, request: BaseModel | dict[str, Any]) -> Any:
        """Send `request` to `op`; the parsed result, or MetadataError. A timeout or no
        responder is UNAVAILABLE: the outcome is unknown and the caller must re-read."""
        _, result_model = METADATA_OPS[op]
        body = (
            request.model_dump_json() if isinstance(request, BaseModel) else json.dumps(request)
        ).encode()
        try:
            msg = await self._nc.request(self._subjects.meta(op), body, timeout=self._timeout_s)
        except (NoRespondersError, NatsTimeoutError) as exc:
            raise MetadataError(
                MetaError(code=MetaErrorCode.UNAVAILABLE, message=f"metadata service: {exc!r}")
            ) from exc
        reply = MetaReply.model_validate_json(msg.data)
        if not reply.ok:
            assert reply.error is not None
            raise MetadataError(reply.error)
        return result_model.model_validate(reply.result)

    async def create_ledger(self, request: CreateLedgerRequest) -> LedgerMetadata:
        return await self.call("ledger.create", request)

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata:
        return await self.call("ledger.get", LedgerIdRequest(ledger_id=ledger_id))

    async def list_ledgers(self, after: int | None = None, limit: int = 100) -> ListLedgersReply:
        return await self.call("ledger.list", ListLedgersRequest(after=after, limit=limit))

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata:
        return await self.call("ledger.update", request)

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.call("ledger.delete", LedgerIdRequest(ledger_id=ledger_id))

    async def register_bookie(
        self,
        bookie_id: str,
        state: BookieState = BookieState.WRITABLE,
        info: dict[str, Any] | None = None,
    ) -> BookieInfo:
        return await self.call(
            "bookie.register",
            RegisterBookieRequest(bookie_id=bookie_id, state=state, info=info or {}),
        )

    async def unregister_bookie(self, bookie_id: str) -> None:
        await self.call("bookie.unregister", BookieIdRequest(bookie_id=bookie_id))

    async def list_bookies(self) -> list[BookieInfo]:
        reply: ListBookiesReply = await self.call("bookie.list", Empty())
        return reply.bookies
