"""ReactiveSocket adapter: frames from the sans-IO :class:`ServerConnection`
become canonical commands on the connection's :class:`Tenant`; results go back as
RESPONSE / ERROR frames.

The session's mechanics (stream tasks, credits, fire-and-forget, failing and
closing) are the family's (``protocols/reactive/session.py``); here is what
is the draft's: SETUP data with credentials and a context, requests named by
``op`` (including ack / nack of manual-ack group subscriptions), REQUEST_SUB,
answers in MessagePack, and the idle timeout.

Mapping, limits and decisions: docs/protocols/reactivesocket.md.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from polyport.core.access import Tenant
from polyport.core.commands import Principal
from polyport.core.errors import NotFound, PolyportError, Unsupported
from polyport.core.events import RecordedEvent
from polyport.core.groups import GroupMember
from polyport.core.subscriptions import Subscription
from polyport.protocols.reactive.eventservice import (
    StreamWork,
    event_map,
    expected_from,
    start_from,
)
from polyport.protocols.reactive.session import EventServiceSession
from polyport.protocols.reactivesocket import payloads
from polyport.protocols.reactivesocket.connection import ServerConnection
from polyport.protocols.reactivesocket.errors import PayloadError
from polyport.protocols.reactivesocket.frames import (
    ErrorFrame,
    RequestFnf,
    RequestResponse,
    RequestStream,
    RequestSub,
    Setup,
)
from polyport.protocols.reactivesocket.limits import Limits

# Shared with RSocket 1.0 (protocols/reactive/eventservice.py); still importable here.
__all__ = [
    "ReactiveSocketSession",
    "event_map",
    "expected_from",
    "start_from",
]

log = logging.getLogger("polyport.reactivesocket")


class ReactiveSocketSession(EventServiceSession):
    """Server side of one ReactiveSocket connection (a StreamSession)."""

    task_prefix = "rs"
    limits_type = Limits
    connection_type = ServerConnection
    request_errors = (PolyportError, PayloadError)
    limits: Limits
    conn: ServerConnection

    def _open(self) -> None:
        self.principal: Principal | None = None
        self.context: str | None = None
        # REQUEST_SUB streams whose group events the client settles itself.
        self._manual_ack: set[int] = set()
        if self.limits.idle_timeout:
            self._spawn(self._idle_watch(), "idle")

    # --- dispatch -------------------------------------------------------------

    async def _dispatch_frame(self, ev: Any) -> None:
        if isinstance(ev, Setup):
            await self._setup(ev)
        elif isinstance(ev, RequestResponse):
            if not self._started_append(ev):
                self._start(ev.stream_id, lambda w: self._request_response(ev))
        elif isinstance(ev, RequestStream):
            self._start(ev.stream_id, lambda w: self._request_stream(w, ev))
        elif isinstance(ev, RequestSub):
            self._start(ev.stream_id, lambda w: self._request_sub(w, ev))

    def _peer_closed(self, frame: ErrorFrame) -> None:
        try:
            err = payloads.decode_error_data(frame.data)
            detail = f"{err.code}: {err.message}"
        except PayloadError:
            detail = repr(frame.data[:200])
        self.ctx.log.info("client %s closed with ERROR %s", self.out.peer, detail)

    def _stream_ended(self, stream_id: int) -> None:
        self._manual_ack.discard(stream_id)

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

    # --- requests ---------------------------------------------------------------

    def _started_append(self, frame: RequestResponse) -> bool:
        """An append (W1's every request) queued at once and answered from
        its commit's callback; False for anything else, or anything that
        fails before it is queued, which a task serves (and answers with the
        same error)."""
        try:
            request = payloads.decode_request(frame.data)
            if not isinstance(request, payloads.AppendRequest):
                return False
            tenant, context = self._tenant(), self._context()
            command = self._append_command(context, request)
        except self.request_errors:
            return False
        self._start_append(frame.stream_id, tenant, command, payloads.encode_append_response)
        return True

    def _completion(self, stream_id: int, data: bytes) -> list[bytes]:
        return self.conn.send_response(stream_id, data, complete=True)

    async def _request_response(self, frame: RequestResponse) -> None:
        request = payloads.decode_request(frame.data)
        tenant, context = self._tenant(), self._context()
        if isinstance(request, payloads.AppendRequest):
            answer = payloads.encode_append_response(
                await self._append(tenant, context, request)
            )
        elif isinstance(request, payloads.ReadRequest):
            events = await self._read(tenant, context, request)
            answer = payloads.encode_read_response(
                payloads.ReadResponse(tuple(event_map(e) for e in events))
            )
        elif isinstance(request, payloads.AckRequest):
            self._settle(request)
            answer = payloads.pack({})
        else:
            answer = await self._query(tenant, request, payloads.encode_query_response)
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

    async def _forget(self, frame: RequestFnf) -> None:
        request = payloads.decode_request(frame.data)
        if isinstance(request, payloads.AckRequest):
            self._settle(request)
            return
        if not isinstance(request, payloads.AppendRequest):
            raise Unsupported("REQUEST_FNF serves ops 'append', 'ack' and 'nack' only")
        await self._append(self._tenant(), self._context(), request)

    async def _request_stream(self, work: StreamWork, frame: RequestStream) -> None:
        request = payloads.decode_request(frame.data)
        if not isinstance(request, payloads.ReadRequest):
            raise Unsupported("REQUEST_STREAM serves op 'read' only")
        await self._read_stream(work, self._tenant(), self._context(), request)

    async def _request_sub(self, work: StreamWork, frame: RequestSub) -> None:
        request = payloads.decode_subscribe_request(frame.data)
        await self._subscribe(work, self._tenant(), self._context(), request)

    def _acks_manually(
        self, stream_id: int, request: payloads.SubscribeRequest, sub: Subscription | GroupMember
    ) -> bool:
        manual = request.manual_ack and isinstance(sub, GroupMember)
        if manual:
            self._manual_ack.add(stream_id)
        return manual

    def _context(self) -> str:
        assert self.context is not None, "requests arrive only after an accepted SETUP"
        return self.context

    def _tenant(self) -> Tenant:
        assert self.tenant is not None, "requests arrive only after an accepted SETUP"
        return self.tenant

    # --- writing ---------------------------------------------------------------

    def _event_data(self, event: RecordedEvent) -> bytes:
        return payloads.encode_event(event_map(event))

    async def _respond(self, stream_id: int, data: bytes, *, complete: bool = False) -> None:
        """RESPONSE (fragmented as needed).  Raises LocalProtocolError when
        the stream has ended meanwhile."""
        await self._write(self.conn.send_response(stream_id, data, complete=complete))

    async def _idle_watch(self) -> None:
        timeout = self.limits.idle_timeout
        assert timeout
        loop = asyncio.get_running_loop()
        while not self.closing:
            idle_for = loop.time() - self._last_input
            if idle_for >= timeout and not self._work and not self._fnf_inflight:
                self.ctx.log.info("closing idle connection from %s", self.out.peer)
                self._close()
                return
            # Sleep until the connection could first be idle long enough.
            wait = timeout - idle_for if idle_for < timeout else timeout / 4
            await asyncio.sleep(max(0.05, wait))
