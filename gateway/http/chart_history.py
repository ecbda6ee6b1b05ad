"""The status page's ten minutes of history, kept across a restart: the
sampled log head and open connections, written to
``<data-dir>/status-history.json`` every minute and at a clean stop, read
back at start.  Only the charts use them; rates start afresh (the counters
they difference start at zero in a new process)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("polyport.telemetry")

FILE_NAME = "status-history.json"
# As long as the charts look back: CHART_BUCKET * CHART_BUCKETS seconds.
KEPT_SECONDS = 600.0


def save(path: Path, points: Iterable[tuple[float, int, dict[str, int]]]) -> None:
    """``points``: (wall time, head position, open connections by protocol)."""
    now = time.time()
    kept: list[dict[str, Any]] = []
    for wall, head, connections in points:
        if wall < now - KEPT_SECONDS:
            continue
        kept.append({"wall": wall, "head": head, "connections": dict(connections)})
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, path)  # readers never see half a file
    except OSError as exc:
        log.debug("could not keep the status history in %s: %s", path, exc)


def load(path: Path) -> list[tuple[float, int, dict[str, int]]]:
    """The points of the last ten minutes, oldest first; none when the file is
    missing, unreadable or not ours."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    now = time.time()
    out: list[tuple[float, int, dict[str, int]]] = []
    if not isinstance(raw, list):
        return []
    for p in raw:
        try:
            wall, head = float(p["wall"]), int(p["head"])
            connections = {str(k): int(v) for k, v in dict(p["connections"]).items()}
        except (KeyError, TypeError, ValueError):
            continue
        if now - KEPT_SECONDS <= wall <= now:
            out.append((wall, head, connections))
    out.sort(key=lambda p: p[0])
    return out
