"""Suite-wide fixtures: one throwaway PostgreSQL cluster, a fresh database per
test cloned from a migrated template, and an EventStore on it."""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

from polyport.core import migrate
from polyport.core.store import EventStore, StoreConfig
from polyport.gateway.process.embedded_pg import EmbeddedPostgres

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

TEMPLATE_DB = "polyport_template"
_counter = itertools.count()

# Every polyport process the suite starts without --data-dir finds its data
# directory here, never the machine's default (/var/lib/polyport as root):
# one per test process, so parallel test processes never share serve's lock
# or gateway.json, and the suite leaves nothing in the machine's places.
os.environ["POLYPORT_DATA_DIR"] = tempfile.mkdtemp(prefix="polyport-test-data-")


def pytest_configure(config: pytest.Config) -> None:
    # The in-process tests run on uvloop, the gateway's loop in production
    # (event_loop = auto; subprocess gateways pick it that way anyway).
    # POLYPORT_TEST_EVENT_LOOP=asyncio runs them on the standard library's
    # loop instead: the README's test command does so for a second, smaller
    # pass (event_loop = asyncio is supported too).  pytest-asyncio makes its
    # loops from the policy.
    if os.environ.get("POLYPORT_TEST_EVENT_LOOP", "uvloop") == "uvloop":
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# --- running on several processes (pytest-xdist) ----------------------------------------
# The suite runs on pytest-xdist's workers (``-n auto`` in pyproject.toml), each
# with its own cluster.  A test marked ``exclusive`` measures the machine's
# spare capacity against a deadline (thousands of sockets in this process):
# it runs while no other test does.  Every other test holds a shared lock on
# one file, an exclusive test the exclusive lock; the turnstile, taken
# briefly before either, keeps a waiting exclusive test from being starved
# by the stream of shared holders.


@pytest.fixture(autouse=True)
def _exclusive_when_marked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: nothing runs beside it
        yield
        return
    # Each worker's basetemp is <the run's basetemp>/<worker id>: the parent
    # is shared by the run's workers, and pytest removes it with old runs.
    run_dir = tmp_path_factory.getbasetemp().parent
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(run_dir / "exclusive.lock", "a") as g, \
            open(run_dir / "exclusive.turnstile", "a") as t:
        fcntl.flock(t, fcntl.LOCK_EX)
        try:
            fcntl.flock(g, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(t, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(g, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(t, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (``main([...])``) points the root
    logger at that test's captured stderr, which pytest closes after it:
    a later record from a background thread (py4j's, once a Spark test's
    JVM is gone) then failed to write, a "Logging error" traceback in the
    CI log.  The handlers the test added (plain StreamHandlers: pytest's
    own capture handlers are subclasses, added and removed by pytest around
    each phase) go, and the root's level is restored."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in before and type(handler) is logging.StreamHandler:
                root.removeHandler(handler)
        root.setLevel(level)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault-injection tests' table (tests/faults), gathered from the test
    reports: with pytest-xdist the tests ran in the workers, and only their
    reports reach this process."""
    from tests.faults.support import SUMMARY_PROPERTY, Row, summary_lines

    rows = [
        Row(*value)  # reports carry the rows as tuples
        for reports in terminalreporter.stats.values()
        for rep in reports
        if getattr(rep, "when", None) == "teardown"
        for key, value in getattr(rep, "user_properties", ())
        if key == SUMMARY_PROPERTY
    ]
    if rows:
        terminalreporter.section("fault injection summary")
        for line in summary_lines(rows):
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[EmbeddedPostgres]:
    # Not pytest's tmp_path: that is 0700 and the cluster may run as another user.
    root = Path(tempfile.mkdtemp(prefix="polyport-test-pg-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "data", fast=True)
    pg.start()
    yield pg
    pg.stop()
    remove_in_background(root)


def remove_in_background(root: Path) -> None:
    """Delete a stopped cluster's directory without the run waiting for it.

    By the end of the suite it holds a database per test, several hundred
    thousand files: deleting them took about 30 s of the run's wall time,
    after every test had finished.  A detached ``rm -rf`` does the same work
    after pytest exits (its own session: it outlives nothing but this
    process)."""
    rm = shutil.which("rm")
    if rm is None:
        shutil.rmtree(root, ignore_errors=True)
        return
    subprocess.Popen([rm, "-rf", "--", str(root)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def _with_db(url: str, db: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + db


@pytest.fixture(scope="session")
def admin_url(pg_cluster: EmbeddedPostgres) -> str:
    port = pg_cluster.running_port()
    assert port is not None
    return pg_cluster.url(port)


@pytest.fixture(scope="session")
def template_url(admin_url: str) -> str:
    import asyncio

    async def create() -> None:
        conn = await asyncpg.connect(admin_url)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
            await conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
        finally:
            await conn.close()

    asyncio.run(create())
    url = _with_db(admin_url, TEMPLATE_DB)
    migrate.upgrade(url)
    return url


async def create_database(admin_url: str, *, template: str | None = TEMPLATE_DB) -> str:
    name = f"t_{os.getpid()}_{next(_counter)}"
    conn = await asyncpg.connect(admin_url)
    try:
        tmpl = f" TEMPLATE {template}" if template else ""
        await conn.execute(f"CREATE DATABASE {name}{tmpl}")
    finally:
        await conn.close()
    return _with_db(admin_url, name)


@pytest.fixture
async def db_url(admin_url: str, template_url: str) -> str:
    """A fresh, migrated database for one test."""
    return await create_database(admin_url)


@pytest.fixture
async def empty_db_url(admin_url: str) -> str:
    """A fresh database with no schema."""
    return await create_database(admin_url, template=None)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[EventStore]:
    s = EventStore(StoreConfig(db_url, poll_interval=0.2))
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def gateway_factory(
    db_url: str, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[Gateway]]]:
    """Start gateways on the test database with every port picked freely.
    ``await gateway_factory(bson_port="off", idle_timeout=2)`` overrides config."""
    from dataclasses import replace

    from polyport.gateway.app import Gateway
    from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig

    started: list[Gateway] = []

    async def start(**overrides: Any) -> Gateway:
        # A data directory of the test's own: never the machine's default one.
        base = GatewayConfig(database_url=db_url, http_port=0, poll_interval=0.2,
                             data_dir=str(tmp_path / "gateway-data"),
                             **{f"{n}_port": 0 for n in DEFAULT_PORTS})
        extra = overrides.pop("extra", {})
        cfg = replace(base, **overrides, extra={**base.extra, **extra})
        gw = Gateway(cfg)
        await gw.start()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        await gw.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A test CA and the gateway's certificate (tests/tlspki.py)."""
    from tests.tlspki import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))
