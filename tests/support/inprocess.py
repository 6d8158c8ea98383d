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
        yield rt
    finally:
        rt.stop()
        await rt.shutdown()
