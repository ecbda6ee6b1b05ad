"""The JDBC address Spark reads through.  The job's connection, its
statements and its errors are core's (:mod:`polyport.core.pipeline_db`, where
every SQL statement lives); they are named here too, for the pipeline's
modules and their callers.

No pyspark here: the CLI imports this module before Spark starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from polyport.core import migrate
from polyport.core.pipeline_db import (
    STATS_JOB,
    Pg,
    PipelineBusy,
    PipelineError,
    export_job,
    sql_text,
    sql_text_array,
)

__all__ = [
    "STATS_JOB",
    "JdbcTarget",
    "Pg",
    "PipelineBusy",
    "PipelineError",
    "export_job",
    "jdbc_target",
    "sql_text",
    "sql_text_array",
]


@dataclass(frozen=True, slots=True)
class JdbcTarget:
    """A PostgreSQL URL as Spark's JDBC source wants it: URL plus credentials."""

    url: str
    user: str | None
    password: str | None

    def options(self) -> dict[str, str]:
        opts = {"url": self.url, "driver": "org.postgresql.Driver"}
        if self.user is not None:
            opts["user"] = self.user
        if self.password is not None:
            opts["password"] = self.password
        return opts


def jdbc_target(database_url: str) -> JdbcTarget:
    """``postgresql://user:pass@host:port/db?sslmode=…`` → ``jdbc:postgresql://host:port/db``
    with user and password apart (Spark needs them as options, and they must
    not end up in logs as part of a URL).  Query parameters (sslmode,
    application_name, …) are passed on: pgjdbc knows the libpq names."""
    parts = urlsplit(migrate.asyncpg_dsn(database_url))
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    if not parts.hostname:
        raise PipelineError(
            "Spark reaches PostgreSQL over TCP (JDBC) and this database URL names no host "
            "(a unix socket?): give --database-url postgresql://user:password@host:port/db"
        )
    params.pop("host", None)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = f":{parts.port}" if parts.port else ""
    database = parts.path.lstrip("/") or unquote(parts.username or "")
    query = f"?{urlencode(params)}" if params else ""
    return JdbcTarget(
        url=f"jdbc:postgresql://{host}{port}/{database}{query}",
        user=unquote(parts.username) if parts.username else params.get("user"),
        password=unquote(parts.password) if parts.password else params.get("password"),
    )
