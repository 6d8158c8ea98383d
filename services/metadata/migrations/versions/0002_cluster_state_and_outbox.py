"""Creator token, transactional outbox, cluster id and settings, cookies, the
under-replication queue, auditor election.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "ledgers",
        sa.Column("creator_token", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    outbox_id_seq = sa.Sequence("outbox_id_seq", start=1, minvalue=1)
    op.execute(sa.schema.CreateSequence(outbox_id_seq))
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, primary_key=True, server_default=outbox_id_seq.next_value()),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("ledger_id", sa.BigInteger, nullable=True),
        sa.Column("bookie_id", sa.Text, nullable=True),
        sa.Column("data", JSONB, nullable=False),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "outbox_cursor",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("last_published_id", sa.BigInteger, nullable=False),
        sa.CheckConstraint("id = 1", name="outbox_cursor_one_row"),
    )
    op.execute("INSERT INTO outbox_cursor (id, last_published_id) VALUES (1, 0)")
    op.create_table(
        "cluster",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("instance_id", sa.Text, nullable=False),
        sa.CheckConstraint("id = 1", name="cluster_one_row"),
    )
    op.execute("INSERT INTO cluster (id, instance_id) VALUES (1, gen_random_uuid()::text)")
    op.create_table(
        "cluster_settings",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", JSONB, nullable=False),
    )
    op.create_table(
        "cookies",
        sa.Column("bookie_id", sa.Text, primary_key=True),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        "underreplicated_ledgers",
        sa.Column(
            "ledger_id",
            sa.BigInteger,
            sa.ForeignKey("ledgers.ledger_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("missing_bookies", JSONB, nullable=False),
        sa.Column("mark_version", sa.Integer, nullable=False),
        sa.Column("marked_at", sa.BigInteger, nullable=False),
        sa.Column("claimed_by", sa.Text, nullable=True),
        sa.Column("claim_expires_at", sa.BigInteger, nullable=True),
    )
    op.create_table(
        "auditor_election",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("leader_id", sa.Text, nullable=True),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("lease_expires_at", sa.BigInteger, nullable=False),
        sa.CheckConstraint("id = 1", name="auditor_election_one_row"),
    )
    op.execute(
        "INSERT INTO auditor_election (id, leader_id, term, lease_expires_at) "
        "VALUES (1, NULL, 0, 0)"
    )


def downgrade() -> None:
    for table in (
        "auditor_election",
        "underreplicated_ledgers",
        "cookies",
        "cluster_settings",
        "cluster",
        "outbox_cursor",
        "outbox",
    ):
        op.drop_table(table)
    op.execute(sa.schema.DropSequence(sa.Sequence("outbox_id_seq")))
    op.drop_column("ledgers", "creator_token")
