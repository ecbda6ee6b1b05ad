"""``polyport migrate`` for DBAs: an offline script, stamp and check."""

from __future__ import annotations

import asyncio
from pathlib import Path

from polyport.core import migrate
from tests.gateway.test_cli_errors import polyport


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
