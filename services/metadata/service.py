"""The metadata service: ledger metadata and the bookie registry over NATS.

Stateless: every instance serves `<prefix>.meta.<op>` in one queue group, and PostgreSQL
(through `MetadataStore`) decides every race by compare-and-set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.micro.request import Request
from pydantic import BaseModel, ValidationError

from services.metadata import core
from services.metadata.store import (
    BadVersion,
    MetadataStore,
    PostgresMetadataStore,
    StoreError,
)
from shared.events import EventPublisher
from shared.metaclient import METADATA_OPS
from shared.models import (
    BookieIdRequest,
    BookieInfo,
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
from shared.service import ServiceRuntime
from shared.subjects import METADATA_QUEUE_GROUP

log = logging.getLogger(__name__)

Clock = Callable[[], int]
Operation = Callable[[Any], Awaitable[BaseModel]]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MetadataService:
    """Turns request bytes into reply bytes; knows nothing of NATS."""

    def __init__(
        self,
        store: MetadataStore,
        events: EventPublisher,
        *,
        bookie_lease_ms: int,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self._store = store
        self._events = events
        self._bookie_lease_ms = bookie_lease_ms
        self._clock = clock
        self._ops: dict[str, Operation] = {
            "ledger.create": self.create_ledger,
            "ledger.get": self.get_ledger,
            "ledger.list": self.list_ledgers,
            "ledger.update": self.update_ledger,
            "ledger.delete": self.delete_ledger,
            "bookie.register": self.register_bookie,
            "bookie.unregister": self.unregister_bookie,
            "bookie.list": self.list_bookies,
        }
        assert self._ops.keys() == METADATA_OPS.keys(), "serve exactly the METADATA_OPS"

    async def handle(self, op: str, data: bytes) -> bytes:
        return (await self.reply(op, data)).model_dump_json().encode()

    async def reply(self, op: str, data: bytes) -> MetaReply:
        request_model, result_model = METADATA_OPS[op]
        try:
            # An empty body is an empty object, so that `nats req <subject> ''` works.
            request = request_model.model_validate_json(data or b"{}")
        except ValidationError as exc:
            return error_reply(MetaErrorCode.BAD_REQUEST, core.describe_validation_error(exc))
        try:
            result = await self._ops[op](request)
        except core.InvalidRequest as exc:
            return error_reply(MetaErrorCode.BAD_REQUEST, str(exc))
        except BadVersion as exc:
            return error_reply(exc.code, str(exc), current=exc.current)
        except StoreError as exc:
            return error_reply(exc.code, str(exc))
        except Exception:
            # A bug, not the caller's fault: loud in the log, an answer for the caller.
            log.exception("metadata operation failed", extra={"op": op})
            return error_reply(MetaErrorCode.INTERNAL, f"{op} failed; see the service log")
        assert isinstance(result, result_model), (op, type(result))
        return MetaReply(ok=True, result=result.model_dump(mode="json"))

    # -- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, request: CreateLedgerRequest) -> LedgerMetadata:
        meta = await self._store.create_ledger(request, self._clock())
        self._events.emit(
            "ledger.created",
            ledger_id=meta.ledger_id,
            ensemble_size=meta.ensemble_size,
            write_quorum=meta.write_quorum,
            ack_quorum=meta.ack_quorum,
            digest=meta.digest.value,
            ensemble=meta.segments[0].bookies,
            ctime=meta.ctime,
        )
        return meta

    async def get_ledger(self, request: LedgerIdRequest) -> LedgerMetadata:
        return await self._store.get_ledger(request.ledger_id)

    async def list_ledgers(self, request: ListLedgersRequest) -> ListLedgersReply:
        return await self._store.list_ledgers(request.after, request.limit)

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata:
        core.check_update(request)
        change = await self._store.update_ledger(request)
        for event in core.change_events(change):
            self._events.emit(event.kind, ledger_id=request.ledger_id, **event.data)
        return change.metadata

    async def delete_ledger(self, request: LedgerIdRequest) -> Empty:
        await self._store.delete_ledger(request.ledger_id)
        self._events.emit("ledger.deleted", ledger_id=request.ledger_id)
        return Empty()

    # -- bookies --------------------------------------------------------------------------

    async def register_bookie(self, request: RegisterBookieRequest) -> BookieInfo:
        core.check_registration(request)
        registration = await self._store.register_bookie(
            request, self._clock(), self._bookie_lease_ms
        )
        for event in core.bookie_events(registration.info, registration.previous_state):
            self._events.emit(event.kind, bookie_id=request.bookie_id, **event.data)
        return registration.info

    async def unregister_bookie(self, request: BookieIdRequest) -> Empty:
        info = await self._store.unregister_bookie(request.bookie_id, self._clock())
        if info is not None:
            self._events.emit("bookie.unregistered", bookie_id=request.bookie_id)
        return Empty()

    async def list_bookies(self, request: Empty) -> ListBookiesReply:
        return ListBookiesReply(bookies=await self._store.list_bookies(self._clock()))


def error_reply(
    code: MetaErrorCode, message: str, current: LedgerMetadata | None = None
) -> MetaReply:
    return MetaReply(ok=False, error=MetaError(code=code, message=message, current=current))


async def main(rt: ServiceRuntime) -> None:
    settings = rt.settings
    store = await PostgresMetadataStore.open(
        settings.database_url,
        pool_size=settings.metadata.db_pool_size,
        timeout_s=settings.request_timeout_ms / 1000,
    )
    rt.on_shutdown(store.close)
    service = MetadataService(store, rt.events, bookie_lease_ms=settings.metadata.bookie_lease_ms)
    for op in METADATA_OPS:
        await rt.add_endpoint(
            op.replace(".", "_"),
            rt.subjects.meta(op),
            endpoint(service, op),
            queue_group=METADATA_QUEUE_GROUP,
            max_in_flight=settings.metadata.max_in_flight,
        )
    # Started means subscribed: once the server has our subscriptions, requests find us.
    await rt.nc.flush()


def endpoint(service: MetadataService, op: str) -> Callable[[Request], Awaitable[None]]:
    async def serve(request: Request) -> None:
        await request.respond(await service.handle(op, request.data))

    return serve
