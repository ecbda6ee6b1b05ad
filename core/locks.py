"""Consumer-group ownership across gateway processes: PostgreSQL advisory locks.

Session-level advisory locks belong to the connection that took them, so every
group lock of this process lives on one dedicated connection (a pooled
connection would drop its locks when returned, or hand them to another
borrower).  Closing that connection releases every lock it holds, which is
also what happens when the process dies.
"""

from __future__ import annotations

import asyncio

import asyncpg

from polyport.core import sql


class GroupLocks:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None
        # One statement at a time on the shared connection.
        self._mutex = asyncio.Lock()

    async def try_acquire(self, context: str, group: str) -> bool:
        """Take the lock of ``group`` in ``context`` if no other session
        holds it; never waits.  Keyed by both: a group name is the context's."""
        async with self._mutex:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self._dsn)
            return bool(await self._conn.fetchval(sql.TRY_GROUP_LOCK, context, group))

    async def release(self, context: str, group: str) -> None:
        async with self._mutex:
            # A lost connection already released everything it held.
            if self._conn is not None and not self._conn.is_closed():
                await self._conn.fetchval(sql.RELEASE_GROUP_LOCK, context, group)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
