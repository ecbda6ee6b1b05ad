"""Res01 listener: a ZeroMQ ROUTER (default tcp 5560), with an optional
PLAIN login port.  The sockets are ``gateway/transports/zmq_router.py``'s; the
protocol (decoding, admission, logins, per-peer state, requests) is one
:class:`~polyport.protocols.res01.session.Res01Session` for all peers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from polyport.gateway.app import is_loopback
from polyport.gateway.registry import ListenerDef
from polyport.gateway.transports.curve import curve_server
from polyport.gateway.transports.zmq_router import RouterListener
from polyport.protocols.res01.frames import DEFAULT_PORT, PROTOCOL
from polyport.protocols.res01.limits import Limits
from polyport.protocols.res01.session import Res01Session, Router
from polyport.protocols.session import ListenerStats

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

log = logging.getLogger("polyport.res01")


async def start(gw: Gateway, host: str, port: int) -> RouterListener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    limits = Limits.from_settings(ctx.settings)

    def session(router: Router, logins: Sequence[bool]) -> Res01Session:
        return Res01Session(ctx, limits, router, logins=logins)

    listener = RouterListener(
        PROTOCOL, host, port, limits, stats, session,
        users=gw.store.users,  # ZAP's PLAIN and CURVE logins
        curve=curve_server(gw.config, gw.store.users),
        login_port=gw.config.res01_login_port,
        allow_from=gw.config.res01_allow_from,
    )
    await listener.start()
    warn_if_open_to_everyone(host, gw.config.res01_allow_from)
    if listener.login_address is not None:
        log.info("listener res01 (PLAIN login) on %s:%d", *listener.login_address)
    return listener


def warn_if_open_to_everyone(host: str, allow_from: tuple[str, ...]) -> None:
    """Nothing bounds what libzmq holds of a multipart message whose last
    part never comes; on a loopback host only local peers can try."""
    if not allow_from and not is_loopback(host):
        log.warning(
            "res01 listens on %s for every address: a peer that completes the ZeroMQ "
            "handshake can make the gateway hold one multipart message without limit "
            "(libzmq keeps every part until the last); set res01_allow_from to the "
            "networks of your clients, or require CURVE or PLAIN logins "
            "(docs/operations.md, Security model)",
            host,
        )


# ZeroMQ binds without SO_REUSEPORT, and a ROUTER's peers and fetch
# subscriptions live in one process: the first worker only.
LISTENER = ListenerDef(PROTOCOL, DEFAULT_PORT, start, per_worker=False)
