"""MicroMsg2 listener: asyncio TCP, default port 7090."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from polyport.gateway.registry import ListenerDef
from polyport.gateway.transports.tcp import TcpListener
from polyport.protocols.micromsg2.adapter import MicroMsg2Session
from polyport.protocols.micromsg2.frames import DEFAULT_PORT, PROTOCOL
from polyport.protocols.micromsg2.limits import Limits
from polyport.protocols.session import ListenerStats, Outbound

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway


@dataclass
class MicroMsg2Listener(TcpListener):
    """A TcpListener that also knows its open sessions (for status and tests)."""

    sessions: set[MicroMsg2Session] = field(default_factory=set)


async def start(gw: Gateway, host: str, port: int) -> MicroMsg2Listener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    limits = Limits.from_settings(ctx.settings)
    listener: MicroMsg2Listener

    def factory(out: Outbound) -> MicroMsg2Session:
        session = MicroMsg2Session(ctx, out, limits, gw.budget_account())
        listener.sessions.add(session)
        session.on_close = listener.sessions.discard
        return session

    # The transport's idle timeout is off: a subscriber legitimately sends
    # nothing for a long time.  The session closes connections that never
    # finish the handshake or are idle with nothing subscribed.
    listener = MicroMsg2Listener(
        PROTOCOL, factory, host, port, stats, idle_timeout=None, tls=gw.server_tls(PROTOCOL)
    )
    await listener.start()
    return listener


LISTENER = ListenerDef(PROTOCOL, DEFAULT_PORT, start)
