"""Binder poison isolation: events a binder could not fold, by binder and position.

The projector records an event it cannot fold here and moves past it, so one
bad event no longer stops its binder (and, before, every binder after it).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Bounded by the log: at most one row per binder and event.  Dropping or
    # rebuilding a binder deletes its rows (as for binder_documents).
    op.create_table(
        "binder_errors",
        sa.Column("binder", sa.Text, primary_key=True),
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    # The skipped events stay in the log; `polyport binders rebuild` after a
    # downgrade meets them again.
    op.drop_table("binder_errors")
