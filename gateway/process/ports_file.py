"""``<data-dir>/gateway.json``: where a running gateway listens.

Like NATS's ports file: with ``--http-port 0`` (or any port picked at start)
no other process could know the address, so ``serve`` writes the bound
addresses and its pid here once every listener is up, and removes the file
when it stops.  ``polyport status`` reads it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("polyport.gateway")

FILE_NAME = "gateway.json"


def ports_file_path(data_dir: str) -> Path:
    return Path(data_dir) / FILE_NAME


def write_ports_file(data_dir: str, gw: Any) -> Path | None:
    return write_ports(
        data_dir, gw.started_at, {name: li.address for name, li in gw.listeners.items()},
        gw.http_address,
    )


def write_ports(
    data_dir: str,
    started_at: float,
    listeners: dict[str, tuple[str, int]],
    http: tuple[str, int] | None,
    workers: int | None = None,
) -> Path | None:
    """The file, by this process (with ``workers``: the supervisor, whose
    workers share these ports)."""
    path = ports_file_path(data_dir)
    data: dict[str, Any] = {
        "pid": os.getpid(),
        "started_at": started_at,
        "listeners": {name: {"host": host, "port": port}
                      for name, (host, port) in listeners.items()},
        "http": {"host": http[0], "port": http[1]} if http else None,
    }
    if workers is not None:
        data["workers"] = workers
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)  # readers never see half a file
    except OSError as exc:
        log.warning("could not write %s (polyport status will not find this gateway): %s",
                    path, exc)
        return None
    return path


def remove_ports_file(path: Path | None) -> None:
    if path is None:
        return
    try:
        data = json.loads(path.read_text())
        if data.get("pid") == os.getpid():  # another gateway may have replaced it
            path.unlink()
    except (OSError, ValueError):
        pass


def read_ports_file(data_dir: str) -> dict[str, Any] | None:
    """The file's content when the gateway that wrote it still runs, else None."""
    path = ports_file_path(data_dir)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data
