"""core.db: a lost connection on a request path is StorageUnavailable (the
core's error model), not an asyncpg exception that ends a protocol task."""

from __future__ import annotations

import asyncio
import logging
import re

import asyncpg
import pytest

from polyport.core.db import Db
from polyport.core.errors import Malformed, StatementRefused, StorageUnavailable
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


async def test_statement_errors_are_translated(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 28: no asyncpg exception leaves core.  A refused statement is
    # StatementRefused (storage_unavailable on every protocol), the driver's
    # error its cause; the client's message has an error id, not the server's
    # text, and the log line with that id has the text.
    pool = await asyncpg.create_pool(asyncpg_dsn(db_url), min_size=1, max_size=1)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(StatementRefused) as refused:
            await Db(pool).fetch("SELECT * FROM no_such_table")
        assert isinstance(refused.value.__cause__, asyncpg.UndefinedTableError)
        assert refused.value.sqlstate == "42P01"
        assert refused.value.code == "storage_unavailable"
        assert "no_such_table" not in refused.value.message
        found = re.search(r"error id ([0-9a-f]{8})", refused.value.message)
        assert found, refused.value.message
        assert any(found.group(1) in r.getMessage() and "no_such_table" in r.getMessage()
                   for r in caplog.records)
        # Inside a transaction too, and a data exception is the caller's: malformed.
        with pytest.raises(Malformed, match="error id"):
            async with Db(pool).acquire() as conn:
                await conn.fetchval("SELECT 'not a number'::int")
    finally:
        pool.terminate()
