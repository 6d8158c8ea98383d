"""Session fixtures: a real nats-server and a real PostgreSQL on free loopback ports,
started once per test session and stopped at its end (no process left behind)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from quire.infra import ManagedProcess, start_nats, start_postgres
from shared.config import QuireSettings


@pytest.fixture(scope="session")
def enterable_tmp() -> Iterator[Path]:
    """A temp dir that PostgreSQL's unprivileged user (as root we run it as 'nobody') can
    enter: pytest's own temp tree is 0700, and other pytest sessions reset it."""
    path = Path(tempfile.mkdtemp(prefix="quire-tests-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster_dir(enterable_tmp: Path):
    """Makes a fresh parent dir for a `quire up` data dir, enterable by PostgreSQL."""

    def make(name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=enterable_tmp))
        path.chmod(0o711)
        return path

    return make


@pytest.fixture(scope="session")
def infra_dir(cluster_dir) -> Path:
    return cluster_dir("infra")


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


@pytest.fixture(scope="session")
def spark(cluster_dir) -> Iterator:
    """One local Spark session (local[2], the `jetstream` source registered) for every test
    that needs Spark: starting it dominates their time."""
    from tests.support.spark import start_spark, stop_spark

    session = start_spark(cluster_dir("spark"))
    yield session
    stop_spark(session)


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
