"""Bring the schema to the newest Alembic migration, one instance at a time.

Every metadata instance runs this at start; a PostgreSQL advisory lock, held for the
migration's transaction, makes the others wait and then find nothing left to do.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

ALEMBIC_INI = Path(__file__).with_name("alembic.ini")
# Any constant all instances agree on; this one spells "quiremig" in ASCII.
MIGRATION_LOCK_KEY = int.from_bytes(b"quiremig", "big") & (2**63 - 1)


def alembic_config() -> Config:
    return Config(str(ALEMBIC_INI))


async def migrate(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        await conn.run_sync(upgrade_to_head)


def upgrade_to_head(connection: Connection) -> None:
    config = alembic_config()
    # env.py runs on this connection, inside this transaction, under the lock.
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
