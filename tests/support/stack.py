"""A whole Quire stack inside the test's event loop: the metadata service on a database of
its own, N bookies (journal + ledgerstore each) and the gateway, all on the session's real
NATS and PostgreSQL, exactly as their processes run them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from quire.infra import free_port
from shared.config import QuireSettings
from shared.service import ServiceRuntime
from tests.support.inprocess import running_service

MAX_ENTRY = 4096
MAX_BATCH = 50


@contextlib.contextmanager
def scratch_database(database_url: str) -> Iterator[str]:
    """A new database on the session's PostgreSQL (its URL), dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    db = make_url(database_url)
    name = f"t_{os.urandom(6).hex()}"
    admin = {"host": db.host, "port": db.port, "user": db.username, "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield db.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def stack_settings(nats_url: str, data_dir: Path, **top: Any) -> QuireSettings:
    """Settings of a fresh stack: the session's NATS, a subject prefix of its own."""
    return QuireSettings(
        nats_url=nats_url, subject_prefix=f"t{os.urandom(4).hex()}", data_dir=data_dir, **top
    )


@dataclass
class Stack:
    url: str
    settings: QuireSettings
    http: httpx.AsyncClient
    # One exit stack per service, so that a test can stop one of them.
    services: dict[str, contextlib.AsyncExitStack] = field(default_factory=dict)
    runtimes: dict[str, ServiceRuntime] = field(default_factory=dict)

    async def start(self, name: str, kind: str, settings: QuireSettings) -> ServiceRuntime:
        stack = contextlib.AsyncExitStack()
        rt = await stack.enter_async_context(running_service(kind, settings, name))
        self.services[name], self.runtimes[name] = stack, rt
        return rt

    async def stop(self, name: str) -> None:
        await self.services.pop(name).aclose()

    async def stop_all(self) -> None:
        for name in reversed(list(self.services)):
            await self.stop(name)


def gateway_settings(settings: QuireSettings, **gateway) -> QuireSettings:
    update = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "ready_min_writable_bookies": 3,
        "max_entry_size_bytes": MAX_ENTRY,
        "max_batch_entries": MAX_BATCH,
        "read_entry_timeout_ms": 500,
        "add_entry_timeout_ms": 3_000,
        **gateway,
    }
    return settings.model_copy(update={"gateway": settings.gateway.model_copy(update=update)})


@contextlib.asynccontextmanager
async def running_stack(
    settings: QuireSettings,
    database_url: str,
    bookies: int = 3,
    bookie_locations: Mapping[str, str] | None = None,
    **gateway,
) -> AsyncIterator[Stack]:
    """`bookie_locations`: bookie id -> QUIRE_BOOKIE_LOCATION, for those not at the default."""
    settings = gateway_settings(
        settings.model_copy(update={"database_url": database_url}), **gateway
    )
    tls = settings.gateway.tls_cert_file is not None
    url = f"{'https' if tls else 'http'}://127.0.0.1:{settings.gateway.http_port}"
    verify: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=str(settings.gateway.tls_cert_file)) if tls else True
    )
    async with httpx.AsyncClient(base_url=url, timeout=15, verify=verify) as http:
        stack = Stack(url, settings, http)
        try:
            await stack.start("metadata", "metadata", settings)
            for i in range(1, bookies + 1):
                bookie_id = f"bookie-{i}"
                update = {"bookie_id": bookie_id}
                if bookie_locations and bookie_id in bookie_locations:
                    update["bookie_location"] = bookie_locations[bookie_id]
                bookie = settings.model_copy(update=update)
                await stack.start(f"bookie-{i}.journal", "journal", bookie)
                await stack.start(f"bookie-{i}.ledgerstore", "ledgerstore", bookie)
            await stack.start("gateway", "gateway", settings)
            await wait_ready(http)
            yield stack
        finally:
            await stack.stop_all()


async def wait_ready(http: httpx.AsyncClient, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        response = await http.get("/readyz")
        if response.status_code == 200:
            return
        assert time.monotonic() < deadline, f"gateway not ready: {response.text}"
        await asyncio.sleep(0.1)
