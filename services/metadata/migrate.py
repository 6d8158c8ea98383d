"""Bring the schema to the newest Alembic migration, one instance at a time.

Every metadata instance runs this at start; a PostgreSQL advisory lock, held for the
migration's transaction, makes the others wait and then find nothing left to do. A
migration is a background operation: traced (`metadata.migrate`, with SQLAlchemy's
instrumentation for its statements) whenever this process traces.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.telemetry import background_span, tracer_provider

ALEMBIC_INI = Path(__file__).with_name("alembic.ini")
# Any constant all instances agree on; this one spells "quiremig" in ASCII.
MIGRATION_LOCK_KEY = int.from_bytes(b"quiremig", "big") & (2**63 - 1)


def alembic_config() -> Config:
    return Config(str(ALEMBIC_INI))


def traced_engine(engine: AsyncEngine) -> AsyncEngine:
    """`engine` with SQLAlchemy's instrumentation when this process traces. The
    instrumentor is a process-wide singleton that instruments once: the first engine
    (a process migrates once, at start) gets it. Its dependency check stops at
    SQLAlchemy < 2.1 while we pin 2.1: the event hooks it uses (before/after cursor
    execute) are unchanged in 2.1, and tests/integration/test_tracing.py checks that its
    spans really appear, so the check is skipped."""
    provider = tracer_provider()
    instrumentor = SQLAlchemyInstrumentor()
    if provider is not None and not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(
            engine=engine.sync_engine, tracer_provider=provider, skip_dep_check=True
        )
    return engine


async def migrate(engine: AsyncEngine) -> None:
    with background_span("metadata.migrate"):
        async with engine.begin() as conn:
            await conn.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
            await conn.run_sync(upgrade_to_head)


def upgrade_to_head(connection: Connection) -> None:
    config = alembic_config()
    # env.py runs on this connection, inside this transaction, under the lock.
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
