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

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from polyport.core.binders import fold_document, to_jsonable
from polyport.core.bodies import body_document
from polyport.core.pipeline_db import (
    BINDER_COLUMNS,
    BINDER_STAGING_TABLE,
    Pg,
    PipelineError,
    binder_where,
    swap_binder,
)
from polyport.pipeline.db import jdbc_target
from polyport.pipeline.progress import Progress
from polyport.pipeline.source import default_partitions, read_events

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
        binder = pg.binder(name)
        if binder is None:
            raise PipelineError(f"no binder named {name!r}")
        pg.clear_binder_staging(name)
        head = pg.head()
        n = partitions or default_partitions(spark, head)
        # The rows Spark will read: the progress display's total.
        expected = pg.count_binder_events(binder, head)
        progress.phase(
            "fold",
            f"positions 1..{head} of context {binder.context!r} ({expected:,} events), streams "
            f"{binder.stream_prefix!r}*, in {n} JDBC partitions; {binder.fold} per stream "
            "-> pipeline_binder_staging",
            total=expected,
        )
        events = read_events(
            spark, target, columns=BINDER_COLUMNS, after=0, through=head, partitions=n,
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
            .option("dbtable", BINDER_STAGING_TABLE)
            .option("batchsize", 5000)
            .mode("append")
            .save()
        )
        rows_read = int(read.get["rows"])
        progress.phase("swap", "the staged documents replace the binder's")
        staged = pg.call(swap_binder, binder, head)
        seconds = progress.elapsed()
        progress.phase(
            "done",
            f"{rows_read:,} rows read, {staged:,} documents written, binder position "
            f"{head} ({seconds:.1f} s)"
        )
        return RebuildResult(name, head, rows_read, staged, seconds)
