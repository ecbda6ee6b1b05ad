"""Pipeline export throughput against a plain ``COPY … TO`` of the same rows,
from one run on one cluster.

- Fill: ``--events`` events through the core (100-event appends, 8 at a time,
  over several contexts and streams), fsync on.
- Baseline: ``COPY (SELECT every column FROM events WHERE position in range)
  TO STDOUT (FORMAT binary)`` on one connection, into a local file.
- Pipeline: ``export`` of the same range to Parquet (Spark JDBC partitioned on
  position, staging, publish, checkpoint), timed from the job's start to its
  checkpoint; the Spark session's start-up is reported apart.  It runs twice,
  into two new directories: the first run pays the JVM's warm-up, the
  second shows the steady state.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import asyncpg

from bench.common import Progress, bench_cluster, fresh_database, report
from polyport.core import migrate
from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.core.sql import EVENT_COLUMNS
from polyport.core.store import EventStore, StoreConfig

BODY = b'{"amount": 42, "currency": "EUR", "note": "benchmark event"}'
CONTEXTS = ("shop", "billing", "metrics")


async def fill(url: str, events: int) -> int:
    store = EventStore(StoreConfig(url, pool_max=8, run_binders=False))
    await store.start()
    prog = Progress("filling through the core (100-event appends)", events)
    done = 0
    try:
        async def worker(w: int) -> None:
            nonlocal done
            i = 0
            while done < events:
                n = min(100, events - done)
                done += n
                batch = tuple(EventData(f"type-{j % 5}", BODY, content_type="application/json")
                              for j in range(n))
                await store.append(Append(CONTEXTS[(w + i) % 3], f"s{w}-{i % 50}", batch))
                i += 1
                prog.update(done)

        await asyncio.gather(*(worker(w) for w in range(8)))
    finally:
        await store.close()
    prog.done(done)
    head: int = await _fetchval(url, "SELECT last_position FROM log_head")
    return head


async def _fetchval(url: str, query: str) -> int:
    conn = await asyncpg.connect(migrate.asyncpg_dsn(url))
    try:
        value: int = await conn.fetchval(query)
        return value
    finally:
        await conn.close()


async def copy_rate(url: str, head: int, target: Path) -> float:
    """Rows/s of a binary COPY of (0, head] to a file."""
    conn = await asyncpg.connect(migrate.asyncpg_dsn(url))
    try:
        started = time.monotonic()
        await conn.copy_from_query(
            f"SELECT {', '.join(EVENT_COLUMNS)} FROM events "
            "WHERE position > $1 AND position <= $2",
            0, head, output=str(target), format="binary",
        )
        elapsed = time.monotonic() - started
    finally:
        await conn.close()
    return head / elapsed


def run_exports(url: str, work: Path, master: str | None, partitions: int | None
                ) -> tuple[float, list[tuple[int, float]]]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from polyport.pipeline.export import export_events
    from polyport.pipeline.session import SparkSettings, spark_session

    started = time.monotonic()
    spark = spark_session(SparkSettings(master=master, conf=(("spark.ui.enabled", "false"),)))
    startup = time.monotonic() - started
    try:
        runs = []
        for n in (1, 2):
            result = export_events(spark, url, str(work / f"export-{n}"), partitions=partitions)
            runs.append((result.rows, result.seconds))
    finally:
        spark.stop()
    return startup, runs


async def run(events: int, master: str | None, partitions: int | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="polyport-bench-pipeline-"))
    try:
        async with bench_cluster() as pg:
            url = await fresh_database(pg)
            head = await fill(url, events)
            copy = await copy_rate(url, head, work / "events.copy")
            copy_bytes = (work / "events.copy").stat().st_size
            startup, runs = await asyncio.to_thread(run_exports, url, work, master, partitions)
        parquet_bytes = sum(p.stat().st_size for p in (work / "export-2").rglob("*.parquet"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (rows1, secs1), (rows2, secs2) = runs
    assert rows1 == rows2 == head, (rows1, rows2, head)
    report(
        f"pipeline export of {head:,} events vs COPY TO of the same rows (fsync on; one run)",
        [
            ("COPY (SELECT …) TO STDOUT (FORMAT binary), 1 connection", copy, "rows/s"),
            ("Spark session start-up", startup, "s"),
            ("pipeline export, first run (cold JVM)", rows1 / secs1, "events/s"),
            ("pipeline export, second run (warm)", rows2 / secs2, "events/s"),
            ("ratio warm export / COPY", rows2 / secs2 / copy, "x"),
            ("COPY output size", copy_bytes / 1e6, "MB"),
            ("Parquet output size", parquet_bytes / 1e6, "MB"),
        ],
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench pipeline")
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--master", help="Spark master (default: local[*])")
    p.add_argument("--partitions", type=int, help="JDBC partitions (default: by rows and cores)")
    args = p.parse_args(argv)
    asyncio.run(run(args.events, args.master, args.partitions))
    return 0
