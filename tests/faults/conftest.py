"""Fault-injection tests run on their OWN throwaway cluster: they restart and
stop PostgreSQL, which must not disturb the suite's shared ``pg_cluster``."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from polyport.core import migrate
from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from tests.conftest import TEMPLATE_DB, _with_db, create_database
from tests.faults.support import SUMMARY, SUMMARY_PROPERTY


@pytest.fixture(scope="session")
def fault_pg() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="polyport-fault-pg-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "data", fast=True)
    pg.start()
    port = pg.running_port()
    assert port is not None
    pg.port = port  # a stopped and started cluster comes back on the same port
    admin = pg.url(port)

    async def template() -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
        finally:
            await conn.close()

    asyncio.run(template())
    migrate.upgrade(_with_db(admin, TEMPLATE_DB))
    yield pg
    pg.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def fault_db(fault_pg: EmbeddedPostgres) -> str:
    """A fresh migrated database on the fault cluster."""
    port = fault_pg.running_port()
    assert port is not None
    return await create_database(fault_pg.url(port))


@pytest.fixture(autouse=True)
def _report_summary_rows(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test's rows of the fault summary go out with its report; the root
    conftest prints them (see tests/conftest.py, pytest_terminal_summary)."""
    start = len(SUMMARY)
    yield
    for row in SUMMARY[start:]:
        request.node.user_properties.append((SUMMARY_PROPERTY, dataclasses.astuple(row)))
