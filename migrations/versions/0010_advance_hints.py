"""hints of the runs that may have a next step to decide, so the engine's advance check reads
what changed rather than every running run

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

BigID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "advance_hints",
        sa.Column("id", BigID, autoincrement=True, nullable=False),
        sa.Column("run_id", BigID, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_advance_hints_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_advance_hints")),
    )
    # Every run under way is looked at once: the engine drops the hints of those with a step
    # still active. (Before this revision the check walked them all, so none is missed.)
    op.execute("INSERT INTO advance_hints (run_id) SELECT id FROM runs WHERE status = 'running'")


def downgrade() -> None:
    op.drop_table("advance_hints")
