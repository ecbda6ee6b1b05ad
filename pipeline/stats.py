"""``polyport pipeline stats``: events and body bytes per context, stream
category (the stream name up to its first ``-``), type and hour (UTC), in
``event_stats`` for ``/status`` and the status page.

Incremental and exactly once: Spark aggregates (checkpoint, high-water mark]
into ``pipeline_stats_staging``; one PostgreSQL transaction then adds the
staged counts to ``event_stats`` and advances the checkpoint, or does
neither.  ``full`` recomputes everything from position 0 in that transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from polyport.core.pipeline_db import (
    STATS_COLUMNS,
    STATS_JOB,
    STATS_STAGING_TABLE,
    Pg,
    merge_stats,
)
from polyport.pipeline.db import jdbc_target
from polyport.pipeline.progress import Progress
from polyport.pipeline.source import default_partitions, read_events

JOB = STATS_JOB
WRITE_PARTITIONS = 4


@dataclass(frozen=True, slots=True)
class StatsResult:
    first: int  # first position counted (0 when nothing was new)
    last: int  # the new checkpoint
    events: int
    rows: int  # (context, category, type, hour) rows written to staging
    seconds: float


def compute_stats(
    spark: SparkSession,
    database_url: str,
    *,
    full: bool = False,
    partitions: int | None = None,
) -> StatsResult:
    target = jdbc_target(database_url)
    with Pg(database_url) as pg, Progress(spark, "stats") as progress:
        pg.lock_job(JOB)
        pg.clear_stats_staging()
        checkpoint, _pending = pg.checkpoint(JOB)
        start = 0 if full else checkpoint
        head = pg.head()
        if head <= start:
            progress.say(f"nothing new: event_stats counts every event up to position {start}")
            return StatsResult(0, checkpoint, 0, 0, progress.elapsed())
        n = partitions or default_partitions(spark, head - start)
        expected = pg.count_range(start, head)
        progress.phase(
            "aggregate",
            f"positions {start + 1}..{head} ({expected:,} events) in {n} JDBC partitions, "
            "by context, category, type and hour -> pipeline_stats_staging",
            total=expected,
        )
        read = Observation("stats-read")
        events = read_events(
            spark, target, columns=STATS_COLUMNS, after=start, through=head, partitions=n
        ).observe(read, F.count(F.lit(1)).alias("rows"))
        hourly = events.groupBy(
            "context",
            F.substring_index("stream", "-", 1).alias("category"),
            "type",
            F.date_trunc("hour", "recorded_at").alias("hour"),
        ).agg(F.count(F.lit(1)).alias("events"), F.sum("bytes").alias("bytes"))
        written = Observation("stats-written")
        (
            hourly.observe(written, F.count(F.lit(1)).alias("rows"))
            .coalesce(WRITE_PARTITIONS)
            .write.format("jdbc")
            .options(**target.options())
            .option("dbtable", STATS_STAGING_TABLE)
            .option("batchsize", 5000)
            .mode("append")
            .save()
        )
        rows_read = int(read.get["rows"])
        rows = int(written.get["rows"])
        progress.phase("merge", f"{rows:,} hourly rows into event_stats")
        pg.call(merge_stats, checkpoint, start, head, full)
        seconds = progress.elapsed()
        progress.phase(
            "done",
            f"positions {start + 1}..{head}, {rows_read:,} rows read, {rows:,} rows "
            f"written, checkpoint {checkpoint} -> {head} ({seconds:.1f} s)"
        )
        return StatsResult(start + 1, head, rows_read, rows, seconds)
