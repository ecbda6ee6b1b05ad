"""How every polyport process logs: text or JSON lines on stderr, each line
of a worker process naming its worker, a library's traceback folded into one
line unless debugging.  Its own module so that the CLI, the supervisor and
the workers set logging up the same way without importing each other."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

LOG_FIELDS = ("protocol", "peer", "code", "worker")
# Set in a worker process (gateway/process/worker.py): every line names its worker.
# (A one-slot table rather than a global rebound by setup_logging.)
_log_worker: dict[str, int | str] = {}


class _WorkerTag(logging.Filter):
    def __init__(self, worker: int | str) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in LOG_FIELDS:  # structured extras, e.g. on protocol error lines
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


class _OneLineLibraries(logging.Filter):
    """A library's record with a traceback (asyncpg's pool, every few seconds
    of a database outage, ~25 lines each) becomes one line; polyport's own
    lines already say what is down.  ``--debug`` keeps the tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not record.name.startswith("polyport"):
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(exc).__name__}: {exc})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def setup_logging(fmt: str = "text", level: str = "info", worker: int | str | None = None) -> None:
    """``worker``: this process is that worker (kept for later calls)."""
    if worker is not None:
        _log_worker["worker"] = worker
    handler = logging.StreamHandler(sys.stderr)
    tag = ""
    if "worker" in _log_worker:
        handler.addFilter(_WorkerTag(_log_worker["worker"]))
        tag = "[worker %(worker)s] "
    if level != "debug":
        handler.addFilter(_OneLineLibraries())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Alembic narrates every run at INFO ("Context impl PostgresqlImpl.", …);
    # operators want that only when they debug.
    logging.getLogger("alembic").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
