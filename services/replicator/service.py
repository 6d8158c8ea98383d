"""The replicator worker, as far as it goes: it runs, registers for discovery and answers
status (`replicated` is always 0). It claims no under-replicated ledger and copies no
fragment: nothing in Quire re-replicates the ledgers of a lost bookie."""

from __future__ import annotations

import json

from nats.micro.request import Request

from shared.service import ServiceRuntime


async def main(rt: ServiceRuntime) -> None:
    async def status(request: Request) -> None:
        await request.respond(json.dumps({"instance": rt.instance, "replicated": 0}).encode())

    await rt.add_endpoint("status", rt.subjects.service("replicator", "status"), status)
