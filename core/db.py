"""The pool that request paths use: asyncpg's, with a lost connection or a
stopping server raised as :class:`StorageUnavailable`.

Without it an ``asyncpg`` exception escapes the core's error model, and a
protocol session that handles only ``PolyportError`` (as every adapter does)
is ended by it: during a PostgreSQL restart a segment reader's read task died
this way, and that connection's later reads were never answered.  Statement
errors on a healthy connection (a unique violation, say) are not translated:
the callers that expect them still catch them by type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from polyport.core.errors import StorageUnavailable
from polyport.core.retry import CONNECTION_LOST


def _unavailable(exc: BaseException) -> StorageUnavailable:
    return StorageUnavailable(f"the database connection failed ({exc}); retry shortly")


class Db:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        try:
            rows: list[asyncpg.Record] = await self.pool.fetch(query, *args)
        except CONNECTION_LOST as exc:
            raise _unavailable(exc) from exc
        return rows

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        try:
            return await self.pool.fetchrow(query, *args)
        except CONNECTION_LOST as exc:
            raise _unavailable(exc) from exc

    async def fetchval(self, query: str, *args: Any) -> Any:
        try:
            return await self.pool.fetchval(query, *args)
        except CONNECTION_LOST as exc:
            raise _unavailable(exc) from exc

    async def execute(self, query: str, *args: Any) -> str:
        try:
            status: str = await self.pool.execute(query, *args)
        except CONNECTION_LOST as exc:
            raise _unavailable(exc) from exc
        return status

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; a lost connection inside the block is raised
        as StorageUnavailable too."""
        try:
            async with self.pool.acquire() as conn:
                yield conn
        except CONNECTION_LOST as exc:
            raise _unavailable(exc) from exc
