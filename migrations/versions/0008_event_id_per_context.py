"""Event ids unique per context: unique (context, event_id).

An event id is an idempotency key, and it was unique across every tenant:
tenant B could append the ids tenant A would use next and block A's
appends for good, or probe which ids exist elsewhere.  The key is now
(context, event_id): each tenant's ids are its own, and a re-sent id is
recognised within its context only.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The constraint PostgreSQL named for 0001's unique event_id.
EVENT_ID_KEY = "events_event_id_key"
CONTEXT_EVENT_ID_KEY = "events_context_event_id_key"


def upgrade() -> None:
    op.create_unique_constraint(CONTEXT_EVENT_ID_KEY, "events", ["context", "event_id"])
    op.drop_constraint(EVENT_ID_KEY, "events", type_="unique")


def downgrade() -> None:
    # A global key cannot hold the same id in two contexts: refuse rather
    # than leave the database without the old constraint.  (An offline --sql
    # script cannot look; the restored constraint then fails on such rows.)
    if not context.is_offline_mode():
        _refuse_shared_ids()
    op.create_unique_constraint(EVENT_ID_KEY, "events", ["event_id"])
    op.drop_constraint(CONTEXT_EVENT_ID_KEY, "events", type_="unique")


def _refuse_shared_ids() -> None:
    clashes = op.get_bind().execute(
        sa.text(
            "SELECT event_id, string_agg(context, ', ' ORDER BY context) AS contexts "
            "FROM events GROUP BY event_id HAVING count(*) > 1 ORDER BY event_id LIMIT 10"
        )
    ).all()
    if clashes:
        listed = "; ".join(f"{r.event_id} in {r.contexts}" for r in clashes)
        raise RuntimeError(
            "cannot downgrade below 0008: event ids are used in more than one context "
            f"({listed}); events are never deleted, so stay on 0008"
        )
