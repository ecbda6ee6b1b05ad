"""``polyport pipeline export --out DIR``: the event log as Parquet,
partitioned by context and date (UTC), incrementally and exactly once.

A run:

1. takes the job's advisory lock (one run per output directory at a time)
   and reads its checkpoint C (every event at or below it is published);
2. fixes the high-water mark H = ``log_head.last_position``;
3. reads (C, H] through Spark's JDBC source, partitioned on position, and
   writes it to ``DIR/_staging`` (Spark and Hive skip ``_`` directories);
4. checks the staged row count against PostgreSQL, marks (C, H] pending,
   renames each staged file to ``DIR/context=…/date=…/events-<C+1>-<H>-<n>.parquet``;
5. advances the checkpoint to H (compare-and-set from C), then drops staging.

A crash before 4 leaves only staging, which the next run deletes.  A crash
during or after 4 but before 5 leaves the pending mark: the next run deletes
every published file whose range ends above C (their names say so) and
exports again from C.  So the directory never holds an event twice, and the
checkpoint never passes an event that is not published.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from polyport.core.pipeline_db import EXPORT_COLUMNS, Pg, PipelineError, export_job
from polyport.pipeline.db import jdbc_target
from polyport.pipeline.progress import Progress
from polyport.pipeline.source import default_partitions, read_events

STAGING = "_staging"
FILE_NAME = re.compile(r"^events-(\d+)-(\d+)-(\d+)\.parquet$")

# Failure injection for tests: raise at a named point of the run
# (after-staging, mid-publish, before-checkpoint), leaving everything as a
# crash there would.
FAULT_ENV = "POLYPORT_PIPELINE_FAULT"

class InjectedFault(PipelineError):
    pass


def _fault(point: str) -> None:
    if os.environ.get(FAULT_ENV) == point:
        raise InjectedFault(f"injected fault at {point} ({FAULT_ENV})")


def file_name(first: int, last: int, seq: int) -> str:
    return f"events-{first:020d}-{last:020d}-{seq:05d}.parquet"


@dataclass(frozen=True, slots=True)
class ExportResult:
    job: str
    first: int  # first position exported (0 when nothing was new)
    last: int  # the high-water mark = the new checkpoint
    rows: int
    files: int
    seconds: float
    removed: int  # files of an unfinished earlier run deleted first


class HadoopDir:
    """A directory through Hadoop's FileSystem API, so that ``--out`` may be
    any filesystem Spark writes to (file:, hdfs:, …)."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark._jvm
        assert jvm is not None and spark._jsc is not None
        self._path_cls = jvm.org.apache.hadoop.fs.Path
        path = self._path_cls(root)
        self.fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        self.root = self.fs.makeQualified(path)
        self.staging = self.path(self.root, STAGING)

    @property
    def uri(self) -> str:
        return str(self.root.toString())

    def path(self, parent: Any, name: str) -> Any:
        return self._path_cls(parent, name)

    def files(self, under: Any) -> list[Any]:
        if not self.fs.exists(under):
            return []
        found = []
        it = self.fs.listFiles(under, True)
        while it.hasNext():
            found.append(it.next().getPath())
        return found

    def parquet_files(self, under: Any) -> list[str]:
        """The Parquet files under a directory, as sorted path strings."""
        return sorted(
            str(p.toString()) for p in self.files(under) if str(p.getName()).endswith(".parquet")
        )

    def path_of(self, name: str) -> Any:
        return self._path_cls(name)

    def delete(self, path: Any, recursive: bool = False) -> None:
        if self.fs.exists(path) and not self.fs.delete(path, recursive):
            raise PipelineError(f"could not delete {path.toString()}")

    def move(self, src: Any, dst: Any) -> None:
        self.fs.mkdirs(dst.getParent())
        if not self.fs.rename(src, dst):
            raise PipelineError(f"could not rename {src.toString()} to {dst.toString()}")


def _published(out: HadoopDir) -> list[tuple[Any, int, int]]:
    """(path, first, last) of every published file."""
    found = []
    staging = str(out.staging.toString()) + "/"
    for p in out.files(out.root):
        if str(p.toString()).startswith(staging):
            continue
        m = FILE_NAME.match(str(p.getName()))
        if m:
            found.append((p, int(m.group(1)), int(m.group(2))))
    return found


def unpublish_after(out: HadoopDir, checkpoint: int) -> int:
    """Delete the files of runs that never reached their checkpoint."""
    removed = 0
    for path, first, last in _published(out):
        if last <= checkpoint:
            continue
        if first <= checkpoint:
            raise PipelineError(
                f"the checkpoint ({checkpoint}) falls inside {path.toString()}: it was reset "
                "to a position that is not a run boundary; reset it to one, or export to a "
                "new directory"
            )
        out.delete(path)
        removed += 1
    return removed


def publish(out: HadoopDir, first: int, last: int, staged: list[str]) -> int:
    """Move the staged Parquet files into their partitions, named by range."""
    for seq, name in enumerate(staged):
        if seq == len(staged) // 2:
            _fault("mid-publish")
        src = out.path_of(name)
        date_dir = src.getParent()
        context_dir = date_dir.getParent()
        dst = out.path(
            out.path(out.path(out.root, str(context_dir.getName())), str(date_dir.getName())),
            file_name(first, last, seq),
        )
        out.move(src, dst)
    return len(staged)


def export_events(
    spark: SparkSession,
    database_url: str,
    out_dir: str,
    *,
    partitions: int | None = None,
) -> ExportResult:
    target = jdbc_target(database_url)
    out = HadoopDir(spark, out_dir)
    job = export_job(out.uri)
    with Pg(database_url) as pg, Progress(spark, "export") as progress:
        pg.lock_job(job)
        checkpoint, pending = pg.checkpoint(job)
        out.delete(out.staging, recursive=True)
        removed = 0
        if pending is not None:
            removed = unpublish_after(out, checkpoint)
            pg.set_pending(job, checkpoint, None)
            progress.say(
                f"the previous run stopped while publishing ({checkpoint}, {pending}]: "
                f"removed the {removed} files it had published"
            )
        head = pg.head()
        if head <= checkpoint:
            progress.say(f"nothing new: {out.uri} holds every event up to position {checkpoint}")
            return ExportResult(job, 0, checkpoint, 0, 0, progress.elapsed(), removed)

        expected = pg.count_range(checkpoint, head)
        n = partitions or default_partitions(spark, expected)
        progress.phase(
            "export to staging",
            f"positions {checkpoint + 1}..{head} ({expected:,} events) in {n} JDBC partitions "
            f"-> Parquet in {out.staging.toString()}",
            total=expected,
        )
        read = Observation("export-read")
        events = read_events(
            spark, target, columns=EXPORT_COLUMNS, after=checkpoint, through=head, partitions=n
        ).observe(read, F.count(F.lit(1)).alias("rows"))
        (
            events.sortWithinPartitions("context", "date", "position")
            .write.mode("overwrite")
            .partitionBy("context", "date")
            .parquet(str(out.staging.toString()))
        )
        _fault("after-staging")
        rows_read = int(read.get["rows"])
        progress.phase("verify", "staged rows against PostgreSQL's count")
        staged_files = out.parquet_files(out.staging)
        staged = spark.read.parquet(*staged_files).count() if staged_files else 0
        if staged != expected or rows_read != expected:
            raise PipelineError(
                f"read {rows_read} and staged {staged} rows where ({checkpoint}, {head}] has "
                f"{expected}; nothing was published"
            )

        progress.phase("publish", f"{staged:,} rows into {out.uri}")
        pg.set_pending(job, checkpoint, head)
        files = publish(out, checkpoint + 1, head, staged_files)
        _fault("before-checkpoint")
        pg.advance(job, checkpoint, head)
        out.delete(out.staging, recursive=True)

        seconds = progress.elapsed()
        progress.phase(
            "done",
            f"positions {checkpoint + 1}..{head}, {rows_read:,} rows read, {staged:,} rows "
            f"written in {files} files, checkpoint {checkpoint} -> {head} "
            f"({seconds:.1f} s, {staged / max(seconds, 1e-9):,.0f} events/s)"
        )
        return ExportResult(job, checkpoint + 1, head, staged, files, seconds, removed)
