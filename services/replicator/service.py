"""The replicator worker. It runs, registers for discovery and reports its status; claiming
under-replicated ledgers and copying their fragments come with the auto-recovery work
(wave 2), once the auditor marks ledgers and the metadata service keeps the queue."""

from __future__ import annotations

import json

from nats.micro.request import Request

from shared.service import ServiceRuntime


async def main(rt: ServiceRuntime) -> None:
    async def status(request: Request) -> None:
        await request.respond(json.dumps({"instance": rt.instance, "replicated": 0}).encode())

    await rt.add_endpoint("status", rt.subjects.service("replicator", "status"), status)
