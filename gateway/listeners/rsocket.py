"""RSocket 1.0 listeners: TCP (default 7878) and WebSocket at ``/rsocket`` on
the HTTP port.  Both feed the same adapter and count in the same
:class:`ListenerStats`; the ReactiveSocket draft keeps its own port and path
(``reactivesocket.py``) over the same store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyport.gateway.registry import ListenerDef
from polyport.gateway.tcp import TcpListener
from polyport.gateway.websocket import WebSocketEndpoint
from polyport.protocols.rsocket.adapter import AdapterLimits, RSocketSession
from polyport.protocols.rsocket.frames import DEFAULT_PORT, PROTOCOL, WEBSOCKET_PATH
from polyport.protocols.session import ListenerStats, Outbound

if TYPE_CHECKING:
    from aiohttp import web

    from polyport.gateway.app import Gateway

# aiohttp buffers a message up to this much above the codec's frame limit, so
# an oversized frame still reaches the codec and gets the protocol's ERROR
# rather than a bare WebSocket close 1009.
WS_MESSAGE_SLACK = 64 * 1024


async def start(gw: Gateway, host: str, port: int) -> TcpListener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    limits = AdapterLimits.from_settings(gw.settings)

    def factory(out: Outbound) -> RSocketSession:
        return RSocketSession(ctx, out, "tcp", limits)

    # Liveness is the SETUP's max lifetime, which the session enforces: a
    # subscriber that only receives still sends KEEPALIVEs.
    listener = TcpListener(
        PROTOCOL, factory, host, port, stats, idle_timeout=None, tls=gw.server_tls(PROTOCOL)
    )
    await listener.start()
    return listener


def http_setup(gw: Gateway, app: web.Application) -> None:
    running = gw.listeners.get(PROTOCOL)
    # With TCP off the WebSocket counts alone.
    stats = running.stats if running is not None else ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    limits = AdapterLimits.from_settings(gw.settings)

    def factory(out: Outbound) -> RSocketSession:
        return RSocketSession(ctx, out, "websocket", limits)

    endpoint = WebSocketEndpoint(
        PROTOCOL,
        factory,
        stats,
        max_message_size=limits.max_frame_size + WS_MESSAGE_SLACK,
        idle_timeout=None,
    )
    endpoint.install(app, WEBSOCKET_PATH)


LISTENER = ListenerDef(PROTOCOL, DEFAULT_PORT, start, http_setup)
