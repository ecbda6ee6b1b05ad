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
import logging
import time
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from polyport.gateway.registry import ListenerDef
from polyport.protocols.res01 import DEFAULT_PORT, PROTOCOL, Error, Res01Error, Response
from polyport.protocols.res01.adapter import (
    Res01Handler,
    Res01Limits,
    error_reply,
    is_write,
    limits_from,
)
from polyport.protocols.res01.connection import (
    Exchange,
    MessageAssembler,
    Received,
    ServerConnection,
)
from polyport.protocols.res01.errors import ErrorCode, LocalProtocolError
from polyport.protocols.session import CURRENT_PEER, ListenerStats, Peer, SessionContext

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

log = logging.getLogger("polyport.res01")

# Messages ZeroMQ may queue per peer in each direction.  Small: a message may
# be up to max_request_bytes, and the in-flight limits already bound the work.
RECEIVE_HWM = 100
SEND_HWM = 1000
# On close: how long in-flight requests may finish, and how long ZeroMQ may
# still flush their replies.
CLOSE_GRACE = 5.0
LINGER_MS = 500


def _endpoint(host: str, port: int) -> str:
    where = f"[{host}]" if ":" in host else host
    return f"tcp://{where}:{port if port else '*'}"


class Res01Listener:
    def __init__(
        self, name: str, ctx: SessionContext, host: str, port: int, limits: Res01Limits
    ) -> None:
        self.name = name
        self.stats = ctx.stats
        self.limits = limits
        self.host = host
        self.port = port
        self.handler = Res01Handler(ctx.store, ctx.stats, ctx.log, limits)
        # Request/reply pairing per peer; the counters below are admission.
        self.conn = ServerConnection(max_request_bytes=limits.max_request_bytes)
        self._zctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._endpoint = ""
        self._address: tuple[str, int] = (host, port)
        self._recv_task: asyncio.Task[None] | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writes = 0
        self._reads = 0
        self._bytes = 0
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def in_flight(self) -> tuple[int, int]:
        """(AC, other) requests being served now."""
        return self._writes, self._reads

    async def start(self) -> None:
        sock = self._zctx.socket(zmq.ROUTER)
        # libzmq checks MAXMSGSIZE per frame; the whole message (parts and
        # bytes) as its parts are received (MessageAssembler).
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_bytes)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        if ":" in self.host:
            sock.setsockopt(zmq.IPV6, 1)
        try:
            sock.bind(_endpoint(self.host, self.port))
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self._zctx.term()
            raise OSError(
                f"res01: cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from exc
        self._sock = sock
        self._endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        host, _, port = self._endpoint.removeprefix("tcp://").rpartition(":")
        self._address = (host.strip("[]"), int(port))
        self._monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._monitor_task = asyncio.create_task(self._watch_peers(), name="res01-monitor")
        self._recv_task = asyncio.create_task(self._receive_loop(), name="res01-receive")

    # --- lifecycle ----------------------------------------------------------

    async def stop_accepting(self) -> None:
        """No new requests: stop receiving and unbind.  Requests already
        admitted go on, so commits drained by the store still get their CR."""
        if self._recv_task is not None:
            self._recv_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recv_task
            self._recv_task = None
        if self._sock is not None and self._endpoint:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.unbind(self._endpoint)
            self._endpoint = ""

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
        if self._monitor_task is not None:
            self._monitor_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor_task
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
        if self._monitor is not None:
            self._monitor.close(linger=0)
        if self._sock is not None:
            self._sock.close()
        # term() waits for the linger of queued replies: off the event loop.
        await asyncio.get_running_loop().run_in_executor(None, self._zctx.term)

    # --- receiving ----------------------------------------------------------

    async def _receive_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        limits = self.limits
        assert limits.max_request_bytes is not None
        # Parts one at a time, so an oversized message is refused as it
        # arrives: nothing past the limits is kept (ZeroMQ delivers a message
        # whole, so its remaining parts are already queued and cheap to drop).
        assembler = MessageAssembler(
            max_parts=limits.max_message_parts, max_bytes=limits.max_request_bytes
        )
        while True:
            try:
                part = await sock.recv()
                received = assembler.add(part, bool(sock.getsockopt(zmq.RCVMORE)))
            except zmq.ZMQError as exc:
                if self._closed or exc.errno == zmq.ETERM:
                    return
                log.warning("res01: receive failed: %s", exc)
                await asyncio.sleep(0.01)
                continue
            if received is not None:
                await self._handle_message(received)

    async def _handle_message(self, received: Received) -> None:
        try:
            await self._dispatch(received)
        except Exception:  # a bug in one message must not end the loop
            log.exception("res01: dispatching a message failed")
            self.stats.error("internal")

    async def _dispatch(self, received: Received) -> None:
        frames = received.frames
        # ZeroMQ hides the peer's address: the routing identity names it.  The
        # request task started below inherits this (error lines, metrics).
        CURRENT_PEER.set(Peer("res01", "zmq:" + frames[0].hex() if frames else "zmq:?"))
        self.stats.frames_in += 1
        self.stats.bytes_in += received.size
        if received.error is not None:  # over max_message_parts / max_request_bytes
            self.stats.error(received.error.code)
            if received.error.request_id is not None:
                await self._send(self.conn.refuse(received.error), wait=False)
            return
        try:
            exchange = self.conn.receive_message(frames)
        except Res01Error as exc:  # undecodable or over max_request_bytes
            self.stats.error(exc.code)
            await self._send(self.conn.refuse(exc), wait=False)
            return
        write = is_write(exchange.request)
        refusal = self._admission(write, exchange.size)
        if refusal is not None:
            self.stats.error("busy")
            code = ErrorCode.STORAGE_WRITER_BUSY if write else ErrorCode.STORAGE_READER_BUSY
            await self._reply(exchange, error_reply(exchange.request, code, refusal), wait=False)
            self.conn.abandon(exchange)  # answered, unless the ER itself was refused
            return
        if write:
            self._writes += 1
        else:
            self._reads += 1
        self._bytes += exchange.size
        task = asyncio.create_task(self._serve(exchange, write))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    async def _serve(self, exchange: Exchange, write: bool) -> None:
        request = exchange.request
        try:
            async with contextlib.aclosing(self.handler.handle(request)) as replies:
                async for response in replies:
                    if not await self._reply(exchange, response, wait=True):
                        break  # the peer is gone or not reading: stop producing
                else:
                    if self.conn.owed(exchange):
                        log.error(
                            "res01: %s ended with %d replies still due",
                            type(request).__name__,
                            self.conn.owed(exchange),
                        )
                        self.stats.error("internal")
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("res01: serving %s failed", type(request).__name__)
            self.stats.error("internal")
        finally:
            self.conn.abandon(exchange)
            if write:
                self._writes -= 1
            else:
                self._reads -= 1
            self._bytes -= exchange.size

    # --- sending ------------------------------------------------------------

    async def _reply(self, exchange: Exchange, response: Response, *, wait: bool) -> bool:
        """Send one reply; False when no more should follow (the peer is gone
        or not reading, or the request had to be ended with an ER)."""
        try:
            frames = self.conn.send(exchange, response)
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
                frames = self.conn.send(exchange, substitute)
            except LocalProtocolError:
                return False  # already answered: nothing more may go out
            await self._send(frames, wait=wait)
            return False  # ER is final: the request is over
        return await self._send(frames, wait=wait)

    async def _send(self, frames: list[bytes], *, wait: bool) -> bool:
        """Send without blocking the loop.  ``wait``: retry while the peer's
        queue is full, up to send_timeout (request tasks); otherwise drop at
        once (the receive loop must never wait on one peer)."""
        sock = self._sock
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
            self.stats.bytes_out += sum(len(f) for f in frames)
            return True

    # --- peers --------------------------------------------------------------

    async def _watch_peers(self) -> None:
        """Connection counters for /status, from the socket monitor."""
        assert self._monitor is not None
        while True:
            try:
                event = parse_monitor_message(await self._monitor.recv_multipart())
            except zmq.ZMQError:
                return
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.stats.connections_total += 1
                self.stats.connections_open += 1
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.stats.connections_open = max(0, self.stats.connections_open - 1)


async def start(gw: Gateway, host: str, port: int) -> Res01Listener:
    stats = ListenerStats(PROTOCOL)
    ctx = gw.context(PROTOCOL, stats)
    listener = Res01Listener(PROTOCOL, ctx, host, port, limits_from(gw.settings))
    await listener.start()
    return listener


LISTENER = ListenerDef(PROTOCOL, DEFAULT_PORT, start)
