"""``polyport migrate`` for DBAs: an offline script, stamp and check."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from polyport.core import migrate
from tests.gateway.test_cli_errors import polyport
from tests.gateway.test_readyz import wait_status


def test_offline_sql_needs_no_database(tmp_path: Path) -> None:
    done = polyport("migrate", "upgrade", "--sql", "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE events" in done.stdout
    assert f"UPDATE alembic_version SET version_num='{migrate.head_revision()}'" in done.stdout
    assert not (tmp_path / "data").exists()  # no embedded database was started
    down = polyport("migrate", "downgrade", f"{migrate.head_revision()}:base", "--sql")
    assert down.returncode == 0, down.stderr
    assert "DROP TABLE events" in down.stdout
    bad = polyport("migrate", "downgrade", "base", "--sql")
    assert bad.returncode == 1 and "FROM:TO" in bad.stderr


async def test_check_and_stamp(empty_db_url: str) -> None:
    def run(*args: str):  # type: ignore[no-untyped-def]
        return asyncio.to_thread(polyport, "migrate", *args, "--database-url", empty_db_url)

    behind = await run("check")
    assert behind.returncode == 1 and "polyport migrate" in behind.stderr
    assert (await run("stamp")).returncode == 1  # needs a revision
    stamped = await run("stamp", "0001")
    assert stamped.returncode == 0, stamped.stderr
    assert await migrate.current_revision(empty_db_url) == "0001"
    assert (await run("stamp", "base")).returncode == 0
    assert (await run("upgrade")).returncode == 0
    ok = await run("check")
    assert ok.returncode == 0 and "up to date" in ok.stdout


async def test_a_downgrade_refuses_under_a_serving_gateway_and_the_gateway_hears_it(
    gateway_factory: Any, db_url: str
) -> None:
    """Issue 29 item 4: a downgrade does not run under a serving gateway unless
    forced, asks first unless --yes, and a gateway whose schema changed goes
    unready at once (its schema timer is 30 s; the migration's notification
    wakes it)."""
    gw = await gateway_factory()
    host, port = gw.http_address
    readyz = f"http://{host}:{port}/readyz"
    head = migrate.head_revision()
    previous = f"{int(head) - 1:04d}"

    def run(*args: str):  # type: ignore[no-untyped-def]
        return asyncio.to_thread(polyport, "migrate", *args, "--database-url", db_url,
                                 stdin="")

    refused = await run("downgrade", previous)
    assert refused.returncode == 1, refused.stderr
    assert "a gateway is serving from this database" in refused.stderr
    assert "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert await migrate.current_revision(db_url) == head

    unasked = await run("downgrade", previous, "--force")
    assert unasked.returncode == 1 and "--yes" in unasked.stderr, unasked.stderr
    assert await migrate.current_revision(db_url) == head

    async with aiohttp.ClientSession() as http:
        await wait_status(http, readyz, 200, 5.0)
        done = await run("downgrade", previous, "--force", "--yes")
        assert done.returncode == 0, done.stderr
        assert await migrate.current_revision(db_url) == previous
        await wait_status(http, readyz, 503, 3.0)
        async with http.get(readyz) as r:
            problems = (await r.json())["problems"]
        assert any(f"revision {previous}" in p for p in problems), problems

        back = await run("upgrade")
        assert back.returncode == 0, back.stderr
        await wait_status(http, readyz, 200, 3.0)
