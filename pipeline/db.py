"""The pipeline's side of PostgreSQL: the JDBC address Spark reads through,
and one synchronous connection the driver keeps for the whole job (its
advisory lock, checkpoints and the final swap transactions).

No pyspark here: the CLI imports this module before Spark starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import asyncpg

from polyport.core import migrate
from polyport.core.sql import HEAD_POSITION

T = TypeVar("T")


class PipelineError(RuntimeError):
    """A pipeline job cannot run or could not finish; the message says why."""


class PipelineBusy(PipelineError):
    pass


@dataclass(frozen=True, slots=True)
class JdbcTarget:
    """A PostgreSQL URL as Spark's JDBC source wants it: URL plus credentials."""

    url: str
    user: str | None
    password: str | None

    def options(self) -> dict[str, str]:
        opts = {"url": self.url, "driver": "org.postgresql.Driver"}
        if self.user is not None:
            opts["user"] = self.user
        if self.password is not None:
            opts["password"] = self.password
        return opts


def jdbc_target(database_url: str) -> JdbcTarget:
    """``postgresql://user:pass@host:port/db?sslmode=…`` → ``jdbc:postgresql://host:port/db``
    with user and password apart (Spark needs them as options, and they must
    not end up in logs as part of a URL).  Query parameters (sslmode,
    application_name, …) are passed on: pgjdbc knows the libpq names."""
    parts = urlsplit(migrate.asyncpg_dsn(database_url))
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    if not parts.hostname:
        raise PipelineError(
            "Spark reaches PostgreSQL over TCP (JDBC) and this database URL names no host "
            "(a unix socket?): give --database-url postgresql://user:password@host:port/db"
        )
    params.pop("host", None)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = f":{parts.port}" if parts.port else ""
    database = parts.path.lstrip("/") or unquote(parts.username or "")
    query = f"?{urlencode(params)}" if params else ""
    return JdbcTarget(
        url=f"jdbc:postgresql://{host}{port}/{database}{query}",
        user=unquote(parts.username) if parts.username else params.get("user"),
        password=unquote(parts.password) if parts.password else params.get("password"),
    )


def sql_text(value: str) -> str:
    """A PostgreSQL string literal, for the SQL text Spark's JDBC source sends
    (it cannot bind parameters).  The E'' form means the same whatever
    ``standard_conforming_strings`` says."""
    if "\x00" in value:
        raise PipelineError("text with a NUL character cannot be used in a query")
    return "E'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_text_array(values: Iterable[str]) -> str:
    return "ARRAY[" + ", ".join(sql_text(v) for v in values) + "]::text[]"


# --- checkpoints --------------------------------------------------------------

GET_CHECKPOINT = "SELECT position, pending_position FROM pipeline_checkpoints WHERE job = $1"

SET_PENDING = """
INSERT INTO pipeline_checkpoints (job, position, updated_at, pending_position)
VALUES ($1, $2, now(), $3)
ON CONFLICT (job) DO UPDATE SET pending_position = EXCLUDED.pending_position, updated_at = now()
"""

# Compare-and-set: the checkpoint moves only from the position this run started at.
ADVANCE_CHECKPOINT = """
INSERT INTO pipeline_checkpoints (job, position, updated_at, pending_position)
VALUES ($1, $3, now(), NULL)
ON CONFLICT (job) DO UPDATE
SET position = EXCLUDED.position, pending_position = NULL, updated_at = now()
WHERE pipeline_checkpoints.position = $2
RETURNING position
"""

LOCK_CHECKPOINT = "SELECT position FROM pipeline_checkpoints WHERE job = $1 FOR UPDATE"

COUNT_RANGE = "SELECT count(*) FROM events WHERE position > $1 AND position <= $2"

TRY_JOB_LOCK = "SELECT pg_try_advisory_lock(hashtextextended($1, 9173))"

# The stats job: its checkpoint name and staging table (here, not in
# pipeline.stats, so the checks before Spark can use them without pyspark).
STATS_JOB = "stats"
CLEAR_STATS_STAGING = "DELETE FROM pipeline_stats_staging"


def export_job(uri: str) -> str:
    """The export job's name (checkpoint and lock) for an output directory URI."""
    return f"export:{uri}"


class Pg:
    """One asyncpg connection driven synchronously from the Spark driver.

    It lives as long as the job: the job's advisory lock is a session lock on
    it, so a crash of the driver releases the lock with the connection."""

    def __init__(self, database_url: str) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self.conn: asyncpg.Connection = self.run(
                asyncpg.connect(migrate.asyncpg_dsn(database_url))
            )
        except BaseException:
            self._loop.close()
            raise

    def run(self, aw: Awaitable[T]) -> T:
        return self._loop.run_until_complete(aw)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(conn, *args)`` on this connection."""
        return self.run(fn(self.conn, *args))

    def fetchval(self, query: str, *args: Any) -> Any:
        return self.run(self.conn.fetchval(query, *args))

    def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return self.run(self.conn.fetchrow(query, *args))

    def execute(self, query: str, *args: Any) -> str:
        return self.run(self.conn.execute(query, *args))

    def close(self) -> None:
        try:
            self.run(self.conn.close())
        finally:
            self._loop.close()

    def __enter__(self) -> Pg:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- job plumbing -----------------------------------------------------------

    def lock_job(self, job: str) -> None:
        """One run of a job at a time, across processes and machines."""
        if not self.fetchval(TRY_JOB_LOCK, f"polyport.pipeline:{job}"):
            raise PipelineBusy(f"another run of pipeline job {job!r} is in progress")

    def head(self) -> int:
        """The high-water mark: every position at or below it is committed."""
        value: int = self.fetchval(HEAD_POSITION)
        return value

    def checkpoint(self, job: str) -> tuple[int, int | None]:
        """(position, pending_position); (0, None) for a job never run."""
        row = self.fetchrow(GET_CHECKPOINT, job)
        if row is None:
            return 0, None
        return row["position"], row["pending_position"]

    def set_pending(self, job: str, position: int, pending: int | None) -> None:
        self.execute(SET_PENDING, job, position, pending)

    def advance(self, job: str, start: int, end: int) -> None:
        self.call(advance_in, job, start, end)


async def advance_in(conn: asyncpg.Connection, job: str, start: int, end: int) -> None:
    """The checkpoint's compare-and-set inside a caller's transaction."""
    if await conn.fetchval(ADVANCE_CHECKPOINT, job, start, end) is None:
        raise PipelineError(f"checkpoint of {job!r} moved away from {start} while this run worked")
