"""Finding the database: ``--database-url``, else the embedded PostgreSQL
under the data directory (started when no other process runs it)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polyport.gateway.config import GatewayConfig
from polyport.gateway.embedded_pg import EmbeddedPostgres

log = logging.getLogger("polyport.database")


@contextmanager
def database_url(config: GatewayConfig, *, say: bool = True) -> Iterator[tuple[str, bool]]:
    """Yields (url, embedded).  An embedded cluster started here is stopped on exit."""
    if config.database_url:
        yield config.database_url, False
        return
    pg = EmbeddedPostgres(Path(config.data_dir))
    if say:
        log.info("no database URL given: using the embedded PostgreSQL in %s", pg.data_dir)
    url = pg.start()
    try:
        yield url, True
    finally:
        pg.stop()
