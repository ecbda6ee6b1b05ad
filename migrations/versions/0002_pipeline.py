"""Pipeline tables: hourly event statistics, job checkpoints, staging tables.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Read by /status and the status page; filled by `polyport pipeline stats`.
    op.create_table(
        "event_stats",
        sa.Column("context", sa.Text, primary_key=True),
        sa.Column("category", sa.Text, primary_key=True),
        sa.Column("type", sa.Text, primary_key=True),
        sa.Column("hour", TZ, primary_key=True),
        sa.Column("events", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
    )
    # One row per incremental job: every event at or below ``position`` is done.
    # ``pending_position`` is set while an export publishes (position, pending]:
    # a run that finds it set knows the previous one stopped mid-publish.
    op.create_table(
        "pipeline_checkpoints",
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.Column("pending_position", sa.BigInteger),
    )
    # Spark writes its results here (JDBC cannot join our transaction); one
    # Postgres transaction then moves them into place with the checkpoint.
    op.create_table(
        "pipeline_stats_staging",
        sa.Column("context", sa.Text, nullable=False),
        sa.Column("category", sa.Text, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("hour", TZ, nullable=False),
        sa.Column("events", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        prefixes=["UNLOGGED"],
    )
    op.create_table(
        "pipeline_binder_staging",
        sa.Column("binder", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("document", sa.Text, nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    for table in (
        "pipeline_binder_staging",
        "pipeline_stats_staging",
        "pipeline_checkpoints",
        "event_stats",
    ):
        op.drop_table(table)
