"""PostgreSQL helpers shared by tests of every layer."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from polyport.core.migrate import asyncpg_dsn

HEAD_LOCK = "SELECT * FROM log_head WHERE id = 1 FOR UPDATE"
SUBSCRIPTION_LOCK = "SELECT * FROM subscriptions WHERE id = $1 FOR UPDATE"


@contextlib.asynccontextmanager
async def row_locked(db_url: str, query: str, *args: Any) -> AsyncIterator[None]:
    """Hold ``SELECT … FOR UPDATE`` locks until the block ends."""
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.fetch(query, *args)
        try:
            yield
        finally:
            await tx.rollback()
    finally:
        await conn.close()
