"""keyed audit chain: the signing key of each event, the row digests it seals, delivery MACs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("audit_events") as batch:
        batch.add_column(sa.Column("key_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("rows", JSONType, nullable=True))
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("mac", sa.String(140), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("mac")
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_column("rows")
        batch.drop_column("key_id")
