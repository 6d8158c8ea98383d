"""The operator endpoints: BookKeeper's admin REST API under its own paths and meanings
(`/api/v1/...`, as `bookkeeper-server`'s HttpService serves them), and Quire's
`GET /v1/autorecovery/underreplicated`.

Where BookKeeper answers about "this bookie" (the HTTP server runs inside a bookie), the
gateway serves every bookie and takes `bookie_id`. Entry reads and deletes need the
ledger password (`Quire-Ledger-Password`), as everywhere else in the API.

No service re-replicates ledgers, so the auto-recovery answers keep BookKeeper's fields
but never say that replication happens: `enabled` is the stored switch as the operator set
it, `ledgerReplicationActive` and cluster_info's `ledgerReplicationEnabled` are false.
"""

from __future__ import annotations

import base64
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query
from pydantic import BaseModel, ConfigDict, Field

from services.gateway.ledgers import Ledgers, metadata_error
from services.gateway.problems import error_responses
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

# Whether under-replicated ledgers get re-replicated. They do not: the auditor reports lost
# bookies but marks no ledger under-replicated, and the replicator claims and copies
# nothing. Whatever the stored switch says, the answers below report this.
LEDGER_REPLICATION_ACTIVE = False
LEDGER_REPLICATION_DETAIL = (
    "No ledger is re-replicated: the auditor reports lost bookies but marks no ledger "
    "under-replicated, and the replicator copies no fragments. `enabled` is only the "
    "stored auto-recovery switch."
)


class AutoRecoveryStatus(BaseModel):
    """BookKeeper's AutoRecoveryStatusService answer (`enabled`), and whether it means
    anything here."""

    # Every field is in every answer: the OpenAPI document says so.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    enabled: bool = Field(
        description="The stored auto-recovery switch (BookKeeper's autoRecoveryDaemonEnabled), "
        "as last set."
    )
    ledgerReplicationActive: bool = Field(
        default=LEDGER_REPLICATION_ACTIVE,
        description="Whether under-replicated ledgers are re-replicated now: false whatever "
        "`enabled` says, since no service re-replicates.",
    )
    detail: str = Field(default=LEDGER_REPLICATION_DETAIL, description="Why, in a sentence.")


def create_admin_router(ledgers: Ledgers) -> APIRouter:
    router = APIRouter(responses=ERRORS)

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
        says whether ledgers are re-replicated (false: nothing re-replicates), not the stored
        switch, which `GET /api/v1/autorecovery/status` reports."""
        bookies = await ledgers.list_bookies()
        auditor = await call(ledgers.meta.who_is_auditor())
        under = await call(ledgers.meta.list_underreplicated(None, 1))
        count = {state: sum(b.state is state for b in bookies) for state in BookieState}
        return {
            "auditorElected": auditor.leader_id is not None,
            "auditorId": auditor.leader_id or "",
            "clusterUnderReplicated": bool(under.ledgers),
            "ledgerReplicationEnabled": LEDGER_REPLICATION_ACTIVE,
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
        missingreplica: str | None = None, excludingmissingreplica: str | None = None
    ) -> dict[str, list[str]]:
        """Under-replicated ledgers -> their missing bookies, optionally only those missing
        (or not missing) a given bookie."""
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
                return found
            after = page.next_after

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
        """The stored auto-recovery switch, and whether ledgers are re-replicated (they are
        not: see `detail`)."""
        settings = await call(ledgers.meta.get_cluster_settings())
        return AutoRecoveryStatus(enabled=settings.autorecovery_enabled)

    @router.put(
        "/api/v1/autorecovery/status", tags=["admin"], operation_id="admin_set_autorecovery_status"
    )
    async def set_autorecovery_status(enabled: bool) -> AutoRecoveryStatus:
        """Store the auto-recovery switch. Nothing re-replicates ledgers whatever it says;
        the metadata service's under-replication queue hands out no claims while it is off."""
        settings = await call(ledgers.meta.set_cluster_settings(autorecovery_enabled=enabled))
        return AutoRecoveryStatus(enabled=settings.autorecovery_enabled)

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
        """Ledgers marked under-replicated, their missing bookies, and any worker's claim.
        Nothing re-replicates them (see `GET /api/v1/autorecovery/status`)."""
        page = await call(ledgers.meta.list_underreplicated(after, limit))
        return {
            "ledgers": [row.model_dump(mode="json") for row in page.ledgers],
            "next_after": page.next_after,
        }

    return router
