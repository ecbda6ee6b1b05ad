"""The data directory: private to its owner, its secrets never readable by
anyone else even for an instant, and served by one ``polyport serve`` at a
time.

A second ``serve`` on the same directory would overwrite ``gateway.json``
(and delete it when it stopped), leaving the first gateway undiscoverable:
``serve`` holds an ``fcntl.flock`` on ``gateway.lock`` for its whole life.
The kernel drops the lock when the process dies, however it dies, so a
crash leaves nothing to clean up; the file itself stays (unlinking it would
let a third process lock a new file while the second still holds the old).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from polyport.gateway.config import ConfigError

LOCK_FILE = "gateway.lock"


class DataDirInUse(ConfigError):
    """Another ``serve`` holds the data directory."""


def make_data_dir(path: Path) -> Path:
    """The directory, created 0700 if missing (parents get the default mode:
    they are not ours).  An existing directory keeps its mode."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    """A new file only its owner can read, from its first byte on: created
    0600 with O_EXCL (never through a link left in its place) rather than
    written and then chmod'ed."""
    path.unlink(missing_ok=True)  # a leftover of an interrupted run, or a planted link
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class DataDirLock:
    """Hold the data directory for this ``serve``; DataDirInUse, naming the
    holder's pid, when another process holds it.  A class, not
    @contextmanager: that one writes ``__traceback__`` on the exception
    passing through, which the gateway's frozen-dataclass errors refuse."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.fd: int | None = None

    def __enter__(self) -> None:
        path = make_data_dir(Path(self.data_dir)) / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(
                f"data directory {self.data_dir} is in use by another polyport serve "
                f"(pid {holder}); stop that one first, or give this one its own --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self.fd = fd

    def __exit__(self, *_exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None
