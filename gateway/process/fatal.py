"""Fatal errors of ``polyport`` commands as one line an operator can act on.

Every command ends in :func:`describe`: it names what failed, the flag or
setting to change, and shows database URLs with their password replaced.  The
traceback is for ``--debug`` (or ``--log-level debug``) only.
"""

from __future__ import annotations

import errno
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from polyport.core import db
from polyport.core.db import sqlstate
from polyport.core.errors import PolyportError
from polyport.core.migrate import SchemaBehind
from polyport.gateway.config import ConfigError
from polyport.gateway.process.embedded_pg import EmbeddedPostgresError
from polyport.gateway.process.logging_setup import JsonFormatter

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?=@)", re.I)


def redact(text: str) -> str:
    """``scheme://user:secret@host`` → ``scheme://user:***@host`` anywhere in ``text``."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + "***", text)


@dataclass(frozen=True)
class ListenerBindError(Exception):
    """A listener could not bind its address."""

    listener: str
    host: str
    port: int
    reason: str

    def __str__(self) -> str:
        flag = f"--{self.listener}-port" if self.listener != "http" else "--http-port"
        env = f"POLYPORT_{self.listener.upper()}_PORT"
        return (
            f"cannot listen on {self.host}:{self.port} for {self.listener}: {self.reason}; "
            f"choose another port with {flag} (or {env}; 'off' turns it off, 0 picks a free one)"
        )


_BIND_ERRNOS = {errno.EADDRINUSE: "address already in use",
                errno.EACCES: "permission denied (ports below 1024 need privileges)",
                errno.EADDRNOTAVAIL: "no such address on this machine"}


@contextmanager
def naming_bind_errors(listener: str, host: str, port: int) -> Iterator[None]:
    """Turn a failed bind inside the block (asyncio's OSError or pyzmq's
    ZMQError, both carry ``errno``) into a :class:`ListenerBindError` that
    names the listener and its flag; anything else passes unchanged."""
    try:
        yield
    except Exception as exc:
        code = getattr(exc, "errno", None)
        if code not in _BIND_ERRNOS:
            raise
        raise ListenerBindError(listener, host, port, _BIND_ERRNOS[code]) from exc


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        # SQLAlchemy wraps the driver's exception in .orig.
        todo.extend([getattr(e, "orig", None), e.__cause__, e.__context__])


_DB_HINT = "check --database-url (or POLYPORT_DATABASE_URL)"


def _database(exc: BaseException, url: str | None) -> str | None:
    where = f" at {redact(url)}" if url else ""
    for e in _chain(exc):
        # The server's refusals by SQLSTATE (core.db knows the driver's types).
        state = sqlstate(e)
        if state == db.INVALID_PASSWORD:
            return f"PostgreSQL{where} refused the password: {e}; {_DB_HINT}"
        if state is not None and state.startswith(db.INVALID_AUTHORIZATION_CLASS):
            return f"PostgreSQL{where} refused the login: {e}; {_DB_HINT}"
        if state == db.INVALID_CATALOG_NAME:
            return f"PostgreSQL{where}: {e}; create it or {_DB_HINT}"
        if state == db.INSUFFICIENT_PRIVILEGE:
            return f"PostgreSQL{where}: {e}; grant the role the rights or {_DB_HINT}"
        if state is not None:
            return f"PostgreSQL{where} failed: {e}; {_DB_HINT}"
        if isinstance(e, ConnectionRefusedError) or (
            isinstance(e, OSError) and e.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                                   errno.ENETUNREACH, errno.ETIMEDOUT)
        ):
            return f"cannot reach PostgreSQL{where}: {e.strerror or e}; is it running? {_DB_HINT}"
        if isinstance(e, OSError) and "Name or service not known" in str(e):
            return f"cannot reach PostgreSQL{where}: unknown host; {_DB_HINT}"
        if isinstance(e, TimeoutError):
            return f"PostgreSQL{where} did not answer in time; {_DB_HINT}"
    return None


def describe(exc: BaseException, database_url: str | None = None) -> str:
    """One line (no traceback, no password) saying what failed and what to change."""
    if isinstance(exc, ListenerBindError | ConfigError | SchemaBehind | EmbeddedPostgresError):
        return redact(str(exc))
    if isinstance(exc, PolyportError):
        return redact(str(exc))
    found = _database(exc, database_url)
    if found is not None:
        return found
    text = redact(str(exc)) or type(exc).__name__
    return f"unexpected error ({type(exc).__name__}): {text}; run again with --debug for details"


def _say_fatal(message: str, fmt: str) -> None:
    if fmt == "json":  # the same record shape as every other log line
        record = logging.makeLogRecord(
            {"name": "polyport", "levelname": "ERROR", "levelno": logging.ERROR, "msg": message}
        )
        print(JsonFormatter().format(record), file=sys.stderr)
    else:
        print(f"polyport: {message}", file=sys.stderr)
