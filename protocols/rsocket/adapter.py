"""RSocket 1.0 adapter: frames from the sans-IO :class:`ServerConnection`
become the event service's commands on the store (``protocols/reactive/eventservice.py``,
shared with the ReactiveSocket draft); answers go back as PAYLOAD / ERROR.

One :class:`RSocketSession` per connection, for TCP or WebSocket.  The
session's mechanics (a task per request, credits, fire-and-forget behind a
semaphore, failing and closing) are the family's
(``protocols/reactive/session.py``); here is what is RSocket's: SETUP with
MIME types and metadata credentials, requests named by route (with
per-request credentials), JSON or MessagePack answers, KEEPALIVE and LEASE.

A watchdog task enforces the SETUP's max lifetime (no KEEPALIVE for that
long: ERROR[CONNECTION_ERROR] and close), closes connections that never send
SETUP, and renews the LEASE of clients that asked for one.

Routes, metadata, limits and decisions: docs/protocols/rsocket.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from polyport.core.access import Tenant
from polyport.core.errors import PolyportError, Unauthenticated, Unsupported
from polyport.core.events import RecordedEvent
from polyport.protocols import errors as shared_errors
from polyport.protocols.reactive.eventservice import StreamWork, event_map
from polyport.protocols.reactive.session import EventServiceSession
from polyport.protocols.rsocket import payloads
from polyport.protocols.rsocket.connection import ServerConnection
from polyport.protocols.rsocket.errors import RemoteProtocolError
from polyport.protocols.rsocket.frames import (
    INVALID_SETUP,
    REJECTED_SETUP,
    UNSUPPORTED_SETUP,
    ErrorFrame,
    Keepalive,
    Lease,
    MetadataPush,
    Request,
    RequestChannel,
    RequestFnf,
    RequestResponse,
    RequestStream,
    Setup,
)
from polyport.protocols.rsocket.limits import Limits
from polyport.protocols.rsocket.metadata import (
    AUTH_SIMPLE,
    COMPOSITE,
    ROUTING,
    Credentials,
    MetadataError,
    RequestMetadata,
    read_metadata,
)

log = logging.getLogger("polyport.rsocket")


_INTERACTION = {
    RequestResponse: payloads.RR,
    RequestFnf: payloads.FNF,
    RequestStream: payloads.STREAM,
}


class RSocketSession(EventServiceSession):
    """Server side of one RSocket connection (a StreamSession)."""

    task_prefix = "rsocket"
    limits_type = Limits
    connection_type = ServerConnection
    request_errors = (PolyportError, payloads.PayloadError, MetadataError)
    limits: Limits
    conn: ServerConnection

    def _connection_options(self) -> dict[str, Any]:
        # LEASEs expire by the loop's clock.
        return {"clock": asyncio.get_running_loop().time}

    def _open(self) -> None:
        self._now = asyncio.get_running_loop().time
        self.data_format = "json"
        self.metadata_mime = COMPOSITE
        # Per-request credentials already checked on this connection.
        self._logins: dict[tuple[str, str], Tenant] = {}
        self._started = self._now()
        self._last_keepalive = self._started
        self._lifetime: float | None = None
        self._lease_renew_at: float | None = None
        self._wake_watch = asyncio.Event()
        self._spawn(self._watch(), "watch")

    # --- dispatch ------------------------------------------------------------------

    def _wire_code(self, exc: shared_errors.RemoteProtocolError) -> int | None:
        return exc.error_code if isinstance(exc, RemoteProtocolError) else None

    async def _dispatch_frame(self, ev: Any) -> None:
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
        elif isinstance(ev, RequestResponse) and self._started_append(ev):
            pass  # answered from its commit's callback
        elif isinstance(ev, (RequestResponse, RequestStream)):
            self._start(ev.stream_id, lambda w: self._request(w, ev))
        elif isinstance(ev, MetadataPush):
            self.ctx.log.debug("METADATA_PUSH from %s ignored", self.out.peer)

    def _peer_closed(self, frame: ErrorFrame) -> None:
        self.ctx.log.info("client %s closed with ERROR 0x%X: %s",
                          self.out.peer, frame.code, frame.text[:200])

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
        tenant = self._known_login(credentials)
        if tenant is None:
            tenant = await self.ctx.authenticate(credentials.user, credentials.password)
            self._logins[(credentials.user, credentials.password)] = tenant
        return tenant

    def _known_login(self, credentials: Credentials) -> Tenant | None:
        """The tenant of credentials this connection logged in with before."""
        if credentials.auth_type != AUTH_SIMPLE:
            raise Unauthenticated(
                f"authentication type {credentials.auth_type!r} is not served (simple is)"
            )
        return self._logins.get((credentials.user, credentials.password))

    async def _grant_lease(self) -> None:
        lease = Lease(self.limits.lease_ttl_ms, self.limits.lease_requests)
        await self._write([self.conn.send(lease)])
        self._lease_renew_at = self._now() + self.limits.lease_ttl_ms / 2000

    async def _routed(
        self, frame: Request, interaction: str
    ) -> tuple[payloads.RoutedRequest, Tenant, str]:
        """Route, tenant (the connection's, or the request's own credentials')
        and context of a request, checked."""
        meta = self._route(frame, interaction)
        tenant = self.tenant
        if meta.credentials is not None:
            tenant = await self._login(meta.credentials)
        assert tenant is not None, "requests arrive only after an accepted SETUP"
        return self._decoded(frame, meta, tenant)

    def _decoded(self, frame: Request, meta: RequestMetadata,
                 tenant: Tenant) -> tuple[payloads.RoutedRequest, Tenant, str]:
        assert meta.route is not None, "checked by _route"
        routed = payloads.decode_request(meta.route, frame.data, self.data_format)
        return routed, tenant, tenant.context(routed.context)

    def _started_append(self, frame: RequestResponse) -> bool:
        """An append (W1's every request) queued at once and answered from
        its commit's callback; False for anything else, for credentials not
        yet logged in, or for anything that fails before it is queued, which
        a task serves (and answers with the same error)."""
        try:
            meta = self._route(frame, payloads.RR)
            tenant = self.tenant if meta.credentials is None else \
                self._known_login(meta.credentials)
            if tenant is None:
                return False
            routed, tenant, context = self._decoded(frame, meta, tenant)
            if not isinstance(routed.request, payloads.AppendRequest):
                return False
            command = self._append_command(context, routed.request)
        except self.request_errors:
            return False
        fmt = self.data_format
        self._start_append(frame.stream_id, tenant, command,
                           lambda answer: payloads.encode_append_response(answer, fmt))
        return True

    def _completion(self, stream_id: int, data: bytes) -> list[bytes]:
        return self.conn.send_payload(stream_id, data, complete=True)

    def _route(self, frame: Request, interaction: str) -> RequestMetadata:
        """The request's metadata, its route checked against the routes and
        the interaction."""
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
        return meta

    async def _request(self, work: StreamWork, frame: RequestResponse | RequestStream) -> None:
        routed, tenant, context = await self._routed(frame, _INTERACTION[type(frame)])
        request, fmt = routed.request, self.data_format
        if isinstance(frame, RequestStream):
            if isinstance(request, payloads.SubscribeRequest):
                await self._subscribe(work, tenant, context, request)
            else:
                assert isinstance(request, payloads.ReadRequest)
                await self._read_stream(work, tenant, context, request)
            return
        if isinstance(request, payloads.AppendRequest):
            answer = payloads.encode_append_response(
                await self._append(tenant, context, request), fmt
            )
        elif isinstance(request, payloads.ReadRequest):
            events = await self._read(tenant, context, request)
            answer = payloads.encode_read_response(
                payloads.ReadResponse(tuple(event_map(e) for e in events)), fmt
            )
        else:
            assert isinstance(request, payloads.QueryRequest)
            answer = await self._query(
                tenant, request, lambda r: payloads.encode_query_response(r, fmt)
            )
        await self._write(self.conn.send_payload(work.stream_id, answer, complete=True))

    async def _forget(self, frame: RequestFnf) -> None:
        routed, tenant, context = await self._routed(frame, payloads.FNF)
        assert isinstance(routed.request, payloads.AppendRequest)
        await self._append(tenant, context, routed.request)

    def _event_data(self, event: RecordedEvent) -> bytes:
        return payloads.encode_event(event_map(event), self.data_format)

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
        while not self.closing:
            delay = self._next_deadline() - self._now()
            if delay > 0:
                self._wake_watch.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake_watch.wait()
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



__all__ = ["RSocketSession"]
