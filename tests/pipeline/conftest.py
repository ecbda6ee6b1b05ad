"""Pipeline fixtures: one local SparkSession for the whole run (small shuffle,
no UI), writers that go through the protocols' own clients, and checks that
compare exported Parquet with the database row for row.

Every module here starts with ``pytest.importorskip("pyspark")``: without the
optional ``pipeline`` extra these tests are skipped with that reason."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

from polyport.core.migrate import asyncpg_dsn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from polyport.gateway.app import Gateway

REPO = Path(__file__).resolve().parents[2]
SKIP_REASON = "PySpark is not installed: pip install -e '.[test,pipeline]' runs these tests"

# Spark binds the driver and block manager here; nothing leaves loopback.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# The command-line runs in these tests are short: the JIT's quick tier and the
# serial collector leave the two cores to the work, not to compiling.  (The
# shared session below keeps the defaults: it exports 100,000 rows many times.)
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One pytest-xdist worker runs every Spark test: one JVM and one shared
    # SparkSession for the run instead of one per worker.
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("spark"))


TEST_CONF = (
    ("spark.sql.shuffle.partitions", "4"),
    ("spark.ui.enabled", "false"),
    ("spark.driver.memory", "1g"),
    # Partition values ("context=123") stay strings when read back.
    ("spark.sql.sources.partitionColumnTypeInference.enabled", "false"),
)


def _claim_spark_for_this_worker(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Fail when a second pytest-xdist worker starts a SparkSession in one
    run: the group mark above no longer reaches the scheduler (as with
    pytest 9.2 and pytest-xdist 3.8), and every worker pays for a JVM and
    the 100,000-event dataset.  Nothing else would notice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    # Shared by the run's workers (see _exclusive_when_marked in tests/conftest.py).
    claim = tmp_path_factory.getbasetemp().parent / "spark.worker"
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        owner = claim.read_text()
        if owner and owner != worker:
            pytest.fail(f"the Spark tests run on {owner} and {worker}: --dist loadgroup "
                        "is not grouping them (check the pytest and pytest-xdist "
                        "versions against pyproject.toml's pins)", pytrace=False)
        return
    with os.fdopen(fd, "w") as f:
        f.write(worker)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    pytest.importorskip("pyspark", reason=SKIP_REASON)
    _claim_spark_for_this_worker(tmp_path_factory)
    from polyport.pipeline.session import SparkSettings, discard_spark_log, spark_session

    session = spark_session(SparkSettings(master="local[2]", conf=TEST_CONF), say=False)
    yield session
    session.stop()
    discard_spark_log()


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "POLYPORT_LOG_LEVEL": "warning",
           # every JVM these commands start: driver, master, worker, executors
           "JAVA_TOOL_OPTIONS": TEST_JAVA_OPTIONS}
    env.update(extra)
    return env


def polyport_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "polyport.gateway.cli.main", *args]


def run_cli(
    args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=timeout,
                          env=env or cli_env(), cwd=REPO)


# --- the database side ---------------------------------------------------------


async def fetch(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute("SET TimeZone = 'UTC'")
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def head(url: str) -> int:
    rows = await fetch(url, "SELECT last_position FROM log_head")
    value: int = rows[0]["last_position"]
    return value


# What an export must hold: every event, once, as stored.
DB_EXPORT_ROWS = """
SELECT position, event_id::text, context, stream, version, type, headers::text,
       md5(body) AS body_md5, content_type, origin,
       to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS date
FROM events WHERE position <= $1 ORDER BY position
"""


def exported_rows(spark: SparkSession, out: Path) -> list[tuple[Any, ...]]:
    """Every row of every published Parquet file under ``out``, by position."""
    from pyspark.sql import functions as F

    df = spark.read.option("basePath", str(out)).parquet(str(out))
    rows = df.select(
        "position", "event_id", "context", "stream", "version", "type", "headers",
        F.md5("body").alias("body_md5"), "content_type", "origin", "date",
    ).collect()
    return sorted((tuple(r) for r in rows), key=lambda r: r[0])


async def assert_exported_once(spark: SparkSession, url: str, out: Path, through: int) -> None:
    """The export holds exactly the events 1..through: none twice, none missing,
    every column as in the database."""
    expected = [tuple(r) for r in await fetch(url, DB_EXPORT_ROWS, through)]
    got = await asyncio.to_thread(exported_rows, spark, out)
    positions = [r[0] for r in got]
    assert len(positions) == len(set(positions)), "an event was exported twice"
    assert positions == list(range(1, through + 1)), "an event is missing or extra"
    assert got == expected


def published_files(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("context=*/date=*/events-*.parquet"))


# --- writing through the protocols ------------------------------------------------


async def write_res01(gw: Gateway, context: str, streams: int, commits: int, batch: int,
                      in_flight: int = 8) -> int:
    """``commits`` Res01 AC commits of ``batch`` JSON events, round robin
    over ``streams`` streams ``cart-<n>``."""
    from polyport.protocols.res01.client import Res01Client, new_event

    client = await Res01Client.connect(gw.listeners["res01"].address, timeout=60)
    sem = asyncio.Semaphore(in_flight)

    async def commit(i: int) -> None:
        async with sem:
            events = [
                new_event(
                    "item-added" if (i + j) % 3 else "item-removed",
                    json.dumps({"sku": f"sku-{j}", "qty": (i * j) % 7, f"slot{j % 5}": i}),
                    json.dumps({"source": "res01", "batch": str(i)}),
                )
                for j in range(batch)
            ]
            await client.commit(context, f"cart-{i % streams}", -1, events)

    try:
        await asyncio.gather(*(commit(i) for i in range(commits)))
    finally:
        await client.close()
    return commits * batch


async def write_bson(gw: Gateway, count: int, streams: int, window: int = 500) -> int:
    """``count`` pipelined BSON EMITs (context ``default``) over ``order-<n>`` streams."""
    from polyport.protocols.bson.client import BsonClient

    host, port = gw.listeners["bson"].address
    client = await BsonClient.connect(host, port)
    kinds = ("placed", "paid", "shipped")
    try:
        pending = []
        for i in range(count):
            event = {"order": i, "status": kinds[i % 3], "total": i * 1.5,
                     "lines": [{"sku": f"sku-{i % 11}", "qty": i % 4}]}
            pending.append(client.send_emit(f"order-{i % streams}", kinds[i % 3], event))
            if len(pending) >= window:
                await client.drain()
                for reply in await asyncio.gather(*pending):
                    assert reply.ok, reply
                pending.clear()
        for reply in await asyncio.gather(*pending):
            assert reply.ok, reply
    finally:
        await client.close()
    return count


async def write_reactivesocket(gw: Gateway, context: str, appends: int, batch: int) -> int:
    """ReactiveSocket appends of ``batch`` events with varied content types."""
    import msgpack

    from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient

    host, port = gw.listeners["reactivesocket"].address
    client = await ReactiveSocketClient.connect(host, port, context=context)
    kinds = [
        ("application/msgpack", lambda i: msgpack.packb({"reading": i, "unit": "C"})),
        ("text/plain", lambda i: f"temperature {i}".encode()),
        ("application/octet-stream", lambda i: bytes([i % 256]) * (i % 40 + 1)),
    ]
    try:
        for a in range(appends):
            events = []
            for j in range(batch):
                ct, body = kinds[(a + j) % 3]
                events.append(NewEvent(type=f"sample-{ct.split('/')[1]}", body=body(a * batch + j),
                                       headers={"sensor": str(j % 4)}, content_type=ct))
            await client.append(f"sensor-{a % 10}", events)
    finally:
        await client.close()
    return appends * batch
