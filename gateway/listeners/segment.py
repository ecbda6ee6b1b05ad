"""Segment wire listener (default tcp 12345)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyport.gateway.registry import ListenerDef
from polyport.gateway.tcp import TcpListener
from polyport.protocols.segment.adapter import AppenderRegistry, SegmentSession, SegmentSettings
from polyport.protocols.segment.frames import DEFAULT_PORT, PROTOCOL
from polyport.protocols.session import ListenerStats, Outbound

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway


async def start(gw: Gateway, host: str, port: int) -> TcpListener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    settings = SegmentSettings.from_settings(ctx.settings)
    # Shared by this listener's sessions: who owns each (ConnectionId, segment).
    registry = AppenderRegistry()
    idle = ctx.settings.get("idle_timeout")

    def factory(out: Outbound) -> SegmentSession:
        return SegmentSession(ctx, out, registry, settings)

    listener = TcpListener(
        PROTOCOL, factory, host, port, stats, idle_timeout=float(idle) if idle else None
    )
    await listener.start()
    return listener


LISTENER = ListenerDef(name=PROTOCOL, default_port=DEFAULT_PORT, start=start)
