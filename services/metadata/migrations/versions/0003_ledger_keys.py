"""The ledger's keys (metadata format 3): master_key and mac_key, hex, so that the
replicator can re-replicate a ledger without its password. "" for the ledgers created
before.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for column in ("master_key", "mac_key"):
        op.add_column(
            "ledgers",
            sa.Column(column, sa.Text, nullable=False, server_default=sa.text("''")),
        )


def downgrade() -> None:
    for column in ("mac_key", "master_key"):
        op.drop_column("ledgers", column)
