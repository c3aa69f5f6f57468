"""index for runs a principal acted on

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_audit_events_actor_run", "audit_events", ["actor", "run_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_audit_events_actor_run", table_name="audit_events")
