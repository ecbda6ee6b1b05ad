"""Reading the event log through Spark's JDBC source, partitioned on the
global position and bounded by a high-water mark fixed before the read."""

from __future__ import annotations

import math

from pyspark.sql import DataFrame, SparkSession

from polyport.core.pipeline_db import events_query
from polyport.pipeline.db import JdbcTarget

# Rows each JDBC partition aims for, and rows per round trip inside one.
ROWS_PER_PARTITION = 25_000
FETCH_SIZE = 10_000


def default_partitions(spark: SparkSession, rows: int) -> int:
    """Enough partitions to keep every core busy, none smaller than it needs."""
    cores = spark.sparkContext.defaultParallelism
    return max(1, min(math.ceil(rows / ROWS_PER_PARTITION), 4 * cores))


def read_events(
    spark: SparkSession,
    target: JdbcTarget,
    *,
    columns: str,
    after: int,
    through: int,
    partitions: int,
    where: str = "",
) -> DataFrame:
    """Events with ``after < position <= through`` (and ``where``, SQL over
    the events table), ``columns`` as SQL select-list items.

    Positions are gapless, so equal position strides are equal row counts:
    each of the ``partitions`` tasks reads one contiguous range over the
    primary key."""
    reader = (
        spark.read.format("jdbc")
        .options(**target.options())
        .option("dbtable", events_query(columns, after, through, where))
        .option("fetchsize", FETCH_SIZE)
    )
    if partitions > 1 and through - after > 1:
        reader = (
            reader.option("partitionColumn", "position")
            .option("lowerBound", int(after) + 1)
            .option("upperBound", int(through) + 1)
            .option("numPartitions", partitions)
        )
    return reader.load()
