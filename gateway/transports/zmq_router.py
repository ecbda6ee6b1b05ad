"""The ZeroMQ ROUTER transport Res01 is served over (pyzmq asyncio).

The one transport that is not a byte stream: ZeroMQ delivers whole multipart
messages, and a ROUTER has no per-peer connection to hang a session on.  So
one :class:`~polyport.protocols.res01.session.Res01Session` serves every peer
of the listener, and this module only owns the sockets:

- one ROUTER socket per endpoint (the main port, and the PLAIN login port when
  configured), each speaking one ZeroMQ mechanism: NULL, PLAIN or CURVE, with
  the ZAP handler (``gateway/transports/zap.py``) answering PLAIN and CURVE logins and
  ``res01_allow_from``;
- one receive loop per endpoint takes the parts of each message (the
  session's assembler keeps them within its limits) and hands the whole
  message to the session, with its connection's ZAP User-Id and descriptor;
- replies are sent with ``DONTWAIT`` through ``ZMQ_ROUTER_MANDATORY``: a reply
  to a peer whose queue is at its high-water mark waits (that request's task
  only) up to ``send_timeout``, then is dropped; a reply to a peer that is
  gone is dropped at once.  Nothing is buffered beyond ZeroMQ's HWM;
- a peer the session drops (an admin close, revoked rights) is disconnected
  through the descriptor its message came over (``ZMQ_SRCFD``);
- the socket monitor counts TCP connections for ``/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from polyport.gateway.transports.zap import DOMAIN as ZAP_DOMAIN
from polyport.gateway.transports.zap import ZapHandler
from polyport.protocols.connections import PEER_CLOSED, SHUTDOWN
from polyport.protocols.res01.peers import NO_SOURCE, PeerState, PeerTable, Source
from polyport.protocols.res01.session import Res01Session, Router

if TYPE_CHECKING:
    from polyport.core.users import UserService
    from polyport.gateway.transports.curve import CurveServer
    from polyport.protocols.res01.connection import ServerConnection
    from polyport.protocols.res01.limits import Limits
    from polyport.protocols.session import ListenerStats

log = logging.getLogger("polyport.res01")
# Parts taken without awaiting before the receive loop yields once.
RECV_BURST = 256

# Flags as plain ints: pyzmq's are enum.IntFlag members, and combining them
# per part (what send_multipart does) goes through the enum machinery.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_DONTWAIT = int(zmq.DONTWAIT)
_DONTWAIT_MORE = int(zmq.DONTWAIT | zmq.SNDMORE)

# Messages ZeroMQ may queue per peer in each direction.  Small: a message may
# be up to max_request_bytes, and the in-flight limits already bound the work.
RECEIVE_HWM = 100
SEND_HWM = 1000
# On close: how long ZeroMQ may still flush replies.
LINGER_MS = 500

# Makes the listener's session: (the router, whether each endpoint logs in).
SessionFactory = Callable[[Router, Sequence[bool]], Res01Session]


def _endpoint(host: str, port: int) -> str:
    where = f"[{host}]" if ":" in host else host
    return f"tcp://{where}:{port if port else '*'}"


class Readable:
    """Waits, by hand, until a ZeroMQ socket has a message to receive.

    The socket's descriptor is edge-triggered: it signals that the socket's
    state changed, not that a message is queued, and any call on the socket,
    a send included, may take that signal without anyone seeing it.  So the
    receive loop waits only after a receive found nothing *and* ZMQ_EVENTS
    says nothing is queued, and each send made while it waits looks at
    ZMQ_EVENTS again (:meth:`sent`).  pyzmq's asyncio sockets do the same,
    with a future per receive and per send; this is the receive loop's one
    wait, and sends go straight through the socket."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self._sock = sock
        self._fd = sock.FD
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._waiting = False
        self._loop.add_reader(self._fd, self._event.set)

    async def wait(self) -> None:
        self._event.clear()
        if self._queued():
            return
        self._waiting = True
        try:
            await self._event.wait()
        finally:
            self._waiting = False

    def sent(self) -> None:
        if self._waiting and self._queued():
            self._event.set()

    def _queued(self) -> bool:
        return bool(cast(int, self._sock.get(_EVENTS)) & _POLLIN)

    def close(self) -> None:
        self._loop.remove_reader(self._fd)


def send_message(io: zmq.Socket[bytes], frames: list[bytes],
                 readable: Readable | None) -> bool | None:
    """Send one message without waiting: True sent, False not sendable (the
    peer disconnected), None while the peer's queue is full.  ``readable``:
    the receive loop's wait on the same socket, told of the send."""
    try:
        # A ROUTER with ROUTER_MANDATORY refuses a message at its first
        # part (peer gone, queue full) or takes it whole.
        send = io.send
        for part in frames[:-1]:
            send(part, _DONTWAIT_MORE)
        send(frames[-1], _DONTWAIT)
    except zmq.Again:
        return None
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EHOSTUNREACH:
            log.warning("res01: send failed: %s", exc)
        return False  # the peer disconnected: nobody to answer
    finally:
        if readable is not None:
            readable.sent()
    return True


@dataclass(eq=False)
class _Endpoint:
    """One ROUTER socket of the listener.  ``plain``: connections log in
    with ZAP PLAIN (each message carries the User-Id); otherwise NULL, every
    message anonymous."""

    plain: bool
    port: int
    # CURVE: the client's public key, mapped to a user by ZAP, is its login.
    curve: bool = False
    sock: zmq.asyncio.Socket | None = None
    # The same libzmq socket without pyzmq's futures: every receive and send.
    io: zmq.Socket[bytes] | None = None
    # While the receive loop runs: its wait for a message.
    readable: Readable | None = None
    monitor: zmq.asyncio.Socket | None = None
    endpoint: str = ""
    address: tuple[str, int] = ("", 0)
    recv_task: asyncio.Task[None] | None = None
    monitor_task: asyncio.Task[None] | None = None

    @property
    def login(self) -> bool:
        return self.plain or self.curve


class RouterListener:
    """The ROUTER endpoints of one listener and the session they serve
    (:class:`~polyport.protocols.res01.session.Router` to it)."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        limits: Limits,
        stats: ListenerStats,
        session: SessionFactory,
        *,
        users: UserService,
        curve: CurveServer | None = None,
        login_port: int | None = None,
        allow_from: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        # ZeroMQ CURVE (gateway/transports/curve.py): set up before the socket binds.
        self.curve = curve
        self.stats = stats
        self.limits = limits
        self.host = host
        self.port = port
        # A ZeroMQ socket speaks one mechanism: the main port is NULL
        # (anonymous) while anonymous access is on, PLAIN when it is off; the
        # login port, when configured, is always PLAIN.
        # With CURVE configured the main port is CURVE: the client's key is
        # its login.
        self._endpoints = [
            _Endpoint(plain=not users.allow_anonymous and curve is None, port=port,
                      curve=curve is not None)
        ]
        if login_port is not None:
            self._endpoints.append(_Endpoint(plain=True, port=login_port))
        self.session = session(self, [e.login for e in self._endpoints])
        self._zctx = zmq.asyncio.Context()
        # One ZAP handler per ZeroMQ context answers PLAIN and CURVE alike.
        self.zap = ZapHandler(self._zctx, users, stats, protocol=name,
                              curve=curve.user_for_key if curve is not None else None,
                              allow_from=[ipaddress.ip_network(n, strict=False)
                                          for n in allow_from])
        self._zap_started = False
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        return self._endpoints[0].address if self._endpoints[0].sock else (self.host, self.port)

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

    # The session's state, for /status and tests.

    @property
    def conn(self) -> ServerConnection:
        """The main endpoint's request/reply pairing."""
        return self.session.conns[0]

    @property
    def in_flight(self) -> tuple[int, int]:
        """(AC, other) requests being served now."""
        return self.session.in_flight

    @property
    def peers(self) -> PeerTable[bytes, PeerState]:
        return self.session.peers

    async def start(self) -> None:
        if self.zap.allow_from or any(e.login for e in self._endpoints):
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
        # bytes) as its parts are received (the session's assembler).
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
        endpoint.io = zmq.Socket.shadow(sock.underlying)
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
        await self.session.close()
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
            endpoint.io = None  # a late reply now finds no socket, not a freed one
            if endpoint.sock is not None:
                endpoint.sock.close()
        if self._zap_started:
            await self.zap.close()
        self.session.forget_all(SHUTDOWN)
        # term() waits for the linger of queued replies: off the event loop.
        await asyncio.get_running_loop().run_in_executor(None, self._zctx.term)

    # --- receiving ----------------------------------------------------------

    async def _receive_loop(self, index: int, endpoint: _Endpoint) -> None:
        io = endpoint.io
        assert io is not None
        readable = endpoint.readable = Readable(io)
        try:
            await self._receive(index, endpoint, io, readable)
        finally:
            endpoint.readable = None
            readable.close()

    async def _receive(self, index: int, endpoint: _Endpoint, io: zmq.Socket[bytes],
                       readable: Readable) -> None:
        session = self.session
        # Parts one at a time, so an oversized message is refused as it
        # arrives: nothing past the limits is kept (ZeroMQ delivers a message
        # whole, so its remaining parts are already queued and cheap to drop).
        assembler = session.assembler()
        login = endpoint.login
        user: str | None = None
        srcfd = -1
        first = True  # the next part starts a message
        # What is queued is taken without awaiting: awaiting each part (an
        # asyncio socket's recv) cost a future and a trip round the loop per
        # part, 44 % of the gateway's samples in a pipelined Res01 bench.
        # Only an empty queue is waited for.
        taken = 0
        while True:
            try:
                try:
                    frame = io.recv(_DONTWAIT, copy=False)
                    taken += 1
                    if taken % RECV_BURST == 0:
                        await asyncio.sleep(0)  # let replies and other peers' work run
                except zmq.Again:
                    await readable.wait()
                    continue
                if first:
                    # The TCP connection the message came over: how an
                    # admin close disconnects this peer (disconnect).
                    srcfd = _source_fd(frame)
                if login and first:
                    # The first part carries its connection's User-Id,
                    # which ZAP's reply gave it.
                    user = _user_id(frame)
                # The part's own flag, not getsockopt(RCVMORE): no call into
                # the socket (0.9 against 2.0 µs a part, measured).
                received = assembler.add(frame.bytes, frame.more)
                first = received is not None
            except zmq.ZMQError as exc:
                if self._closed or exc.errno == zmq.ETERM:
                    return
                log.warning("res01: receive failed: %s", exc)
                await asyncio.sleep(0.01)
                continue
            if received is not None:
                await session.message_received(index, received, user, srcfd)

    # --- the session's Router -----------------------------------------------

    async def send(self, endpoint: int, frames: list[bytes], *, wait: bool) -> bool:
        """Send without blocking the loop.  ``wait``: retry while the peer's
        queue is full, up to send_timeout (request tasks); otherwise drop at
        once (the receive loop must never wait on one peer)."""
        where = self._endpoints[endpoint]
        deadline = time.monotonic() + self.limits.send_timeout
        delay = 0.001
        while True:
            sent = self._send_now(where, frames)
            if sent is not None:
                return sent
            if not wait or time.monotonic() >= deadline:
                self.stats.error("busy")
                log.info("res01: dropped a reply to a peer that is not reading")
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def send_now(self, endpoint: int, frames: list[bytes]) -> bool | None:
        """One try of :meth:`send`: True sent, False not sendable (the peer
        disconnected), None while the peer's queue is full."""
        return self._send_now(self._endpoints[endpoint], frames)

    @staticmethod
    def _send_now(endpoint: _Endpoint, frames: list[bytes]) -> bool | None:
        # Not io.closed: a shadow does not own the libzmq socket; close()
        # drops io before it closes the socket.
        if endpoint.io is None:
            return False
        return send_message(endpoint.io, frames, endpoint.readable)

    def source(self, fd: int) -> Source:
        """(fd, its remote address now): what :meth:`disconnect` checks first."""
        if fd < 0:
            return NO_SOURCE
        try:
            with socket.socket(fileno=os.dup(fd)) as s:
                return fd, s.getpeername()
        except OSError:
            return NO_SOURCE

    def disconnect(self, source: Source) -> bool:
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
        fd, address = source
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
                    self.session.forget_all(PEER_CLOSED)


def _source_fd(frame: zmq.Frame) -> int:
    """ZMQ_SRCFD of a received part: libzmq's file descriptor of the TCP
    connection it came over, -1 when there is none (ipc, inproc)."""
    try:
        fd = frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return -1
    return fd if isinstance(fd, int) else -1


def _user_id(frame: zmq.Frame) -> str | None:
    """The User-Id ZAP gave the frame's connection, None without one."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:  # no such property: the connection had no ZAP login
        return None
    return user if isinstance(user, str) and user else None
