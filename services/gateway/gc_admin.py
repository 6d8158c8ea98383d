"""The bookies' garbage collection over HTTP: BookKeeper's admin paths and bodies
(TriggerGCService, GCDetailsService, SuspendCompactionService, ResumeCompactionService) and
Quire's `GET /api/v1/bookie/gc/explain`, each carried to the bookie's ledgerstore over NATS
(`shared.bookie_client.BookieClient.gc`, `gc_details`, ...).

BookKeeper serves these inside one bookie; the gateway serves every bookie. With
`bookie_id` the call goes to that bookie and the answer is the bookie's own: an id not in
the registry is 404 NO_SUCH_BOOKIE, a bookie that does not answer 503 UNAVAILABLE (504
TIMEOUT when it took the request but did not answer in time). Without `bookie_id` it goes
to every registered bookie that is not lost, at once, and the answer is
`{"<bookie_id>": <its answer>, ...}`: a bookie that does not answer does not fail the others,
its entry is `{"error": {"code": "UNAVAILABLE" or "TIMEOUT", "detail": "..."}}`. A bookie that
answers that the call failed (its GC run failed: GC_FAILED) counts as UNAVAILABLE, the
bookie's code in the detail; one that refuses the input (BAD_REQUEST) is INVALID_ARGUMENT.

What each bookie's answer is:
- `PUT /api/v1/bookie/gc`: `{"triggered": true}`, or with `wait=true` (Quire's) the run's
  figures, `{"run": {...}}`, once it ended. BookKeeper answers a sentence
  ("Triggered GC on BookieServer: ..."); the object says the same and more.
- `GET /api/v1/bookie/gc_details`: a list of one GarbageCollectionStatus object (BookKeeper
  answers a list, one per ledger storage; a Quire bookie has one), with Quire's figures.
- `PUT .../suspend_compaction`, `PUT .../resume_compaction`: the state after,
  `{"isMajorGcSuspended": bool, "isMinorGcSuspended": bool}` (the names of BookKeeper's
  `GET .../suspend_compaction`, which answers the same; its PUT answers a sentence, and
  its values are the strings "true" and "false").
- `GET /api/v1/bookie/gc/explain`: every entry log on the bookie's disk with its usage, the
  ledgers that pin it and what the next minor and major compaction would do with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Self

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.gateway.ledgers import Ledgers
from services.gateway.problems import error_responses
from shared.bookie_client import BookieAdminError, BookieUnreachable
from shared.models import BookieState
from shared.status import ApiCodes, QuireError

ERRORS = error_responses(400, 404, 500, 503, 504)
ERRORS[404] = {**ERRORS[404], "description": "NO_SUCH_BOOKIE: bookie_id is not registered"}
ERRORS[503] = {**ERRORS[503], "description": "UNAVAILABLE: the bookie named did not answer"}
ERRORS[504] = {**ERRORS[504], "description": "TIMEOUT: the bookie named answered too late"}
# Bookies asked at once by one fan-out (the rest wait their turn).
FAN_OUT_CONCURRENCY = 64
# A waiting GC call must answer before the gateway's own request deadline (which would fail
# the whole fan-out with 504): each bookie gets the deadline less this margin.
WAIT_MARGIN_S = 1.0

BookieIdFilter = Annotated[
    str | None,
    Query(
        pattern=r"^[A-Za-z0-9_-]+$",
        max_length=128,
        description="One bookie; without it, every registered bookie that is not lost",
    ),
]


class TriggerGcBody(BaseModel):
    """BookKeeper's TriggerGCService body. A key left out is false (BookKeeper forces a key
    left out unless that compaction is suspended); a kind named true is compacted even when
    suspended, as the bookie's `gc` request does."""

    model_config = ConfigDict(extra="forbid", strict=True)
    forceMajor: bool = Field(default=False, description="Run a major compaction now")
    forceMinor: bool = Field(default=False, description="Run a minor compaction now")


class SuspendCompactionBody(BaseModel):
    """BookKeeper's SuspendCompactionService body: at least one of the two."""

    model_config = ConfigDict(extra="forbid", strict=True)
    suspendMajor: bool | None = Field(default=None, description="Suspend major compaction")
    suspendMinor: bool | None = Field(default=None, description="Suspend minor compaction")

    @model_validator(mode="after")
    def one_of_them(self) -> Self:
        if self.suspendMajor is None and self.suspendMinor is None:
            raise ValueError("no suspendMajor or suspendMinor")
        return self


class ResumeCompactionBody(BaseModel):
    """BookKeeper's ResumeCompactionService body: at least one of the two."""

    model_config = ConfigDict(extra="forbid", strict=True)
    resumeMajor: bool | None = Field(default=None, description="Resume major compaction")
    resumeMinor: bool | None = Field(default=None, description="Resume minor compaction")

    @model_validator(mode="after")
    def one_of_them(self) -> Self:
        if self.resumeMajor is None and self.resumeMinor is None:
            raise ValueError("no resumeMajor or resumeMinor")
        return self


def call_error(exc: BookieUnreachable | BookieAdminError) -> QuireError:
    """What a failed call on one bookie is as an API error."""
    if isinstance(exc, BookieAdminError):
        code = ApiCodes.INVALID_ARGUMENT if exc.code == "BAD_REQUEST" else ApiCodes.UNAVAILABLE
        return QuireError(code, str(exc))
    return QuireError(ApiCodes.TIMEOUT if exc.timed_out else ApiCodes.UNAVAILABLE, str(exc))


async def fan_out(bookie_ids: list[str], call: Callable[[str], Awaitable[Any]]) -> dict[str, Any]:
    """`call` on every bookie, FAN_OUT_CONCURRENCY at a time: `{bookie_id: its answer}`, a
    failed call as `{"error": {"code", "detail"}}` in its place. Programmer errors raise."""
    gate = asyncio.Semaphore(FAN_OUT_CONCURRENCY)

    async def one(bookie_id: str) -> Any:
        async with gate:
            try:
                return await call(bookie_id)
            except (BookieUnreachable, BookieAdminError) as exc:
                error = call_error(exc)
                return {"error": {"code": error.api.code, "detail": error.detail}}

    answers = await asyncio.gather(*(one(b) for b in bookie_ids))
    return dict(zip(bookie_ids, answers, strict=True))


def suspended(state: dict[str, Any]) -> dict[str, bool]:
    """A bookie's `{"suspendMajor", "suspendMinor"}` under BookKeeper's names."""
    return {
        "isMajorGcSuspended": bool(state["suspendMajor"]),
        "isMinorGcSuspended": bool(state["suspendMinor"]),
    }


def create_gc_router(ledgers: Ledgers) -> APIRouter:
    router = APIRouter(responses=ERRORS, tags=["admin"])

    def admin_timeout_s() -> float:
        return ledgers.settings.request_timeout_ms / 1000

    def wait_timeout_s() -> float:
        deadline_s = ledgers.settings.gateway.request_timeout_ms / 1000
        return max(deadline_s - WAIT_MARGIN_S, admin_timeout_s())

    async def on_bookies(bookie_id: str | None, call: Callable[[str], Awaitable[Any]]) -> Any:
        bookies = await ledgers.list_bookies()
        if bookie_id is None:
            alive = sorted(b.bookie_id for b in bookies if b.state is not BookieState.LOST)
            return await fan_out(alive, call)
        if not any(b.bookie_id == bookie_id for b in bookies):
            raise QuireError(ApiCodes.NO_SUCH_BOOKIE, f"no bookie {bookie_id} is registered")
        try:
            return await call(bookie_id)
        except (BookieUnreachable, BookieAdminError) as exc:
            raise call_error(exc) from exc

    @router.put("/api/v1/bookie/gc", operation_id="admin_trigger_gc")
    async def trigger_gc(
        body: Annotated[TriggerGcBody | None, Body()] = None,
        bookie_id: BookieIdFilter = None,
        wait: Annotated[
            bool,
            Query(
                description="Quire's: answer once each bookie's run ended, with its figures "
                "(a run longer than the gateway's request timeout answers TIMEOUT and goes on)"
            ),
        ] = False,
    ) -> dict[str, Any]:
        """Run garbage collection (and compaction) now: BookKeeper's forceGC. Ledgers gone
        from the metadata are forgotten, entry logs with no live ledger deleted, and with
        `forceMajor` / `forceMinor` entry logs under that usage threshold compacted."""
        command = body or TriggerGcBody()
        timeout_s = wait_timeout_s() if wait else admin_timeout_s()

        async def call(b: str) -> Any:
            return await ledgers.bookies.gc(
                b, command.forceMajor, command.forceMinor, wait, timeout_s=timeout_s
            )

        return await on_bookies(bookie_id, call)

    @router.get("/api/v1/bookie/gc_details", operation_id="admin_gc_details")
    async def gc_details(bookie_id: BookieIdFilter = None) -> list[dict[str, Any]] | dict[str, Any]:
        """Whether GC or compaction runs, the last runs, entry logs and bytes on disk, bytes
        reclaimed by deletion and by compaction (BookKeeper's GarbageCollectionStatus keys,
        then Quire's): a list of one object per bookie, as BookKeeper's."""

        async def call(b: str) -> Any:
            return [await ledgers.bookies.gc_details(b, timeout_s=admin_timeout_s())]

        return await on_bookies(bookie_id, call)

    @router.put("/api/v1/bookie/gc/suspend_compaction", operation_id="admin_suspend_compaction")
    async def suspend_compaction(
        body: SuspendCompactionBody, bookie_id: BookieIdFilter = None
    ) -> dict[str, Any]:
        """Suspend major and/or minor compaction (GC of deleted ledgers and of entry logs
        with no live ledger goes on). The state after."""

        async def call(b: str) -> Any:
            state = await ledgers.bookies.gc_suspend(
                b, bool(body.suspendMajor), bool(body.suspendMinor), timeout_s=admin_timeout_s()
            )
            return suspended(state)

        return await on_bookies(bookie_id, call)

    @router.get("/api/v1/bookie/gc/suspend_compaction", operation_id="admin_compaction_suspended")
    async def compaction_suspended(bookie_id: BookieIdFilter = None) -> dict[str, Any]:
        """Whether major and minor compaction are suspended."""

        async def call(b: str) -> Any:
            return suspended(await ledgers.bookies.gc_details(b, timeout_s=admin_timeout_s()))

        return await on_bookies(bookie_id, call)

    @router.put("/api/v1/bookie/gc/resume_compaction", operation_id="admin_resume_compaction")
    async def resume_compaction(
        body: ResumeCompactionBody, bookie_id: BookieIdFilter = None
    ) -> dict[str, Any]:
        """Resume major and/or minor compaction. The state after."""

        async def call(b: str) -> Any:
            state = await ledgers.bookies.gc_resume(
                b, bool(body.resumeMajor), bool(body.resumeMinor), timeout_s=admin_timeout_s()
            )
            return suspended(state)

        return await on_bookies(bookie_id, call)

    @router.get("/api/v1/bookie/gc/explain", operation_id="admin_gc_explain")
    async def gc_explain(bookie_id: BookieIdFilter = None) -> dict[str, Any]:
        """Quire's (BookKeeper has none): every entry log on the bookie's disk, its size and
        usage, the ledgers that pin it (largest first) and what the next minor and major
        compaction would do with it; the thresholds and when the next compactions are due."""

        async def call(b: str) -> Any:
            return await ledgers.bookies.gc_explain(b, timeout_s=admin_timeout_s())

        return await on_bookies(bookie_id, call)

    return router
