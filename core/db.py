"""The pool that request paths use, and the one translation of the driver's
errors into core's (as the eventsourcing library's recorders do): nothing
above ``core/`` sees an ``asyncpg`` exception.

- A lost connection or a stopping server → :class:`StorageUnavailable` with
  the driver's words (they name no data) and "retry shortly".
- A statement the database refused on a healthy connection →
  :class:`StatementRefused` (a ``StorageUnavailable``: on every protocol the
  same canonical code, ``storage_unavailable``), or :class:`Malformed` for a
  data exception (SQLSTATE class 22: the caller's values, which the writer
  reports the same way).  The client gets an error id, never the server's
  text (it may quote another tenant's keys); the log line has both.

Without it an ``asyncpg`` exception escapes the core's error model, and a
protocol session that handles only ``PolyportError`` (as every adapter does)
is ended by it: during a PostgreSQL restart a segment reader's read task died
this way, and that connection's later reads were never answered.  Core code
that expects a particular refusal (a unique violation, a missing table) runs
its statement on the pool itself and catches the driver's type there.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import asyncpg

from polyport.core.errors import (
    Malformed,
    PolyportError,
    StatementRefused,
    StorageUnavailable,
    new_error_id,
)
from polyport.core.retry import CONNECTION_LOST

log = logging.getLogger("polyport.storage")

# What the driver raises: the server's refusals, the client library's own
# failures, and the socket's.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (asyncpg.PostgresError, *CONNECTION_LOST)

# SQLSTATEs that the operator's tools name (gateway/process/fatal.py).
INVALID_PASSWORD = "28P01"
INVALID_AUTHORIZATION_CLASS = "28"
INVALID_CATALOG_NAME = "3D000"
INSUFFICIENT_PRIVILEGE = "42501"
DATA_EXCEPTION_CLASS = "22"


def storage_error(exc: BaseException) -> PolyportError:
    """core's error for a driver error (see the module docstring)."""
    if isinstance(exc, PolyportError):
        return exc
    if not isinstance(exc, asyncpg.PostgresError) or isinstance(exc, CONNECTION_LOST):
        return StorageUnavailable(f"the database connection failed ({exc}); retry shortly")
    eid = new_error_id()
    state = sqlstate(exc) or ""
    log.warning("storage error (error id %s, SQLSTATE %s): %s", eid, state, exc)
    if state.startswith(DATA_EXCEPTION_CLASS):
        return Malformed(f"the database refused the data (error id {eid})")
    return StatementRefused(f"event storage error (error id {eid}); retry shortly",
                            sqlstate=state)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error or of core's translation of one ("" for
    one without); None for anything else."""
    if isinstance(exc, StatementRefused):
        return exc.sqlstate
    if isinstance(exc, asyncpg.PostgresError):
        return str(getattr(exc, "sqlstate", None) or "")
    return None


@contextmanager
def driver_errors() -> Iterator[None]:
    """Raise a driver error inside the block as core's error."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise storage_error(exc) from exc


class Db:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        with driver_errors():
            rows: list[asyncpg.Record] = await self.pool.fetch(query, *args)
        return rows

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        with driver_errors():
            return await self.pool.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        with driver_errors():
            return await self.pool.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        with driver_errors():
            status: str = await self.pool.execute(query, *args)
        return status

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; a driver error inside the block is raised as
        core's error too."""
        with driver_errors():
            async with self.pool.acquire() as conn:
                yield conn
