"""core.db: a lost connection on a request path is StorageUnavailable (the
core's error model), not an asyncpg exception that ends a protocol task."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from polyport.core.db import Db
from polyport.core.errors import StorageUnavailable
from polyport.core.migrate import asyncpg_dsn


async def test_backend_terminated_mid_statement(db_url: str) -> None:
    dsn = asyncpg_dsn(db_url)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    other = await asyncpg.connect(dsn)
    try:
        db = Db(pool)
        pid = await db.fetchval("SELECT pg_backend_pid()")
        slow = asyncio.create_task(db.fetchval("SELECT pg_sleep(10)"))
        await asyncio.sleep(0.2)
        await other.execute("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(StorageUnavailable, match="retry shortly"):
            await asyncio.wait_for(slow, 5)
        # The pool replaces the connection: the next statement works.
        assert await db.fetchval("SELECT 1") == 1
    finally:
        await other.close()
        pool.terminate()


async def test_unreachable_server() -> None:
    # Port 1 on loopback: nothing listens, the connect is refused.
    pool = await asyncpg.create_pool("postgresql://nobody@127.0.0.1:1/none", min_size=0,
                                     max_size=1)
    try:
        with pytest.raises(StorageUnavailable):
            await Db(pool).execute("SELECT 1")
    finally:
        pool.terminate()


async def test_statement_errors_are_not_translated(db_url: str) -> None:
    pool = await asyncpg.create_pool(asyncpg_dsn(db_url), min_size=1, max_size=1)
    try:
        with pytest.raises(asyncpg.UndefinedTableError):
            await Db(pool).fetch("SELECT * FROM no_such_table")
    finally:
        pool.terminate()
