"""Finding the database: ``--database-url``, else the embedded PostgreSQL
under the data directory (started when no other process runs it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polyport.gateway.config import OLD_DEFAULT_DATA_DIR, GatewayConfig, default_data_dir
from polyport.gateway.process.embedded_pg import EmbeddedPostgres, EmbeddedPostgresError
from polyport.gateway.process.ports_file import read_ports_file

log = logging.getLogger("polyport.database")


class NoDatabase(EmbeddedPostgresError):
    """A command that never creates a cluster found none; the message says
    where it looked and what to pass."""


# How often a serving gateway looks at its embedded cluster, and the longest
# wait between two attempts to restart it.
WATCH_INTERVAL = 1.0
RESTART_BACKOFF_MAX = 30.0


@contextmanager
def database_url(
    config: GatewayConfig, *, say: bool = True, create: bool = True, start: bool = True
) -> Iterator[tuple[str, bool]]:
    """Yields (url, embedded); see :func:`database`."""
    with database(config, say=say, create=create, start=start) as (url, pg):
        yield url, pg is not None


@contextmanager
def database(
    config: GatewayConfig, *, say: bool = True, create: bool = True, start: bool = True
) -> Iterator[tuple[str, EmbeddedPostgres | None]]:
    """Yields (url, the embedded cluster or None).  An embedded cluster
    started here is stopped on exit.

    ``create=False`` (every command but ``serve`` and ``migrate``): no new
    cluster is made, and a cluster a running gateway serves from is never
    started or stopped here (that gateway supervises it).  ``start=False``
    (``status``): an embedded cluster that is not running is not started."""
    if config.database_url:
        yield config.database_url, None
        return
    pg = EmbeddedPostgres(Path(config.data_dir))
    if create:
        _refuse_the_old_default(config, pg)
    elif not pg.initialized():
        raise NoDatabase(
            f"no polyport database in {pg.data_dir}: pass --data-dir with the gateway's data "
            "directory (or set POLYPORT_DATA_DIR), or --database-url")
    elif pg.running_port() is None and (gw := read_ports_file(str(pg.data_dir))) is not None:
        raise NoDatabase(
            f"the database of the gateway serving from {pg.data_dir} (pid {gw['pid']}) is "
            "down; the gateway restarts it: retry shortly")
    elif not start and pg.running_port() is None:
        raise NoDatabase(f"the embedded database in {pg.data_dir} is not running (no gateway "
                         "serves from it): start one with 'polyport serve'")
    if say:
        log.info("no database URL given: using the embedded PostgreSQL in %s", pg.data_dir)
    url = pg.start()
    try:
        yield url, pg
    finally:
        pg.stop()


async def supervise_embedded(pg: EmbeddedPostgres) -> None:
    """Keep a serving gateway's embedded cluster running: restart it on the
    same port (the URL, and so every pool, stays valid) when it stops, with
    backoff, and say so once per change of state, not once per try."""
    pg.port = pg.running_port() or pg.port
    delay = WATCH_INTERVAL
    failing: str | None = None
    down = False
    while True:
        await asyncio.sleep(delay)
        if pg.running_port() is not None:
            if down:
                log.warning("embedded PostgreSQL in %s is back on port %d", pg.data_dir, pg.port)
            down, failing, delay = False, None, WATCH_INTERVAL
            continue
        if not down:
            log.error("embedded PostgreSQL in %s stopped; restarting it", pg.data_dir)
            down = True
        try:
            await asyncio.to_thread(pg.start)
        except Exception as exc:  # noqa: BLE001 - any failure: try again later
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            delay = min(RESTART_BACKOFF_MAX, max(2 * delay, 2.0))
            if reason != failing:
                log.error("embedded PostgreSQL did not restart (%s); trying again, at most "
                          "every %.0f s", reason, RESTART_BACKOFF_MAX)
                failing = reason
        else:
            delay = 0.0  # the next look logs "back"


def _refuse_the_old_default(config: GatewayConfig, pg: EmbeddedPostgres) -> None:
    """A cluster under ./polyport-data (the default before it moved) is not
    silently replaced by a new, empty one in the new default place."""
    old = Path(OLD_DEFAULT_DATA_DIR).resolve()
    if (
        config.data_dir == default_data_dir()
        and not pg.initialized()
        and (old / "pgdata" / "PG_VERSION").exists()
    ):
        raise NoDatabase(
            f"found a database in {old} (the data directory's old default) and none in "
            f"{pg.data_dir} (the default now): pass --data-dir {old}, or move it there")
