"""``polyport pipeline export|stats|rebuild-binder``: the command-line side.

Imports nothing from pyspark at module level, so ``polyport`` runs without
the optional ``pipeline`` extra; the jobs import it when they run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from polyport.core import migrate
from polyport.gateway.process.database import database_url
from polyport.pipeline.db import PipelineError
from polyport.pipeline.preflight import nothing_to_do
from polyport.pipeline.session import (
    SparkSettings,
    check_submitted_master,
    discard_spark_log,
    parse_conf,
    spark_log,
)

if TYPE_CHECKING:
    from polyport.gateway.config import GatewayConfig


def _spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--master",
        help="Spark master URL (e.g. spark://host:7077); default: spark-submit's, else local[*]",
    )
    p.add_argument(
        "--jdbc-jar",
        help="PostgreSQL JDBC driver jar (default: $POLYPORT_JDBC_JAR, ~/.m2, "
        "/usr/share/java/postgresql.jar, else Maven Central)",
    )
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark configuration property (repeat)",
    )
    p.add_argument(
        "--partitions", type=int,
        help="JDBC read partitions (default: by row count and cores)",
    )
    p.add_argument(
        "--verbose", action="store_true",
        help="show Spark's own console output (start-up, log4j warnings, stage bars)",
    )


P = TypeVar("P", bound=argparse.ArgumentParser)


def add_pipeline_parser(
    sub: argparse._SubParsersAction[P],
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Generic in the parser class: the gateway CLI's subparsers are its own
    ArgumentParser subclass (one-line errors)."""
    pipeline = sub.add_parser("pipeline", help="Spark jobs over the event log")
    jobs = pipeline.add_subparsers(dest="action", required=True)
    export = jobs.add_parser("export", help="incremental export to Parquet (context/date)")
    export.add_argument("--out", required=True, help="output directory (any Hadoop filesystem)")
    stats = jobs.add_parser("stats", help="events and bytes per context/category/type/hour")
    stats.add_argument("--full", action="store_true", help="recompute from the first event")
    rebuild = jobs.add_parser("rebuild-binder", help="recompute a binder from the whole log")
    rebuild.add_argument("name")
    for job in (export, stats, rebuild):
        common(job)
        _spark_options(job)


def run(args: argparse.Namespace, config: GatewayConfig) -> int:
    try:
        settings = SparkSettings(
            master=args.master,
            jdbc_jar=args.jdbc_jar,
            conf=tuple(parse_conf(args.conf).items()),
            verbose=args.verbose,
        )
        with database_url(config, say=False, create=False) as (url, embedded):
            if embedded:
                migrate.upgrade(url, "head")
            else:
                asyncio.run(migrate.check_current(url))
            check_submitted_master(settings.master)
            # Everything that needs no Spark first: seconds, not a JVM start.
            done = nothing_to_do(
                args.action, url,
                out_dir=getattr(args, "out", None),
                full=getattr(args, "full", False),
                binder=getattr(args, "name", None),
            )
            if done is not None:
                print(f"pipeline {args.action}: {done}", file=sys.stderr)
                return 0
            return _run_job(args, settings, url)
    except PipelineError as exc:
        print(f"polyport pipeline: {exc}", file=sys.stderr)
        log = spark_log()
        if log is not None:
            print(f"polyport pipeline: Spark's own output is in {log}", file=sys.stderr)
        return 1


def _run_job(args: argparse.Namespace, settings: SparkSettings, url: str) -> int:
    from polyport.pipeline.session import spark_session

    # A JVM start takes seconds (tens on a small machine): say so before it.
    print(f"pipeline {args.action}: starting Spark…", file=sys.stderr, flush=True)
    spark = spark_session(settings)
    try:
        if args.action == "export":
            from polyport.pipeline.export import export_events

            export_events(spark, url, args.out, partitions=args.partitions)
        elif args.action == "stats":
            from polyport.pipeline.stats import compute_stats

            compute_stats(spark, url, full=args.full, partitions=args.partitions)
        else:
            from polyport.pipeline.binders import rebuild_binder

            rebuild_binder(spark, url, args.name, partitions=args.partitions)
    except PipelineError:
        raise
    except Exception as exc:  # Spark's own failures: the first line says what broke
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise PipelineError(f"the Spark job failed: {first}") from exc
    finally:
        spark.stop()
    # Spark's own log is kept only when the job failed (the error names it).
    discard_spark_log()
    return 0
