"""indexes for auditor queries

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_audit_events_actor", "audit_events", ["actor", "id"]),
    ("ix_audit_events_kind", "audit_events", ["kind", "id"]),
    ("ix_audit_events_to_status", "audit_events", ["to_status", "id"]),
    ("ix_audit_events_step", "audit_events", ["step_id"]),
    ("ix_audit_events_episode", "audit_events", ["episode_id"]),
    ("ix_runs_gpu", "runs", ["gpu", "created_at"]),
    ("ix_runs_principal", "runs", ["principal", "created_at"]),
    ("ix_runs_created", "runs", ["created_at"]),
    ("ix_steps_action", "steps", ["action", "run_id"]),
    ("ix_approvals_principal", "approvals", ["principal"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns, unique=False)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
