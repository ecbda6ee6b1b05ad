"""The Spark pipeline's side of PostgreSQL (``pipeline/`` holds no SQL and
no driver): every statement and SQL fragment it uses, by name; the SQL text
Spark's JDBC source sends, which cannot bind parameters and so is built here
with :func:`sql_text`; the one synchronous connection the Spark driver keeps
for a whole job (:class:`Pg`: its advisory lock, checkpoints) and the
transactions that end a job.

Beside :mod:`core.sql` rather than in it: only ``polyport pipeline`` runs
these, against the pipeline's staging tables (``migrations/``).  No pyspark
here: the CLI's checks before Spark starts use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import asyncpg

from polyport.core import migrate, sql
from polyport.core.binders import BinderSpec, spec_from_row

T = TypeVar("T")


class PipelineError(RuntimeError):
    """A pipeline job cannot run or could not finish; the message says why."""


class PipelineBusy(PipelineError):
    pass


# --- checkpoints and the job lock ------------------------------------------------

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

# The stats job: its checkpoint name.
STATS_JOB = "stats"

# --- stats ------------------------------------------------------------------------

STATS_COLUMNS = "position, context, stream, type, recorded_at, octet_length(body)::bigint AS bytes"
STATS_STAGING_TABLE = "pipeline_stats_staging"
CLEAR_STATS_STAGING = "DELETE FROM pipeline_stats_staging"
STAGED_STATS_EVENTS = "SELECT coalesce(sum(events), 0)::bigint FROM pipeline_stats_staging"
CLEAR_EVENT_STATS = "DELETE FROM event_stats"
MERGE_STATS = """
INSERT INTO event_stats (context, category, type, hour, events, bytes)
SELECT context, category, type, hour, sum(events), sum(bytes)
FROM pipeline_stats_staging GROUP BY context, category, type, hour
ON CONFLICT (context, category, type, hour) DO UPDATE
SET events = event_stats.events + EXCLUDED.events, bytes = event_stats.bytes + EXCLUDED.bytes
"""

# --- export -----------------------------------------------------------------------

EXPORT_COLUMNS = (
    "position, event_id::text AS event_id, context, stream, version, type, "
    "headers::text AS headers, body, content_type, client_time, recorded_at, origin, "
    "segment_offset, to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS date"
)

# --- binder rebuild ---------------------------------------------------------------

BINDER_COLUMNS = "position, stream, content_type, body"
BINDER_STAGING_TABLE = "pipeline_binder_staging"
CLEAR_BINDER_STAGING = "DELETE FROM pipeline_binder_staging WHERE binder = $1"
LOCK_BINDER = """
SELECT name, context, stream_prefix, types, fold, position FROM binders
WHERE name = $1 FOR UPDATE
"""
BINDER_STAGED = "SELECT count(*) FROM pipeline_binder_staging WHERE binder = $1"
BINDER_SWAP_IN = """
INSERT INTO binder_documents (binder, key, document, position)
SELECT binder, key, document::jsonb, position FROM pipeline_binder_staging WHERE binder = $1
"""


def sql_text(value: str) -> str:
    """A PostgreSQL string literal, for the SQL text Spark's JDBC source sends
    (it cannot bind parameters).  The E'' form means the same whatever
    ``standard_conforming_strings`` says."""
    if "\x00" in value:
        raise PipelineError("text with a NUL character cannot be used in a query")
    return "E'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_text_array(values: Iterable[str]) -> str:
    return "ARRAY[" + ", ".join(sql_text(v) for v in values) + "]::text[]"


def binder_where(binder: BinderSpec) -> str:
    """The binder's selector as SQL over the events table."""
    parts = [f"context = {sql_text(binder.context)}"]
    if binder.stream_prefix:
        parts.append(f"starts_with(stream, {sql_text(binder.stream_prefix)})")
    if binder.types:  # an empty list selects every type, as in the projector
        parts.append(f"type = ANY({sql_text_array(binder.types)})")
    return " AND ".join(parts)


def count_binder_events(binder: BinderSpec) -> str:
    """The events a rebuild of ``binder`` reads up to the head ($1)."""
    return f"SELECT count(*) FROM events WHERE position <= $1 AND {binder_where(binder)}"


def events_query(columns: str, after: int, through: int, where: str = "") -> str:
    """Spark's JDBC ``dbtable``: events with ``after < position <= through``
    (and ``where``, SQL over the events table), ``columns`` as select-list items."""
    condition = f"position > {int(after)} AND position <= {int(through)}"
    if where:
        condition += f" AND ({where})"
    return f"(SELECT {columns} FROM events WHERE {condition}) AS e"


def export_job(uri: str) -> str:
    """The export job's name (checkpoint and lock) for an output directory URI."""
    return f"export:{uri}"


# --- the job's connection ---------------------------------------------------------


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
        status: str = self.run(self.conn.execute(query, *args))
        return status

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
        value: int = self.fetchval(sql.HEAD_POSITION)
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

    def count_range(self, start: int, end: int) -> int:
        """Events in (start, end]."""
        return int(self.fetchval(COUNT_RANGE, start, end))

    def clear_stats_staging(self) -> None:
        self.execute(CLEAR_STATS_STAGING)

    def binder(self, name: str) -> BinderSpec | None:
        row = self.fetchrow(sql.GET_BINDER, name)
        return None if row is None else spec_from_row(row)

    def clear_binder_staging(self, name: str) -> None:
        self.execute(CLEAR_BINDER_STAGING, name)

    def count_binder_events(self, binder: BinderSpec, head: int) -> int:
        """Events a rebuild of ``binder`` reads up to ``head``."""
        return int(self.fetchval(count_binder_events(binder), head))


async def advance_in(conn: asyncpg.Connection, job: str, start: int, end: int) -> None:
    """The checkpoint's compare-and-set inside a caller's transaction."""
    if await conn.fetchval(ADVANCE_CHECKPOINT, job, start, end) is None:
        raise PipelineError(f"checkpoint of {job!r} moved away from {start} while this run worked")


async def merge_stats(
    conn: asyncpg.Connection, checkpoint: int, start: int, head: int, full: bool
) -> None:
    """The staged counts of (start, head] into event_stats and the stats
    checkpoint from ``checkpoint`` to ``head``: one transaction, all or nothing."""
    async with conn.transaction():
        await conn.fetchval(LOCK_CHECKPOINT, STATS_JOB)
        staged = await conn.fetchval(STAGED_STATS_EVENTS)
        expected = await conn.fetchval(COUNT_RANGE, start, head)
        if staged != expected:
            # e.g. a JDBC write task that committed and was then retried
            raise PipelineError(
                f"staged statistics count {staged} events where ({start}, {head}] has "
                f"{expected}; nothing was changed, run stats again"
            )
        if full:
            await conn.execute(CLEAR_EVENT_STATS)
        await conn.execute(MERGE_STATS)
        await advance_in(conn, STATS_JOB, checkpoint, head)
        await conn.execute(CLEAR_STATS_STAGING)


async def swap_binder(conn: asyncpg.Connection, binder: BinderSpec, head: int) -> int:
    """The staged documents replace ``binder``'s, its position set to
    ``head``, in one transaction holding the binder row the projector locks
    too; the number of documents."""
    async with conn.transaction():
        row = await conn.fetchrow(LOCK_BINDER, binder.name)
        if row is None or spec_from_row(row).definition != binder.definition:
            raise PipelineError(
                f"binder {binder.name!r} was dropped or redefined during the rebuild; "
                "nothing was changed"
            )
        staged: int = await conn.fetchval(BINDER_STAGED, binder.name)
        await conn.execute(sql.CLEAR_BINDER_DOCUMENTS, binder.name)
        await conn.execute(BINDER_SWAP_IN, binder.name)
        await conn.execute(sql.SET_BINDER_POSITION, binder.name, head)
        await conn.execute(CLEAR_BINDER_STAGING, binder.name)
        return staged
