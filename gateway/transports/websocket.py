"""The WebSocket transport loop shared by protocols that run over WebSocket.

It plays the role :mod:`gateway.transports.tcp` plays for byte streams: one loop per
connection pumps messages into a protocol session (one binary message per
``data_received`` call: message-framed protocols such as ReactiveSocket carry
exactly one frame per message), writes wait for the socket to drain
(backpressure), an optional idle timeout closes silent connections, and an
exception in a session closes that connection only.  The endpoint is an
aiohttp route on the gateway's HTTP port.

Browsers let any page open a WebSocket to any address, and send the page's
origin along: a handshake whose ``Origin`` is not in the app's
:data:`ALLOWED_ORIGINS` (``websocket_allowed_origins``, empty by default) is
refused with 403, so a page on some other site cannot use a visitor's
browser to reach the gateway.  Clients that are not browsers send no Origin
and are not affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import WebSocketError, WSCloseCode, WSMsgType, web

from polyport.gateway.transports.tcp import (
    FrameDeadline,
    HandshakeDeadline,
    register_connection,
    unregister_connection,
)
from polyport.gateway.transports.tls import transport_user
from polyport.protocols.connections import (
    FRAME_TIMEOUT,
    IDLE,
    INTERNAL,
    PEER_CLOSED,
    SHUTDOWN,
    Connection,
)
from polyport.protocols.session import CURRENT_PEER, ListenerStats, Outbound, Peer, StreamSession

log = logging.getLogger("polyport.websocket")

# How long a closing handshake may take before the connection is dropped.
CLOSE_TIMEOUT = 2.0
# Bytes aiohttp may buffer for writing before send waits for the socket.
WRITER_LIMIT = 64 * 1024


class WebSocketOutbound:
    """:class:`Outbound` over an aiohttp WebSocket: one ``send`` = one binary message."""

    def __init__(self, ws: web.WebSocketResponse, peer: str, stats: ListenerStats) -> None:
        self._ws = ws
        self._stats = stats
        self.peer = peer
        self._closed = False
        self.handshaken = False
        # Serialises sends so messages leave in the order ``send`` was called
        # (FIFO lock), whatever aiohttp does while draining.
        self._lock = asyncio.Lock()
        self._close_task: asyncio.Task[None] | None = None
        self.connection: Connection | None = None  # set once registered

    @property
    def closed(self) -> bool:
        return self._closed or self._ws.closed

    @property
    def closed_here(self) -> bool:
        """Closed by the server side (a session, an admin, shutdown)."""
        return self._closed

    async def send(self, data: bytes) -> None:
        if self.closed:
            return
        async with self._lock:
            if self.closed:
                return
            try:
                # aiohttp drains once its write buffer passes the writer
                # limit: this await is the backpressure path.
                await self._ws.send_bytes(data)
            except (ConnectionError, RuntimeError, OSError):
                self._closed = True
                return
            self._stats.bytes_out += len(data)
            if self.connection is not None:
                self.connection.bytes_out += len(data)

    def try_send(self, data: bytes) -> bool:
        # aiohttp's send may always wait (its lock, its drain).
        return False

    def handshake_done(self) -> None:
        self.handshaken = True

    def close(self, code: int = WSCloseCode.OK, message: bytes = b"") -> None:
        """Send the close handshake after everything already sent."""
        self._closed = True
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close(code, message))

    async def wait_closed(self) -> None:
        if self._close_task is not None:
            await asyncio.shield(self._close_task)

    async def _close(self, code: int, message: bytes) -> None:
        # Messages already handed to aiohttp are in the transport buffer, so
        # the close frame follows them.  A peer that stops reading cannot hold
        # the close up for long: on timeout aiohttp drops the transport.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT * 2):
                await self._ws.close(code=code, message=message)


SessionFactory = Callable[[Outbound], StreamSession]

# Any origin, when an operator really means it.
ANY_ORIGIN = "*"


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, without a trailing slash, as
    browsers send it (``null`` for opaque origins stays ``null``)."""
    return origin.strip().rstrip("/").lower()


def origin_allowed(origin: str | None, allowed: tuple[str, ...]) -> bool:
    """No Origin header: not a browser, allowed.  Otherwise it must be listed."""
    if origin is None:
        return True
    wanted = {normalize_origin(a) for a in allowed}
    return ANY_ORIGIN in wanted or normalize_origin(origin) in wanted


# Set by the gateway when the HTTP port speaks TLS: where a client
# certificate names its user (gateway.transports.tls.certificate_user).
TLS_USER_FROM: web.AppKey[str] = web.AppKey("tls_user_from")


def _certificate_user(request: web.Request) -> str | None:
    user_from = request.app.get(TLS_USER_FROM)
    if user_from is None:
        return None
    return transport_user(request.transport, user_from)


class _InputWatch(asyncio.Protocol):
    """Between the transport and aiohttp's protocol: says when bytes arrive
    (``frame_timeout``: aiohttp shows a message only once it is whole, and
    a peer trickling one in would otherwise go unseen until it completes)."""

    def __init__(self, inner: asyncio.Protocol, arrived: Callable[[], None]) -> None:
        self._inner = inner
        self._arrived = arrived

    def data_received(self, data: bytes) -> None:
        self._arrived()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _watch_input(request: web.Request, arrived: Callable[[], None]) -> None:
    transport = request.transport
    if transport is None:
        return
    inner = transport.get_protocol()
    if isinstance(inner, asyncio.Protocol):
        transport.set_protocol(_InputWatch(inner, arrived))


class _Discard(asyncio.Protocol):
    """Reads and drops whatever the peer still sends; ``done`` once it stops."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        if not self.done.done():
            self.done.set_result(None)
        return True  # keep the transport: the owner closes it

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _LingeringResponse(web.WebSocketResponse):
    """A WebSocket that closes after a too-big message without a reset.

    aiohttp answers a message over ``max_msg_size`` with close 1009 and then
    closes the transport at once, with the rest of the message unread: the
    kernel then resets the connection and the peer, still sending, never
    reads the close frame.  Here the transport stays open a little longer
    (the owner awaits :meth:`linger`), reading and dropping the rest, so the
    close frame is what the peer sees.  (Overrides aiohttp's private
    ``_close_transport``; the subclass is the one place that knows it.)
    """

    _lingering: asyncio.Future[None] | None = None

    def _close_transport(self) -> None:
        req = self._req
        transport = req.transport if req is not None else None
        reader = self._reader
        failure = reader.exception() if reader is not None else None
        if (
            isinstance(failure, WebSocketError)
            and failure.code == WSCloseCode.MESSAGE_TOO_BIG
            and self._lingering is None
            and transport is not None
            and not transport.is_closing()
        ):
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            original = transport.get_protocol()
            transport.set_protocol(_Discard(done))

            def restore(_: object) -> None:
                # aiohttp's protocol is told the connection is gone as usual.
                transport.set_protocol(original)
                transport.close()

            done.add_done_callback(restore)
            self._lingering = done
            return
        super()._close_transport()

    async def linger(self) -> None:
        """Wait (at most CLOSE_TIMEOUT) until a too-big message is drained."""
        done = self._lingering
        if done is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await asyncio.shield(done)
        if not done.done():
            done.set_result(None)


def _peer_address(request: web.Request) -> str:
    """``host:port`` of the connection, as TCP names its peers."""
    peer = request.remote or "?"
    transport = request.transport
    if transport is not None:
        addr = transport.get_extra_info("peername")
        if isinstance(addr, tuple):
            peer = f"{addr[0]}:{addr[1]}"
    return peer


@dataclass
class WebSocketEndpoint:
    """A WebSocket route whose connections each get a session from ``factory``.

    ``max_message_size`` bounds what aiohttp buffers for one message (above
    it aiohttp closes with 1009); text messages are refused with close code
    1003 unless ``accept_text`` (then their UTF-8 bytes go to the session).
    """

    name: str
    factory: SessionFactory
    stats: ListenerStats
    max_message_size: int = 4 * 1024 * 1024
    idle_timeout: float | None = None
    accept_text: bool = False
    _connections: dict[asyncio.Task[object], WebSocketOutbound] = field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def open_connections(self) -> int:
        """Connections this endpoint serves now (``/status`` lists it)."""
        return len(self._connections)

    def install(self, app: web.Application, path: str) -> None:
        app.router.add_get(path, self.handle)
        app.on_shutdown.append(self._on_shutdown)
        # /status lists the WebSocket endpoints beside the TCP listeners.
        if WEBSOCKET_ENDPOINTS not in app:
            app[WEBSOCKET_ENDPOINTS] = []
        app[WEBSOCKET_ENDPOINTS].append((path, self))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = self._response()
        if not ws.can_prepare(request).ok:
            return web.Response(status=426, text=f"{self.name}: WebSocket upgrade required\n")
        peer = _peer_address(request)
        refusal = self._refuse_origin(request, peer)
        if refusal is not None:
            return refusal
        host = request.remote or "?"  # the source address, as TCP counts it
        refused = self.stats.admit(host)
        if refused is not None:
            log.warning("%s: WebSocket refused from %s: %s", self.name, peer, refused)
            return web.Response(status=503, text=f"{self.name}: too many connections\n")
        try:
            await ws.prepare(request)
        except BaseException:
            self.stats.release(host)
            raise
        task = asyncio.current_task()
        assert task is not None
        out = WebSocketOutbound(ws, peer, self.stats)
        conn = out.connection = register_connection(self.stats, self.name, peer, out.close)
        reason: str | None = None  # None: the server side closed it
        # Tasks the session starts inherit the peer (error lines, metrics).
        CURRENT_PEER.set(Peer(self.name, peer, conn, certificate_user=_certificate_user(request),
                              host=host))
        self._connections[task] = out
        session: StreamSession | None = None
        try:
            session = self.factory(out)
            reason = await self._receive(request, ws, out, session, conn, peer)
        except ConnectionError:
            reason = PEER_CLOSED
        except asyncio.CancelledError:
            reason = SHUTDOWN
        except Exception:
            log.exception("%s: WebSocket from %s failed", self.name, peer)
            self.stats.error("internal")
            reason = INTERNAL
        finally:
            unregister_connection(self.stats, conn, reason)
            self.stats.release(host)
            self._connections.pop(task, None)
            if session is not None:
                try:
                    await session.connection_lost()
                except Exception:
                    log.exception("%s: cleanup after %s failed", self.name, peer)
            out.close()
            await out.wait_closed()
            await ws.linger()
        return ws

    def _response(self) -> _LingeringResponse:
        return _LingeringResponse(
            max_msg_size=self.max_message_size,
            # Compression would run large messages through an executor and
            # cost CPU per frame; the protocols carry binary payloads.
            compress=False,
            writer_limit=WRITER_LIMIT,
            timeout=CLOSE_TIMEOUT,
            # Pings find a vanished peer (and a proxy's dead connection) even
            # when the protocol itself is silent; no pong closes it.
            heartbeat=self.stats.websocket_heartbeat,
            # Pings and pongs come to the loop below, so that they count as
            # whole frames for frame_timeout (it answers pings itself).
            autoping=False,
        )

    def _refuse_origin(self, request: web.Request, peer: str) -> web.Response | None:
        """403 for a page whose origin is not allowed; None lets it through."""
        origin = request.headers.get("Origin")
        if origin_allowed(origin, request.app.get(ALLOWED_ORIGINS, ())):
            return None
        CURRENT_PEER.set(Peer(self.name, peer, host=request.remote))
        self.stats.error("forbidden")
        log.warning("%s: WebSocket from %s refused: origin %r is not allowed",
                    self.name, peer, origin)
        return web.Response(
            status=403,
            text=f"{self.name}: WebSocket connections from pages of {origin} are not "
                 "allowed; the gateway's operator can add that origin to "
                 "websocket_allowed_origins\n",
        )

    async def _receive(
        self, request: web.Request, ws: _LingeringResponse, out: WebSocketOutbound,
        session: StreamSession, conn: Connection, peer: str,
    ) -> str | None:
        """Hand each message to the session until the connection ends; the
        reason it ended (None: the server side closed it)."""
        reason: str | None = None
        deadline = HandshakeDeadline(self.stats)
        frame = FrameDeadline(self.stats)
        _watch_input(request, frame.bytes_arrived)
        while not out.closed:
            timeout = deadline.read_timeout(self.idle_timeout, out.handshaken)
            timeout = frame.read_timeout(timeout)
            try:
                async with asyncio.timeout(timeout) as waiting:
                    frame.waiting = waiting  # moved earlier when a frame starts
                    msg = await ws.receive()
            except TimeoutError:
                # (Still inside the timeout's wait: frame.waiting is cleared after.)
                ended, reason = await self._timed_out(
                    out, session, deadline, frame, timeout, peer)
                if ended:
                    break
                continue  # the handshake completed while waiting: idle time restarts
            finally:
                frame.waiting = None
            # A whole message: what arrived is used (a chunk that also
            # started the next one is caught at the next chunk).
            frame.completed()
            if msg.type == WSMsgType.PING:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.pong(msg.data)
                continue
            if msg.type == WSMsgType.PONG:
                continue
            if msg.type == WSMsgType.BINARY:
                data: bytes = msg.data
            elif msg.type == WSMsgType.TEXT and self.accept_text:
                data = msg.data.encode("utf-8")
            elif msg.type == WSMsgType.TEXT:
                out.close(WSCloseCode.UNSUPPORTED_DATA, b"binary messages only")
                break
            else:  # CLOSE, CLOSING, CLOSED, ERROR (e.g. message too big)
                if msg.type == WSMsgType.ERROR:
                    log.info("%s: WebSocket from %s failed: %s", self.name, peer, msg.data)
                    reason = f"protocol error {msg.data}"
                elif not out.closed_here:
                    reason = PEER_CLOSED
                break
            self.stats.bytes_in += len(data)
            conn.bytes_in += len(data)
            started = asyncio.get_running_loop().time()
            await session.data_received(data)
            frame.server_busy(asyncio.get_running_loop().time() - started)
        return reason

    async def _timed_out(
        self, out: WebSocketOutbound, session: StreamSession, deadline: HandshakeDeadline,
        frame: FrameDeadline, timeout: float | None, peer: str,
    ) -> tuple[bool, str | None]:
        """A read that waited ``timeout``: whether the connection ends, and why
        (None: the server side closed it)."""
        message = frame.expired(self.name, peer)
        if message is not None:
            await session.frame_timed_out(message)
            out.close(WSCloseCode.POLICY_VIOLATION, b"frame not completed in time")
            return True, FRAME_TIMEOUT
        if deadline.expired(self.name, peer, out.handshaken):
            out.close(WSCloseCode.POLICY_VIOLATION, b"no handshake in time")
            return True, None
        if timeout != self.idle_timeout:
            return False, None
        log.info("%s: closing idle WebSocket from %s", self.name, peer)
        return True, IDLE

    async def _on_shutdown(self, app: web.Application) -> None:
        """Close every connection (going away) so the HTTP server can stop
        without waiting for its shutdown timeout."""
        if not self._connections:
            return
        for out in list(self._connections.values()):
            if out.connection is not None:
                out.connection.close_reason = SHUTDOWN
            out.close(WSCloseCode.GOING_AWAY, b"server shutting down")
        tasks = list(self._connections)
        _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_TIMEOUT)


# The browser origins (``scheme://host[:port]``) allowed to open any
# WebSocket endpoint of the app; set from ``websocket_allowed_origins``.
ALLOWED_ORIGINS: web.AppKey[tuple[str, ...]] = web.AppKey("polyport_websocket_allowed_origins")

WEBSOCKET_ENDPOINTS: web.AppKey[list[tuple[str, WebSocketEndpoint]]] = web.AppKey(
    "polyport_websocket_endpoints"
)
