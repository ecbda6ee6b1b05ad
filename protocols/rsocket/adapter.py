"""RSocket 1.0 adapter: frames from the sans-IO :class:`ServerConnection`
become the event service's commands on the store (``protocols/reactive/eventservice.py``,
shared with the ReactiveSocket draft); answers go back as PAYLOAD / ERROR.

One :class:`RSocketSession` per connection, for TCP or WebSocket.  The
transport loop awaits ``data_received``, so every request runs in a task of
its own; live streams are bounded by the codec (``max_streams``: more get
ERROR[REJECTED]) and fire-and-forget appends by a semaphore (more pause the
reading of the socket: backpressure).  Every write awaits ``Outbound.send``.

A watchdog task enforces the SETUP's max lifetime (no KEEPALIVE for that
long: ERROR[CONNECTION_ERROR] and close), closes connections that never send
SETUP, and renews the LEASE of clients that asked for one.

Routes, metadata, limits and decisions: docs/protocols/rsocket.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from polyport.core.access import Tenant
from polyport.core.errors import PolyportError, TooLarge, Unauthenticated, Unsupported
from polyport.core.groups import GroupMember
from polyport.protocols import errors as shared_errors
from polyport.protocols.budgets import BudgetAccount
from polyport.protocols.errors import TIMEOUT
from polyport.protocols.framing import InputBuffer
from polyport.protocols.reactive.eventservice import (
    StreamWork,
    append_command,
    event_map,
    finite_read,
    query_documents,
    read_events,
    subscribe_command,
)
from polyport.protocols.rsocket import payloads
from polyport.protocols.rsocket.connection import ServerConnection, StreamError
from polyport.protocols.rsocket.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.rsocket.frames import (
    CONNECTION_ERROR,
    CONNECTION_STREAM_ID,
    DEFAULT_MAX_FRAGMENT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    INVALID_SETUP,
    MAX_U31,
    PROTOCOL,
    REJECTED_SETUP,
    UNSUPPORTED_SETUP,
    Cancel,
    ErrorFrame,
    Keepalive,
    Lease,
    MetadataPush,
    Request,
    RequestChannel,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    Setup,
)
from polyport.protocols.rsocket.metadata import (
    AUTH_SIMPLE,
    COMPOSITE,
    ROUTING,
    Credentials,
    MetadataError,
    read_metadata,
)
from polyport.protocols.session import Outbound, SessionContext
from polyport.protocols.settings import settings_from

ORIGIN = PROTOCOL

log = logging.getLogger("polyport.rsocket")


@dataclass(frozen=True, slots=True)
class AdapterLimits:
    """Per-connection limits; each is the gateway setting ``rsocket_<name>``
    (``max_event_bytes`` falls back to the gateway-wide setting)."""

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_fragment: int = DEFAULT_MAX_FRAGMENT
    # Live request-response / request-stream streams on one connection.
    max_streams: int = 256
    # Bytes of fragmented requests held for all streams of one connection
    # (each also within max_message_size); past it a stream's request gets
    # ERROR too_large.  One request alone always fits.
    max_reassembly_bytes: int = 32 * 1024 * 1024
    # Fire-and-forget appends in flight; more pause reading the socket.
    max_fnf_inflight: int = 64
    # A read answer stops adding events past this many body bytes (always at
    # least one event); a query answer above it fails with too_large.
    max_response_bytes: int = 8 * 1024 * 1024
    read_page: int = 100
    default_read_max: int = 1000
    # Events a subscription buffers ahead of the credits.
    subscription_buffer: int = 128
    max_event_bytes: int = 1 << 20
    # A connection that sends no SETUP for this long is closed.
    setup_timeout: float = 30.0
    # The LEASE granted to clients that ask for one (SETUP with L), renewed
    # every half TTL.
    lease_ttl_ms: int = 30_000
    lease_requests: int = 10_000

    def __post_init__(self) -> None:
        for name in ("max_streams", "max_fnf_inflight", "read_page", "default_read_max",
                     "subscription_buffer", "max_fragment", "lease_ttl_ms", "lease_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"rsocket_{name} must be at least 1")
        if self.lease_ttl_ms > MAX_U31 or self.lease_requests > MAX_U31:
            raise ValueError("rsocket_lease_ttl_ms and rsocket_lease_requests fit 31 bits")
        if self.setup_timeout <= 0:
            raise ValueError("rsocket_setup_timeout must be positive")

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> AdapterLimits:
        return settings_from(cls, settings, prefix=PROTOCOL, shared=("max_event_bytes",))


_INTERACTION = {
    RequestResponse: payloads.RR,
    RequestFnf: payloads.FNF,
    RequestStream: payloads.STREAM,
}


class RSocketSession:
    """Server side of one RSocket connection (a StreamSession)."""

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
        self.stats = ctx.stats
        self.out = out
        ctx.on_revoke(self._fail_connection)
        self.limits = limits or AdapterLimits.from_settings(ctx.settings)
        loop = asyncio.get_running_loop()
        self._now = loop.time
        self.conn = ServerConnection(
            transport,
            max_frame_size=self.limits.max_frame_size,
            max_message_size=self.limits.max_message_size,
            max_fragment=self.limits.max_fragment,
            max_streams=self.limits.max_streams,
            max_reassembly_bytes=self.limits.max_reassembly_bytes,
            clock=loop.time,
        )
        self.conn.budget = budget
        # The store as the SETUP's principal may use it; None before SETUP.
        self.tenant: Tenant | None = None
        self.data_format = "json"
        self.metadata_mime = COMPOSITE
        # Per-request credentials already checked on this connection.
        self._logins: dict[tuple[str, str], Tenant] = {}
        self._work: dict[int, StreamWork] = {}
        self._fnf_slots = asyncio.Semaphore(self.limits.max_fnf_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._started = self._now()
        self._last_keepalive = self._started
        self._lifetime: float | None = None
        self._lease_renew_at: float | None = None
        self._wake_watch = asyncio.Event()
        self._watch_task = asyncio.create_task(self._watch(), name="rsocket-watch")

    # --- transport callbacks ---------------------------------------------------------

    async def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            events = self.conn.receive_data(data)
        except RemoteProtocolError as exc:
            # Frames decoded before the fault are dropped with the connection.
            await self._fail_connection(exc.code, exc.message, exc.error_code)
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
        self._watch_task.cancel()
        for work in list(self._work.values()):
            work.stop()
        self._work.clear()
        tasks = [*self._tasks, self._watch_task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- dispatch ------------------------------------------------------------------

    async def _dispatch(self, ev: object) -> None:
        if isinstance(ev, Setup):
            await self._setup(ev)
        elif isinstance(ev, Keepalive):
            self._last_keepalive = self._now()
            if ev.respond:
                # "The data in the received KEEPALIVE MUST be echoed back."
                await self._write([self.conn.send(Keepalive(False, 0, ev.data))])
        elif isinstance(ev, RequestChannel):
            await self._send_error(
                ev.stream_id, "unsupported", "request-channel is not served; see the routes"
            )
        elif isinstance(ev, RequestFnf):
            # Waiting for a slot stops the transport reading: backpressure.
            await self._fnf_slots.acquire()
            task = asyncio.create_task(
                self._fire_and_forget(ev), name=f"rsocket-fnf-{ev.stream_id}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._fnf_done)
        elif isinstance(ev, (RequestResponse, RequestStream)):
            self._start(ev)
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
        elif isinstance(ev, MetadataPush):
            self.ctx.log.debug("METADATA_PUSH from %s ignored", self.out.peer)
        elif isinstance(ev, ErrorFrame) and ev.stream_id == CONNECTION_STREAM_ID:
            self.ctx.log.info("client %s closed with ERROR 0x%X: %s",
                              self.out.peer, ev.code, ev.text[:200])
            self._close()

    def _fnf_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._fnf_slots.release()

    # --- SETUP ---------------------------------------------------------------------

    async def _setup(self, frame: Setup) -> None:
        fmt = payloads.data_format(frame.data_mime)
        if fmt is None:
            await self._fail_connection(
                "unsupported",
                f"data MIME type {frame.data_mime!r} is not served "
                f"({payloads.JSON_MIME} and {payloads.MSGPACK_MIME} are)",
                UNSUPPORTED_SETUP,
            )
            return
        if frame.metadata_mime not in (COMPOSITE, ROUTING):
            await self._fail_connection(
                "unsupported",
                f"metadata MIME type {frame.metadata_mime!r} is not served ({COMPOSITE} is)",
                UNSUPPORTED_SETUP,
            )
            return
        self.data_format, self.metadata_mime = fmt, frame.metadata_mime
        try:
            credentials = read_metadata(frame.metadata, frame.metadata_mime).credentials
            self.tenant = await self._login(credentials)
        except MetadataError as exc:
            await self._fail_connection(exc.code, exc.message, INVALID_SETUP)
            return
        except PolyportError as exc:
            await self._fail_connection(exc.code, exc.message, REJECTED_SETUP)
            return
        self._lifetime = frame.lifetime / 1000
        self._last_keepalive = self._now()
        self.out.handshake_done()
        if frame.lease:
            await self._grant_lease()
        self._wake_watch.set()

    async def _login(self, credentials: Credentials | None) -> Tenant:
        if credentials is None:
            return await self.ctx.authenticate(None, None)
        if credentials.auth_type != AUTH_SIMPLE:
            raise Unauthenticated(
                f"authentication type {credentials.auth_type!r} is not served (simple is)"
            )
        key = (credentials.user, credentials.password)
        tenant = self._logins.get(key)
        if tenant is None:
            tenant = await self.ctx.authenticate(credentials.user, credentials.password)
            self._logins[key] = tenant
        return tenant

    async def _grant_lease(self) -> None:
        lease = Lease(self.limits.lease_ttl_ms, self.limits.lease_requests)
        await self._write([self.conn.send(lease)])
        self._lease_renew_at = self._now() + self.limits.lease_ttl_ms / 2000

    # --- stream tasks --------------------------------------------------------------

    def _start(self, frame: RequestResponse | RequestStream) -> None:
        work = StreamWork(frame.stream_id)
        self._work[frame.stream_id] = work
        task = asyncio.create_task(self._serve(work, lambda w: self._request(w, frame)),
                                   name=f"rsocket-stream-{frame.stream_id}")
        work.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_work(self, stream_id: int) -> None:
        work = self._work.pop(stream_id, None)
        if work is not None:
            work.stop()

    async def _serve(self, work: StreamWork, body: Callable[[StreamWork], Awaitable[None]]) -> None:
        sid = work.stream_id
        try:
            await body(work)
        except asyncio.CancelledError:
            raise
        except (PolyportError, payloads.PayloadError, MetadataError) as exc:
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

    async def _routed(
        self, frame: Request, interaction: str
    ) -> tuple[payloads.RoutedRequest, Tenant, str]:
        """Route, tenant (the connection's, or the request's own credentials')
        and context of a request, checked."""
        meta = read_metadata(frame.metadata, self.metadata_mime)
        if meta.route is None:
            raise Unsupported(
                f"no route in the metadata ({ROUTING} entry); routes: {', '.join(payloads.ROUTES)}"
            )
        served = payloads.ROUTES.get(meta.route)
        if served is None:
            raise Unsupported(
                f"unknown route {meta.route!r}; routes: {', '.join(payloads.ROUTES)}"
            )
        if interaction not in served:
            raise Unsupported(
                f"route {meta.route} is served as {' or '.join(sorted(served))}, "
                f"not {interaction}"
            )
        tenant = self.tenant
        if meta.credentials is not None:
            tenant = await self._login(meta.credentials)
        assert tenant is not None, "requests arrive only after an accepted SETUP"
        routed = payloads.decode_request(meta.route, frame.data, self.data_format)
        return routed, tenant, tenant.context(routed.context)

    async def _request(self, work: StreamWork, frame: RequestResponse | RequestStream) -> None:
        routed, tenant, context = await self._routed(frame, _INTERACTION[type(frame)])
        request, fmt = routed.request, self.data_format
        sid = frame.stream_id
        if isinstance(frame, RequestStream):
            if isinstance(request, payloads.SubscribeRequest):
                await self._subscribe(work, tenant, context, request)
            else:
                assert isinstance(request, payloads.ReadRequest)
                await self._read_stream(work, tenant, context, request)
            return
        if isinstance(request, payloads.AppendRequest):
            result = await tenant.append(self._append_command(context, request))
            answer = payloads.encode_append_response(
                payloads.AppendResponse(
                    result.first_version, result.last_version, result.last_position
                ),
                fmt,
            )
        elif isinstance(request, payloads.ReadRequest):
            events = await read_events(
                tenant, context, request,
                default_max=self.limits.default_read_max,
                page=self.limits.read_page,
                max_bytes=self.limits.max_response_bytes,
            )
            answer = payloads.encode_read_response(
                payloads.ReadResponse(tuple(event_map(e) for e in events)), fmt
            )
        else:
            assert isinstance(request, payloads.QueryRequest)
            documents = await query_documents(tenant, request)
            answer = payloads.encode_query_response(payloads.QueryResponse(tuple(documents)), fmt)
            if len(answer) > self.limits.max_response_bytes:
                raise TooLarge(
                    f"{len(documents)} documents make {len(answer)} bytes, above the limit of "
                    f"{self.limits.max_response_bytes}; narrow the matcher"
                )
        await self._write(self.conn.send_payload(sid, answer, complete=True))

    def _append_command(self, context: str, request: payloads.AppendRequest) -> Any:
        return append_command(
            context, request, max_event_bytes=self.limits.max_event_bytes, origin=ORIGIN
        )

    async def _fire_and_forget(self, frame: RequestFnf) -> None:
        try:
            routed, tenant, context = await self._routed(frame, payloads.FNF)
            assert isinstance(routed.request, payloads.AppendRequest)
            await tenant.append(self._append_command(context, routed.request))
        except asyncio.CancelledError:
            raise
        except (PolyportError, payloads.PayloadError, MetadataError) as exc:
            # Fire-and-forget is best effort: nothing goes back to the client.
            self.stats.error(exc.code, str(exc))
            self.ctx.log.info("REQUEST_FNF %d from %s dropped: %s",
                              frame.stream_id, self.out.peer, exc.message)
        except Exception:
            self.stats.error("internal")
            self.ctx.log.exception("REQUEST_FNF %d from %s failed", frame.stream_id, self.out.peer)

    async def _read_stream(
        self, work: StreamWork, tenant: Tenant, context: str, request: payloads.ReadRequest
    ) -> None:
        sid = work.stream_id
        async for ev in finite_read(tenant, context, request, page=self.limits.read_page):
            await self._wait_credit(work)
            await self._write(self.conn.send_payload(
                sid, payloads.encode_event(event_map(ev), self.data_format)
            ))
        if self.conn.is_live(sid):
            await self._write([self.conn.send_complete(sid)])

    async def _wait_credit(self, work: StreamWork) -> None:
        sid = work.stream_id
        while self.conn.credits(sid) <= 0:
            if not self.conn.is_live(sid):
                raise LocalProtocolError(f"stream {sid} ended")
            work.wake.clear()
            await work.wake.wait()

    async def _subscribe(
        self,
        work: StreamWork,
        tenant: Tenant,
        context: str,
        request: payloads.SubscribeRequest,
    ) -> None:
        sid = work.stream_id
        sub = await tenant.subscribe(
            subscribe_command(context, request, buffer_size=self.limits.subscription_buffer),
            credit=True,
        )
        work.sub = sub
        if not self.conn.is_live(sid):  # CANCEL while the subscription opened
            return
        # Initial Request N plus any REQUEST_N that came meanwhile (nothing has
        # been sent, so the codec's count is everything granted so far).
        sub.grant(self.conn.credits(sid))
        while True:
            ev = await sub.next()
            if ev is None or not self.conn.is_live(sid):
                return
            await self._write(self.conn.send_payload(
                sid, payloads.encode_event(event_map(ev), self.data_format)
            ))
            if isinstance(sub, GroupMember):
                # No ack frame in the protocol: delivered to the transport
                # counts as acknowledged (the group's checkpoint moves on).
                sub.ack(ev.position)

    # --- writing -----------------------------------------------------------------

    async def _write(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            await self.out.send(chunk)
            self.stats.frames_out += 1

    async def _send_error(self, stream_id: int, code: str, message: str) -> None:
        if not self.conn.is_live(stream_id) or self.conn.closed:
            return
        try:
            wire = self.conn.send_error(stream_id, code, message)
        except LocalProtocolError:
            return
        self.stats.error(code, message)
        await self._write([wire])

    async def _fail_connection(
        self, code: str, message: str, rsocket_code: int = CONNECTION_ERROR
    ) -> None:
        """ERROR on stream 0, then close (codec faults, refused SETUP, lifetime)."""
        if self._closing:
            return
        self._closing = True
        self.ctx.log.info("closing %s: %s: %s", self.out.peer, code, message)
        for work in list(self._work.values()):
            work.stop()
        self._work.clear()
        self.stats.error(code, message)
        try:
            wire = self.conn.send_error(CONNECTION_STREAM_ID, code, message, rsocket_code)
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

    # --- the watchdog ----------------------------------------------------------------

    def _next_deadline(self) -> float:
        if self.conn.setup is None:
            return self._started + self.limits.setup_timeout
        deadlines = []
        if self._lifetime is not None:
            deadlines.append(self._last_keepalive + self._lifetime)
        if self._lease_renew_at is not None:
            deadlines.append(self._lease_renew_at)
        return min(deadlines) if deadlines else self._now() + 3600

    async def _watch(self) -> None:
        while not self._closing:
            delay = self._next_deadline() - self._now()
            if delay > 0:
                self._wake_watch.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake_watch.wait(), delay)
                continue
            now = self._now()
            if self.conn.setup is None:
                self.ctx.log.info("closing %s: no SETUP within %.0f s", self.out.peer,
                                  self.limits.setup_timeout)
                self._close()
                return
            if self._lifetime is not None and now >= self._last_keepalive + self._lifetime:
                await self._fail_connection(
                    "timeout", f"no KEEPALIVE within the max lifetime of {self._lifetime:g} s"
                )
                return
            if self._lease_renew_at is not None and now >= self._lease_renew_at:
                try:
                    await self._grant_lease()
                except shared_errors.ProtocolError:
                    return  # the connection is closing


__all__ = ["AdapterLimits", "RSocketSession"]
