"""Res01 CURVE: client public keys mapped to users.

A ZeroMQ client that completes the CURVE handshake with a key listed here acts
as that key's user (gateway/transports/curve.py); only the public key is stored, the
secret is printed once by ``polyport keys create``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "curve_keys",
        # Z85 text of the 32-byte key: 40 characters.
        sa.Column("public_key", sa.Text, primary_key=True),
        sa.Column(
            "user_name",
            sa.Text,
            sa.ForeignKey("users.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("curve_keys_user", "curve_keys", ["user_name"])


def downgrade() -> None:
    # Clients with CURVE keys can no longer log in; the users stay.
    op.drop_index("curve_keys_user", table_name="curve_keys")
    op.drop_table("curve_keys")
