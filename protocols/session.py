"""The seam between gateway transports and protocol adapters.

A gateway transport (asyncio TCP, WebSocket) owns the socket; it feeds received
bytes to a :class:`StreamSession` and gives it an :class:`Outbound` to write
with.  ``Outbound.send`` waits while the peer is slow to read, which is the
backpressure path: a session that awaits it never buffers without bound.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from core.store import EventStore


class Outbound(Protocol):
    peer: str

    async def send(self, data: bytes) -> None:
        """Write ``data``; returns once the transport buffer is below its
        high-water mark."""

    def close(self) -> None:
        """Flush what was sent, then close the connection."""

    @property
    def closed(self) -> bool: ...


class StreamSession(Protocol):
    async def data_received(self, data: bytes) -> None:
        """Handle bytes from the peer.  The transport does not read more until
        this returns, so long-running work belongs in a task of the session."""

    async def connection_lost(self) -> None:
        """The connection is gone: cancel tasks, release subscriptions."""


@dataclass
class ListenerStats:
    """Counters one listener keeps; ``/status`` and ``/metrics`` read them."""

    protocol: str
    connections_total: int = 0
    connections_open: int = 0
    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def error(self, code: str) -> None:
        self.errors[code] += 1


@dataclass
class SessionContext:
    """What every protocol session gets from the gateway."""

    store: EventStore
    stats: ListenerStats
    settings: dict[str, Any]
    log: logging.Logger
