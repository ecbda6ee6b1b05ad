"""Persistent subscriptions: per-subscription settings and parked events.

``subscriptions.settings`` holds what an operator set with ``polyport
subscriptions create|update`` (start, max in flight, max retries, message
timeout); ``parked_events`` holds the events a consumer group gave up on after
too many retries, until ``replay-parked`` hands them out again.  Fetch-style
subscriptions (Res01) count how often the same batch was fetched without
progress in ``fetch_attempts``.

(Named for what it adds, so a renumbering at merge time only touches the two
revision ids below.)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Empty settings = the behaviour before this revision (no limits, never park).
    op.add_column(
        "subscriptions",
        sa.Column("settings", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.add_column(
        "subscriptions",
        sa.Column("fetch_attempts", sa.Integer, nullable=False, server_default="0"),
    )
    # Bounded by the log: at most one row per subscription and event.  Deleting
    # a subscription deletes its parked events.
    op.create_table(
        "parked_events",
        sa.Column(
            "subscription_id", sa.BigInteger,
            sa.ForeignKey("subscriptions.id", ondelete="CASCADE"), primary_key=True,
        ),
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("retries", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("parked_at", sa.DateTime(timezone=True), nullable=False),
        # Set by replay-parked; the group owning the subscription hands the
        # event out again and deletes the row once it is acknowledged.
        sa.Column("replay", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    # Parked events stay in the log; after a downgrade they are simply behind
    # their subscription's checkpoint.
    op.drop_table("parked_events")
    op.drop_column("subscriptions", "fetch_attempts")
    op.drop_column("subscriptions", "settings")
