"""The listeners of both ReactiveSocket versions (the draft and RSocket 1.0):
TCP on the protocol's port and WebSocket at its path on the HTTP port.  Both
feed the same adapter and count in the same :class:`ListenerStats`; the two
versions differ only in protocol name, port, path and session class.  Every
connection of both draws its fragments from the gateway's one
``reassembly_budget``, by the host it comes from."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from polyport.gateway.registry import ListenerDef
from polyport.gateway.transports.tcp import TcpListener
from polyport.gateway.transports.websocket import WebSocketEndpoint
from polyport.protocols.budgets import BudgetAccount
from polyport.protocols.session import ListenerStats, Outbound, SessionContext

if TYPE_CHECKING:
    from aiohttp import web

    from polyport.gateway.app import Gateway

# aiohttp buffers a message up to this much above the codec's frame limit, so
# an oversized frame still reaches the codec and gets the protocol's ERROR
# (too_large) rather than a bare WebSocket close 1009.
WS_MESSAGE_SLACK = 64 * 1024


SessionType = Callable[[SessionContext, Outbound, str, Any, BudgetAccount], Any]


def reactive_listener(
    protocol: str,
    port: int,
    path: str,
    session: SessionType,
    limits_from_settings: Callable[[Any], Any],
) -> ListenerDef:
    """``LISTENER`` of a ReactiveSocket version: ``session(ctx, out,
    transport, limits, budget)`` makes one connection's session, with the
    limits (which have ``max_frame_size``) from the gateway's settings and
    its account in the gateway's reassembly budget."""

    async def start(gw: Gateway, host: str, p: int) -> TcpListener:
        stats = ListenerStats(protocol)
        ctx = gw.context(protocol, stats)
        limits = limits_from_settings(gw.settings)

        def factory(out: Outbound) -> Any:
            return session(ctx, out, "tcp", limits, gw.budget_account())

        # The session applies liveness itself (the draft's idle timeout,
        # RSocket's SETUP lifetime): a subscriber that only receives sends
        # little or nothing for long stretches and must not be cut off.
        listener = TcpListener(
            protocol, factory, host, p, stats, idle_timeout=None, tls=gw.server_tls(protocol)
        )
        await listener.start()
        return listener

    def http_setup(gw: Gateway, app: web.Application) -> None:
        running = gw.listeners.get(protocol)
        # With TCP off the WebSocket counts alone.
        stats = running.stats if running is not None else ListenerStats(protocol)
        ctx = gw.context(protocol, stats)
        limits = limits_from_settings(gw.settings)

        def factory(out: Outbound) -> Any:
            return session(ctx, out, "websocket", limits, gw.budget_account())

        endpoint = WebSocketEndpoint(
            protocol,
            factory,
            stats,
            max_message_size=limits.max_frame_size + WS_MESSAGE_SLACK,
            idle_timeout=None,
        )
        endpoint.install(app, path)

    return ListenerDef(protocol, port, start, http_setup)
