"""Res01 listener: a pyzmq asyncio ROUTER socket (default tcp 5560).

The one transport that is not a byte stream: ZeroMQ delivers whole multipart
messages, and a ROUTER has no per-peer connection to hang a session on.  So
this module is the transport loop for Res01:

- one receive loop hands each message to the sans-IO
  :class:`~polyport.protocols.res01.connection.ServerConnection`, which decodes
  it and opens its request, and answers at once what it cannot decode or what
  is over ``max_request_bytes`` (ER 1/2/3);
- every reply goes out through that connection, which checks it against the
  request (the right response command or ER, one EF per FE entry, nothing
  after the final reply), per peer;
- an admitted request runs as a task of its own (``Res01Handler``), so a slow
  commit for one client never holds up another client's fetch;
- admission is bounded: at most ``res01_max_in_flight_writes`` AC and
  ``res01_max_in_flight_reads`` other requests, and a byte budget; beyond that
  the request is answered at once with ER 4 (writer busy) or ER 10 (reader
  busy) instead of being queued;
- replies are sent with ``DONTWAIT`` through ``ZMQ_ROUTER_MANDATORY``: a reply
  to a peer whose queue is at its high-water mark waits (that request's task
  only) up to ``send_timeout``, then is dropped; a reply to a peer that is
  gone is dropped at once.  Nothing is buffered beyond ZeroMQ's HWM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from polyport.core.access import Tenant
from polyport.core.errors import Unauthenticated
from polyport.gateway.app import is_loopback
from polyport.gateway.registry import ListenerDef
from polyport.gateway.transports.curve import CurveServer, curve_server
from polyport.gateway.transports.tcp import register_connection, unregister_connection
from polyport.gateway.transports.zap import DOMAIN as ZAP_DOMAIN
from polyport.gateway.transports.zap import ZapHandler
from polyport.protocols.connections import ADMIN_CLOSE, IDLE, PEER_CLOSED, SHUTDOWN, Connection
from polyport.protocols.res01 import DEFAULT_PORT, PROTOCOL, Error, Res01Error, Response
from polyport.protocols.res01.adapter import (
    Res01Handler,
    Res01Limits,
    is_write,
    limits_from,
)
from polyport.protocols.res01.connection import (
    Exchange,
    MessageAssembler,
    Received,
    ServerConnection,
)
from polyport.protocols.res01.errors import ErrorCode, LocalProtocolError, error_reply
from polyport.protocols.res01.peers import PeerTable
from polyport.protocols.session import CURRENT_PEER, ListenerStats, Peer, SessionContext

if TYPE_CHECKING:
    from polyport.core.store import EventStore
    from polyport.gateway.app import Gateway

log = logging.getLogger("polyport.res01")
# Parts taken without awaiting before the receive loop yields once.
RECV_BURST = 256

# Messages ZeroMQ may queue per peer in each direction.  Small: a message may
# be up to max_request_bytes, and the in-flight limits already bound the work.
RECEIVE_HWM = 100
SEND_HWM = 1000
# On close: how long in-flight requests may finish, and how long ZeroMQ may
# still flush their replies.
CLOSE_GRACE = 5.0
LINGER_MS = 500
# A logged-in peer's principal is looked up again after this long, so a
# change of the user's contexts reaches connections that stay open.
TENANT_TTL = 30.0
# A ROUTER cannot tell which peer a disconnect was: a peer silent this long
# (or the gateway's idle timeout, if shorter) is forgotten and leaves the
# connection table; so does every peer once no TCP connection is left.
PEER_FORGET_AFTER = 600.0


def _endpoint(host: str, port: int) -> str:
    where = f"[{host}]" if ":" in host else host
    return f"tcp://{where}:{port if port else '*'}"


@dataclass(eq=False)
class _Endpoint:
    """One ROUTER socket of the listener and its request/reply pairing.
    ``plain``: connections log in with ZAP PLAIN (each message carries the
    User-Id); otherwise NULL, every message anonymous."""

    plain: bool
    port: int
    conn: ServerConnection
    # CURVE: the client's public key, mapped to a user by ZAP, is its login.
    curve: bool = False
    sock: zmq.asyncio.Socket | None = None
    monitor: zmq.asyncio.Socket | None = None
    endpoint: str = ""
    address: tuple[str, int] = ("", 0)
    recv_task: asyncio.Task[None] | None = None
    monitor_task: asyncio.Task[None] | None = None


class Res01Listener:
    def __init__(
        self,
        name: str,
        ctx: SessionContext,
        host: str,
        port: int,
        limits: Res01Limits,
        curve: CurveServer | None = None,
        *,
        store: EventStore,
        login_port: int | None = None,
        allow_from: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        # ZeroMQ CURVE (gateway/transports/curve.py): set up before the socket binds.
        self.curve = curve
        self.stats = ctx.stats
        self.limits = limits
        self.host = host
        self.port = port
        self._store = store
        self._users = store.users
        self.handler = Res01Handler(ctx.stats, ctx.log, limits)
        self._anonymous = Tenant(store, self._users.anonymous)
        # A ZeroMQ socket speaks one mechanism: the main port is NULL
        # (anonymous) while anonymous access is on, PLAIN when it is off; the
        # login port, when configured, is always PLAIN.
        # With CURVE configured the main port is CURVE: the client's key is
        # its login.
        self._endpoints = [
            _Endpoint(plain=not self._users.allow_anonymous and curve is None, port=port,
                      conn=self._conn(), curve=curve is not None)
        ]
        if login_port is not None:
            self._endpoints.append(_Endpoint(plain=True, port=login_port, conn=self._conn()))
        self._zctx = zmq.asyncio.Context()
        # One ZAP handler per ZeroMQ context answers PLAIN and CURVE alike.
        self.zap = ZapHandler(self._zctx, self._users, ctx.stats, protocol=name,
                              curve=curve.user_for_key if curve is not None else None,
                              allow_from=[ipaddress.ip_network(n, strict=False)
                                          for n in allow_from])
        self._zap_started = False
        # Per peer (routing identity): its connection-table row, and the
        # principal of a logged-in peer, looked up once a while rather than
        # per message.  The table forgets idle peers and bounds their number
        # (res01_max_peers); a forgotten peer leaves the connection table.
        idle = limits.idle_timeout
        self.peers: PeerTable[bytes, _PeerState] = PeerTable(
            max_peers=limits.max_peers,
            idle_timeout=min(PEER_FORGET_AFTER, idle) if idle else PEER_FORGET_AFTER,
            on_forget=self._forgotten,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._writes = 0
        self._reads = 0
        self._bytes = 0
        self._closed = False

    def _conn(self) -> ServerConnection:
        # Request/reply pairing per peer; the counters are admission.
        return ServerConnection(max_request_bytes=self.limits.max_request_bytes)

    @property
    def address(self) -> tuple[str, int]:
        return self._endpoints[0].address if self._endpoints[0].sock else (self.host, self.port)

    @property
    def conn(self) -> ServerConnection:
        """The main endpoint's request/reply pairing."""
        return self._endpoints[0].conn

    @property
    def login_address(self) -> tuple[str, int] | None:
        """Where the PLAIN-only login endpoint listens, when configured."""
        if len(self._endpoints) < 2:
            return None
        return self._endpoints[1].address

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The ZeroMQ mechanism of each endpoint (main first)."""
        return tuple("CURVE" if e.curve else "PLAIN" if e.plain else "NULL"
                     for e in self._endpoints)

    @property
    def in_flight(self) -> tuple[int, int]:
        """(AC, other) requests being served now."""
        return self._writes, self._reads

    async def start(self) -> None:
        if self.zap.allow_from or any(e.plain or e.curve for e in self._endpoints):
            # Bound before any PLAIN socket: libzmq lets PLAIN connections in
            # unchecked when no ZAP handler is there.
            self.zap.start()
            self._zap_started = True
        try:
            for index, endpoint in enumerate(self._endpoints):
                self._bind(endpoint)
                endpoint.monitor_task = asyncio.create_task(
                    self._watch_peers(endpoint), name="res01-monitor"
                )
                endpoint.recv_task = asyncio.create_task(
                    self._receive_loop(index, endpoint), name="res01-receive"
                )
        except BaseException:
            await self.close()
            raise

    def _bind(self, endpoint: _Endpoint) -> None:
        sock = self._zctx.socket(zmq.ROUTER)
        # libzmq checks MAXMSGSIZE per frame; the whole message (parts and
        # bytes) as its parts are received (MessageAssembler).
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_bytes)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        if endpoint.plain:
            sock.setsockopt(zmq.PLAIN_SERVER, 1)
        if endpoint.plain or self.zap.allow_from:
            # With a domain libzmq asks ZAP about NULL handshakes too: the
            # only way to refuse a peer before it can send a message.
            sock.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        if ":" in self.host:
            sock.setsockopt(zmq.IPV6, 1)
        if endpoint.curve:
            assert self.curve is not None
            self.curve.apply(sock)
        try:
            sock.bind(_endpoint(self.host, endpoint.port))
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            # With its errno (libzmq's are the system's): naming_bind_errors
            # turns EADDRINUSE and the like into the one line naming the flag.
            raise OSError(
                exc.errno, f"res01: cannot listen on {self.host}:{endpoint.port}: {exc.strerror}"
            ) from exc
        endpoint.sock = sock
        endpoint.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        host, _, port = endpoint.endpoint.removeprefix("tcp://").rpartition(":")
        endpoint.address = (host.strip("[]"), int(port))
        endpoint.monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)

    # --- lifecycle ----------------------------------------------------------

    async def stop_accepting(self) -> None:
        """No new requests: stop receiving and unbind.  Requests already
        admitted go on, so commits drained by the store still get their CR."""
        for endpoint in self._endpoints:
            if endpoint.recv_task is not None:
                endpoint.recv_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await endpoint.recv_task
                endpoint.recv_task = None
            if endpoint.sock is not None and endpoint.endpoint:
                with contextlib.suppress(zmq.ZMQError):
                    endpoint.sock.unbind(endpoint.endpoint)
                endpoint.endpoint = ""

    async def close(self) -> None:
        if self._closed:
            return
        await self.stop_accepting()
        self._closed = True
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=CLOSE_GRACE)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for endpoint in self._endpoints:
            if endpoint.monitor_task is not None:
                endpoint.monitor_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await endpoint.monitor_task
            if endpoint.sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    endpoint.sock.disable_monitor()
            if endpoint.monitor is not None:
                endpoint.monitor.close(linger=0)
            if endpoint.sock is not None:
                endpoint.sock.close()
        if self._zap_started:
            await self.zap.close()
        self._forget_all(SHUTDOWN)
        # term() waits for the linger of queued replies: off the event loop.
        await asyncio.get_running_loop().run_in_executor(None, self._zctx.term)

    # --- receiving ----------------------------------------------------------

    async def _receive_loop(self, index: int, endpoint: _Endpoint) -> None:
        sock = endpoint.sock
        assert sock is not None
        limits = self.limits
        assert limits.max_request_bytes is not None
        # Parts one at a time, so an oversized message is refused as it
        # arrives: nothing past the limits is kept (ZeroMQ delivers a message
        # whole, so its remaining parts are already queued and cheap to drop).
        assembler = MessageAssembler(
            max_parts=limits.max_message_parts, max_bytes=limits.max_request_bytes
        )
        login = endpoint.plain or endpoint.curve
        user: str | None = None
        srcfd = -1
        first = True  # the next part starts a message
        # What is already queued is taken without awaiting, through a plain
        # socket on the same libzmq socket (what pyzmq itself does for a
        # DONTWAIT recv): awaiting each part cost a future and a trip round
        # the loop per part, 44 % of the gateway's samples in a pipelined
        # Res01 bench.  Only an empty queue is awaited.
        shadow: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        taken = 0
        while True:
            try:
                try:
                    frame = shadow.recv(zmq.DONTWAIT, copy=False)
                    taken += 1
                    if taken % RECV_BURST == 0:
                        await asyncio.sleep(0)  # let replies and other peers' work run
                except zmq.Again:
                    frame = await sock.recv(copy=False)
                if first:
                    # The TCP connection the message came over: how an
                    # admin close disconnects this peer (_disconnect).
                    srcfd = _source_fd(frame)
                if login and first:
                    # The first part carries its connection's User-Id,
                    # which ZAP's reply gave it.
                    user = _user_id(frame)
                received = assembler.add(frame.bytes, bool(shadow.getsockopt(zmq.RCVMORE)))
                first = received is not None
            except zmq.ZMQError as exc:
                if self._closed or exc.errno == zmq.ETERM:
                    return
                log.warning("res01: receive failed: %s", exc)
                await asyncio.sleep(0.01)
                continue
            if received is not None:
                await self._handle_message(index, endpoint, received, user, srcfd)

    async def _handle_message(
        self, index: int, endpoint: _Endpoint, received: Received, user: str | None,
        srcfd: int = -1,
    ) -> None:
        try:
            await self._dispatch(index, endpoint, received, user, srcfd)
        except Exception:  # a bug in one message must not end the loop
            log.exception("res01: dispatching a message failed")
            self.stats.error("internal")

    async def _dispatch(
        self, index: int, endpoint: _Endpoint, received: Received, user: str | None,
        srcfd: int = -1,
    ) -> None:
        frames = received.frames
        # ZeroMQ hides the peer's address: the routing identity names it.  The
        # request task started below inherits this (error lines, metrics).
        identity = frames[0] if frames else b""
        row = self._peer_connection(identity, srcfd)  # the connection table's row
        row.bytes_in += received.size
        CURRENT_PEER.set(Peer("res01", row.peer, row))
        self.stats.frames_in += 1
        self.stats.bytes_in += received.size
        conn = endpoint.conn
        if received.error is not None:  # over max_message_parts / max_request_bytes
            self.stats.error(received.error.code)
            if received.error.request_id is not None:
                await self._send(endpoint, conn.refuse(received.error), wait=False)
            return
        try:
            exchange = conn.receive_message(frames)
        except Res01Error as exc:  # undecodable or over max_request_bytes
            self.stats.error(exc.code)
            await self._send(endpoint, conn.refuse(exc), wait=False)
            return
        write = is_write(exchange.request)
        refusal = self._admission(write, exchange.size)
        if refusal is not None:
            self.stats.error("busy")
            code = ErrorCode.STORAGE_WRITER_BUSY if write else ErrorCode.STORAGE_READER_BUSY
            await self._reply(
                endpoint, exchange, error_reply(exchange.request, code, refusal), wait=False
            )
            conn.abandon(exchange)  # answered, unless the ER itself was refused
            return
        if write:
            self._writes += 1
        else:
            self._reads += 1
        self._bytes += exchange.size
        task = asyncio.create_task(self._serve(index, endpoint, exchange, write, user))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tenant(
        self, index: int, endpoint: _Endpoint, peer: bytes, user: str | None
    ) -> Tenant:
        """The tenant a request of this peer is served as.  A PLAIN peer is
        the user ZAP logged in; the principal (contexts may change) is looked
        up again after TENANT_TTL seconds, and whenever the routing id shows
        up with another user (a client may choose its routing id)."""
        if not (endpoint.plain or endpoint.curve):
            return self._anonymous
        if not user:
            # Cannot happen on a PLAIN socket behind our ZAP handler: refuse
            # rather than guess.
            raise Unauthenticated("this endpoint requires a ZeroMQ PLAIN login")
        now = time.monotonic()
        state = self.peers.get(peer)
        cached = state.login if state is not None else None
        if cached is not None and cached[:2] == (index, user) and cached[3] > now:
            return cached[2]
        tenant = Tenant(self._store, await self._users.principal_for(user))
        state = self.peers.get(peer)  # unless forgotten meanwhile
        if state is not None:
            # Narrowed in place, or the peer forgotten, when the user's
            # rights change (gateway/process/rights.py).
            state.row.user = user
            state.row.tenants.add(tenant)
            self.peers.set(peer, replace(state, login=(index, user, tenant, now + TENANT_TTL)))
        return tenant

    def _admission(self, write: bool, size: int) -> str | None:
        """Why the request cannot be admitted now, or None."""
        if write and self._writes >= self.limits.max_in_flight_writes:
            return (
                f"storage writer busy: {self._writes} commits in progress; retry shortly "
                "(re-sending the same event ids is safe)"
            )
        if not write and self._reads >= self.limits.max_in_flight_reads:
            return f"storage reader busy: {self._reads} requests in progress; retry shortly"
        if self._bytes and self._bytes + size > self.limits.max_in_flight_bytes:
            return f"server busy: {self._bytes} bytes of requests in progress; retry shortly"
        return None

    async def _serve(
        self, index: int, endpoint: _Endpoint, exchange: Exchange, write: bool, user: str | None
    ) -> None:
        request = exchange.request
        try:
            try:
                tenant = await self._tenant(index, endpoint, exchange.routing[0], user)
            except Unauthenticated as exc:  # the user was removed since logging in
                self.stats.error(exc.code)
                reply = error_reply(request, ErrorCode.UNAUTHENTICATED, exc.message)
                await self._reply(endpoint, exchange, reply, wait=True)
                return
            # A held FE (fetch_wait) only while at most half the read slots
            # are busy: the others stay free for requests that need them.
            hold = self._reads <= self.limits.max_in_flight_reads // 2
            replies_of = self.handler.handle(request, tenant, hold=hold)
            async with contextlib.aclosing(replies_of) as replies:
                async for response in replies:
                    if not await self._reply(endpoint, exchange, response, wait=True):
                        break  # the peer is gone or not reading: stop producing
                else:
                    if endpoint.conn.owed(exchange):
                        log.error(
                            "res01: %s ended with %d replies still due",
                            type(request).__name__,
                            endpoint.conn.owed(exchange),
                        )
                        self.stats.error("internal")
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("res01: serving %s failed", type(request).__name__)
            self.stats.error("internal")
        finally:
            endpoint.conn.abandon(exchange)
            if write:
                self._writes -= 1
            else:
                self._reads -= 1
            self._bytes -= exchange.size

    # --- sending ------------------------------------------------------------

    async def _reply(
        self, endpoint: _Endpoint, exchange: Exchange, response: Response, *, wait: bool
    ) -> bool:
        """Send one reply; False when no more should follow (the peer is gone
        or not reading, or the request had to be ended with an ER)."""
        conn = endpoint.conn
        try:
            frames = conn.send(exchange, response)
        except LocalProtocolError as exc:  # our bug: a value the wire cannot carry, …
            log.error("res01: cannot send %s: %s", type(response).__name__, exc)
            self.stats.error("internal")
            request = exchange.request
            substitute = Error(
                request.request_id,
                ErrorCode.UNEXPECTED,
                f"reply could not be encoded: {exc}",
                request.protocol,
            )
            try:
                frames = conn.send(exchange, substitute)
            except LocalProtocolError:
                return False  # already answered: nothing more may go out
            await self._send(endpoint, frames, wait=wait)
            return False  # ER is final: the request is over
        return await self._send(endpoint, frames, wait=wait)

    async def _send(self, endpoint: _Endpoint, frames: list[bytes], *, wait: bool) -> bool:
        """Send without blocking the loop.  ``wait``: retry while the peer's
        queue is full, up to send_timeout (request tasks); otherwise drop at
        once (the receive loop must never wait on one peer)."""
        sock = endpoint.sock
        if sock is None or sock.closed or not frames or not frames[0]:
            return False
        deadline = time.monotonic() + self.limits.send_timeout
        delay = 0.001
        while True:
            try:
                await sock.send_multipart(frames, flags=zmq.DONTWAIT)
            except zmq.Again:
                if not wait or time.monotonic() >= deadline:
                    self.stats.error("busy")
                    log.info("res01: dropped a reply to a peer that is not reading")
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
                continue
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH and not sock.closed:
                    log.warning("res01: send failed: %s", exc)
                return False  # the peer disconnected: nobody to answer
            self.stats.frames_out += 1
            size = sum(len(f) for f in frames)
            self.stats.bytes_out += size
            known = self.peers.get(frames[0])
            if known is not None:
                known.row.bytes_out += size
            return True

    # --- peers --------------------------------------------------------------

    async def _watch_peers(self, endpoint: _Endpoint) -> None:
        """Connection counters for /status, from the socket monitor."""
        assert endpoint.monitor is not None
        while True:
            try:
                event = parse_monitor_message(await endpoint.monitor.recv_multipart())
            except zmq.ZMQError:
                return
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.stats.connections_total += 1
                self.stats.connections_open += 1
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.stats.connections_open = max(0, self.stats.connections_open - 1)
                if self.stats.connections_open == 0:
                    self._forget_all(PEER_CLOSED)

    def _peer_connection(self, identity: bytes, srcfd: int = -1) -> Connection:
        """The peer's row in the connection table, registered on its first
        message; the peer is now the most recently seen."""
        state = self.peers.get(identity)
        if state is not None:
            self.peers.seen(identity)
            if srcfd != state.source[0]:  # the peer came back over a new connection
                self.peers.set(identity, replace(state, source=_source(srcfd)))
            return state.row
        row = register_connection(
            self.stats, self.name, "zmq:" + (identity.hex() or "?"),
            lambda: self._close_peer(identity, ADMIN_CLOSE),
        )
        self.peers.set(identity, _PeerState(row, source=_source(srcfd)))
        return row

    def _close_peer(self, identity: bytes, reason: str) -> None:
        """Disconnect the peer's TCP connection and forget the peer (an
        admin close, or its user's rights revoked)."""
        state = self.peers.get(identity)
        if state is not None and not _disconnect(*state.source):
            log.info("res01: peer %s could not be disconnected (not over TCP, or its "
                     "connection is gone): forgotten only", state.row.peer)
        self._forget(identity, reason)

    def _forgotten(self, identity: bytes, state: _PeerState | None) -> None:
        """The table dropped an idle peer (or the least recently seen, for room)."""
        if state is not None:
            unregister_connection(self.stats, state.row, IDLE)

    def _forget(self, identity: bytes, reason: str) -> None:
        """Drop a peer from the table: a ROUTER cannot close one peer, but its
        next message registers it afresh."""
        state = self.peers.pop(identity)
        if state is not None:
            unregister_connection(self.stats, state.row, reason)

    def _forget_all(self, reason: str) -> None:
        for identity in self.peers:
            self._forget(identity, reason)


@dataclass(frozen=True)
class _PeerState:
    """What the listener keeps per Res01 peer."""

    row: Connection  # its connection-table row
    # (file descriptor, remote address) of the TCP connection its latest
    # message came over; (-1, None) when unknown (not TCP).
    source: tuple[int, object] = (-1, None)
    # (endpoint index, user, tenant, expires) of a logged-in peer.
    login: tuple[int, str, Tenant, float] | None = None


def _source_fd(frame: zmq.Frame) -> int:
    """ZMQ_SRCFD of a received part: libzmq's file descriptor of the TCP
    connection it came over, -1 when there is none (ipc, inproc)."""
    try:
        fd = frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return -1
    return fd if isinstance(fd, int) else -1


def _source(fd: int) -> tuple[int, object]:
    """(fd, its remote address now): what :func:`_disconnect` checks first."""
    if fd < 0:
        return -1, None
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            return fd, s.getpeername()
    except OSError:
        return -1, None


def _disconnect(fd: int, address: object) -> bool:
    """Shut one peer's TCP connection down under libzmq.

    A ROUTER has no call to drop one peer (libzmq issue #2319; monitor
    events carry no routing id either), but ZMQ_SRCFD names the descriptor
    a message came over.  ``shutdown(2)`` on a duplicate of it ends the
    TCP connection for libzmq too: its I/O thread reads EOF, closes the
    descriptor and drops the pipe, as when the peer goes away.  libzmq may
    have closed and reused the descriptor since (its manual warns of
    this), so the remote address is compared first: a reused descriptor
    names another connection and is left alone.  Only the duplicate is
    closed here.  A ZeroMQ client reconnects on its own; that new
    connection is a new login (ZAP checks it again on PLAIN/CURVE ports)."""
    if fd < 0:
        return False
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            if s.getpeername() != address:
                return False
            s.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    return True


def _user_id(frame: zmq.Frame) -> str | None:
    """The User-Id ZAP gave the frame's connection, None without one."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:  # no such property: the connection had no ZAP login
        return None
    return user if isinstance(user, str) and user else None


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


async def start(gw: Gateway, host: str, port: int) -> Res01Listener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    listener = Res01Listener(
        PROTOCOL, ctx, host, port, limits_from(gw.settings),
        curve=curve_server(gw.config, gw.store.users),
        store=gw.store,  # a gateway listener: it makes each request's Tenant
        login_port=gw.config.res01_login_port,
        allow_from=gw.config.res01_allow_from,
    )
    await listener.start()
    warn_if_open_to_everyone(host, gw.config.res01_allow_from)
    if listener.login_address is not None:
        log.info("listener res01 (PLAIN login) on %s:%d", *listener.login_address)
    return listener


# ZeroMQ binds without SO_REUSEPORT, and a ROUTER's peers and fetch
# subscriptions live in one process: the first worker only.
LISTENER = ListenerDef(PROTOCOL, DEFAULT_PORT, start, per_worker=False)
