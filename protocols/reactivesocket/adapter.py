"""ReactiveSocket adapter: frames from the sans-IO :class:`ServerConnection`
become canonical commands on the connection's :class:`Tenant`; results go back as
RESPONSE / ERROR frames.

One :class:`ReactiveSocketSession` per connection, for either transport (TCP
or WebSocket: only the wire framing differs).  The transport loop awaits
``data_received``, so anything that may take long (a request, a stream, a
subscription) runs in a task of its own, one per live stream; the number of
live streams is bounded by the connection object (``max_streams``: more get ERROR
``busy``) and fire-and-forget appends by a semaphore (more stop the reading
of the socket, which is the backpressure path).  Every write awaits
``Outbound.send``.

Mapping, limits and decisions: docs/protocols/reactivesocket.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from polyport.core.access import Tenant
from polyport.core.commands import Append, Principal
from polyport.core.errors import NotFound, PolyportError, TooLarge, Unsupported
from polyport.core.events import RecordedEvent
from polyport.core.groups import GroupMember
from polyport.protocols.budgets import BudgetAccount
from polyport.protocols.errors import TIMEOUT
from polyport.protocols.framing import InputBuffer
from polyport.protocols.reactive.eventservice import StreamWork as _Work
from polyport.protocols.reactive.eventservice import (
    append_command,
    event_map,
    expected_from,
    finite_read,
    query_documents,
    read_events,
    start_from,
    subscribe_command,
)
from polyport.protocols.reactivesocket import payloads
from polyport.protocols.reactivesocket.connection import ServerConnection, StreamError
from polyport.protocols.reactivesocket.errors import (
    LocalProtocolError,
    PayloadError,
    RemoteProtocolError,
)
from polyport.protocols.reactivesocket.frames import (
    CONNECTION_STREAM_ID,
    DEFAULT_MAX_FRAGMENT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    HEADER_SIZE,
    PROTOCOL,
    Cancel,
    ErrorFrame,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Setup,
)
from polyport.protocols.session import Outbound, SessionContext
from polyport.protocols.settings import settings_from

# Shared with RSocket 1.0 (protocols/reactive/eventservice.py); still importable here.
__all__ = [
    "AdapterLimits",
    "ReactiveSocketSession",
    "event_map",
    "expected_from",
    "start_from",
]

ORIGIN = PROTOCOL

log = logging.getLogger("polyport.reactivesocket")


@dataclass(frozen=True, slots=True)
class AdapterLimits:
    """Per-connection limits.  Every one can be set in the gateway config's
    extra settings as ``reactivesocket_<name>``; the body limit and the idle
    timeout fall back to the gateway-wide ``max_event_bytes`` and
    ``idle_timeout``."""

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_fragment: int = DEFAULT_MAX_FRAGMENT
    # Live REQUEST_RESPONSE / STREAM / SUB streams on one connection.
    max_streams: int = 256
    # Bytes of fragmented requests held for all streams of one connection
    # (each stream is also within max_message_size); past it a stream's
    # request gets ERROR too_large.  One request alone always fits.
    max_reassembly_bytes: int = 32 * 1024 * 1024
    # Fire-and-forget appends in flight; more pause reading the socket.
    max_fnf_inflight: int = 64
    # A read answer (REQUEST_RESPONSE) stops adding events past this many
    # body bytes (always at least one event); a query answer above it fails
    # with too_large.  Below the client's default reassembly limit (16 MiB).
    max_response_bytes: int = 8 * 1024 * 1024
    # Events fetched per database read of REQUEST_STREAM / read.
    read_page: int = 100
    # Default `max` of a REQUEST_RESPONSE read.
    default_read_max: int = 1000
    # Events a subscription buffers ahead of the credits.
    subscription_buffer: int = 128
    # Body limit of appended events (the gateway's max_event_bytes).
    max_event_bytes: int = 1 << 20
    # A connection with no live stream and no input for this long is closed
    # (a subscriber that only receives is never idle).  None = never.
    idle_timeout: float | None = 300.0

    def __post_init__(self) -> None:
        # Checked here, so that a bad setting stops the gateway at start
        # rather than failing (a read with read_page 0) or hanging (no
        # fire-and-forget slot) on every connection.
        for name, least in _LEAST.items():
            value = getattr(self, name)
            if value < least:
                raise ValueError(f"{PROTOCOL}_{name} must be at least {least}, not {value}")
        if self.idle_timeout is not None and self.idle_timeout < 0:
            raise ValueError(f"{PROTOCOL}_idle_timeout must not be negative: {self.idle_timeout}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> AdapterLimits:
        shared = ("max_event_bytes", "idle_timeout")
        return settings_from(cls, settings, prefix=PROTOCOL, shared=shared)


# The smallest value of each limit that works; an idle_timeout of 0 means never,
# like None.
_LEAST = {
    "max_frame_size": HEADER_SIZE,
    "max_message_size": 0,
    "max_fragment": 1,
    "max_streams": 1,
    "max_reassembly_bytes": 0,
    "max_fnf_inflight": 1,
    "max_response_bytes": 0,
    "read_page": 1,
    "default_read_max": 1,
    "subscription_buffer": 0,
    "max_event_bytes": 0,
}


class ReactiveSocketSession:
    """Server side of one ReactiveSocket connection (a StreamSession)."""

    def __init__(
        self,
        ctx: SessionContext,
        out: Outbound,
        transport: str = "tcp",
        limits: AdapterLimits | None = None,
        budget: BudgetAccount | None = None,
    ) -> None:
        """``budget``: this connection's share of the gateway's reassembly
        budget (fragments of every connection together), released when the
        connection is lost."""
        self.ctx = ctx
        ctx.on_revoke(self._fail_connection)
        # The store as the SETUP's principal may use it; None before SETUP.
        self.tenant: Tenant | None = None
        self.stats = ctx.stats
        self.out = out
        self.limits = limits or AdapterLimits.from_settings(ctx.settings)
        self.transport = transport
        self.conn = ServerConnection(
            transport,
            max_frame_size=self.limits.max_frame_size,
            max_message_size=self.limits.max_message_size,
            max_fragment=self.limits.max_fragment,
            max_streams=self.limits.max_streams,
            max_reassembly_bytes=self.limits.max_reassembly_bytes,
        )
        self.conn.budget = budget
        self.principal: Principal | None = None
        self.context: str | None = None
        self._work: dict[int, _Work] = {}
        # REQUEST_SUB streams whose group events the client settles itself.
        self._manual_ack: set[int] = set()
        self._fnf_slots = asyncio.Semaphore(self.limits.max_fnf_inflight)
        self._fnf_tasks: set[asyncio.Task[None]] = set()
        # Every stream task, also those already told to stop, so that
        # connection_lost can wait for their cleanup.
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        loop = asyncio.get_running_loop()
        self._last_input = loop.time()
        self._idle_task: asyncio.Task[None] | None = None
        if self.limits.idle_timeout:
            self._idle_task = asyncio.create_task(self._idle_watch(), name="rs-idle")

    # --- transport callbacks --------------------------------------------------

    async def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._last_input = asyncio.get_running_loop().time()
        try:
            events = self.conn.receive_data(data)
        except RemoteProtocolError as exc:
            # Frames decoded before the fault are dropped with the connection.
            await self._fail_connection(exc.code, exc.message)
            return
        for ev in events:
            if self._closing:
                return
            self.stats.frames_in += 1
            await self._dispatch(ev)

    @property
    def input_buffer(self) -> InputBuffer:
        return self.conn.input_buffer

    async def frame_timed_out(self, message: str) -> None:
        await self._fail_connection(TIMEOUT, message)

    async def connection_lost(self) -> None:
        self._closing = True
        # Fragments held for half-received requests go back to the budget now,
        # whatever their streams' state.
        self.conn.release_budget()
        if self._idle_task is not None:
            self._idle_task.cancel()
        for work in list(self._work.values()):
            work.stop()
        self._work.clear()
        tasks = [*self._tasks, *self._fnf_tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- dispatch -------------------------------------------------------------

    async def _dispatch(self, ev: object) -> None:
        if isinstance(ev, Setup):
            await self._setup(ev)
        elif isinstance(ev, RequestResponse):
            self._start(ev.stream_id, lambda w: self._request_response(ev))
        elif isinstance(ev, RequestStream):
            self._start(ev.stream_id, lambda w: self._request_stream(w, ev))
        elif isinstance(ev, RequestSub):
            self._start(ev.stream_id, lambda w: self._request_sub(w, ev))
        elif isinstance(ev, RequestFnf):
            # Waiting for a slot stops the transport reading: backpressure.
            await self._fnf_slots.acquire()
            task = asyncio.create_task(self._fire_and_forget(ev), name=f"rs-fnf-{ev.stream_id}")
            self._fnf_tasks.add(task)
            task.add_done_callback(self._fnf_done)
        elif isinstance(ev, RequestN):
            work = self._work.get(ev.stream_id)
            if work is not None:
                if work.sub is not None:
                    work.sub.grant(ev.n)
                work.wake.set()
        elif isinstance(ev, Cancel):
            self._stop_work(ev.stream_id)
        elif isinstance(ev, StreamError):
            self._stop_work(ev.stream_id)
            await self._send_error(ev.stream_id, ev.code, ev.message)
        elif isinstance(ev, ErrorFrame) and ev.stream_id == CONNECTION_STREAM_ID:
            # The client ended the connection with an error.
            try:
                err = payloads.decode_error_data(ev.data)
                detail = f"{err.code}: {err.message}"
            except PayloadError:
                detail = repr(ev.data[:200])
            self.ctx.log.info("client %s closed with ERROR %s", self.out.peer, detail)
            self._close()

    def _fnf_done(self, task: asyncio.Task[None]) -> None:
        self._fnf_tasks.discard(task)
        self._fnf_slots.release()

    # --- SETUP ----------------------------------------------------------------

    async def _setup(self, frame: Setup) -> None:
        try:
            setup = payloads.decode_setup_data(frame.data)
        except PayloadError as exc:
            await self._fail_connection(exc.code, exc.message)
            return
        try:
            tenant = await self.ctx.authenticate(setup.user, setup.password)
            # A context the principal may not use rejects the SETUP (forbidden).
            context = tenant.context(setup.context)
        except PolyportError as exc:
            await self._fail_connection(exc.code, exc.message)
            return
        self.tenant = tenant
        self.principal = tenant.principal
        self.context = context
        self.out.handshake_done()

    # --- stream tasks ----------------------------------------------------------

    def _start(self, stream_id: int, body: Callable[[_Work], Awaitable[None]]) -> None:
        work = _Work(stream_id)
        self._work[stream_id] = work
        task = asyncio.create_task(self._serve(work, body), name=f"rs-stream-{stream_id}")
        work.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_work(self, stream_id: int) -> None:
        work = self._work.pop(stream_id, None)
        if work is not None:
            work.stop()

    async def _serve(self, work: _Work, body: Callable[[_Work], Awaitable[None]]) -> None:
        sid = work.stream_id
        try:
            await body(work)
        except asyncio.CancelledError:
            raise
        except (PolyportError, PayloadError) as exc:
            await self._send_error(sid, exc.code, exc.message)
        except LocalProtocolError as exc:
            # The stream ended under us (CANCEL, connection error): nothing to
            # send.  If it is still live, we broke the rules: a bug.
            if self.conn.is_live(sid):
                self.ctx.log.error("stream %d: %s", sid, exc.message)
                await self._send_error(sid, "internal", "internal error")
        except Exception:
            self.ctx.log.exception("stream %d from %s failed", sid, self.out.peer)
            await self._send_error(sid, "internal", "internal error")
        finally:
            if work.sub is not None:
                work.sub.close()
            if self._work.get(sid) is work:
                del self._work[sid]
                self._manual_ack.discard(sid)

    async def _request_response(self, frame: RequestResponse) -> None:
        request = payloads.decode_request(frame.data)
        if isinstance(request, payloads.AppendRequest):
            result = await self._tenant().append(self._append_command(request))
            answer = payloads.encode_append_response(
                payloads.AppendResponse(
                    result.first_version, result.last_version, result.last_position
                )
            )
        elif isinstance(request, payloads.ReadRequest):
            events = await self._read(request)
            answer = payloads.encode_read_response(
                payloads.ReadResponse(tuple(event_map(e) for e in events))
            )
        elif isinstance(request, payloads.AckRequest):
            self._settle(request)
            answer = payloads.pack({})
        else:
            answer = await self._query(request)
        await self._respond(frame.stream_id, answer, complete=True)

    def _settle(self, request: payloads.AckRequest) -> None:
        """ack / nack events of a manual-ack group subscription."""
        work = self._work.get(request.subscription)
        member = work.sub if work is not None else None
        if not isinstance(member, GroupMember) or request.subscription not in self._manual_ack:
            raise NotFound(
                f"{'nack' if request.negative else 'ack'}: stream {request.subscription} is "
                "not a live group subscription with ack \"manual\""
            )
        for position in request.positions:
            if request.negative:
                member.nack(position)
            else:
                member.ack(position)

    async def _fire_and_forget(self, frame: RequestFnf) -> None:
        try:
            request = payloads.decode_request(frame.data)
            if isinstance(request, payloads.AckRequest):
                self._settle(request)
                return
            if not isinstance(request, payloads.AppendRequest):
                raise Unsupported("REQUEST_FNF serves ops 'append', 'ack' and 'nack' only")
            await self._tenant().append(self._append_command(request))
        except asyncio.CancelledError:
            raise
        except (PolyportError, PayloadError) as exc:
            # Fire-and-forget is best effort: nothing goes back to the client.
            self.stats.error(exc.code, str(exc))
            self.ctx.log.info(
                "REQUEST_FNF %d from %s dropped: %s", frame.stream_id, self.out.peer, exc.message
            )
        except Exception:
            self.stats.error("internal")
            self.ctx.log.exception("REQUEST_FNF %d from %s failed", frame.stream_id, self.out.peer)

    async def _request_stream(self, work: _Work, frame: RequestStream) -> None:
        sid = frame.stream_id
        request = payloads.decode_request(frame.data)
        if not isinstance(request, payloads.ReadRequest):
            raise Unsupported("REQUEST_STREAM serves op 'read' only")
        events = finite_read(
            self._tenant(), self._context(), request, page=self.limits.read_page
        )
        async for ev in events:
            await self._wait_credit(work)
            await self._respond(sid, payloads.encode_event(event_map(ev)))
        if self.conn.is_live(sid):
            await self._write([self.conn.send_complete(sid)])

    async def _wait_credit(self, work: _Work) -> None:
        sid = work.stream_id
        while self.conn.credits(sid) <= 0:
            if not self.conn.is_live(sid):
                raise LocalProtocolError(f"stream {sid} ended")
            work.wake.clear()
            await work.wake.wait()

    async def _request_sub(self, work: _Work, frame: RequestSub) -> None:
        sid = frame.stream_id
        request = payloads.decode_subscribe_request(frame.data)
        sub = await self._tenant().subscribe(
            subscribe_command(
                self._context(), request, buffer_size=self.limits.subscription_buffer
            ),
            credit=True,
        )
        work.sub = sub
        if not self.conn.is_live(sid):  # CANCEL while the subscription opened
            return
        manual = request.manual_ack and isinstance(sub, GroupMember)
        if manual:
            self._manual_ack.add(sid)
        # Initial Request N plus any REQUEST_N that came meanwhile (nothing has
        # been sent, so the connection's count is everything granted so far).
        sub.grant(self.conn.credits(sid))
        while True:
            ev = await sub.next()
            if ev is None or not self.conn.is_live(sid):
                return
            await self._respond(sid, payloads.encode_event(event_map(ev)))
            if isinstance(sub, GroupMember) and not manual:
                # No ack frame in the protocol: delivered to the transport
                # counts as acknowledged (the group's checkpoint moves on),
                # unless the client asked to ack itself (ack: "manual").
                sub.ack(ev.position)

    # --- commands ---------------------------------------------------------------

    def _context(self) -> str:
        assert self.context is not None, "requests arrive only after an accepted SETUP"
        return self.context

    def _tenant(self) -> Tenant:
        assert self.tenant is not None, "requests arrive only after an accepted SETUP"
        return self.tenant

    def _append_command(self, request: payloads.AppendRequest) -> Append:
        return append_command(
            self._context(), request, max_event_bytes=self.limits.max_event_bytes, origin=ORIGIN
        )

    async def _read(self, request: payloads.ReadRequest) -> list[RecordedEvent]:
        return await read_events(
            self._tenant(),
            self._context(),
            request,
            default_max=self.limits.default_read_max,
            page=self.limits.read_page,
            max_bytes=self.limits.max_response_bytes,
        )

    async def _query(self, request: payloads.QueryRequest) -> bytes:
        documents = await query_documents(self._tenant(), request)
        answer = payloads.encode_query_response(payloads.QueryResponse(tuple(documents)))
        if len(answer) > self.limits.max_response_bytes:
            raise TooLarge(
                f"{len(documents)} documents make {len(answer)} bytes, above the limit of "
                f"{self.limits.max_response_bytes}; narrow the matcher"
            )
        return answer

    # --- writing ---------------------------------------------------------------

    async def _write(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            await self.out.send(chunk)
            self.stats.frames_out += 1

    async def _respond(self, stream_id: int, data: bytes, *, complete: bool = False) -> None:
        """RESPONSE (fragmented as needed).  Raises LocalProtocolError when
        the stream has ended meanwhile."""
        await self._write(self.conn.send_response(stream_id, data, complete=complete))

    async def _send_error(self, stream_id: int, code: str, message: str) -> None:
        if not self.conn.is_live(stream_id) or self.conn.closed:
            return
        try:
            wire = self.conn.send_error(stream_id, code, message)
        except LocalProtocolError:
            return
        self.stats.error(code, message)
        await self._write([wire])

    async def _fail_connection(self, code: str, message: str) -> None:
        """ERROR on stream 0, then close (codec faults, rejected SETUP)."""
        if self._closing:
            return
        self._closing = True
        self.ctx.log.info("closing %s: %s: %s", self.out.peer, code, message)
        for work in list(self._work.values()):
            work.stop()
        self._work.clear()
        self.stats.error(code, message)
        try:
            wire = self.conn.send_error(CONNECTION_STREAM_ID, code, message)
        except LocalProtocolError:
            wire = b""
        if wire:
            with contextlib.suppress(ConnectionError, OSError):
                await self._write([wire])
        self.out.close()

    def _close(self) -> None:
        self._closing = True
        for work in list(self._work.values()):
            work.stop()
        self._work.clear()
        self.out.close()

    async def _idle_watch(self) -> None:
        timeout = self.limits.idle_timeout
        assert timeout
        loop = asyncio.get_running_loop()
        while not self._closing:
            idle_for = loop.time() - self._last_input
            if idle_for >= timeout and not self._work and not self._fnf_tasks:
                self.ctx.log.info("closing idle connection from %s", self.out.peer)
                self._close()
                return
            # Sleep until the connection could first be idle long enough.
            wait = timeout - idle_for if idle_for < timeout else timeout / 4
            await asyncio.sleep(max(0.05, wait))
