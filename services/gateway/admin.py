"""The operator endpoints: BookKeeper's admin REST API under its own paths and meanings
(`/api/v1/...`, as `bookkeeper-server`'s HttpService serves them), and Quire's
`GET /v1/autorecovery/underreplicated`.

Where BookKeeper answers about "this bookie" (the HTTP server runs inside a bookie), the
gateway serves every bookie and takes `bookie_id`; the garbage-collection paths
(`/api/v1/bookie/gc...`) are in `services.gateway.gc_admin`. Entry reads and deletes need the
ledger password (`Quire-Ledger-Password`), as everywhere else in the API.

The auto-recovery commands (trigger_audit, decommission, bookie) go to the elected auditor
(`Ledgers.auditor`, a `shared.auditor_client.AuditorClient`): 503 UNAVAILABLE when none is
elected or it does not answer, 400 INVALID_ARGUMENT for what it refuses (a live bookie to
decommission), 422 INVALID_ARGUMENT for a body of the wrong shape, as everywhere in the API.
"""

from __future__ import annotations

import asyncio
import base64
import json
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query
from pydantic import BaseModel, ConfigDict, Field

from services.gateway.gc_admin import create_gc_router
from services.gateway.ledgers import Ledgers, metadata_error
from services.gateway.problems import error_responses
from shared.auditor_client import BOOKIE_ID_PATTERN
from shared.metaclient import MetadataError
from shared.models import MAX_LEDGER_ID, BookieState
from shared.status import ApiCodes, QuireError

PASSWORD_HEADER = "Quire-Ledger-Password"
LIST_PAGE = 1000  # BookKeeper's list endpoint pages by this many

ERRORS = error_responses(400, 403, 404, 500, 503)

LedgerIdQuery = Annotated[int, Query(ge=0, le=MAX_LEDGER_ID, description="The ledger id")]
BookieIdQuery = Annotated[
    str, Query(pattern=r"^[A-Za-z0-9_-]+$", max_length=128, description="The bookie id")
]
Password = Annotated[str | None, Header(alias=PASSWORD_HEADER, description="Ledger password")]

# NATS micro discovery: every running replicator worker answers a ping on this subject.
REPLICATOR_PING_SUBJECT = "$SRV.PING.quire-replicator"
# How long the status waits for the replicators' answers to a discovery ping.
REPLICATOR_PING_WAIT_S = 0.25
REPLICATORS_COUNTED_MAX = 1000
REPLICATION_ON = (
    "Replicator workers claim under-replicated ledgers from the queue and re-replicate them."
)
REPLICATION_OFF = "The switch is off: the queue hands out no under-replicated ledger to claim."
NO_REPLICATOR = "No replicator worker answered: nothing claims under-replicated ledgers."


BookieSrc = Annotated[str, Field(pattern=BOOKIE_ID_PATTERN, max_length=128)]


class DecommissionBody(BaseModel):
    """BookKeeper's DecommissionService body."""

    model_config = ConfigDict(extra="forbid", strict=True)
    bookie_src: BookieSrc = Field(description="The bookie to decommission (it must be down)")


class RecoverBookieBody(BaseModel):
    """BookKeeper's RecoveryBookieService body."""

    model_config = ConfigDict(extra="forbid", strict=True)
    bookie_src: list[BookieSrc] = Field(
        min_length=1, max_length=1000, description="The bookies whose ledgers to recover"
    )
    delete_cookie: bool = Field(
        default=False, description="Remove their cookies once no ledger needs them"
    )


class AutoRecoveryStatus(BaseModel):
    """BookKeeper's AutoRecoveryStatusService answer (`enabled`), with what it means now."""

    # Every field is in every answer: the OpenAPI document says so.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    enabled: bool = Field(
        description="The auto-recovery switch (BookKeeper's autoRecoveryDaemonEnabled): while "
        "it is off, no replicator worker claims an under-replicated ledger."
    )
    replicators: int = Field(
        description="Replicator workers that answered a discovery ping (NATS micro) just now."
    )
    ledgerReplicationActive: bool = Field(
        description="Whether under-replicated ledgers are being re-replicated: the switch is "
        "on and at least one replicator worker runs."
    )
    detail: str = Field(description="Why, in a sentence.")


def replication_status(enabled: bool, replicators: int) -> AutoRecoveryStatus:
    if not enabled:
        detail = REPLICATION_OFF
    elif replicators == 0:
        detail = NO_REPLICATOR
    else:
        detail = REPLICATION_ON
    return AutoRecoveryStatus(
        enabled=enabled,
        replicators=replicators,
        ledgerReplicationActive=enabled and replicators > 0,
        detail=detail,
    )


async def count_replicators(ledgers: Ledgers) -> int:
    """The replicator workers that answer NATS micro discovery within the wait."""
    nc = ledgers.nc
    inbox = nc.new_inbox()
    answered: set[str] = set()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(REPLICATOR_PING_SUBJECT, b"", reply=inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLICATOR_PING_WAIT_S
        while len(answered) < REPLICATORS_COUNTED_MAX:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                msg = await sub.next_msg(timeout=remaining)
            except TimeoutError:
                break
            try:
                answered.add(str(json.loads(msg.data)["id"]))
            except (ValueError, KeyError, TypeError):
                continue  # not a micro PING answer
    finally:
        await sub.unsubscribe()
    return len(answered)


def create_admin_router(ledgers: Ledgers) -> APIRouter:
    router = APIRouter(responses=ERRORS)
    router.include_router(create_gc_router(ledgers))

    async def call(coro):
        try:
            return await coro
        except MetadataError as exc:
            raise metadata_error(exc) from exc

    # -- bookies --------------------------------------------------------------------------

    @router.get("/api/v1/bookie/list_bookies", tags=["admin"], operation_id="admin_list_bookies")
    async def list_bookies(
        type: Annotated[str, Query(pattern="^(rw|ro)$", description="rw or ro")] = "rw",
        print_hostnames: bool = False,
    ) -> dict[str, str | None]:
        """Available bookies, writable (`rw`) or read-only (`ro`): id -> hostname."""
        wanted = BookieState.WRITABLE if type == "rw" else BookieState.READONLY
        return {
            b.bookie_id: (b.info.get("host") if print_hostnames else None)
            for b in await ledgers.list_bookies()
            if b.state is wanted
        }

    @router.get("/api/v1/bookie/cluster_info", tags=["admin"], operation_id="admin_cluster_info")
    async def cluster_info() -> dict[str, Any]:
        """The cluster at a glance (BookKeeper's ClusterInfoService). `ledgerReplicationEnabled`
        is the auto-recovery switch, as BookKeeper's isLedgerReplicationEnabled;
        `GET /api/v1/autorecovery/status` also says whether any replicator runs."""
        bookies = await ledgers.list_bookies()
        leadership = await call(ledgers.meta.who_is_auditor())
        under = await call(ledgers.meta.list_underreplicated(None, 1))
        switch = await call(ledgers.meta.get_cluster_settings())
        count = {state: sum(b.state is state for b in bookies) for state in BookieState}
        return {
            "auditorElected": leadership.leader_id is not None,
            "auditorId": leadership.leader_id or "",
            "clusterUnderReplicated": bool(under.ledgers),
            "ledgerReplicationEnabled": switch.autorecovery_enabled,
            "totalBookiesCount": len(bookies),
            "writableBookiesCount": count[BookieState.WRITABLE],
            "readonlyBookiesCount": count[BookieState.READONLY],
            "unavailableBookiesCount": count[BookieState.LOST],
        }

    @router.get("/api/v1/bookie/info", tags=["admin"], operation_id="admin_bookie_info")
    async def bookie_info(bookie_id: BookieIdQuery) -> dict[str, int | None]:
        """A bookie's free and total space (the smallest of its directories)."""
        info = await ledgers.bookie_info(bookie_id)
        return {"freeSpace": info.get("free_bytes"), "totalSpace": info.get("total_bytes")}

    @router.get("/api/v1/bookie/state", tags=["admin"], operation_id="admin_bookie_state")
    async def bookie_state(bookie_id: BookieIdQuery) -> dict[str, bool]:
        """A bookie's state as BookKeeper's BookieStateService shows it."""
        info = await ledgers.bookie_info(bookie_id)
        running = bool(info["reachable"]) and info["state"] != BookieState.LOST.value
        read_only = info["state"] == BookieState.READONLY.value
        return {
            "running": running,
            "readOnly": read_only,
            "shuttingDown": False,
            "availableForHighPriorityWrites": running and not read_only,
        }

    # -- ledgers --------------------------------------------------------------------------

    @router.get("/api/v1/ledger/list", tags=["admin"], operation_id="admin_list_ledgers")
    async def list_ledgers(
        print_metadata: bool = False,
        page: Annotated[int | None, Query(ge=1, description="1-based page of 1000")] = None,
    ) -> dict[str, Any]:
        """Ledger ids (with their metadata when `print_metadata`), all or one page."""
        found: dict[str, Any] = {}
        after, index = None, 1
        while True:
            listed = await ledgers.list(after, LIST_PAGE)
            if page is None or index == page:
                for m in listed.ledgers:
                    found[str(m.ledger_id)] = m.public() if print_metadata else None
            if listed.next_after is None or (page is not None and index >= page):
                return found
            after, index = listed.next_after, index + 1

    @router.get("/api/v1/ledger/metadata", tags=["admin"], operation_id="admin_ledger_metadata")
    async def ledger_metadata(ledger_id: LedgerIdQuery) -> dict[str, Any]:
        return (await ledgers.get(ledger_id)).public()

    @router.get("/api/v1/ledger/read", tags=["admin"], operation_id="admin_read_ledger")
    async def read_ledger(
        ledger_id: LedgerIdQuery,
        start_entry_id: Annotated[int, Query(ge=0, le=MAX_LEDGER_ID)] = 0,
        end_entry_id: Annotated[int | None, Query(ge=0, le=MAX_LEDGER_ID)] = None,
        password: Password = None,
    ) -> dict[str, str]:
        """Entries (base64) by entry id, up to the LAC; at most max_batch_entries of them
        (the answer is one JSON object, built whole)."""
        max_entries = ledgers.settings.gateway.max_batch_entries
        if end_entry_id is None:
            end_entry_id = start_entry_id + max_entries - 1
        elif end_entry_id - start_entry_id + 1 > max_entries:
            raise QuireError(
                ApiCodes.INVALID_ARGUMENT,
                f"a range holds at most {max_entries} entries here; "
                f"got start_entry_id={start_entry_id} end_entry_id={end_entry_id}",
            )
        pages = ledgers.read_stream(
            ledger_id,
            password.encode() if password is not None else None,
            start_entry_id,
            end_entry_id,
        )
        async with aclosing(pages):
            return {
                str(e): base64.b64encode(p).decode()
                async for page in pages
                for e, p in page.entries
            }

    @router.delete("/api/v1/ledger/delete", tags=["admin"], operation_id="admin_delete_ledger")
    async def delete_ledger(ledger_id: LedgerIdQuery, password: Password = None) -> dict:
        await ledgers.delete(ledger_id, password.encode() if password is not None else None)
        return {}

    # -- auto-recovery --------------------------------------------------------------------

    @router.get(
        "/api/v1/autorecovery/who_is_auditor", tags=["admin"], operation_id="admin_who_is_auditor"
    )
    async def who_is_auditor() -> dict[str, str | None]:
        return {"Auditor": (await call(ledgers.meta.who_is_auditor())).leader_id}

    @router.get(
        "/api/v1/autorecovery/list_under_replicated_ledger",
        tags=["admin"],
        operation_id="admin_list_under_replicated_ledger",
    )
    async def list_under_replicated_ledger(
        missingreplica: Annotated[
            str | None, Query(max_length=128, description="Only ledgers missing this bookie")
        ] = None,
        excludingmissingreplica: Annotated[
            str | None, Query(max_length=128, description="Only ledgers not missing this bookie")
        ] = None,
        printmissingreplica: Annotated[
            bool, Query(description="Answer ledger id -> its missing bookies")
        ] = False,
    ) -> list[int] | dict[str, list[str]]:
        """Under-replicated ledgers, as BookKeeper's ListUnderReplicatedLedgerService: their
        ids, or with `printmissingreplica` each id with its missing bookies; optionally only
        those missing (`missingreplica`) or not missing (`excludingmissingreplica`) a
        bookie. Nothing under-replicated answers 200 with an empty list (BookKeeper answers
        404 "No under replicated ledgers found")."""
        found: dict[str, list[str]] = {}
        after = None
        while True:
            page = await call(ledgers.meta.list_underreplicated(after, 1000))
            for row in page.ledgers:
                if missingreplica and missingreplica not in row.missing_bookies:
                    continue
                if excludingmissingreplica and excludingmissingreplica in row.missing_bookies:
                    continue
                found[str(row.ledger_id)] = row.missing_bookies
            if page.next_after is None:
                break
            after = page.next_after
        return found if printmissingreplica else [int(ledger_id) for ledger_id in found]

    @router.put(
        "/api/v1/autorecovery/trigger_audit",
        tags=["admin"],
        operation_id="admin_trigger_audit",
    )
    async def trigger_audit() -> dict[str, Any]:
        """Run the elected auditor's audit now (BookKeeper's TriggerAuditService): every
        ledger with a fragment on a lost bookie is marked under-replicated. What it did."""
        return await ledgers.auditor.trigger_audit()

    @router.put(
        "/api/v1/autorecovery/decommission",
        tags=["admin"],
        operation_id="admin_decommission_bookie",
    )
    async def decommission(command: DecommissionBody) -> dict[str, Any]:
        """Decommission a bookie that is down (BookKeeper's DecommissionService): the auditor
        marks every ledger with a fragment on it under-replicated and removes its cookie
        once no ledger needs it. 200 once started; progress in list_under_replicated_ledger.
        A bookie still registered alive: 400 INVALID_ARGUMENT."""
        return await ledgers.auditor.decommission(command.bookie_src)

    @router.put("/api/v1/autorecovery/bookie", tags=["admin"], operation_id="admin_recover_bookie")
    async def recover_bookie(command: RecoverBookieBody) -> dict[str, Any]:
        """Manual recovery of bookies' ledgers onto others (BookKeeper's RecoveryBookieService):
        the auditor marks every ledger with a fragment on `bookie_src` under-replicated, and
        with `delete_cookie` removes their cookies once no ledger needs them."""
        bookie_ids = sorted(set(command.bookie_src))
        return await ledgers.auditor.recover_bookie(bookie_ids, command.delete_cookie)

    @router.get(
        "/api/v1/autorecovery/lost_bookie_recovery_delay",
        tags=["admin"],
        operation_id="admin_get_lost_bookie_recovery_delay",
    )
    async def get_lost_bookie_recovery_delay() -> dict[str, int]:
        settings = await call(ledgers.meta.get_cluster_settings())
        return {"lostBookieRecoveryDelay": settings.lost_bookie_recovery_delay_s}

    @router.put(
        "/api/v1/autorecovery/lost_bookie_recovery_delay",
        tags=["admin"],
        operation_id="admin_set_lost_bookie_recovery_delay",
    )
    async def set_lost_bookie_recovery_delay(
        delay_seconds: Annotated[int, Body(embed=True, ge=0, le=86_400, strict=True)],
    ) -> dict[str, int]:
        settings = await call(
            ledgers.meta.set_cluster_settings(lost_bookie_recovery_delay_s=delay_seconds)
        )
        return {"lostBookieRecoveryDelay": settings.lost_bookie_recovery_delay_s}

    @router.get(
        "/api/v1/autorecovery/status", tags=["admin"], operation_id="admin_autorecovery_status"
    )
    async def autorecovery_status() -> AutoRecoveryStatus:
        """The auto-recovery switch, and whether ledgers are being re-replicated: the switch
        is on and replicator workers run (they claim only while it is on)."""
        stored = await call(ledgers.meta.get_cluster_settings())
        return replication_status(stored.autorecovery_enabled, await count_replicators(ledgers))

    @router.put(
        "/api/v1/autorecovery/status", tags=["admin"], operation_id="admin_set_autorecovery_status"
    )
    async def set_autorecovery_status(enabled: bool) -> AutoRecoveryStatus:
        """Turn auto-recovery on or off (BookKeeper's `shell autorecovery -enable|-disable`):
        while it is off, the under-replication queue hands out no claims, so no replicator
        worker starts on an under-replicated ledger."""
        stored = await call(ledgers.meta.set_cluster_settings(autorecovery_enabled=enabled))
        return replication_status(stored.autorecovery_enabled, await count_replicators(ledgers))

    # -- Quire's own ----------------------------------------------------------------------

    @router.get(
        "/v1/autorecovery/underreplicated",
        tags=["autorecovery"],
        operation_id="list_underreplicated",
    )
    async def underreplicated(
        after: Annotated[int | None, Query(ge=-1, le=MAX_LEDGER_ID)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        """Ledgers waiting for re-replication: their missing bookies, when they were first
        marked, and the replicator worker's claim on each (`claimed_by`, until
        `claim_expires_at`), if any. `GET /api/v1/autorecovery/status` says whether workers
        run and may claim."""
        page = await call(ledgers.meta.list_underreplicated(after, limit))
        return {
            "ledgers": [row.model_dump(mode="json") for row in page.ledgers],
            "next_after": page.next_after,
        }

    return router
