"""The metadata service's PostgreSQL schema, as SQLAlchemy table definitions.

This module and the Alembic migrations describe the same schema; a test checks that the
migrations' result matches these definitions, so change both together.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, MetaData, Sequence, Table, Text
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

# Ledger ids come from here unless the creator chose one. BookKeeper's first id is 0.
# The sequence only moves forward, so an id it handed out is never handed out again,
# even after the ledger is deleted (bookies may still hold the old ledger's entries).
ledger_id_seq = Sequence("ledger_id_seq", metadata=metadata, start=0, minvalue=0)

ledgers = Table(
    "ledgers",
    metadata,
    Column("ledger_id", BigInteger, primary_key=True, autoincrement=False),
    # The row version every update compares and sets (BookKeeper's metadata version).
    Column("version", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("ensemble_size", Integer, nullable=False),
    Column("write_quorum", Integer, nullable=False),
    Column("ack_quorum", Integer, nullable=False),
    Column("digest", Text, nullable=False),
    Column("last_entry_id", BigInteger, nullable=True),
    Column("length", BigInteger, nullable=False),
    Column("ctime", BigInteger, nullable=False),  # ms since the epoch
    Column("custom_metadata", JSONB, nullable=False),
    Column("segments", JSONB, nullable=False),  # [{"first_entry_id", "bookies"}, ...]
    Column("password_salt", Text, nullable=False),
    Column("password_hash", Text, nullable=False),
    Column("format_version", Integer, nullable=False),
)

bookies = Table(
    "bookies",
    metadata,
    Column("bookie_id", Text, primary_key=True),
    # What the bookie last declared (writable or readonly); "lost" is derived from the lease.
    Column("state", Text, nullable=False),
    Column("last_seen", BigInteger, nullable=False),  # ms since the epoch
    Column("lease_expires_at", BigInteger, nullable=False),  # ms since the epoch
    Column("info", JSONB, nullable=False),
)
