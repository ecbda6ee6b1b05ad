"""Acceptance: migrate creates the schema on an empty database, downgrade to
base and upgrade to head round-trip, and serve refuses a stale schema."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import asyncpg

from core import migrate
from core.migrate import asyncpg_dsn


def polyport(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args],
                          capture_output=True, text=True, timeout=120)


async def tables(url: str) -> set[str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


async def test_migrate_round_trip_and_stale_serve(empty_db_url: str) -> None:
    serve = await asyncio.to_thread(
        polyport, "serve", "--database-url", empty_db_url, "--http-port", "0",
        *[a for n in ("res01", "bson", "reactivesocket", "micromsg2", "segment")
          for a in (f"--{n}-port", "off")])
    assert serve.returncode != 0
    assert "polyport migrate" in serve.stderr

    up = await asyncio.to_thread(polyport, "migrate", "--database-url", empty_db_url)
    assert up.returncode == 0, up.stderr
    assert {"events", "streams", "log_head", "subscriptions", "users", "binders"} <= await tables(
        empty_db_url)
    assert await migrate.current_revision(empty_db_url) == migrate.head_revision()

    current = await asyncio.to_thread(polyport, "migrate", "current", "--database-url",
                                      empty_db_url)
    assert "up to date" in current.stdout

    down = await asyncio.to_thread(polyport, "migrate", "downgrade", "base", "--database-url",
                                   empty_db_url)
    assert down.returncode == 0, down.stderr
    assert await tables(empty_db_url) == {"alembic_version"}
    assert await migrate.current_revision(empty_db_url) is None

    again = await asyncio.to_thread(polyport, "migrate", "upgrade", "--database-url",
                                    empty_db_url)
    assert again.returncode == 0, again.stderr
    assert await migrate.current_revision(empty_db_url) == migrate.head_revision()

    history = await asyncio.to_thread(polyport, "migrate", "history", "--database-url",
                                      empty_db_url)
    assert "Initial schema" in history.stdout


async def test_schema_matches_metadata(db_url: str) -> None:
    """The migrations and core.schema describe the same tables and columns."""
    from core.schema import metadata

    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name <> 'alembic_version'")
    finally:
        await conn.close()
    in_db: dict[str, set[str]] = {}
    for r in rows:
        in_db.setdefault(r["table_name"], set()).add(r["column_name"])
    in_meta = {t.name: {c.name for c in t.columns} for t in metadata.sorted_tables}
    assert in_db == in_meta
