"""PostgreSQL helpers shared by tests of every layer."""

from __future__ import annotations

import asyncio
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


async def lock_waiters(db_url: str, count: int, timeout: float = 20.0) -> None:
    """Return once ``count`` backends of this database wait on a lock: a
    statement is then in PostgreSQL's lock queue, not merely sent (on a
    loaded machine a fixed sleep may not cover a new connection's start)."""
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'")
            if waiting >= count:
                return
            if loop.time() > deadline:
                raise AssertionError(f"{waiting} of {count} lock waiters after {timeout}s")
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
