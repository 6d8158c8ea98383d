"""Run a Quire service inside the test's event loop, exactly as its process would run it
(same runtime, same `main`), against real NATS. Use subprocesses where a test must kill."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from shared.config import QuireSettings
from shared.service import ServiceRuntime


@asynccontextmanager
async def running_service(
    kind: str, settings: QuireSettings, instance: str | None = None
) -> AsyncIterator[ServiceRuntime]:
    """`kind` is a folder of services/ whose `service` module has `async def main(rt)`."""
    module = importlib.import_module(f"services.{kind}.service")
    rt = ServiceRuntime(kind, settings, instance or kind)
    await rt.start()
    try:
        await module.main(rt)
        rt.started = True  # as shared/service.py run_service marks it
        yield rt
    finally:
        rt.stop()
        await rt.shutdown()


async def wait_until_serving(client, timeout_s: float = 10.0) -> None:
    """Wait until the metadata service answers: right after its subscriptions were flushed
    a request still meets "no responders" now and then (seen on this NATS server), which
    MetadataClient reports as UNAVAILABLE."""
    import asyncio

    from shared.metaclient import MetadataError

    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await client.instance_id()
            return
        except MetadataError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.01)
