"""what a step a guard holds waits for, so a release of the disruption budget or a reset of
the breaker wakes the steps it frees rather than every held step being re-evaluated on a timer

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_WAITING = "status = 'pending' AND waiting_for IS NOT NULL"


def upgrade() -> None:
    # Steps held when this runs are due within a recheck: each is held again with what it
    # waits for, or goes.
    op.add_column("steps", sa.Column("waiting_for", sa.String(400), nullable=True))
    op.create_index(
        "ix_steps_waiting",
        "steps",
        ["waiting_for", "id"],
        sqlite_where=sa.text(_WAITING),
        postgresql_where=sa.text(_WAITING),
    )


def downgrade() -> None:
    op.drop_index("ix_steps_waiting", table_name="steps")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("waiting_for")
