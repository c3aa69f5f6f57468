"""an index for a node's last disruption, read by every guard decision

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_disruptions_node", "disruptions", ["node", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_disruptions_node", table_name="disruptions")
