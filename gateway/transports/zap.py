"""ZeroMQ authentication (ZAP, RFC 27) against polyport's users.

libzmq asks a ZAP handler, bound at ``inproc://zeromq.zap.01`` in the same
ZeroMQ context, whether each new connection to a socket with a security
mechanism may proceed.  This handler answers PLAIN logins with
:meth:`UserService.authenticate` (scrypt, the per-address failed-login
throttle) and replies with the user's name as ZAP's User-Id, which libzmq
then attaches to every message of that connection (``frame.get("User-Id")``):
the listener maps it to a principal per message.

Why not pyzmq's ``zmq.auth.asyncio.AsyncioAuthenticator``: its ZAP socket is
a REP, so it answers one request at a time.  A password check costs ~50 ms of
scrypt, and the throttle delays a guessing address by up to ten seconds;
behind a REP every other client's login would wait for those.  A ROUTER
answers each request when its own check is done (libzmq gives every
connection its own pipe to the handler, and each request names its pipe), so
one slow or throttled login never holds up another.

NULL connections only reach a ZAP handler when their socket has a ZAP domain;
the Res01 listener sets one on its NULL endpoint only when ``allow_from``
(``res01_allow_from``) is set: then every mechanism's handshake is refused
to a peer outside those networks before libzmq reads a message from it.
CURVE is answered by an optional ``curve`` check (a public key to a user
name), which the CURVE support plugs in; without one CURVE is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from polyport.core.errors import PolyportError, Unauthenticated
from polyport.core.users import UserService
from polyport.protocols.session import CURRENT_PEER, ListenerStats, Peer

log = logging.getLogger("polyport.zap")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
# The ZAP domain polyport's sockets name (ZMQ_ZAP_DOMAIN): every socket of a
# listener's context is checked the same way, the domain is informational.
DOMAIN = "polyport"
# ZAP requests being checked at once; beyond this, new connections are told
# to retry (status 300), so a connection flood costs bounded memory.
MAX_PENDING = 1024

# A CURVE client's public key (32 bytes) and address → the user it is, or
# None when the key is unknown.
CurveCheck = Callable[[bytes, str], Awaitable[str | None]]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ZapRequest:
    """One ZAP request (RFC 27), as libzmq sends it to a ROUTER handler."""

    routing: bytes
    request_id: bytes
    domain: str
    address: str
    mechanism: bytes
    credentials: tuple[bytes, ...]

    @classmethod
    def parse(cls, frames: list[bytes]) -> ZapRequest | None:
        # [routing, "", version, request id, domain, address, identity,
        #  mechanism, credentials…]
        if len(frames) < 8 or frames[1] != b"" or frames[2] != ZAP_VERSION:
            return None
        return cls(
            routing=frames[0],
            request_id=frames[3],
            domain=frames[4].decode("utf-8", "replace"),
            address=frames[5].decode("utf-8", "replace"),
            mechanism=frames[7],
            credentials=tuple(frames[8:]),
        )


@dataclass(frozen=True, slots=True)
class ZapDecision:
    status: bytes  # b"200" ok, b"300" temporary failure, b"400" refused, b"500" error
    text: str
    user_id: str = ""


def _address_in(address: str, networks: Sequence[IPNetwork]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:  # not an IP peer (ipc://, inproc://): not from a network
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # an IPv4 peer on a dual-stack socket
    return any(ip in net for net in networks)


def _allow(user: str) -> ZapDecision:
    return ZapDecision(b"200", "OK", user)


def _deny(text: str) -> ZapDecision:
    return ZapDecision(b"400", text)


class ZapHandler:
    """The ZAP handler of one ZeroMQ context.  :meth:`start` before any
    socket with a mechanism binds: libzmq lets PLAIN connections in
    unchecked when no handler is bound."""

    def __init__(
        self,
        zctx: zmq.asyncio.Context,
        users: UserService,
        stats: ListenerStats,
        *,
        protocol: str,
        curve: CurveCheck | None = None,
        allow_from: Sequence[IPNetwork] = (),
    ) -> None:
        """``allow_from``: the networks whose peers may connect at all
        (empty: every address)."""
        self._zctx = zctx
        self.allow_from = tuple(allow_from)
        self._users = users
        self._stats = stats
        self._protocol = protocol
        self.curve = curve
        self._sock: zmq.asyncio.Socket | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        sock = self._zctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(ZAP_ENDPOINT)
        self._sock = sock
        self._loop_task = asyncio.create_task(self._receive_loop(), name="zap")

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for task in list(self._pending):
            task.cancel()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def _receive_loop(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frames = await self._sock.recv_multipart()
            except zmq.ZMQError as exc:
                if exc.errno == zmq.ETERM or self._sock.closed:
                    return
                log.warning("zap: receive failed: %s", exc)
                await asyncio.sleep(0.01)
                continue
            request = ZapRequest.parse(frames)
            if request is None:
                # Not a ZAP 1.0 request: nothing in libzmq sends these.
                log.error("zap: ignoring a malformed request of %d frames", len(frames))
                continue
            if len(self._pending) >= MAX_PENDING:
                await self._reply(request, ZapDecision(b"300", "too many logins at once"))
                continue
            task = asyncio.create_task(self._serve(request))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, request: ZapRequest) -> None:
        CURRENT_PEER.set(Peer(self._protocol, request.address))
        try:
            decision = await self.decide(request)
        except PolyportError as exc:  # e.g. the database is unreachable
            log.warning("zap: cannot check a %s login: %s", request.mechanism.decode(), exc)
            decision = ZapDecision(b"500", exc.message)
        except Exception as exc:
            log.exception("zap: checking a login failed")
            decision = ZapDecision(b"500", f"internal error: {type(exc).__name__}")
        if decision.status == b"400":
            self._stats.error(Unauthenticated.code)
        await self._reply(request, decision)

    async def decide(self, request: ZapRequest) -> ZapDecision:
        """Whether the connection may proceed, and as whom."""
        if self.allow_from and not _address_in(request.address, self.allow_from):
            # Before any credential is looked at: an unknown peer costs no
            # password check, and gets no chance to send a message.
            return _deny(f"{request.address} is not in res01_allow_from")
        mechanism = request.mechanism
        if mechanism == b"PLAIN":
            if len(request.credentials) != 2:
                return _deny("PLAIN needs a user name and a password")
            user = request.credentials[0].decode("utf-8", "replace")
            password = request.credentials[1].decode("utf-8", "replace")
            if not user:
                # authenticate() would take a missing name for anonymous; a
                # PLAIN login always names its user.
                return _deny("a PLAIN login needs a user name")
            try:
                principal = await self._users.authenticate(user, password, peer=request.address)
            except Unauthenticated as exc:
                return _deny(exc.message)
            assert principal.user is not None
            return _allow(principal.user)
        if mechanism == b"CURVE":
            if self.curve is None or len(request.credentials) != 1:
                return _deny("CURVE is not accepted here")
            found = await self.curve(request.credentials[0], request.address)
            return _allow(found) if found else _deny("unknown CURVE key")
        if mechanism == b"NULL":
            # Only a socket with a ZAP domain asks about NULL (ours, with
            # allow_from): NULL is anonymous access.
            if self._users.allow_anonymous:
                return _allow("")
            return _deny("anonymous access is disabled: log in with PLAIN")
        return _deny(f"mechanism {mechanism.decode('ascii', 'replace')} is not accepted")

    async def _reply(self, request: ZapRequest, decision: ZapDecision) -> None:
        sock = self._sock
        if sock is None or sock.closed:
            return
        frames = [
            request.routing,
            b"",
            ZAP_VERSION,
            request.request_id,
            decision.status,
            decision.text.encode("utf-8", "replace"),
            decision.user_id.encode("utf-8") if decision.status == b"200" else b"",
            b"",  # metadata: none
        ]
        try:
            await sock.send_multipart(frames, flags=zmq.DONTWAIT)
        except zmq.ZMQError as exc:  # the connection went away meanwhile
            log.debug("zap: reply not sent: %s", exc)
