"""Checks that need no Spark, run before Spark starts (a JVM takes 15–30 s
to come up): the database answers, the job is not running elsewhere, the
binder exists, and there is something new to do.  A job with nothing to do
answers in about the time PostgreSQL takes.

No pyspark here: ``polyport pipeline`` imports this before deciding whether
Spark is needed at all.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from polyport.core.pipeline_db import STATS_JOB, Pg, PipelineError, export_job


def local_export_uri(out_dir: str) -> str | None:
    """The URI Hadoop qualifies a local ``--out`` to (``file:/abs/path``), or
    None for other filesystems (hdfs:, s3a:, …), which only Spark can resolve.
    A wrong guess is harmless: a job name never run has checkpoint 0, so the
    check sends the run on to Spark."""
    parts = urlsplit(out_dir)
    if parts.scheme and parts.scheme != "file":
        return None
    path = parts.path if parts.scheme else out_dir
    if parts.scheme and parts.netloc:  # file://host/path: leave it to Hadoop
        return None
    return "file:" + os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _connect(database_url: str) -> Pg:
    try:
        return Pg(database_url)
    except OSError as exc:
        raise PipelineError(f"the database is unreachable: {exc}") from exc


def nothing_to_do(
    action: str,
    database_url: str,
    *,
    out_dir: str | None = None,
    full: bool = False,
    binder: str | None = None,
) -> str | None:
    """The answer when the job has nothing to do (then Spark need not start),
    else None.  Raises :class:`PipelineError` when the job cannot run
    (:class:`~polyport.pipeline.db.PipelineBusy` when another run holds its
    lock).  The lock is only tried here: the job takes it again in Spark."""
    with _connect(database_url) as pg:
        if action == "rebuild-binder":
            assert binder is not None
            pg.lock_job(f"binder:{binder}")
            if pg.binder(binder) is None:
                raise PipelineError(f"no binder named {binder!r}")
            return None  # a rebuild always reads the whole log
        if action == "stats":
            pg.lock_job(STATS_JOB)
            # What the Spark job does first, also on its own "nothing new" path.
            pg.clear_stats_staging()
            checkpoint, _pending = pg.checkpoint(STATS_JOB)
            start = 0 if full else checkpoint
            if pg.head() <= start:
                return f"nothing new: event_stats counts every event up to position {start}"
            return None
        assert action == "export" and out_dir is not None
        uri = local_export_uri(out_dir)
        if uri is None:
            return None
        job = export_job(uri)
        pg.lock_job(job)
        checkpoint, pending = pg.checkpoint(job)
        # A pending mark means files of an interrupted run to remove: Spark's
        # filesystem does that.
        if pending is None and pg.head() <= checkpoint:
            return f"nothing new: {uri} holds every event up to position {checkpoint}"
        return None
