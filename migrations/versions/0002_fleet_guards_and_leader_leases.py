"""fleet guards and leader leases

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "guard_state",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column(
            "value",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_guard_state")),
    )
    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_leases")),
    )
    op.create_table(
        "disruptions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("pool", sa.String(length=253), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_disruptions_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_disruptions")),
        sa.UniqueConstraint("run_id", "node", name="uq_disruptions_run_node"),
    )
    with op.batch_alter_table("disruptions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_disruptions_active",
            ["node"],
            unique=False,
            sqlite_where=sa.text("released_at IS NULL"),
            postgresql_where=sa.text("released_at IS NULL"),
        )
        batch_op.create_index("ix_disruptions_started", ["started_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("disruptions", schema=None) as batch_op:
        batch_op.drop_index("ix_disruptions_started")
        batch_op.drop_index(
            "ix_disruptions_active",
            sqlite_where=sa.text("released_at IS NULL"),
            postgresql_where=sa.text("released_at IS NULL"),
        )

    op.drop_table("disruptions")
    op.drop_table("leader_leases")
    op.drop_table("guard_state")
