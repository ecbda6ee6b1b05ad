"""Durable subscriptions record who created them: the per-principal quota.

``subscriptions.created_by`` is the creating user's name, "" for the
anonymous user, NULL for the operator's own (``polyport subscriptions
create``) and for rows from before this revision, which count against
nobody.  A partial index serves the count.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

INDEX = "subscriptions_created_by_idx"


def upgrade() -> None:
    op.add_column("subscriptions", sa.Column("created_by", sa.Text(), nullable=True))
    op.create_index(INDEX, "subscriptions", ["created_by"],
                    postgresql_where=sa.text("created_by IS NOT NULL"))


def downgrade() -> None:
    op.drop_index(INDEX, table_name="subscriptions")
    op.drop_column("subscriptions", "created_by")
