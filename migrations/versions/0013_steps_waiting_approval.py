"""an index of the steps waiting for approval, which the metrics count at every scrape and the
console lists at every refresh (each walked every step ever stored)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_WAITING_APPROVAL = "status = 'waiting_approval'"


def upgrade() -> None:
    op.create_index(
        "ix_steps_waiting_approval",
        "steps",
        ["id"],
        sqlite_where=sa.text(_WAITING_APPROVAL),
        postgresql_where=sa.text(_WAITING_APPROVAL),
    )


def downgrade() -> None:
    op.drop_index("ix_steps_waiting_approval", table_name="steps")
