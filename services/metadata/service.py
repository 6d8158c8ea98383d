"""The metadata service: ledger metadata and the cluster's state over NATS.

Stateless: every instance serves `<prefix>.meta.<op>` in one queue group, and PostgreSQL
(through `MetadataStore`) decides every race by compare-and-set. Every change writes its
outbox record in its own transaction; the outbox publisher (one instance at a time)
turns the records into events and watch notifications. Requests are counted by operation
and outcome (`services.metadata.metrics`; docs/metrics.md), served on `metrics_port`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.micro.request import Request
from pydantic import BaseModel, ValidationError

from services.metadata import core
from services.metadata.metrics import MetadataStats, metadata_metrics
from services.metadata.outbox import OutboxPublisher
from services.metadata.postgres import PostgresMetadataStore
from services.metadata.store import BadVersion, CookieBadVersion, MetadataStore, StoreError
from shared import clock
from shared.metaclient import METADATA_OPS
from shared.metrics import serve_metrics
from shared.models import (
    BookieIdRequest,
    BookieInfo,
    ClaimOutcome,
    ClaimUnderreplicatedReply,
    ClaimUnderreplicatedRequest,
    ClusterSettings,
    Cookie,
    CookieRequest,
    CreateLedgerRequest,
    DeleteCookieRequest,
    ElectRequest,
    Empty,
    InstanceIdReply,
    Leadership,
    LedgerIdRequest,
    LedgerMetadata,
    LedgerRangesReply,
    LedgerRangesRequest,
    ListBookiesReply,
    ListLedgersReply,
    ListLedgersRequest,
    ListUnderreplicatedReply,
    ListUnderreplicatedRequest,
    MarkUnderreplicatedRequest,
    MetaError,
    MetaErrorCode,
    MetaReply,
    PutCookieRequest,
    RegisterBookieRequest,
    SetClusterSettingsRequest,
    UnderreplicatedClaimRequest,
    UnderreplicatedLedger,
    UpdateLedgerRequest,
)
from shared.natsfast import respond_soon
from shared.service import ServiceRuntime
from shared.subjects import METADATA_QUEUE_GROUP

log = logging.getLogger(__name__)

Clock = Callable[[], int]
Operation = Callable[[Any], Awaitable[BaseModel]]


def wall_clock_ms() -> int:
    return clock.wall_ms()


class MetadataService:
    """Turns request bytes into reply bytes; knows nothing of NATS."""

    def __init__(
        self,
        store: MetadataStore,
        *,
        bookie_lease_ms: int,
        clock: Clock = wall_clock_ms,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._bookie_lease_ms = bookie_lease_ms
        self._clock = clock
        # Called after every operation that may have committed a change (the outbox
        # publisher's wake-up).
        self._on_change = on_change
        self._ops: dict[str, Operation] = {
            "ledger.create": self.create_ledger,
            "ledger.get": self.get_ledger,
            "ledger.list": self.list_ledgers,
            "ledger.ranges": self.ledger_ranges,
            "ledger.update": self.update_ledger,
            "ledger.delete": self.delete_ledger,
            "bookie.register": self.register_bookie,
            "bookie.unregister": self.unregister_bookie,
            "bookie.remove": self.remove_bookie,
            "bookie.list": self.list_bookies,
            "cookie.get": self.get_cookie,
            "cookie.put": self.put_cookie,
            "cookie.delete": self.delete_cookie,
            "cluster.instance_id": self.instance_id,
            "cluster.get_settings": self.get_cluster_settings,
            "cluster.set_settings": self.set_cluster_settings,
            "urq.mark": self.mark_underreplicated,
            "urq.claim": self.claim_underreplicated,
            "urq.renew": self.renew_underreplicated,
            "urq.release": self.release_underreplicated,
            "urq.replicated": self.mark_replicated,
            "urq.list": self.list_underreplicated,
            "auditor.elect": self.elect_auditor,
            "auditor.renew": self.renew_auditor,
            "auditor.resign": self.resign_auditor,
            "auditor.who": self.who_is_auditor,
        }
        assert self._ops.keys() == METADATA_OPS.keys(), "serve exactly the METADATA_OPS"
        self._request_models = {op: request for op, (request, _) in METADATA_OPS.items()}
        self.stats = MetadataStats()

    async def handle(self, op: str, data: bytes) -> bytes:
        """The reply's bytes. A success is written without a second round of
        validation: the result model is dumped straight into the envelope."""
        outcome = await self.run(op, data)
        if isinstance(outcome, MetaReply):
            return outcome.model_dump_json().encode()
        return b'{"ok":true,"result":' + outcome.model_dump_json().encode() + b',"error":null}'

    async def reply(self, op: str, data: bytes) -> MetaReply:
        outcome = await self.run(op, data)
        if isinstance(outcome, MetaReply):
            return outcome
        return MetaReply(ok=True, result=outcome.model_dump(mode="json"))

    async def run(self, op: str, data: bytes) -> BaseModel | MetaReply:
        """The operation's result model, or an error reply; counted in `stats`."""
        started = time.perf_counter()
        outcome = await self._run(op, data)
        error = outcome.error if isinstance(outcome, MetaReply) else None
        code = "OK" if error is None else error.code.value
        self.stats.record(op, code, (time.perf_counter() - started) * 1000)
        return outcome

    async def _run(self, op: str, data: bytes) -> BaseModel | MetaReply:
        try:
            # An empty body is an empty object, so that `nats req <subject> ''` works.
            request = self._request_models[op].model_validate_json(data or b"{}")
        except ValidationError as exc:
            return error_reply(MetaErrorCode.BAD_REQUEST, core.describe_validation_error(exc))
        try:
            return await self._ops[op](request)
        except core.InvalidRequest as exc:
            return error_reply(MetaErrorCode.BAD_REQUEST, str(exc))
        except BadVersion as exc:
            return error_reply(exc.code, str(exc), current=exc.current)
        except CookieBadVersion as exc:
            return error_reply(exc.code, str(exc))
        except StoreError as exc:
            return error_reply(exc.code, str(exc))
        except Exception:
            # A bug, not the caller's fault: loud in the log, an answer for the caller.
            log.exception("metadata operation failed", extra={"op": op})
            return error_reply(MetaErrorCode.INTERNAL, f"{op} failed; see the service log")

    async def _changed(self, result: Any) -> Any:
        self._on_change()
        return result

    # -- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, request: CreateLedgerRequest) -> LedgerMetadata:
        return await self._changed(await self._store.create_ledger(request, self._clock()))

    async def get_ledger(self, request: LedgerIdRequest) -> LedgerMetadata:
        return await self._store.get_ledger(request.ledger_id)

    async def list_ledgers(self, request: ListLedgersRequest) -> ListLedgersReply:
        return await self._store.list_ledgers(request.after, request.limit)

    async def ledger_ranges(self, request: LedgerRangesRequest) -> LedgerRangesReply:
        return await self._store.ledger_ranges(request.after, request.limit)

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata:
        core.check_update(request)
        change = await self._store.update_ledger(request, self._clock())
        return await self._changed(change.metadata)

    async def delete_ledger(self, request: LedgerIdRequest) -> Empty:
        await self._store.delete_ledger(request.ledger_id, self._clock())
        return await self._changed(Empty())

    # -- bookies --------------------------------------------------------------------------

    async def register_bookie(self, request: RegisterBookieRequest) -> BookieInfo:
        core.check_registration(request)
        registration = await self._store.register_bookie(
            request, self._clock(), self._bookie_lease_ms
        )
        return await self._changed(registration.info)

    async def unregister_bookie(self, request: BookieIdRequest) -> Empty:
        await self._store.unregister_bookie(request.bookie_id, self._clock())
        return await self._changed(Empty())

    async def remove_bookie(self, request: BookieIdRequest) -> Empty:
        await self._store.remove_bookie(request.bookie_id, self._clock())
        return await self._changed(Empty())

    async def list_bookies(self, request: Empty) -> ListBookiesReply:
        return ListBookiesReply(bookies=await self._store.list_bookies(self._clock()))

    async def get_cookie(self, request: CookieRequest) -> Cookie:
        return await self._store.get_cookie(request.bookie_id)

    async def put_cookie(self, request: PutCookieRequest) -> Cookie:
        return await self._changed(await self._store.put_cookie(request, self._clock()))

    async def delete_cookie(self, request: DeleteCookieRequest) -> Empty:
        await self._store.delete_cookie(request, self._clock())
        return await self._changed(Empty())

    # -- cluster --------------------------------------------------------------------------

    async def instance_id(self, request: Empty) -> InstanceIdReply:
        return InstanceIdReply(instance_id=await self._store.instance_id())

    async def get_cluster_settings(self, request: Empty) -> ClusterSettings:
        return await self._store.get_cluster_settings()

    async def set_cluster_settings(self, request: SetClusterSettingsRequest) -> ClusterSettings:
        return await self._changed(await self._store.set_cluster_settings(request, self._clock()))

    # -- under-replication ----------------------------------------------------------------

    async def mark_underreplicated(
        self, request: MarkUnderreplicatedRequest
    ) -> UnderreplicatedLedger:
        return await self._changed(await self._store.mark_underreplicated(request, self._clock()))

    async def claim_underreplicated(
        self, request: ClaimUnderreplicatedRequest
    ) -> ClaimUnderreplicatedReply:
        ledger = await self._store.claim_underreplicated(
            request.worker_id, request.lease_ms, self._clock()
        )
        return ClaimUnderreplicatedReply(ledger=ledger)

    async def renew_underreplicated(self, request: UnderreplicatedClaimRequest) -> ClaimOutcome:
        done = await self._store.renew_underreplicated(
            request.ledger_id, request.worker_id, request.lease_ms, self._clock()
        )
        return ClaimOutcome(done=done)

    async def release_underreplicated(self, request: UnderreplicatedClaimRequest) -> ClaimOutcome:
        done = await self._store.release_underreplicated(request.ledger_id, request.worker_id)
        return ClaimOutcome(done=done)

    async def mark_replicated(self, request: UnderreplicatedClaimRequest) -> ClaimOutcome:
        done = await self._store.mark_replicated(
            request.ledger_id, request.worker_id, request.mark_version, self._clock()
        )
        return await self._changed(ClaimOutcome(done=done))

    async def list_underreplicated(
        self, request: ListUnderreplicatedRequest
    ) -> ListUnderreplicatedReply:
        return await self._store.list_underreplicated(request.after, request.limit)

    # -- auditor election -----------------------------------------------------------------

    async def elect_auditor(self, request: ElectRequest) -> Leadership:
        return await self._changed(
            await self._store.elect_auditor(request.candidate_id, request.lease_ms, self._clock())
        )

    async def renew_auditor(self, request: ElectRequest) -> Leadership:
        return await self._store.renew_auditor(
            request.candidate_id, request.lease_ms, self._clock()
        )

    async def resign_auditor(self, request: ElectRequest) -> Leadership:
        return await self._store.resign_auditor(request.candidate_id, self._clock())

    async def who_is_auditor(self, request: Empty) -> Leadership:
        return await self._store.who_is_auditor(self._clock())


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
        batch_max=settings.metadata.db_batch_max,
        batches_in_flight=settings.metadata.db_batches_in_flight,
    )
    rt.on_shutdown(store.close)
    publisher = OutboxPublisher(
        store,
        rt.nc,
        rt.subjects,
        source=rt.instance,
        batch_size=settings.metadata.outbox_batch_size,
        poll_interval_ms=settings.metadata.outbox_poll_interval_ms,
    )
    rt.spawn(publisher.run(), "outbox-publisher")
    service = MetadataService(
        store, bookie_lease_ms=settings.metadata.bookie_lease_ms, on_change=publisher.poke
    )
    rt.outbox_publisher = publisher  # type: ignore[attr-defined]  # for tests
    batches = {"ledger.create": store.creates.stats, "ledger.update": store.updates.stats}
    serve_metrics(rt, metadata_metrics(service.stats, publisher, batches))
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
    """The reply is queued in the NATS client's pending buffer (`respond_soon`), not
    published with an await: the replies of one group commit, which finish in the same
    event-loop turn, go out in one socket write, and none costs a coroutine of nats-py's."""

    async def serve(request: Request) -> None:
        respond_soon(request, await service.handle(op, request.data))

    return serve
