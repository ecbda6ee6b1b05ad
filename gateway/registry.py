"""Protocol listeners known to the gateway.

Each module in :mod:`gateway.listeners` defines ``LISTENER``, a
:class:`ListenerDef`.  The gateway starts every one whose port is not
``off``; adding a protocol never touches this file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aiohttp import web

    from polyport.gateway.app import Gateway
    from polyport.protocols.session import ListenerStats


class RunningListener(Protocol):
    name: str
    stats: ListenerStats

    @property
    def address(self) -> tuple[str, int]: ...

    async def stop_accepting(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class ListenerDef:
    name: str
    default_port: int
    start: Callable[[Gateway, str, int], Awaitable[RunningListener]]
    # Optional routes on the HTTP port (e.g. a WebSocket endpoint).
    http_setup: Callable[[Gateway, web.Application], Any] | None = None
    # With several workers (gateway/process/supervisor.py): True = started in every
    # worker, all bound to one port with SO_REUSEPORT (a TCP listener, whose
    # connections are independent); False = only in the first worker (a
    # listener that cannot share its port, like Res01's ZeroMQ ROUTER).
    per_worker: bool = True


def discover() -> list[ListenerDef]:
    import polyport.gateway.listeners as pkg

    found: list[ListenerDef] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"polyport.gateway.listeners.{info.name}")
        definition = getattr(module, "LISTENER", None)
        if isinstance(definition, ListenerDef):
            found.append(definition)
    return found
