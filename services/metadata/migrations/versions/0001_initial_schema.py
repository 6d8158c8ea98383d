"""The initial schema: ledgers, the ledger id sequence, bookies.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("ledger_id_seq", start=0, minvalue=0)))
    op.create_table(
        "ledgers",
        sa.Column("ledger_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("ensemble_size", sa.Integer, nullable=False),
        sa.Column("write_quorum", sa.Integer, nullable=False),
        sa.Column("ack_quorum", sa.Integer, nullable=False),
        sa.Column("digest", sa.Text, nullable=False),
        sa.Column("last_entry_id", sa.BigInteger, nullable=True),
        sa.Column("length", sa.BigInteger, nullable=False),
        sa.Column("ctime", sa.BigInteger, nullable=False),
        sa.Column("custom_metadata", JSONB, nullable=False),
        sa.Column("segments", JSONB, nullable=False),
        sa.Column("password_salt", sa.Text, nullable=False),
        sa.Column("password_hash", sa.Text, nullable=False),
        sa.Column("format_version", sa.Integer, nullable=False),
    )
    op.create_table(
        "bookies",
        sa.Column("bookie_id", sa.Text, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("last_seen", sa.BigInteger, nullable=False),
        sa.Column("lease_expires_at", sa.BigInteger, nullable=False),
        sa.Column("info", JSONB, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("bookies")
    op.drop_table("ledgers")
    op.execute(sa.schema.DropSequence(sa.Sequence("ledger_id_seq")))
