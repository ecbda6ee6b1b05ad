"""Consumer-group ownership across gateway processes: PostgreSQL advisory locks.

Session-level advisory locks belong to the connection that took them, so every
group lock of this process lives on one dedicated connection (a pooled
connection would drop its locks when returned, or hand them to another
borrower).  Closing that connection releases every lock it holds, which is
also what happens when the process dies.

So does losing it: then another process may take the groups over at once.
Every new connection starts a new ``generation``; a group owns its lock only
while the generation it took it in is current and its connection open
(:meth:`GroupLocks.holds`), and ``on_lost`` callbacks run as soon as asyncpg
sees the connection end, so owners stop delivering without waiting for their
next statement.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from polyport.core import sql

log = logging.getLogger("polyport.groups")


class GroupLocks:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None
        # One statement at a time on the shared connection.
        self._mutex = asyncio.Lock()
        self.generation = 0
        # Called (without awaiting) when the lock connection ends: every lock
        # taken on it is gone.
        self.on_lost: list[Callable[[], None]] = []

    async def try_acquire(self, group: str) -> bool:
        """Take ``group``'s lock if no other session holds it; never waits."""
        async with self._mutex:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self._dsn, timeout=10)
                self.generation += 1
                self._conn.add_termination_listener(self._terminated)
            try:
                return bool(await self._conn.fetchval(sql.TRY_GROUP_LOCK, group))
            except Exception:
                # Unusable or gone (an InternalClientError leaves it open but
                # stuck): end it, which ends every lock it held, and say so.
                self._conn.terminate()
                self._terminated(self._conn)
                raise

    def holds(self, generation: int) -> bool:
        """Whether locks taken in ``generation`` are still held."""
        conn = self._conn
        return generation == self.generation and conn is not None and not conn.is_closed()

    def _terminated(self, conn: object) -> None:
        if conn is not self._conn:
            return
        log.warning("group lock connection lost: this process no longer owns its groups")
        self.generation += 1
        for cb in list(self.on_lost):
            cb()

    async def release(self, group: str) -> None:
        async with self._mutex:
            # A lost connection already released everything it held.
            if self._conn is not None and not self._conn.is_closed():
                await self._conn.fetchval(sql.RELEASE_GROUP_LOCK, group)

    async def close(self) -> None:
        conn, self._conn = self._conn, None  # a deliberate close is no loss
        if conn is not None:
            await conn.close()
