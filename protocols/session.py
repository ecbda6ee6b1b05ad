"""The seam between gateway transports and protocol adapters.

A gateway transport (asyncio TCP, WebSocket) owns the socket; it feeds received
bytes to a :class:`StreamSession` and gives it an :class:`Outbound` to write
with.  ``Outbound.send`` waits while the peer is slow to read, which is the
backpressure path: a session that awaits it never buffers without bound.
"""

from __future__ import annotations

from typing import Protocol


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
