"""Segment wire listener (default tcp 12345)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyport.gateway.registry import ListenerDef
from polyport.gateway.transports.tcp import TcpListener
from polyport.protocols.segment.adapter import AppenderRegistry, SegmentSession
from polyport.protocols.segment.frames import DEFAULT_PORT, PROTOCOL
from polyport.protocols.segment.limits import Limits
from polyport.protocols.session import ListenerStats, Outbound

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway


async def start(gw: Gateway, host: str, port: int) -> TcpListener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    limits = Limits.from_settings(ctx.settings)
    # Shared by this listener's sessions: who owns each (ConnectionId, segment).
    registry = AppenderRegistry()

    def factory(out: Outbound) -> SegmentSession:
        return SegmentSession(ctx, out, registry, limits, gw.budget_account())

    listener = TcpListener(PROTOCOL, factory, host, port, stats, idle_timeout=limits.idle_timeout,
                           tls=gw.server_tls(PROTOCOL))
    await listener.start()
    return listener


LISTENER = ListenerDef(name=PROTOCOL, default_port=DEFAULT_PORT, start=start)
