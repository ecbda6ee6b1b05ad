"""Spark set-up without starting Spark: the JDBC address and credentials,
string literals in pushed-down SQL, where the driver jar comes from, Java,
the master, and the CLI's errors when Java or the driver is missing.  None of
this needs pyspark, and the gateway must not import it."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import asyncpg
import pytest

from polyport.core.migrate import asyncpg_dsn
from polyport.pipeline.db import PipelineError, jdbc_target, sql_text, sql_text_array
from polyport.pipeline.session import (
    DEBIAN_JAR,
    DRIVER_PACKAGE,
    SparkSetupError,
    find_java,
    find_jdbc_driver,
    parse_conf,
    resolve_master,
)
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


async def test_cli_says_how_to_get_java_or_the_driver(db_url: str, tmp_path: Path) -> None:
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
        "import sys, polyport.gateway.cli, polyport.gateway.app\n"
        "polyport.gateway.cli.build_parser().parse_args(['pipeline', 'export', '--out', 'x'])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))\n"
        "assert not loaded, loaded\n"
    )
    done = run_cli([sys.executable, "-c", probe])
    assert done.returncode == 0, done.stderr
