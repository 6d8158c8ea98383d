"""The caller's side of the auditor's operator commands (BookKeeper's BookKeeperAdmin calls
that go through the Auditor: triggerAudit, recoverBookieData, decommissionBookie).

Only the elected auditor acts, so a command is addressed to it by name: the client asks the
metadata service who leads (`who_is_auditor`) and sends the request to
`Subjects.auditor_command(leader_id, op)`. A standby or a leader that lost its lease in the
meantime answers UNAVAILABLE; so does the client when no auditor is elected or the leader
does not answer the subject (it just went away): the caller may ask again.

Replies are JSON: the command's result, or {"error": {"code": ApiCodes name, "message": str}}.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import BaseModel, ConfigDict, Field

from shared.metaclient import MetadataClient, MetadataError
from shared.requests import request as nats_request
from shared.status import ApiCode, ApiCodes, QuireError
from shared.subjects import Subjects

TRIGGER_AUDIT = "trigger_audit"
RECOVER_BOOKIE = "recover_bookie"
DECOMMISSION = "decommission"
AUDITOR_COMMANDS = (TRIGGER_AUDIT, RECOVER_BOOKIE, DECOMMISSION)

BOOKIE_ID_PATTERN = r"^[A-Za-z0-9_-]+$"


class TriggerAuditCommand(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecoverBookieCommand(BaseModel):
    """BookKeeper's recoverBookieData (`PUT /api/v1/autorecovery/bookie`)."""

    model_config = ConfigDict(extra="forbid")
    bookie_src: list[Annotated[str, Field(pattern=BOOKIE_ID_PATTERN)]] = Field(
        min_length=1, max_length=1000
    )
    delete_cookie: bool = False

    def bookie_ids(self) -> list[str]:
        return sorted(set(self.bookie_src))


class DecommissionCommand(BaseModel):
    """BookKeeper's decommissionBookie (`PUT /api/v1/autorecovery/decommission`)."""

    model_config = ConfigDict(extra="forbid")
    bookie_src: str = Field(pattern=BOOKIE_ID_PATTERN)


_CODES: dict[str, ApiCode] = {
    name: code for name, code in vars(ApiCodes).items() if isinstance(code, ApiCode)
}


def error_reply(api: ApiCode, message: str) -> dict[str, Any]:
    """The documented error answer of a command (the auditor's side builds it here too)."""
    name = next(n for n, c in _CODES.items() if c is api)
    return {"error": {"code": name, "message": message}}


class AuditorClient:
    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        meta: MetadataClient,
        timeout_s: float = 30.0,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._meta = meta
        self._timeout_s = timeout_s

    async def trigger_audit(self) -> dict[str, Any]:
        """Run every audit now (lost bookies and the periodic checks); what each found."""
        return await self.call(TRIGGER_AUDIT, {})

    async def recover_bookie(self, bookie_ids: list[str], delete_cookie: bool) -> dict[str, Any]:
        """Mark every ledger with entries on `bookie_ids` under-replicated; with
        `delete_cookie`, the auditor removes their cookies once no ledger needs them."""
        return await self.call(
            RECOVER_BOOKIE, {"bookie_src": list(bookie_ids), "delete_cookie": delete_cookie}
        )

    async def decommission(self, bookie_id: str) -> dict[str, Any]:
        """Mark every ledger with entries on `bookie_id` (which must be down) and remove its
        cookie once no ledger needs it (the auditor does that in the background)."""
        return await self.call(DECOMMISSION, {"bookie_src": bookie_id})

    async def leader_id(self) -> str:
        try:
            held = await self._meta.who_is_auditor()
        except MetadataError as exc:
            raise QuireError(ApiCodes.UNAVAILABLE, f"who is auditor: {exc}") from exc
        if held.leader_id is None:
            raise QuireError(ApiCodes.UNAVAILABLE, "no auditor is elected")
        return held.leader_id

    async def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        leader = await self.leader_id()
        subject = self._subjects.auditor_command(leader, op)
        try:
            msg = await nats_request(
                self._nc, subject, json.dumps(body).encode(), timeout_s=self._timeout_s
            )
        except NoRespondersError as exc:
            raise QuireError(ApiCodes.UNAVAILABLE, f"auditor {leader} does not answer") from exc
        except NatsTimeoutError as exc:
            raise QuireError(ApiCodes.TIMEOUT, f"auditor {leader}: {op} timed out") from exc
        try:
            reply = json.loads(msg.data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            # A handler that failed answers a NATS micro error (headers, no JSON body).
            detail = (msg.headers or {}).get("Nats-Service-Error", "malformed reply")
            raise QuireError(ApiCodes.INTERNAL, f"auditor {leader}: {op}: {detail}")
        error = reply.get("error")
        if error is not None:
            api = _CODES.get(str(error.get("code")), ApiCodes.INTERNAL)
            raise QuireError(api, str(error.get("message", "")))
        return reply
