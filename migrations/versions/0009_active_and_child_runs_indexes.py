"""indexes of the unfinished runs (every engine probe and claim) and of a run's child runs

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
_CHILD = "parent_run_id IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_runs_active",
        "runs",
        ["id"],
        sqlite_where=sa.text(_ACTIVE),
        postgresql_where=sa.text(_ACTIVE),
    )
    op.create_index(
        "ix_runs_parent",
        "runs",
        ["parent_run_id", "id"],
        sqlite_where=sa.text(_CHILD),
        postgresql_where=sa.text(_CHILD),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_parent", table_name="runs")
    op.drop_index("ix_runs_active", table_name="runs")
