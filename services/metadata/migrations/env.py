"""Alembic environment: runs on the connection the service hands over (under its
advisory lock), or, from the command line, on QUIRE_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from services.metadata.schema import metadata
from shared.config import load_settings

config = context.config


def run_on(connection) -> None:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    engine = create_engine(load_settings().database_url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        run_on(connection)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported")
run_online()
