"""web sessions, used sign-in nonces and failed sign-ins, shared by every replica

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BigID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id_sha256", sa.String(length=64), nullable=False),
        sa.Column("principal", sa.String(length=200), nullable=False),
        sa.Column("remote", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id_sha256", name=op.f("pk_web_sessions")),
    )
    op.create_index("ix_web_sessions_expires", "web_sessions", ["expires_at"])
    op.create_table(
        "login_nonces",
        sa.Column("nonce_sha256", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("nonce_sha256", name=op.f("pk_login_nonces")),
    )
    op.create_index("ix_login_nonces_expires", "login_nonces", ["expires_at"])
    op.create_table(
        "auth_failures",
        sa.Column("id", BigID, autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_auth_failures")),
    )
    op.create_index("ix_auth_failures_key_at", "auth_failures", ["key", "at"])
    op.create_index("ix_auth_failures_at", "auth_failures", ["at"])


def downgrade() -> None:
    op.drop_index("ix_auth_failures_at", table_name="auth_failures")
    op.drop_index("ix_auth_failures_key_at", table_name="auth_failures")
    op.drop_table("auth_failures")
    op.drop_index("ix_login_nonces_expires", table_name="login_nonces")
    op.drop_table("login_nonces")
    op.drop_index("ix_web_sessions_expires", table_name="web_sessions")
    op.drop_table("web_sessions")
