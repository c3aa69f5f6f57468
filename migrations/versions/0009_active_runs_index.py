"""an index of the unfinished runs, read by every engine probe and claim

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_ACTIVE = "status IN ('pending', 'running', 'waiting_approval')"


def upgrade() -> None:
    op.create_index(
        "ix_runs_active",
        "runs",
        ["id"],
        sqlite_where=sa.text(_ACTIVE),
        postgresql_where=sa.text(_ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_active", table_name="runs")
