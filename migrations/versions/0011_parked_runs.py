"""what a pending run that could not start waits for, so the engine's start check reads the
runs to try rather than every pending run

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_STARTABLE = "status = 'pending' AND waiting_for IS NULL"
_WAITING = "status = 'pending' AND waiting_for IS NOT NULL"


def upgrade() -> None:
    # Every pending run starts unparked: the engine tries each once and parks those that wait.
    op.add_column("runs", sa.Column("waiting_for", sa.String(400), nullable=True))
    op.create_index(
        "ix_runs_startable",
        "runs",
        ["id"],
        sqlite_where=sa.text(_STARTABLE),
        postgresql_where=sa.text(_STARTABLE),
    )
    op.create_index(
        "ix_runs_waiting",
        "runs",
        ["waiting_for", "id"],
        sqlite_where=sa.text(_WAITING),
        postgresql_where=sa.text(_WAITING),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_waiting", table_name="runs")
    op.drop_index("ix_runs_startable", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("waiting_for")
