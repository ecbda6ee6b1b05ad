"""Schema migrations driven programmatically (no alembic.ini needed).

The gateway and the CLI call these; ``polyport migrate`` is a thin wrapper.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from polyport import migrations
from polyport.core import sql

# Alembic (and SQLAlchemy under it) is imported by the functions that run
# migrations, not here: every gateway process, worker and CLI command
# imports this module, and loading Alembic and reading the revision files
# cost each of them about half a second of CPU at start, for a head
# revision that migrations.HEAD_REVISION names (docs/performance.md,
# session 32).
if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def sqlalchemy_url(database_url: str) -> str:
    """``postgresql://`` URLs as users write them, with SQLAlchemy's asyncpg driver."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+asyncpg://" + database_url[len(prefix) :]
    # Never echo the URL: it may carry a password.
    scheme = database_url.partition("://")[0] if "://" in database_url else "(none)"
    raise ValueError(f"not a PostgreSQL URL (scheme {scheme!r}); write postgresql://…")


def asyncpg_dsn(database_url: str) -> str:
    return "postgresql://" + sqlalchemy_url(database_url)[len("postgresql+asyncpg://") :]


# Every connection of a serving gateway carries this name (pg_stat_activity
# shows it), so a downgrade can tell that a gateway still uses the database.
GATEWAY_APPLICATION_NAME = "polyport-gateway"


def with_application_name(dsn: str, name: str) -> str:
    """``dsn`` with ``application_name`` set (asyncpg passes query parameters
    it does not know to the server as settings)."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "application_name"]
    query.append(("application_name", name))
    return urlunsplit(parts._replace(query=urlencode(query)))


def alembic_config(database_url: str, stdout: TextIO | None = None) -> Config:
    from alembic.config import Config

    cfg = Config(stdout=stdout) if stdout is not None else Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = sqlalchemy_url(database_url)
    return cfg


def head_revision() -> str:
    """The revision this code expects the database at."""
    return migrations.HEAD_REVISION


def script_head() -> str:
    """The head as Alembic finds it in the revision files (what
    :func:`head_revision` must name; tests/core/test_migrations.py holds
    them together)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("postgresql://unused/x")).get_current_head()
    assert head is not None
    return head


def upgrade(database_url: str, revision: str = "head", *, sql: bool = False) -> None:
    """Run the upgrade, or with ``sql`` print its script (offline, no connection)."""
    from alembic import command

    command.upgrade(alembic_config(database_url), revision, sql=sql)


def downgrade(database_url: str, revision: str, *, sql: bool = False) -> None:
    from alembic import command

    command.downgrade(alembic_config(database_url), revision, sql=sql)


def stamp(database_url: str, revision: str) -> None:
    """Record ``revision`` as current without running anything (for a schema
    a DBA applied from the ``--sql`` script)."""
    from alembic import command

    command.stamp(alembic_config(database_url), revision)


def history(database_url: str, stdout: TextIO | None = None) -> None:
    from alembic import command

    command.history(alembic_config(database_url, stdout), verbose=False)


async def current_revision(database_url: str) -> str | None:
    """The revision the database is at, or None for an empty database."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        exists = await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
        if not exists:
            return None
        value: str | None = await conn.fetchval("SELECT version_num FROM alembic_version")
        return value
    finally:
        await conn.close()


async def gateway_sessions(database_url: str) -> tuple[int, str]:
    """How many sessions serving gateways hold on the database, and from where."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        row = await conn.fetchrow(sql.GATEWAY_SESSIONS, GATEWAY_APPLICATION_NAME)
    finally:
        await conn.close()
    assert row is not None
    return int(row["sessions"]), str(row["clients"])


class SchemaBehind(RuntimeError):
    pass


def schema_behind(current: str | None, head: str) -> str | None:
    """What is wrong, with the remedy, when ``current`` is not ``head``; else None."""
    if current == head:
        return None
    return (
        f"database schema is at revision {current or 'none (empty database)'}, "
        f"this polyport needs {head}: run `polyport migrate` "
        "(with the same --database-url) and start again"
    )


async def check_current(database_url: str) -> None:
    """Raise :class:`SchemaBehind` with the remedy when the schema is not at head."""
    problem = schema_behind(await current_revision(database_url), head_revision())
    if problem is not None:
        raise SchemaBehind(problem)


def upgrade_in_thread(database_url: str) -> asyncio.Future[None]:
    """Alembic's env runs its own event loop; keep it off the caller's loop."""
    return asyncio.get_running_loop().run_in_executor(None, upgrade, database_url, "head")
