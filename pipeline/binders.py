"""``polyport pipeline rebuild-binder NAME``: a binder's documents recomputed
from the whole log in Spark, then swapped in atomically.

The fold is the live projector's own (``core.binders.fold_document`` over
``core.bodies.body_document`` and ``core.binders.to_jsonable``), run in
Python on the executors over each stream's events in position order, so the
rebuilt binder equals the one the projector keeps.  Spark writes the
documents to ``pipeline_binder_staging``; one transaction, holding the binder
row the projector locks too, replaces the documents and sets the binder's
position to the high-water mark the rebuild read up to.  The projector then
carries on from there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import asyncpg
from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from polyport.core import sql
from polyport.core.binders import BinderSpec, fold_document, spec_from_row, to_jsonable
from polyport.core.bodies import body_document
from polyport.pipeline.db import Pg, PipelineError, jdbc_target, sql_text, sql_text_array
from polyport.pipeline.progress import Progress
from polyport.pipeline.source import default_partitions, read_events

COLUMNS = "position, stream, content_type, body"
STAGING_SCHEMA = StructType(
    [
        StructField("binder", StringType(), False),
        StructField("key", StringType(), False),
        StructField("document", StringType(), False),
        StructField("position", LongType(), False),
        # events folded into the document: counted, not stored
        StructField("events", LongType(), False),
    ]
)
WRITE_PARTITIONS = 4

CLEAR_STAGING = "DELETE FROM pipeline_binder_staging WHERE binder = $1"
LOCK_BINDER = """
SELECT name, context, stream_prefix, types, fold, position FROM binders
WHERE name = $1 FOR UPDATE
"""
STAGED = "SELECT count(*) FROM pipeline_binder_staging WHERE binder = $1"
SWAP_IN = """
INSERT INTO binder_documents (binder, key, document, position)
SELECT binder, key, document::jsonb, position FROM pipeline_binder_staging WHERE binder = $1
"""


def binder_where(binder: BinderSpec) -> str:
    """The binder's selector as SQL over the events table."""
    parts = [f"context = {sql_text(binder.context)}"]
    if binder.stream_prefix:
        parts.append(f"starts_with(stream, {sql_text(binder.stream_prefix)})")
    if binder.types:  # an empty list selects every type, as in the projector
        parts.append(f"type = ANY({sql_text_array(binder.types)})")
    return " AND ".join(parts)


@dataclass(frozen=True, slots=True)
class RebuildResult:
    binder: str
    position: int
    events: int
    documents: int
    seconds: float


def fold_streams(fold: str, binder: str, rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """Rows sorted by (stream, position) → one (binder, key, document JSON,
    last position, events) per stream, folded exactly as the live projector does."""
    key: str | None = None
    doc: dict[str, Any] | None = None
    last = events = 0
    for row in rows:
        if row.stream != key:
            if key is not None:
                yield (binder, key, json.dumps(doc), last, events)
            key, doc, events = row.stream, None, 0
        body = to_jsonable(body_document(row.content_type, bytes(row.body)))
        doc = fold_document(fold, doc, body)
        last = row.position
        events += 1
    if key is not None:
        yield (binder, key, json.dumps(doc), last, events)


async def _swap(conn: asyncpg.Connection, binder: BinderSpec, head: int) -> int:
    async with conn.transaction():
        row = await conn.fetchrow(LOCK_BINDER, binder.name)
        if row is None or spec_from_row(row).definition != binder.definition:
            raise PipelineError(
                f"binder {binder.name!r} was dropped or redefined during the rebuild; "
                "nothing was changed"
            )
        staged: int = await conn.fetchval(STAGED, binder.name)
        await conn.execute(sql.CLEAR_BINDER_DOCUMENTS, binder.name)
        await conn.execute(SWAP_IN, binder.name)
        await conn.execute(sql.SET_BINDER_POSITION, binder.name, head)
        await conn.execute(CLEAR_STAGING, binder.name)
        return staged


def rebuild_binder(
    spark: SparkSession,
    database_url: str,
    name: str,
    *,
    partitions: int | None = None,
) -> RebuildResult:
    target = jdbc_target(database_url)
    with Pg(database_url) as pg, Progress(spark, f"rebuild-binder {name}") as progress:
        pg.lock_job(f"binder:{name}")
        row = pg.fetchrow(sql.GET_BINDER, name)
        if row is None:
            raise PipelineError(f"no binder named {name!r}")
        binder = spec_from_row(row)
        pg.execute(CLEAR_STAGING, name)
        head = pg.head()
        n = partitions or default_partitions(spark, head)
        # The rows Spark will read: the progress display's total.
        expected: int = pg.fetchval(
            f"SELECT count(*) FROM events WHERE position <= $1 AND {binder_where(binder)}", head
        )
        progress.phase(
            "fold",
            f"positions 1..{head} of context {binder.context!r} ({expected:,} events), streams "
            f"{binder.stream_prefix!r}*, in {n} JDBC partitions; {binder.fold} per stream "
            "-> pipeline_binder_staging",
            total=expected,
        )
        events = read_events(
            spark, target, columns=COLUMNS, after=0, through=head, partitions=n,
            where=binder_where(binder),
        )
        ordered = events.repartition("stream").sortWithinPartitions("stream", "position")
        documents = spark.createDataFrame(
            ordered.rdd.mapPartitions(partial(fold_streams, binder.fold, name)), STAGING_SCHEMA
        )
        # Observed on the written DataFrame: an observation behind .rdd never reports.
        read = Observation("rebuild-read")
        (
            documents.observe(read, F.coalesce(F.sum("events"), F.lit(0)).alias("rows"))
            .drop("events")
            .coalesce(WRITE_PARTITIONS)
            .write.format("jdbc")
            .options(**target.options())
            .option("dbtable", "pipeline_binder_staging")
            .option("batchsize", 5000)
            .mode("append")
            .save()
        )
        rows_read = int(read.get["rows"])
        progress.phase("swap", "the staged documents replace the binder's")
        staged = pg.call(_swap, binder, head)
        seconds = progress.elapsed()
        progress.phase(
            "done",
            f"{rows_read:,} rows read, {staged:,} documents written, binder position "
            f"{head} ({seconds:.1f} s)"
        )
        return RebuildResult(name, head, rows_read, staged, seconds)
