"""Initial schema: event log, streams, producer checkpoints, subscriptions,
users, binders.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    _create_log()
    _create_subscriptions()
    _create_users()
    _create_binders()
    _create_assert_function()


def _create_log() -> None:
    """The log's head, its events with their indexes, the streams registry
    and the producers' checkpoints."""
    op.create_table(
        "log_head",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("last_position", sa.BigInteger, nullable=False),
        sa.Column("last_recorded_at", TZ, nullable=False),
    )
    op.execute("INSERT INTO log_head (id, last_position, last_recorded_at) VALUES (1, 0, now())")

    op.create_table(
        "events",
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("context", sa.Text, nullable=False),
        sa.Column("stream", sa.Text, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("headers", pg.JSONB, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("content_type", sa.Text, nullable=False),
        sa.Column("client_time", TZ),
        sa.Column("recorded_at", TZ, nullable=False),
        sa.Column("origin", sa.Text, nullable=False),
        sa.Column("segment_offset", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("context", "stream", "version", name="events_stream_version_key"),
        sa.UniqueConstraint("event_id", name="events_event_id_key"),
    )
    op.create_index("events_stream_offset_idx", "events", ["context", "stream", "segment_offset"])
    op.create_index("events_recorded_at_idx", "events", ["recorded_at"])

    op.create_table(
        "streams",
        sa.Column("context", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("last_version", sa.BigInteger, nullable=False),
        sa.Column("segment_length", sa.BigInteger, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )

    op.create_table(
        "producer_checkpoints",
        sa.Column("producer_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("context", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("ack_level", sa.BigInteger, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
    )


def _create_subscriptions() -> None:
    op.create_table(
        "subscriptions",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("selector", pg.JSONB, nullable=False),
        sa.Column("checkpoint", sa.BigInteger, nullable=False),
        sa.Column("fetched_position", sa.BigInteger),
        sa.Column("fetched_time", TZ),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
    )


def _create_users() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("password_hash", sa.Text, nullable=False),
        sa.Column(
            "default_context", sa.Text, nullable=False, server_default=sa.text("'default'")
        ),
        sa.Column("contexts", pg.ARRAY(sa.Text)),
        sa.Column("created_at", TZ, nullable=False),
    )


def _create_binders() -> None:
    """Binders and the documents they fold events into."""
    op.create_table(
        "binders",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("context", sa.Text, nullable=False),
        sa.Column("stream_prefix", sa.Text, nullable=False),
        sa.Column("types", pg.ARRAY(sa.Text)),
        sa.Column("fold", sa.Text, nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "binder_documents",
        sa.Column("binder", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("document", pg.JSONB, nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
    )


def _create_assert_function() -> None:
    # Aborts the group commit's one-statement fast path when the stream state
    # it was planned against no longer holds (see core.sql.FAST_APPEND).
    op.execute(
        """
        CREATE FUNCTION polyport_assert(ok boolean, message text) RETURNS boolean
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT ok THEN
                RAISE EXCEPTION USING ERRCODE = 'PP001', MESSAGE = message;
            END IF;
            RETURN true;
        END $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS polyport_assert(boolean, text)")
    for table in (
        "binder_documents",
        "binders",
        "users",
        "subscriptions",
        "producer_checkpoints",
        "streams",
        "events",
        "log_head",
    ):
        op.drop_table(table)
