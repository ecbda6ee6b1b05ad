"""Starting Spark for the pipeline, offline or online.

- Java: ``JAVA_HOME`` or ``java`` on PATH, version 17 or newer (Spark 4).
- The PostgreSQL JDBC driver: ``--jdbc-jar`` / ``POLYPORT_JDBC_JAR``, else the
  newest ``org/postgresql/postgresql`` jar in the local Maven repository, else
  Debian's ``/usr/share/java/postgresql.jar`` (``libpostgresql-jdbc-java``),
  else ``spark.jars.packages`` (resolved from Maven Central at start).
- The master: ``--master`` when given; otherwise whatever Spark's own launcher
  decides (``spark-submit --master``, ``PYSPARK_SUBMIT_ARGS``,
  ``spark-defaults.conf``, ``MASTER``), which is ``local[*]`` when nothing says
  otherwise.  Under ``spark-submit`` a different ``--master`` is an error, not
  an override.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from polyport.pipeline.db import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17
DRIVER_CLASS = "org.postgresql.Driver"
# Only used when no jar is found locally and Maven Central is reachable.
DRIVER_PACKAGE = "org.postgresql:postgresql:42.7.13"
DEBIAN_JAR = Path("/usr/share/java/postgresql.jar")
JAR_ENV = "POLYPORT_JDBC_JAR"

# Defaults a user's --conf may change.
DEFAULT_CONF = {
    "spark.app.name": "polyport-pipeline",
    "spark.sql.session.timeZone": "UTC",
}
# Unless --verbose: our own progress lines replace Spark's console bar.
QUIET_CONF = {"spark.ui.showConsoleProgress": "false"}

GET_DRIVER_HELP = (
    f"install it (`apt-get install -y libpostgresql-jdbc-java` puts it at {DEBIAN_JAR}), "
    "or download postgresql-42.x.jar from https://jdbc.postgresql.org and pass "
    f"--jdbc-jar PATH (or set {JAR_ENV})"
)
GET_JAVA_HELP = (
    f"Spark 4 needs Java {MIN_JAVA} or newer: install it "
    "(`apt-get install -y openjdk-17-jre-headless`) or point JAVA_HOME at one"
)


class SparkSetupError(PipelineError):
    pass


@dataclass(frozen=True, slots=True)
class JdbcDriver:
    """Where the driver comes from: a jar on disk, or a Maven coordinate."""

    source: str
    jar: Path | None = None
    package: str | None = None


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.name))


def find_jdbc_driver(
    explicit: str | None = None,
    env: Mapping[str, str] | None = None,
    m2_repository: Path | None = None,
    debian_jar: Path = DEBIAN_JAR,
) -> JdbcDriver:
    env = os.environ if env is None else env
    configured = explicit or env.get(JAR_ENV)
    if configured:
        path = Path(configured).expanduser()
        origin = "--jdbc-jar" if explicit else JAR_ENV
        if not path.is_file():
            raise SparkSetupError(
                f"{origin} names {path}, which is not a file; {GET_DRIVER_HELP}"
            )
        return JdbcDriver(origin, jar=path)
    repo = m2_repository or Path(env.get("HOME", str(Path.home()))) / ".m2" / "repository"
    jars = [
        p
        for p in (repo / "org" / "postgresql" / "postgresql").glob("*/postgresql-*.jar")
        if p.name == f"postgresql-{p.parent.name}.jar"  # not -sources / -javadoc
    ]
    if jars:
        return JdbcDriver("local Maven repository", jar=max(jars, key=_version_key))
    if debian_jar.is_file():
        return JdbcDriver("libpostgresql-jdbc-java", jar=debian_jar)
    return JdbcDriver("Maven Central (spark.jars.packages)", package=DRIVER_PACKAGE)


def find_java(env: Mapping[str, str] | None = None) -> Path:
    """The java Spark's launcher will run, checked for its version."""
    env = os.environ if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not java.is_file():
            raise SparkSetupError(f"JAVA_HOME is {home} but {java} does not exist; {GET_JAVA_HELP}")
    else:
        found = shutil.which("java", path=env.get("PATH", os.defpath))
        if found is None:
            raise SparkSetupError(
                f"no Java found (JAVA_HOME is not set and `java` is not on PATH); {GET_JAVA_HELP}"
            )
        java = Path(found)
    try:
        out = subprocess.run([str(java), "-version"], check=False, capture_output=True,
                             text=True, timeout=60)
    except OSError as exc:
        raise SparkSetupError(f"{java} does not run ({exc}); {GET_JAVA_HELP}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        raise SparkSetupError(f"cannot tell the version of {java}; {GET_JAVA_HELP}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392"
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise SparkSetupError(f"{java} is Java {major}; {GET_JAVA_HELP}")
    return java


def resolve_master(cli_master: str | None, submitted_master: str | None) -> str | None:
    """The master to set on the builder; None leaves it to Spark's launcher,
    whose default is ``local[*]``."""
    if cli_master and submitted_master and cli_master != submitted_master:
        raise SparkSetupError(
            f"spark-submit gave master {submitted_master} and --master says {cli_master}: "
            "give only one of them"
        )
    return cli_master or None


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SparkSetupError(f"--conf wants KEY=VALUE, not {item!r}")
        conf[key.strip()] = value
    return conf


@dataclass(frozen=True, slots=True)
class SparkSettings:
    master: str | None = None
    jdbc_jar: str | None = None
    conf: tuple[tuple[str, str], ...] = ()
    # Spark's own console output (JVM start-up, log4j, stage bars); off, it
    # goes to a log file named only when something fails.
    verbose: bool = False


@dataclass
class _QuietJvm:
    """This process's quiet Spark: the file with its JVM's stdout and stderr, if any."""

    log: Path | None = None


_JVM = _QuietJvm()


def spark_log() -> Path | None:
    return _JVM.log


def discard_spark_log() -> None:
    """Delete Spark's log after a job that went well."""
    if _JVM.log is not None:
        _JVM.log.unlink(missing_ok=True)
        _JVM.log = None


def _launch_quiet_jvm(conf: Mapping[str, str], master: str | None) -> None:
    """Start Spark's JVM (spark-submit, as PySpark would) with its output in
    a log file: start-up notices, Ivy resolution and log4j warnings are noise
    on an operator's terminal, but the file is named when Spark fails."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:  # a JVM is already up in this process
        return
    spark_conf = SparkConf(loadDefaults=False)
    for key, value in conf.items():
        spark_conf.set(key, value)
    if master:
        spark_conf.setMaster(master)
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - the JVM writes it for its lifetime
        prefix="polyport-spark-", suffix=".log", delete=False
    )
    _JVM.log = Path(handle.name)
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": handle, "stderr": handle})
    except Exception as exc:
        raise SparkSetupError(
            f"Spark's JVM did not start: {exc}; its output is in {_JVM.log}; {GET_JAVA_HELP}"
        ) from exc
    finally:
        handle.close()  # the JVM has its own descriptor
    SparkContext._ensure_initialized(gateway=gateway)


def check_submitted_master(cli_master: str | None) -> None:
    """Under spark-submit, refuse a different ``--master`` before anything
    else answers (even "nothing new"): the command line is wrong either way.
    Joining spark-submit's JVM costs nothing, it is already running."""
    if not cli_master or "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    resolve_master(cli_master, SparkConf().get("spark.master", None))


def _driver_loadable(spark: SparkSession) -> bool:
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    assert jvm is not None
    try:
        jvm.org.apache.spark.util.Utils.classForName(DRIVER_CLASS, False, False)
    except Py4JJavaError:
        return False
    return True


def spark_session(settings: SparkSettings, *, say: bool = True) -> SparkSession:
    """Start (or join) the SparkSession the pipeline jobs run in."""
    # spark-submit starts the JVM first and hands Python its gateway port.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if not submitted:
        find_java()
    # Python workers must be this interpreter (with polyport and its deps),
    # not whatever `python3` is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # py4j logs every callback (our progress listener) at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise SparkSetupError(
            "the pipeline needs PySpark: pip install 'polyport[pipeline]'"
        ) from exc

    submitted_master = None
    if submitted:
        # Join spark-submit's JVM first: only then does SparkConf see its settings.
        SparkContext._ensure_initialized()
        submitted_master = SparkConf().get("spark.master", None)
    master = resolve_master(settings.master, submitted_master)
    quiet = {} if settings.verbose else QUIET_CONF
    conf = {**DEFAULT_CONF, **quiet, **dict(settings.conf)}
    driver = find_jdbc_driver(settings.jdbc_jar)
    if not submitted:
        # spark.jars / spark.jars.packages must be known when the JVM starts;
        # under spark-submit they are its --jars / --packages (checked below).
        if driver.jar is not None:
            conf["spark.jars"] = ",".join(
                j for j in (conf.get("spark.jars"), str(driver.jar)) if j
            )
        else:
            assert driver.package is not None
            conf["spark.jars.packages"] = ",".join(
                p for p in (conf.get("spark.jars.packages"), driver.package) if p
            )
    if not submitted and not settings.verbose:
        _launch_quiet_jvm(conf, master)
    builder = SparkSession.builder
    if master:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        if driver.package is not None and not submitted:
            raise SparkSetupError(
                f"Spark could not start with the JDBC driver from Maven ({driver.package}): "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}; "
                f"no local driver jar was found, so {GET_DRIVER_HELP}"
            ) from exc
        log = f"; its output is in {_JVM.log}" if _JVM.log else ""
        raise SparkSetupError(f"Spark did not start: {exc}{log}; {GET_JAVA_HELP}") from exc
    if not settings.verbose:
        # Set after start: the JVM's start-up already went to the log file.
        spark.sparkContext.setLogLevel("ERROR")
    # Hours and dates are UTC whatever the session says elsewhere.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if not _driver_loadable(spark):
        where = f"{driver.jar}" if driver.jar else "the driver jar"
        raise SparkSetupError(
            f"the PostgreSQL JDBC driver ({DRIVER_CLASS}) is not on Spark's driver classpath: "
            f"under spark-submit pass --jars {where}; otherwise {GET_DRIVER_HELP}"
        )
    if say:
        sys.stderr.write(
            f"pipeline: Spark {spark.version}, master {spark.sparkContext.master}, "
            f"JDBC driver from {driver.source}"
            f"{f' ({driver.jar})' if driver.jar else ''}\n"
        )
    return spark
