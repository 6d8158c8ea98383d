"""The caller's side of the metadata service: typed requests over NATS.

`METADATA_OPS` is the whole protocol: operation name -> (request model, result model).
The metadata service serves exactly these on `<prefix>.meta.<op>`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import BaseModel, ValidationError

from shared.models import (
    BookieIdRequest,
    BookieInfo,
    BookieState,
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
    LedgerWatchEvent,
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
from shared.requests import request as nats_request
from shared.subjects import Subjects

METADATA_OPS: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    "ledger.create": (CreateLedgerRequest, LedgerMetadata),
    "ledger.get": (LedgerIdRequest, LedgerMetadata),
    "ledger.list": (ListLedgersRequest, ListLedgersReply),
    "ledger.ranges": (LedgerRangesRequest, LedgerRangesReply),
    "ledger.update": (UpdateLedgerRequest, LedgerMetadata),
    "ledger.delete": (LedgerIdRequest, Empty),
    "bookie.register": (RegisterBookieRequest, BookieInfo),
    "bookie.unregister": (BookieIdRequest, Empty),
    "bookie.remove": (BookieIdRequest, Empty),
    "bookie.list": (Empty, ListBookiesReply),
    "cookie.get": (CookieRequest, Cookie),
    "cookie.put": (PutCookieRequest, Cookie),
    "cookie.delete": (DeleteCookieRequest, Empty),
    "cluster.instance_id": (Empty, InstanceIdReply),
    "cluster.get_settings": (Empty, ClusterSettings),
    "cluster.set_settings": (SetClusterSettingsRequest, ClusterSettings),
    "urq.mark": (MarkUnderreplicatedRequest, UnderreplicatedLedger),
    "urq.claim": (ClaimUnderreplicatedRequest, ClaimUnderreplicatedReply),
    "urq.renew": (UnderreplicatedClaimRequest, ClaimOutcome),
    "urq.release": (UnderreplicatedClaimRequest, ClaimOutcome),
    "urq.replicated": (UnderreplicatedClaimRequest, ClaimOutcome),
    "urq.list": (ListUnderreplicatedRequest, ListUnderreplicatedReply),
    "auditor.elect": (ElectRequest, Leadership),
    "auditor.renew": (ElectRequest, Leadership),
    "auditor.resign": (ElectRequest, Leadership),
    "auditor.who": (Empty, Leadership),
}

R = TypeVar("R", bound=BaseModel)


class _Reply(BaseModel, Generic[R]):
    """MetaReply with a typed result: a reply is parsed once, straight into its model."""

    ok: bool
    result: R | None = None
    error: MetaError | None = None


# One parser per op, built once.
_REPLY_MODELS: dict[str, type[_Reply[Any]]] = {
    op: _Reply[result]
    for op, (_, result) in METADATA_OPS.items()  # type: ignore[valid-type]
}

# Watch notifications a slow watcher may hold before NATS drops them for it.
WATCH_PENDING_MSGS_LIMIT = 1024


def _unavailable(exc: Exception) -> MetadataError:
    return MetadataError(
        MetaError(code=MetaErrorCode.UNAVAILABLE, message=f"metadata service: {exc!r}")
    )


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
        body = (
            request.model_dump_json() if isinstance(request, BaseModel) else json.dumps(request)
        ).encode()
        try:
            msg = await nats_request(
                self._nc, self._subjects.meta(op), body, timeout_s=self._timeout_s
            )
        except (NoRespondersError, NatsTimeoutError) as exc:
            raise _unavailable(exc) from exc
        reply = _REPLY_MODELS[op].model_validate_json(msg.data)
        if not reply.ok:
            assert reply.error is not None
            raise MetadataError(reply.error)
        return reply.result

    # -- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, request: CreateLedgerRequest) -> LedgerMetadata:
        return await self.call("ledger.create", request)

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata:
        return await self.call("ledger.get", LedgerIdRequest(ledger_id=ledger_id))

    async def list_ledgers(self, after: int | None = None, limit: int = 100) -> ListLedgersReply:
        return await self.call("ledger.list", ListLedgersRequest(after=after, limit=limit))

    async def ledger_ranges(
        self, after: int | None = None, limit: int = 10_000
    ) -> LedgerRangesReply:
        return await self.call("ledger.ranges", LedgerRangesRequest(after=after, limit=limit))

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata:
        return await self.call("ledger.update", request)

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.call("ledger.delete", LedgerIdRequest(ledger_id=ledger_id))

    async def watch_ledger(self, ledger_id: int) -> AsyncIterator[LedgerMetadata | None]:
        """The ledger's metadata now, then each newer version as it is committed; None
        once it is deleted (then the iteration ends). Versions only go up: a notification
        older than what was already yielded is skipped. Notifications are best effort: a
        holder that acts on the metadata still compares versions (CAS) as always.

            async for metadata in client.watch_ledger(7): ...
        """
        sub = await self._nc.subscribe(
            self._subjects.ledger_watch(ledger_id), pending_msgs_limit=WATCH_PENDING_MSGS_LIMIT
        )
        try:
            # Subscribed first, read second: no change can fall between the two.
            try:
                current: LedgerMetadata | None = await self.get_ledger(ledger_id)
            except MetadataError as exc:
                if exc.code is not MetaErrorCode.NO_SUCH_LEDGER:
                    raise
                current = None
            yield current
            while current is not None:
                msg = await sub.next_msg(timeout=None)
                try:
                    event = LedgerWatchEvent.model_validate_json(msg.data)
                except ValidationError:
                    continue  # not ours to crash on; the next change will come
                if event.metadata is None:
                    current = None
                    yield None
                elif event.metadata.version > current.version:
                    current = event.metadata
                    yield current
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # -- bookies --------------------------------------------------------------------------

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

    async def remove_bookie(self, bookie_id: str) -> None:
        """Forget a bookie whose lease lapsed (BOOKIE_ALIVE while it holds); nothing to do
        for an unknown bookie."""
        await self.call("bookie.remove", BookieIdRequest(bookie_id=bookie_id))

    async def list_bookies(self) -> list[BookieInfo]:
        reply: ListBookiesReply = await self.call("bookie.list", Empty())
        return reply.bookies

    async def get_cookie(self, bookie_id: str) -> Cookie:
        return await self.call("cookie.get", CookieRequest(bookie_id=bookie_id))

    async def put_cookie(self, bookie_id: str, data: str, expected_version: int) -> Cookie:
        """Compare-and-set (expected_version NO_VERSION: create); BAD_VERSION if it lost."""
        return await self.call(
            "cookie.put",
            PutCookieRequest(bookie_id=bookie_id, data=data, expected_version=expected_version),
        )

    async def delete_cookie(self, bookie_id: str, expected_version: int) -> None:
        await self.call(
            "cookie.delete",
            DeleteCookieRequest(bookie_id=bookie_id, expected_version=expected_version),
        )

    # -- cluster --------------------------------------------------------------------------

    async def instance_id(self) -> str:
        reply: InstanceIdReply = await self.call("cluster.instance_id", Empty())
        return reply.instance_id

    async def get_cluster_settings(self) -> ClusterSettings:
        return await self.call("cluster.get_settings", Empty())

    async def set_cluster_settings(self, **changes: Any) -> ClusterSettings:
        return await self.call("cluster.set_settings", SetClusterSettingsRequest(**changes))

    # -- under-replication ----------------------------------------------------------------

    async def mark_underreplicated(
        self, ledger_id: int, missing_bookies: list[str]
    ) -> UnderreplicatedLedger:
        return await self.call(
            "urq.mark",
            MarkUnderreplicatedRequest(ledger_id=ledger_id, missing_bookies=missing_bookies),
        )

    async def claim_underreplicated(
        self, worker_id: str, lease_ms: int
    ) -> UnderreplicatedLedger | None:
        reply: ClaimUnderreplicatedReply = await self.call(
            "urq.claim", ClaimUnderreplicatedRequest(worker_id=worker_id, lease_ms=lease_ms)
        )
        return reply.ledger

    async def _claim_op(self, op: str, ledger_id: int, worker_id: str, **extra: Any) -> bool:
        request = UnderreplicatedClaimRequest(ledger_id=ledger_id, worker_id=worker_id, **extra)
        outcome: ClaimOutcome = await self.call(op, request)
        return outcome.done

    async def renew_underreplicated(self, ledger_id: int, worker_id: str, lease_ms: int) -> bool:
        return await self._claim_op("urq.renew", ledger_id, worker_id, lease_ms=lease_ms)

    async def release_underreplicated(self, ledger_id: int, worker_id: str) -> bool:
        return await self._claim_op("urq.release", ledger_id, worker_id)

    async def mark_replicated(self, ledger_id: int, worker_id: str, mark_version: int) -> bool:
        return await self._claim_op(
            "urq.replicated", ledger_id, worker_id, mark_version=mark_version
        )

    async def list_underreplicated(
        self, after: int | None = None, limit: int = 100
    ) -> ListUnderreplicatedReply:
        return await self.call("urq.list", ListUnderreplicatedRequest(after=after, limit=limit))

    # -- auditor election -----------------------------------------------------------------

    async def elect_auditor(self, candidate_id: str, lease_ms: int) -> Leadership:
        return await self.call(
            "auditor.elect", ElectRequest(candidate_id=candidate_id, lease_ms=lease_ms)
        )

    async def renew_auditor(self, candidate_id: str, lease_ms: int) -> Leadership:
        return await self.call(
            "auditor.renew", ElectRequest(candidate_id=candidate_id, lease_ms=lease_ms)
        )

    async def resign_auditor(self, candidate_id: str) -> Leadership:
        return await self.call("auditor.resign", ElectRequest(candidate_id=candidate_id))

    async def who_is_auditor(self) -> Leadership:
        return await self.call("auditor.who", Empty())


__all__ = ["METADATA_OPS", "MetaReply", "MetadataClient", "MetadataError"]
