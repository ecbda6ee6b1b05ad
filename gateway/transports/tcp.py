"""The asyncio TCP transport shared by every byte-stream protocol.

One loop per connection pumps bytes into the protocol session; writes wait
for the socket to drain (backpressure), an idle connection is closed after the
listener's idle timeout, and an exception in a session closes that connection
only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from polyport.gateway.transports.tls import ServerTls, TlsServer, serve_tls, transport_user
from polyport.protocols.connections import (
    FRAME_TIMEOUT,
    IDLE,
    INTERNAL,
    PEER_CLOSED,
    SHUTDOWN,
    Connection,
)
from polyport.protocols.framing import InputBuffer
from polyport.protocols.session import (
    CURRENT_PEER,
    ListenerStats,
    Outbound,
    Peer,
    StreamSession,
    register_connection,
    unregister_connection,
)

log = logging.getLogger("polyport.tcp")

READ_CHUNK = 64 * 1024
WRITE_HIGH_WATER = 1 << 20


# Connections the kernel completes before the gateway accepts them.  asyncio's
# default (100) overflowed under bursts of a few hundred connects: past it,
# clients saw their connect succeed on a connection the gateway never
# accepted (as the TLS listeners, gateway/transports/tls.py, already used 511).
LISTEN_BACKLOG = 1024


class StreamOutbound:
    """A connection's sending side.  Sends made in one event-loop iteration
    go out in one socket write: the replies to every append of one group
    commit are settled together, as are a delivery task's buffered events,
    and one write each (a syscall and a wake-up of the peer) was the largest
    single cost in the W1/W2 profiles (docs/performance.md)."""

    def __init__(self, writer: asyncio.StreamWriter, stats: ListenerStats) -> None:
        self._writer = writer
        self._stats = stats
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._closed = False
        self.handshaken = False
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.connection: Connection | None = None  # set once registered
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._flush_due = False
        self._ended = asyncio.Event()
        # Kept: asyncio.get_running_loop() is a getpid() system call per call
        # on Python 3.11, and try_send asked it once per reply.
        self._loop = asyncio.get_running_loop()

    @property
    def closed(self) -> bool:
        return self._closed or self._writer.is_closing()

    async def send(self, data: bytes) -> None:
        if self.try_send(data):
            return
        self._queue(data)
        self.flush()
        try:
            async with asyncio.timeout(self._stats.write_timeout):
                await self._writer.drain()
        except TimeoutError:  # first: TimeoutError is an OSError too
            self._write_timed_out()
        except (ConnectionError, OSError):
            self._closed = True

    def try_send(self, data: bytes) -> bool:
        if self.closed:
            return True  # dropped, as send drops it
        buffered = self._pending_bytes + len(data) + self._writer.transport.get_write_buffer_size()
        if buffered > WRITE_HIGH_WATER:
            return False
        # Below the high-water mark the transport is not paused and drain
        # would not wait; but a timed drain costs a timer and a trip through
        # the event loop on every send (with wait_for, a task too), so a
        # delivery task sent one event per loop iteration and fell behind
        # under load.
        self._queue(data)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self.flush)
        return True

    def _queue(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._stats.bytes_out += len(data)
        if self.connection is not None:
            self.connection.bytes_out += len(data)

    def flush(self) -> None:
        """Hand what was sent so far to the transport, as one write."""
        self._flush_due = False
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._pending_bytes = 0
        if self.closed:
            return
        try:
            self._writer.write(pending[0] if len(pending) == 1 else b"".join(pending))
        except (ConnectionError, OSError, RuntimeError):
            self._closed = True

    def _write_timed_out(self) -> None:
        # The peer stopped reading: what is buffered would never drain, so
        # the connection is dropped (abort: close() would wait to flush).
        log.info(
            "closing %s: a write could not drain for %gs (write_timeout)",
            self.peer, self._stats.write_timeout,
        )
        self._stats.error("timeout")
        self._closed = True
        self._ended.set()
        with contextlib.suppress(Exception):
            self._writer.transport.abort()

    def close(self) -> None:
        self.flush()  # what was sent before the close still goes out first
        self._closed = True
        self._ended.set()
        with contextlib.suppress(Exception):
            self._writer.close()

    async def wait_closed(self, timeout: float) -> None:
        """Until this side closed the connection, at most ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ended.wait()

    def handshake_done(self) -> None:
        self.handshaken = True


SessionFactory = Callable[[Outbound], StreamSession]


class HandshakeDeadline:
    """The ``handshake_timeout`` of one connection (TCP or WebSocket): reads
    wait at most until the deadline while the session has not called
    ``Outbound.handshake_done``; past it the connection is closed, so a peer
    that connects and says nothing (or half a handshake) does not hold a
    connection slot until the idle timeout."""

    def __init__(self, stats: ListenerStats) -> None:
        self._stats = stats
        self._loop = asyncio.get_running_loop()
        timeout = stats.handshake_timeout
        self._at = None if timeout is None else self._loop.time() + timeout

    def read_timeout(self, idle: float | None, handshaken: bool) -> float | None:
        """How long the next read may wait: the idle timeout, or less while
        the handshake is due."""
        if self._at is None or handshaken:
            return idle
        left = max(self._at - self._loop.time(), 0.0)
        return left if idle is None else min(idle, left)

    def expired(self, name: str, peer: str, handshaken: bool) -> bool:
        """After a read timed out: whether it was the handshake deadline (then
        logged and counted as a ``timeout`` error)."""
        if self._at is None or handshaken or self._loop.time() < self._at:
            return False
        log.info(
            "%s: closing %s: no handshake within %gs (handshake_timeout)",
            name, peer, self._stats.handshake_timeout,
        )
        self._stats.error("timeout")
        return True


class FrameDeadline:
    """The ``frame_timeout`` of one connection (TCP or WebSocket): a frame the
    peer started must be complete this long after its first byte arrived.
    The idle timeout, which every byte restarts, still governs the gaps
    between frames; this bounds a peer that keeps a frame open by trickling
    it in (slowloris).

    TCP asks the session's codec after each read (:meth:`after_input`, on
    its :class:`InputBuffer`); WebSocket messages are framed by aiohttp, so
    the WebSocket loop says when bytes arrived (:meth:`bytes_arrived`) and
    when a message came out whole (:meth:`completed`)."""

    def __init__(self, stats: ListenerStats) -> None:
        self.limit = stats.frame_timeout
        self._loop = asyncio.get_running_loop()
        self._at: float | None = None
        self._taken = 0
        # The read now waiting, moved earlier when a frame starts meanwhile.
        self.waiting: asyncio.Timeout | None = None

    def _start(self) -> None:
        assert self.limit is not None
        self._at = self._loop.time() + self.limit
        waiting = self.waiting
        if waiting is not None:
            when = waiting.when()
            waiting.reschedule(self._at if when is None else min(when, self._at))

    def after_input(self, buffer: InputBuffer | None, busy: float = 0.0) -> None:
        """After the session decoded a read (taking ``busy`` seconds): a
        frame left incomplete gets its deadline, which stays while the same
        frame goes on arriving."""
        if self.limit is None or buffer is None or not buffer.partial_frame:
            self._at = None
            return
        if self._at is None or buffer.taken != self._taken:
            self._start()  # a new frame (what was buffered before is decoded)
        else:
            self.server_busy(busy)
        self._taken = buffer.taken

    def server_busy(self, seconds: float) -> None:
        """The gateway did not read for ``seconds`` (the session was busy
        with what came before): not the peer's time."""
        if self._at is not None:
            self._at += seconds

    def bytes_arrived(self) -> None:
        """Bytes came in with no frame completed since the last one did."""
        if self.limit is not None and self._at is None:
            self._start()

    def completed(self) -> None:
        """A whole frame came out: nothing is due until the next starts."""
        self._at = None

    def read_timeout(self, timeout: float | None) -> float | None:
        """How long the next read may wait: ``timeout``, or less while a
        frame is due."""
        if self._at is None:
            return timeout
        left = max(self._at - self._loop.time(), 0.0)
        return left if timeout is None else min(timeout, left)

    def expired(self, name: str, peer: str, buffer: InputBuffer | None = None) -> str | None:
        """After a read timed out: the error message when it was this
        deadline (logged, one line), else None.  ``buffer`` (TCP) is looked
        at again first: a session may decode buffered input between reads
        (BSON's frames held behind CONNECT)."""
        if buffer is not None:
            self.after_input(buffer)
        if self._at is None or self._loop.time() < self._at:
            return None
        log.info("%s: closing %s: a frame was not completed within %gs (frame_timeout)",
                 name, peer, self.limit)
        return f"frame not completed within {self.limit:g} seconds"


class ReadTimer:
    """The deadline of one connection's reads, on one timer that is moved
    lazily.  ``asyncio.timeout`` around every read made, cancelled and
    heap-pushed a timer per read (3-4 us each, ~6 % of the gateway's CPU
    on W1, docs/performance.md); here a read only notes its deadline, and
    the timer, when it fires, sleeps again until the latest deadline, so a
    busy connection re-arms about once per idle timeout.  Only a deadline
    earlier than the armed one (a handshake or frame due) moves it sooner.

    On expiry it cancels the reading task, as ``asyncio.timeout`` does;
    :meth:`expired` then tells that cancellation from a real one."""

    def __init__(self, task: asyncio.Task[object]) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = task
        # A plain Handle when the deadline was already due: uvloop's call_at
        # then schedules with call_soon, whose handle has no when().  So the
        # time it was armed for is kept here.
        self._handle: asyncio.Handle | None = None
        self._armed_for = 0.0
        self._at: float | None = None  # the waiting read's deadline
        self._fired = False

    def start(self, timeout: float | None) -> None:
        """A read begins that may wait at most ``timeout`` seconds (None: for ever)."""
        if timeout is None:
            self._at = None
            return
        at = self._at = self._loop.time() + timeout
        handle = self._handle
        if handle is None or self._armed_for > at:
            if handle is not None:
                handle.cancel()
            self._arm(at)

    def _arm(self, at: float) -> None:
        self._armed_for = at
        self._handle = self._loop.call_at(at, self._fire)

    def stop(self) -> None:
        """The read returned (or failed)."""
        self._at = None

    def _fire(self) -> None:
        self._handle = None
        at = self._at
        if at is None:
            return  # no read waiting: the next one arms the timer again
        if at > self._loop.time() + TIMER_SLACK:
            self._arm(at)
            return
        self._fired = True
        self._task.cancel()

    def expired(self) -> bool:
        """After the read raised CancelledError: True when this timer caused
        it and nothing else cancelled the task meanwhile."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() == 0

    def close(self) -> None:
        self._at = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


# A timer that fires this close to its read's deadline counts as on time
# (the loop runs timers up to its clock resolution early).
TIMER_SLACK = 0.001


# How long a session may take to send its error after a missed deadline
# (behind the replies already due) before the connection is closed anyway.
ERROR_GRACE = 2.0


# TCP keepalive on accepted sockets: a peer that vanished (power loss, a
# dropped NAT entry) is found after about KEEPIDLE + KEEPCNT x KEEPINTVL
# seconds even when no write is pending.
KEEPALIVE_IDLE = 60
KEEPALIVE_INTERVAL = 10
KEEPALIVE_COUNT = 6


def set_keepalive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # Linux names; other systems keep their defaults.
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _source_address(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


@dataclass
class TcpListener:
    name: str
    factory: SessionFactory
    host: str
    port: int
    stats: ListenerStats
    idle_timeout: float | None = None
    # TLS (required or dual), or None: plain only.
    tls: ServerTls | None = None

    def __post_init__(self) -> None:
        self._server: asyncio.Server | TlsServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        sock = self._server.sockets[0].getsockname()
        return sock[0], sock[1]

    async def start(self) -> None:
        if self.tls is not None:
            self._server = await self._start_tls(self.tls)
            return
        # reuse_port (workers): every worker binds this port; None, not
        # False, when off (some loops refuse the argument on other systems).
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_port=self.stats.reuse_port or None,
            backlog=LISTEN_BACKLOG,
        )

    # --- TLS (gateway/transports/tls.py) -------------------------------------------

    async def _start_tls(self, tls: ServerTls) -> TlsServer:
        """TLS listeners accept in gateway.transports.tls: it looks at the first bytes
        (dual mode, clean refusal of plain clients) before wrapping."""

        def refused(why: str) -> None:
            self.stats.connections_refused += 1
            log.info("%s: refused %s", self.name, why)

        # Admission at accept, before the handshake (serve_tls releases what
        # never reaches _serve).
        return await serve_tls(self._serve_admitted, self.host, self.port, tls, refused,
                               admit=self.stats.admit, release=self.stats.release,
                               handshake_timeout=self.stats.handshake_timeout,
                               reuse_port=self.stats.reuse_port)

    def _peer(
        self, writer: asyncio.StreamWriter, address: str, conn: Connection | None = None
    ) -> Peer:
        """The connection's Peer (its connection-table row), with the user a
        verified client certificate names."""
        user = None
        if self.tls is not None:
            user = transport_user(writer.transport, self.tls.user_from)
        return Peer(self.name, address, conn, certificate_user=user,
                    host=_source_address(writer))

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        await self.stop_accepting()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    def _register(self, out: StreamOutbound) -> Connection:
        out.connection = register_connection(self.stats, self.name, out.peer, out.close)
        return out.connection

    def _unregister(self, conn: Connection, reason: str | None) -> None:
        unregister_connection(self.stats, conn, reason)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        out = StreamOutbound(writer, self.stats)
        host = _source_address(writer)
        refused = self.stats.admit(host)
        if refused is not None:
            log.warning("%s: connection refused from %s: %s", self.name, out.peer, refused)
            out.close()
            return
        await self._serve(reader, writer, out, host)

    async def _serve_admitted(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> None:
        """A connection the TLS accept loop admitted already (from ``host``)."""
        await self._serve(reader, writer, StreamOutbound(writer, self.stats), host)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, out: StreamOutbound,
        host: str,
    ) -> None:
        """Serve an admitted connection; releases its admission at the end."""
        task = asyncio.current_task()
        assert task is not None
        set_keepalive(writer)
        conn = self._register(out)
        reason: str | None = None  # None: the server side closed it
        # Tasks the session starts inherit the peer (error lines, metrics).
        CURRENT_PEER.set(self._peer(writer, out.peer, conn))
        self._connections.add(task)
        log.debug("%s: connection from %s", self.name, out.peer)
        session: StreamSession | None = None
        try:
            session = self.factory(out)
            reason = await self._receive(reader, out, session, conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            reason = PEER_CLOSED
        except asyncio.CancelledError:
            reason = SHUTDOWN
        except Exception:
            log.exception("%s: connection from %s failed", self.name, out.peer)
            self.stats.error("internal")
            reason = INTERNAL
        finally:
            self._unregister(conn, reason)
            self.stats.release(host)
            log.debug("%s: connection from %s closed", self.name, out.peer)
            if session is not None:
                try:
                    await session.connection_lost()
                except Exception:
                    log.exception("%s: cleanup after %s failed", self.name, out.peer)
            out.close()
            self._connections.discard(task)

    async def _receive(
        self, reader: asyncio.StreamReader, out: StreamOutbound, session: StreamSession,
        conn: Connection,
    ) -> str | None:
        """Hand what arrives to the session until the connection ends; the
        reason it ended (None: the server side closed it)."""
        loop = asyncio.get_running_loop()
        deadline = HandshakeDeadline(self.stats)
        frame = FrameDeadline(self.stats)
        task = asyncio.current_task()
        assert task is not None
        timer = ReadTimer(task)
        try:
            while not out.closed:
                timeout = deadline.read_timeout(self.idle_timeout, out.handshaken)
                timeout = frame.read_timeout(timeout)
                timer.start(timeout)
                try:
                    data = await reader.read(READ_CHUNK)
                except asyncio.CancelledError:
                    if not timer.expired():
                        raise
                    message = frame.expired(self.name, out.peer, session.input_buffer)
                    if message is not None:
                        await session.frame_timed_out(message)
                        await out.wait_closed(ERROR_GRACE)
                        return FRAME_TIMEOUT
                    if deadline.expired(self.name, out.peer, out.handshaken):
                        return None
                    if timeout != self.idle_timeout:
                        continue  # the handshake completed while waiting: idle time restarts
                    log.info("%s: closing idle connection from %s", self.name, out.peer)
                    return IDLE
                finally:
                    timer.stop()
                if not data:
                    return PEER_CLOSED
                self.stats.bytes_in += len(data)
                conn.bytes_in += len(data)
                started = loop.time()
                await session.data_received(data)
                frame.after_input(session.input_buffer, loop.time() - started)
        finally:
            timer.close()
        return None
