"""Stream state comes from each stream's last event, not a row kept per stream.

Also drops polyport_assert(), which only the old check used.

Appends used to update ``streams.last_version`` and ``segment_length`` for
every touched stream in every commit; the unique index on events (context,
stream, version) already guards versions, so that write is dropped and
``streams`` stays a registry (one row per stream, written by its first append).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_column("streams", "last_version")
    op.drop_column("streams", "segment_length")
    # Only the old fast path's stream-state check called it.
    op.execute("DROP FUNCTION IF EXISTS polyport_assert(boolean, text)")


def downgrade() -> None:
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
    op.add_column("streams", sa.Column("last_version", sa.BigInteger))
    op.add_column("streams", sa.Column("segment_length", sa.BigInteger))
    # 8 = the segment wire's event frame header (type i32 + length u32),
    # core.events.SEGMENT_EVENT_HEADER_SIZE when this revision was written.
    op.execute(
        """
        UPDATE streams s
        SET last_version = e.version,
            segment_length = e.segment_offset + 8 + octet_length(e.body)
        FROM (SELECT DISTINCT ON (context, stream) context, stream, version,
                     segment_offset, body
              FROM events ORDER BY context, stream, version DESC) e
        WHERE s.context = e.context AND s.stream = e.stream
        """
    )
    op.execute(
        "UPDATE streams SET last_version = 0, segment_length = 0 WHERE last_version IS NULL"
    )
    op.alter_column("streams", "last_version", nullable=False)
    op.alter_column("streams", "segment_length", nullable=False)
