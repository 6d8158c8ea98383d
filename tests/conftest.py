"""Session fixtures: a real nats-server and a real PostgreSQL on free loopback ports,
started once per test session and stopped at its end (no process left behind)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from quire.infra import ManagedProcess, start_nats, start_postgres
from shared.config import QuireSettings


@pytest.fixture(scope="session")
def infra_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # As root, PostgreSQL runs as 'nobody', which must be able to enter the temp dirs.
    for path in (base, *base.parents):
        if path == Path("/"):
            break
        if os.geteuid() == 0:
            os.chmod(path, os.stat(path).st_mode | 0o001)
    directory = base / "infra"
    directory.mkdir(exist_ok=True)
    return directory


@pytest.fixture(scope="session")
def nats_server(infra_dir: Path) -> Iterator[ManagedProcess]:
    server = start_nats(infra_dir / "nats")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server(infra_dir: Path) -> Iterator[ManagedProcess]:
    server = start_postgres(infra_dir / "postgres")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: ManagedProcess) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def database_url(postgres_server: ManagedProcess) -> str:
    return postgres_server.url


@pytest.fixture
def settings(nats_url: str, tmp_path: Path) -> QuireSettings:
    """Settings for a service under test: the session's NATS, a subject prefix of its own
    (tests do not see each other's traffic), a fresh data dir."""
    prefix = f"t{os.urandom(4).hex()}"
    return QuireSettings(nats_url=nats_url, subject_prefix=prefix, data_dir=tmp_path)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator:
    import nats

    client = await nats.connect(nats_url)
    yield client
    await client.drain()


@pytest.fixture
def fresh_database_url(database_url: str) -> Iterator[str]:
    """A new, empty database on the session's PostgreSQL, dropped after the test."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    name = f"t_{os.urandom(6).hex()}"
    admin = {
        "host": url.host,
        "port": url.port,
        "user": url.username,
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**admin) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield url.set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(**admin) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
