"""what remediator knows about a step's effect on the cluster

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("effect", sa.String(16), nullable=False, server_default="none"))
    # Steps that succeeded before the column existed applied their effect.
    op.execute("UPDATE steps SET effect = 'applied' WHERE status = 'succeeded'")
    op.execute("UPDATE steps SET effect = 'undone' WHERE status = 'undone'")


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("effect")
