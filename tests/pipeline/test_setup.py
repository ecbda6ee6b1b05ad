"""Spark set-up without starting Spark: the JDBC address and credentials,
string literals in pushed-down SQL, where the driver jar comes from, Java,
the master, and the CLI's errors when Java or the driver is missing; the
checks that answer before Spark starts (nothing new, unknown binder, another
run busy) within seconds and without importing pyspark.  None of this needs
pyspark, and the gateway must not import it."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from polyport.core.events import EventData
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore
from polyport.pipeline.db import Pg, PipelineError, jdbc_target, sql_text, sql_text_array
from polyport.pipeline.preflight import local_export_uri
from polyport.pipeline.session import (
    DEBIAN_JAR,
    DRIVER_PACKAGE,
    SparkSetupError,
    find_java,
    find_jdbc_driver,
    parse_conf,
    resolve_master,
)
from tests.core.helpers import append
from tests.pipeline.conftest import cli_env, polyport_cmd, run_cli

pytestmark = pytest.mark.timeout(60)


def test_jdbc_target_from_database_urls() -> None:
    t = jdbc_target("postgresql://ann%40corp:p%3Ass%2Fw@db.example:5433/events?sslmode=require")
    assert t.url == "jdbc:postgresql://db.example:5433/events?sslmode=require"
    assert (t.user, t.password) == ("ann@corp", "p:ss/w")
    assert t.options()["driver"] == "org.postgresql.Driver"
    assert "password" not in t.url and "p:ss" not in t.url

    t = jdbc_target("postgresql+asyncpg://bob@[::1]/bob")
    assert (t.url, t.user, t.password) == ("jdbc:postgresql://[::1]/bob", "bob", None)
    assert jdbc_target("postgres://u:p@h/").url == "jdbc:postgresql://h/u"
    with pytest.raises(PipelineError, match="names no host"):
        jdbc_target("postgresql:///db?host=/var/run/postgresql")


async def test_sql_literals_mean_the_text(db_url: str) -> None:
    tricky = ["plain", "it's", "back\\slash", "\\'", "'; DROP TABLE events; --", "ünï €", ""]
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        for setting in ("on", "off"):
            await conn.execute(f"SET standard_conforming_strings = {setting}")
            for value in tricky:
                assert await conn.fetchval(f"SELECT {sql_text(value)}") == value
            assert await conn.fetchval(f"SELECT {sql_text_array(tricky)}") == tricky
    finally:
        await conn.close()
    with pytest.raises(PipelineError):
        sql_text("nul\x00")


def _jar(repo: Path, version: str) -> Path:
    d = repo / "org" / "postgresql" / "postgresql" / version
    d.mkdir(parents=True)
    for name in (f"postgresql-{version}.jar", f"postgresql-{version}-sources.jar"):
        (d / name).write_bytes(b"PK")
    return d / f"postgresql-{version}.jar"


def test_driver_jar_search_order(tmp_path: Path) -> None:
    repo = tmp_path / "m2"
    debian = tmp_path / "postgresql.jar"
    explicit = tmp_path / "mine.jar"
    explicit.write_bytes(b"PK")

    # Nothing local: Maven Central through spark.jars.packages.
    d = find_jdbc_driver(None, {}, repo, debian)
    assert (d.jar, d.package) == (None, DRIVER_PACKAGE)
    # Debian's package.
    debian.write_bytes(b"PK")
    assert find_jdbc_driver(None, {}, repo, debian).jar == debian
    # The local Maven repository wins over Debian, newest version first.
    _jar(repo, "42.2.9")
    newest = _jar(repo, "42.10.1")
    _jar(repo, "42.7.13")
    assert find_jdbc_driver(None, {}, repo, debian).jar == newest
    # Configuration wins over everything: the environment, then the flag.
    env = {"POLYPORT_JDBC_JAR": str(explicit)}
    assert find_jdbc_driver(None, env, repo, debian).jar == explicit
    assert find_jdbc_driver(str(newest), env, repo, debian).jar == newest
    with pytest.raises(SparkSetupError, match="libpostgresql-jdbc-java"):
        find_jdbc_driver(None, {"POLYPORT_JDBC_JAR": str(tmp_path / "gone.jar")}, repo, debian)
    assert DEBIAN_JAR == Path("/usr/share/java/postgresql.jar")


def test_java_is_found_and_checked(tmp_path: Path) -> None:
    with pytest.raises(SparkSetupError, match="openjdk-17"):
        find_java({"PATH": str(tmp_path)})
    with pytest.raises(SparkSetupError, match="JAVA_HOME"):
        find_java({"JAVA_HOME": str(tmp_path)})
    old = tmp_path / "old" / "bin"
    old.mkdir(parents=True)
    (old / "java").write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    (old / "java").chmod(0o755)
    with pytest.raises(SparkSetupError, match="Java 11"):
        find_java({"JAVA_HOME": str(old.parent)})
    java = shutil.which("java")
    assert java is not None, "Java 17+ is needed to run the pipeline tests"
    assert find_java({"PATH": str(Path(java).parent)}).name == "java"


def test_master_is_never_overridden() -> None:
    assert resolve_master(None, None) is None  # Spark's launcher: local[*]
    assert resolve_master("spark://h:7077", None) == "spark://h:7077"
    assert resolve_master(None, "yarn") is None  # spark-submit's stays
    assert resolve_master("yarn", "yarn") == "yarn"
    with pytest.raises(SparkSetupError, match="only one"):
        resolve_master("local[2]", "spark://h:7077")


def test_conf_pairs() -> None:
    assert parse_conf(["a.b=1", "c= x=y "]) == {"a.b": "1", "c": " x=y "}
    with pytest.raises(SparkSetupError):
        parse_conf(["novalue"])


async def test_cli_says_how_to_get_java_or_the_driver(
    store: EventStore, db_url: str, tmp_path: Path
) -> None:
    # One event: with nothing new the jobs would answer before needing Java.
    await store.append(append("s", EventData("T", b"{}")))
    env = cli_env(PATH=str(tmp_path))
    env.pop("JAVA_HOME", None)
    no_java = await asyncio.to_thread(
        run_cli, polyport_cmd("pipeline", "stats", "--database-url", db_url), env)
    assert no_java.returncode == 1
    assert "no Java found" in no_java.stderr and "apt-get install" in no_java.stderr

    no_jar = await asyncio.to_thread(
        run_cli, polyport_cmd("pipeline", "export", "--out", str(tmp_path / "x"),
                              "--database-url", db_url),
        cli_env(POLYPORT_JDBC_JAR=str(tmp_path / "missing.jar")))
    assert no_jar.returncode == 1
    assert "POLYPORT_JDBC_JAR names" in no_jar.stderr and "--jdbc-jar" in no_jar.stderr


def test_gateway_runs_without_pyspark() -> None:
    probe = (
        "import sys, polyport.gateway.cli.main, polyport.gateway.app\n"
        "from polyport.gateway.cli.parser import build_parser\n"
        "build_parser().parse_args(['pipeline', 'export', '--out', 'x'])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))\n"
        "assert not loaded, loaded\n"
    )
    done = run_cli([sys.executable, "-c", probe])
    assert done.returncode == 0, done.stderr


# Runs `polyport pipeline …` in a fresh interpreter and says whether PySpark
# (or py4j, its JVM bridge) was ever imported: a job answered before Spark.
NO_SPARK_PROBE = """
import sys
from polyport.gateway.cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))
print('SPARK-MODULES', len(loaded), file=sys.stderr)
sys.exit(rc)
"""


def run_without_spark(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    started = time.monotonic()
    done = run_cli([sys.executable, "-c", NO_SPARK_PROBE, "pipeline", *args], env, timeout=60)
    seconds = time.monotonic() - started
    assert "SPARK-MODULES 0" in done.stderr, done.stderr
    return done.returncode, done.stderr, seconds


async def test_nothing_new_answers_before_spark(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "export"
    rc, err, seconds = await asyncio.to_thread(
        run_without_spark, "export", "--out", str(out), "--database-url", db_url)
    assert rc == 0, err
    assert f"pipeline export: nothing new: file:{out} holds every event up to position 0" in err
    assert seconds < 5
    rc, err, seconds = await asyncio.to_thread(
        run_without_spark, "stats", "--database-url", db_url)
    assert rc == 0, err
    assert "pipeline stats: nothing new: event_stats counts every event up to position 0" in err
    assert seconds < 5


async def test_unknown_binder_and_busy_job_answer_before_spark(db_url: str) -> None:
    rc, err, seconds = await asyncio.to_thread(
        run_without_spark, "rebuild-binder", "no-such", "--database-url", db_url)
    assert rc == 1 and "no binder named 'no-such'" in err, err
    assert seconds < 5

    def busy() -> tuple[int, str, float]:
        with Pg(db_url) as holder:
            holder.lock_job("stats")
            return run_without_spark("stats", "--database-url", db_url)

    rc, err, seconds = await asyncio.to_thread(busy)
    assert rc == 1 and "another run of pipeline job 'stats' is in progress" in err, err
    assert seconds < 5


def test_export_uri_as_hadoop_qualifies_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_export_uri("out/x/") == f"file:{tmp_path}/out/x"
    assert local_export_uri("file:///data/exp") == "file:/data/exp"
    assert local_export_uri("/data//exp") == "file:/data/exp"
    assert local_export_uri("hdfs://nn:8020/exp") is None
