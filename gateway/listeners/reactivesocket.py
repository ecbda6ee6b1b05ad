"""ReactiveSocket listeners: TCP (default 7070) and WebSocket at
``/reactivesocket`` on the HTTP port.  Both feed the same adapter and count in
the same :class:`ListenerStats`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyport.gateway.registry import ListenerDef
from polyport.gateway.tcp import TcpListener
from polyport.gateway.websocket import WebSocketEndpoint
from polyport.protocols.reactivesocket.adapter import AdapterLimits, ReactiveSocketSession
from polyport.protocols.reactivesocket.frames import DEFAULT_PORT, PROTOCOL, WEBSOCKET_PATH
from polyport.protocols.session import ListenerStats, Outbound

if TYPE_CHECKING:
    from aiohttp import web

    from polyport.gateway.app import Gateway

# aiohttp buffers a message up to this much above the codec's frame limit, so
# an oversized frame still reaches the codec and gets the protocol's ERROR
# (too_large) rather than a bare WebSocket close 1009.
WS_MESSAGE_SLACK = 64 * 1024


def _stats(gw: Gateway) -> ListenerStats:
    running = gw.listeners.get(PROTOCOL)
    if running is not None:
        return running.stats
    return ListenerStats(PROTOCOL)  # TCP off: the WebSocket counts alone


async def start(gw: Gateway, host: str, port: int) -> TcpListener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    limits = AdapterLimits.from_settings(gw.settings)

    def factory(out: Outbound) -> ReactiveSocketSession:
        return ReactiveSocketSession(ctx, out, "tcp", limits)

    # The session applies the idle timeout itself: a subscriber that only
    # receives sends nothing for long stretches and must not be cut off.
    listener = TcpListener(
        PROTOCOL, factory, host, port, stats, idle_timeout=None, tls=gw.server_tls(PROTOCOL)
    )
    await listener.start()
    return listener


def http_setup(gw: Gateway, app: web.Application) -> None:
    stats = _stats(gw)
    ctx = gw.context(PROTOCOL, stats)
    limits = AdapterLimits.from_settings(gw.settings)

    def factory(out: Outbound) -> ReactiveSocketSession:
        return ReactiveSocketSession(ctx, out, "websocket", limits)

    endpoint = WebSocketEndpoint(
        PROTOCOL,
        factory,
        stats,
        max_message_size=limits.max_frame_size + WS_MESSAGE_SLACK,
        idle_timeout=None,
    )
    endpoint.install(app, WEBSOCKET_PATH)


LISTENER = ListenerDef(PROTOCOL, DEFAULT_PORT, start, http_setup)
