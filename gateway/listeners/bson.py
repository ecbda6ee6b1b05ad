"""The BSON frames listener: asyncio TCP, default port 7451."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyport.gateway.registry import ListenerDef
from polyport.gateway.transports.tcp import TcpListener
from polyport.protocols.bson.adapter import session_factory
from polyport.protocols.bson.frames import DEFAULT_PORT, PROTOCOL
from polyport.protocols.session import ListenerStats

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway


async def start(gw: Gateway, host: str, port: int) -> TcpListener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    idle = gw.settings.get("idle_timeout")
    listener = TcpListener(
        PROTOCOL,
        session_factory(ctx, gw.budget_account),
        host,
        port,
        stats,
        idle_timeout=float(idle) if idle else None,
        tls=gw.server_tls(PROTOCOL),
    )
    await listener.start()
    return listener


LISTENER = ListenerDef(PROTOCOL, DEFAULT_PORT, start)
