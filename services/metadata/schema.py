"""The metadata service's PostgreSQL schema, as SQLAlchemy table definitions (the
statements that use them are in sql.py).

This module and the Alembic migrations describe the same schema; a test checks that the
migrations' result matches these definitions, so change both together.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    ForeignKey,
    Integer,
    MetaData,
    Sequence,
    SmallInteger,
    Table,
    Text,
    text,
)
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
    # BookKeeper's cToken (0: none).
    Column("creator_token", BigInteger, nullable=False, server_default=text("0")),
    # The ledger's keys, hex ("": created before format 3; LedgerMetadata says why).
    Column("master_key", Text, nullable=False, server_default=text("''")),
    Column("mac_key", Text, nullable=False, server_default=text("''")),
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

# -- the transactional outbox -------------------------------------------------------------

# Each change inserts its outbox row in the statement (so the transaction) that makes it.
# Ids come from a sequence; the publisher publishes in id order (outbox.py, with
# core.OutboxCursor deciding about gaps) and deletes what it published, so the table
# holds only what is still to publish.
outbox_id_seq = Sequence("outbox_id_seq", metadata=metadata, start=1, minvalue=1)

outbox = Table(
    "outbox",
    metadata,
    Column(
        "id", BigInteger, outbox_id_seq, primary_key=True, server_default=outbox_id_seq.next_value()
    ),
    # What changed: ledger.created, ledger.changed, ledger.deleted, bookie.registered, ...
    # The publisher turns it into the events Spark reads (core.outbox_events).
    Column("kind", Text, nullable=False),
    Column("ledger_id", BigInteger, nullable=True),
    Column("bookie_id", Text, nullable=True),
    Column("data", JSONB, nullable=False),
    Column("ts_ms", BigInteger, nullable=False),  # when the change was made
)

# One row: the highest outbox id published so far (rows below it that still exist were
# committed late, past a gap, and are published anyway).
outbox_cursor = Table(
    "outbox_cursor",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("last_published_id", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="outbox_cursor_one_row"),
)

# -- cluster state ------------------------------------------------------------------------

# One row: the cluster's instance id (BookKeeper's INSTANCEID znode), made by the migration.
cluster = Table(
    "cluster",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("instance_id", Text, nullable=False),
    CheckConstraint("id = 1", name="cluster_one_row"),
)

# Cluster-wide settings an operator changes at run time (name -> JSON value).
cluster_settings = Table(
    "cluster_settings",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", JSONB, nullable=False),
)

# Bookie identity cookies (BookKeeper's cookies znodes), compare-and-set on `version`.
cookies = Table(
    "cookies",
    metadata,
    Column("bookie_id", Text, primary_key=True),
    Column("data", Text, nullable=False),
    Column("version", Integer, nullable=False),
)

# The under-replication queue (LedgerUnderreplicationManager). A claim is a lease: a worker
# that dies stops renewing and the ledger becomes claimable again.
underreplicated_ledgers = Table(
    "underreplicated_ledgers",
    metadata,
    Column(
        "ledger_id",
        BigInteger,
        ForeignKey("ledgers.ledger_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("missing_bookies", JSONB, nullable=False),  # sorted list of bookie ids
    Column("mark_version", Integer, nullable=False),
    Column("marked_at", BigInteger, nullable=False),  # ms since the epoch
    Column("claimed_by", Text, nullable=True),
    Column("claim_expires_at", BigInteger, nullable=True),  # ms since the epoch
)

# One row: who audits. A lease, renewed by the leader; a lapsed lease may be taken.
auditor_election = Table(
    "auditor_election",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("leader_id", Text, nullable=True),
    Column("term", BigInteger, nullable=False),
    Column("lease_expires_at", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="auditor_election_one_row"),
)
