"""Durable subscription names scoped by context: unique (context, name).

Before, a durable subscription or consumer-group name was global, so two
tenants choosing the same group name shared one checkpoint (and one event
feed).  The key is now (context, name); ``context`` is backfilled from the
stored selector's context ('default' where the selector named none).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The constraint PostgreSQL named for 0001's ``unique=True`` on ``name``.
NAME_KEY = "subscriptions_name_key"
CONTEXT_NAME_KEY = "subscriptions_context_name_key"


def upgrade() -> None:
    op.add_column("subscriptions", sa.Column("context", sa.Text, nullable=True))
    op.execute(
        "UPDATE subscriptions SET context = COALESCE(selector->>'context', 'default')"
    )
    op.alter_column("subscriptions", "context", nullable=False)
    op.drop_constraint(NAME_KEY, "subscriptions", type_="unique")
    op.create_unique_constraint(CONTEXT_NAME_KEY, "subscriptions", ["context", "name"])


def downgrade() -> None:
    # A global name cannot hold two contexts' subscriptions: refuse rather
    # than drop one tenant's checkpoint.  (An offline --sql script cannot look;
    # the restored unique constraint then fails on such rows instead.)
    if not context.is_offline_mode():
        _refuse_shared_names()
    op.drop_constraint(CONTEXT_NAME_KEY, "subscriptions", type_="unique")
    op.create_unique_constraint(NAME_KEY, "subscriptions", ["name"])
    op.drop_column("subscriptions", "context")


def _refuse_shared_names() -> None:
    clashes = op.get_bind().execute(
        sa.text(
            "SELECT name, string_agg(context, ', ' ORDER BY context) AS contexts "
            "FROM subscriptions GROUP BY name HAVING count(*) > 1 ORDER BY name"
        )
    ).all()
    if clashes:
        listed = "; ".join(f"{r.name!r} in {r.contexts}" for r in clashes[:10])
        raise RuntimeError(
            "cannot downgrade below 0005: durable subscription names are used in more "
            f"than one context ({listed}); delete or rename one of each first "
            "(polyport subscriptions delete NAME --context CONTEXT)"
        )
