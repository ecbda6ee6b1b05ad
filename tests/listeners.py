"""Command-line port flags for tests that run ``polyport serve`` as a process."""

from __future__ import annotations

from collections.abc import Iterable

from polyport.gateway.config import DEFAULT_PORTS

LISTENERS = (*DEFAULT_PORTS, "http")


def port_flags(value: str, *, but: Iterable[str] = ()) -> list[str]:
    """``--<name>-port VALUE`` for every listener of ``polyport serve`` (HTTP
    included) except those in ``but``.  Derived from the gateway's own table:
    a listener a test forgets keeps its default port, which two tests running
    at once (pytest-xdist) then both try to bind."""
    skip = set(but)
    return [a for n in LISTENERS if n not in skip for a in (f"--{n}-port", value)]
