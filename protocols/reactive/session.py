"""The server session both ReactiveSocket versions share, below their adapters.

One session per connection, for either transport (TCP or WebSocket: only the
wire framing differs).  The transport loop awaits ``data_received``, so
anything that may take long (a request, a stream, a subscription) runs in a
task of its own, one per live stream, except a request-response append,
which is queued on the writer at once and answered from its commit's
callback through one responder task; the number of live streams is bounded
by the connection object (``max_streams``) and fire-and-forget appends by a
semaphore (more stop the reading of the socket, which is the backpressure
path).  Every write awaits ``Outbound.send``.

What is written here once: the stream tasks and their end, credit waits,
REQUEST_N / CANCEL / stream faults, fire-and-forget, the event service's
append, read, streamed read, query and subscription, and how a connection
fails or closes.  Each version's ``adapter.py`` adds SETUP, how a request
names its operation (the draft's ``op``, RSocket's route) and how answers are
encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, Protocol, cast

from polyport.core.access import Tenant
from polyport.core.commands import Append, AppendResult
from polyport.core.errors import PolyportError, TooLarge
from polyport.core.events import RecordedEvent
from polyport.core.groups import GroupMember
from polyport.core.subscriptions import Subscription
from polyport.protocols.budgets import BudgetAccount
from polyport.protocols.errors import TIMEOUT, LocalProtocolError, RemoteProtocolError
from polyport.protocols.reactive.connection import StreamError
from polyport.protocols.reactive.eventservice import (
    StreamWork,
    append_command,
    finite_read,
    query_documents,
    read_events,
    subscribe_command,
)
from polyport.protocols.reactive.frames import CONNECTION_STREAM_ID
from polyport.protocols.reactive.limits import StreamLimits
from polyport.protocols.reactive.payloads import (
    AppendRequest,
    AppendResponse,
    QueryRequest,
    QueryResponse,
    ReadRequest,
    SubscribeRequest,
)
from polyport.protocols.session import (
    DELIVERY_BATCH,
    ByteStreamSession,
    Outbound,
    SessionContext,
)


class _Coded(Protocol):
    """What every error a request may end with carries."""

    code: str
    message: str


# An append's answer as the version's response data.
_AnswerEncoder = Callable[[AppendResponse], bytes]


class EventServiceSession(ByteStreamSession[StreamLimits, Any]):
    """Server side of one connection of either version (a StreamSession)."""

    # Task names start with this.
    task_prefix: ClassVar[str] = ""
    # The version's limits and sans-IO server connection classes.
    limits_type = StreamLimits
    connection_type: ClassVar[type[Any]] = type(None)
    # Errors a request ends with that its stream is answered with (ERROR
    # ``{code, message}``); anything else is a bug, answered ``internal``.
    request_errors: ClassVar[tuple[type[Exception], ...]] = (PolyportError,)

    def __init__(
        self,
        ctx: SessionContext,
        out: Outbound,
        transport: str = "tcp",
        limits: StreamLimits | None = None,
        budget: BudgetAccount | None = None,
    ) -> None:
        """``budget``: this connection's share of the gateway's reassembly
        budget (fragments of every connection together), released when the
        connection is lost."""
        self.transport = transport
        super().__init__(ctx, out, limits, budget)

    def _connection(self) -> Any:
        return self.connection_type(
            self.transport, **self.limits.connection_args(), **self._connection_options()
        )

    def _init_state(self) -> None:
        self.stats = self.ctx.stats
        # The version's frame classes.
        self.frames = self.conn.frames
        # The store as the SETUP's principal may use it; None before SETUP.
        self.tenant: Tenant | None = None
        self._work: dict[int, StreamWork] = {}
        self._fnf_slots = asyncio.Semaphore(self.limits.max_fnf_inflight)
        # Fire-and-forgets started and not yet ended (each holds a slot).
        # self._tasks holds every task of the connection, ended with it: each
        # stream's (also those already told to stop, so that connection_lost
        # waits for their cleanup), each fire-and-forget's and the version's
        # watchdog (idle connections, SETUP and KEEPALIVE deadlines).
        self._fnf_inflight = 0
        self._last_input = asyncio.get_running_loop().time()
        # Answers of appends settled in a commit's callback that could not be
        # written there (a WebSocket, a full buffer), and the one task that
        # writes them.
        self._answers: deque[list[bytes]] = deque()
        self._answers_ready = asyncio.Event()
        self._responder: asyncio.Task[None] | None = None
        self._open()

    # --- transport callbacks --------------------------------------------------------

    def _input_arrived(self) -> None:
        self._last_input = asyncio.get_running_loop().time()

    async def _undecodable(self, exc: RemoteProtocolError) -> None:
        # Frames decoded before the fault are dropped with the connection.
        await self._fail_connection(exc.code, exc.message, self._wire_code(exc))

    async def _received(self, events: list[Any]) -> None:
        for ev in events:
            if self.closing:
                return
            self.stats.frames_in += 1
            await self._dispatch(ev)

    async def _revoked(self, code: str, message: str) -> None:
        await self._fail_connection(code, message)

    async def frame_timed_out(self, message: str) -> None:
        await self._fail_connection(TIMEOUT, message)

    async def connection_lost(self) -> None:
        self.closing = True
        # Fragments held for half-received requests go back to the budget now,
        # whatever their streams' state.
        self.conn.release_budget()
        self._stop_all()
        await self._tasks.close()

    # --- the version's part ------------------------------------------------------------

    def _connection_options(self) -> dict[str, Any]:
        """Arguments of the version's connection beyond the limits."""
        return {}

    def _open(self) -> None:
        """The version's own state of a new connection (and its watchdog, if
        any, started through :meth:`_spawn`)."""

    def _wire_code(self, exc: RemoteProtocolError) -> int | None:
        """The version's own error code for a connection fault, if it has one."""
        return None

    async def _dispatch_frame(self, ev: Any) -> None:
        """SETUP, requests and the version's connection frames."""
        raise NotImplementedError

    def _peer_closed(self, frame: Any) -> None:
        """Log the ERROR on stream 0 that ended the connection."""
        raise NotImplementedError

    async def _forget(self, frame: Any) -> None:
        """Carry out a REQUEST_FNF."""
        raise NotImplementedError

    def _event_data(self, event: RecordedEvent) -> bytes:
        """One event of a streamed read or a subscription, as the version's
        item data."""
        raise NotImplementedError

    async def _send_event(self, stream_id: int, event: RecordedEvent) -> None:
        """One event as an item.  Raises LocalProtocolError when the stream
        has ended."""
        await self._send_events(stream_id, (event,))

    async def _send_events(self, stream_id: int, events: Sequence[RecordedEvent]) -> None:
        """Events as items, all or nothing, in one write on TCP.  Raises
        LocalProtocolError when the stream has ended."""
        await self._write_together(
            self.conn.send_items(stream_id, [self._event_data(ev) for ev in events]))

    def _acks_manually(
        self, stream_id: int, request: SubscribeRequest, sub: Subscription | GroupMember
    ) -> bool:
        """Whether the client settles a group subscription's events itself."""
        return False

    def _stream_ended(self, stream_id: int) -> None:
        """Forget what the version keeps for a stream."""

    def _completion(self, stream_id: int, data: bytes) -> list[bytes]:
        """A request-response stream's one answer, which completes it, as
        the version's frames.  Raises LocalProtocolError when the stream has
        ended."""
        raise NotImplementedError

    # --- dispatch --------------------------------------------------------------------

    async def _dispatch(self, ev: Any) -> None:
        frames = self.frames
        if isinstance(ev, frames.RequestFnf):
            # Waiting for a slot stops the transport reading: backpressure.
            await self._fnf_slots.acquire()
            task = self._spawn(self._fire_and_forget(ev), f"fnf-{ev.stream_id}")
            self._fnf_inflight += 1
            task.add_done_callback(self._fnf_done)
        elif isinstance(ev, frames.RequestN):
            work = self._work.get(ev.stream_id)
            if work is not None:
                if work.sub is not None:
                    work.sub.grant(ev.n)
                work.wake.set()
        elif isinstance(ev, frames.Cancel):
            self._stop_work(ev.stream_id)
        elif isinstance(ev, StreamError):
            self._stop_work(ev.stream_id)
            await self._send_error(ev.stream_id, ev.code, ev.message)
        elif isinstance(ev, frames.ErrorFrame):
            if ev.stream_id == CONNECTION_STREAM_ID:
                # The client ended the connection with an error.
                self._peer_closed(ev)
                self._close()
        else:
            await self._dispatch_frame(ev)

    def _fnf_done(self, task: asyncio.Task[None]) -> None:
        """A fire-and-forget ended (done, failed or cancelled): its slot is free."""
        self._fnf_inflight -= 1
        self._fnf_slots.release()

    async def _fire_and_forget(self, frame: Any) -> None:
        try:
            await self._forget(frame)
        except asyncio.CancelledError:
            raise
        except self.request_errors as exc:
            # Fire-and-forget is best effort: nothing goes back to the client.
            coded = cast(_Coded, exc)
            self.stats.error(coded.code, str(exc))
            self.ctx.log.info(
                "REQUEST_FNF %d from %s dropped: %s", frame.stream_id, self.out.peer, coded.message
            )
        except Exception:
            self.stats.error("internal")
            self.ctx.log.exception("REQUEST_FNF %d from %s failed", frame.stream_id, self.out.peer)

    # --- stream tasks -----------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of this connection, named ``<task_prefix>-<name>``: cancelled
        and awaited when the connection is lost."""
        return self._tasks.spawn(coro, name=f"{self.task_prefix}-{name}")

    def _start(self, stream_id: int, body: Callable[[StreamWork], Awaitable[None]]) -> None:
        work = StreamWork(stream_id)
        self._work[stream_id] = work
        work.task = self._spawn(self._serve(work, body), f"stream-{stream_id}")

    def _stop_work(self, stream_id: int) -> None:
        work = self._work.pop(stream_id, None)
        if work is not None:
            work.stop()

    def _stop_all(self) -> None:
        for work in list(self._work.values()):
            work.stop()
        self._work.clear()

    async def _serve(self, work: StreamWork, body: Callable[[StreamWork], Awaitable[None]]) -> None:
        sid = work.stream_id
        try:
            await body(work)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - _failure_frames logs a bug with its traceback
            frames = self._failure_frames(sid, exc)
            if frames:
                await self._write(frames)
        finally:
            if work.sub is not None:
                work.sub.close()
            if self._work.get(sid) is work:
                del self._work[sid]
                self._stream_ended(sid)

    # --- appends answered from the commit's callback ------------------------------

    def _start_append(self, stream_id: int, tenant: Tenant, command: Append,
                      encode: _AnswerEncoder) -> None:
        """A request-response append queued on the writer at once, and
        answered from its commit's callback: written there when the
        transport takes it without waiting, else by the connection's
        responder task.  A task per request (created, stepped, awaited) cost
        more than the rest of an append's path in the gateway
        (docs/performance.md, session 14)."""
        work = StreamWork(stream_id)
        self._work[stream_id] = work
        try:
            outcome = tenant.start_append(command)
        # Refused before queuing (busy, forbidden): answered as any failure,
        # and anything else as the bug it is (_answer logs it).
        except Exception as exc:  # noqa: BLE001
            outcome = asyncio.get_running_loop().create_future()
            outcome.set_exception(exc)
        outcome.add_done_callback(functools.partial(self._append_settled, work, encode))

    def _append_settled(self, work: StreamWork, encode: _AnswerEncoder,
                        outcome: asyncio.Future[list[AppendResult]]) -> None:
        if self.closing:
            if not outcome.cancelled():
                outcome.exception()  # retrieved: nobody is left to answer
            return
        frames = self._answer(work, encode, outcome)
        if not frames:
            return
        # Behind answers still waiting, so that none overtakes another.
        if not self._answers and self.conn.transport == "tcp" and \
                self.out.try_send(frames[0] if len(frames) == 1 else b"".join(frames)):
            self.stats.frames_out += len(frames)
            return
        self._answers.append(frames)
        self._answers_ready.set()
        if self._responder is None:
            self._responder = self._spawn(self._write_answers(), "responder")

    async def _write_answers(self) -> None:
        """Writes the answers the callbacks could not, in their order."""
        while not self.closing:
            if not self._answers:
                self._answers_ready.clear()
                await self._answers_ready.wait()
                continue
            chunks: list[bytes] = []
            while self._answers:
                chunks += self._answers.popleft()
            await self._write_together(chunks)

    def _answer(self, work: StreamWork, encode: _AnswerEncoder,
                outcome: asyncio.Future[list[AppendResult]]) -> list[bytes]:
        """The frames that answer a settled append: RESPONSE, or ERROR as
        :meth:`_serve` would send it; none when the stream has ended."""
        sid = work.stream_id
        try:
            if outcome.cancelled():
                return []
            exc = outcome.exception()
            if exc is None:
                result = outcome.result()[0]
                return self._completion(sid, encode(AppendResponse(
                    result.first_version, result.last_version, result.last_position)))
        except LocalProtocolError as ended:
            exc = ended
        finally:
            if self._work.get(sid) is work:
                del self._work[sid]
                self._stream_ended(sid)
        return self._failure_frames(sid, exc)

    def _failure_frames(self, sid: int, exc: BaseException) -> list[bytes]:
        """What ends a stream whose request failed with ``exc``: its ERROR
        (``internal`` for a bug, logged with its traceback), or nothing when
        the stream has ended under it (CANCEL, a connection error)."""
        if isinstance(exc, self.request_errors):
            coded = cast(_Coded, exc)
            return self._error_frames(sid, coded.code, coded.message)
        if isinstance(exc, LocalProtocolError):
            if not self.conn.is_live(sid):
                return []
            # Still live: we broke the rules, a bug.
            self.ctx.log.error("stream %d: %s", sid, exc.message)
        else:
            self.ctx.log.error("stream %d from %s failed", sid, self.out.peer, exc_info=exc)
        return self._error_frames(sid, "internal", "internal error")

    async def _wait_credit(self, work: StreamWork) -> None:
        sid = work.stream_id
        while self.conn.credits(sid) <= 0:
            if not self.conn.is_live(sid):
                raise LocalProtocolError(f"stream {sid} ended")
            work.wake.clear()
            await work.wake.wait()

    # --- the event service -----------------------------------------------------------

    def _append_command(self, context: str, request: AppendRequest) -> Append:
        return append_command(
            context,
            request,
            max_event_bytes=self.limits.max_event_bytes,
            origin=self.limits.protocol,
        )

    async def _append(self, tenant: Tenant, context: str, request: AppendRequest) -> AppendResponse:
        result = await tenant.append(self._append_command(context, request))
        return AppendResponse(result.first_version, result.last_version, result.last_position)

    async def _read(
        self, tenant: Tenant, context: str, request: ReadRequest
    ) -> list[RecordedEvent]:
        return await read_events(
            tenant,
            context,
            request,
            default_max=self.limits.default_read_max,
            page=self.limits.read_page,
            max_bytes=self.limits.max_response_bytes,
        )

    async def _query(
        self, tenant: Tenant, request: QueryRequest, encode: Callable[[QueryResponse], bytes]
    ) -> bytes:
        documents = await query_documents(tenant, request)
        answer = encode(QueryResponse(tuple(documents)))
        if len(answer) > self.limits.max_response_bytes:
            raise TooLarge(
                f"{len(documents)} documents make {len(answer)} bytes, above the limit of "
                f"{self.limits.max_response_bytes}; narrow the matcher"
            )
        return answer

    async def _read_stream(
        self, work: StreamWork, tenant: Tenant, context: str, request: ReadRequest
    ) -> None:
        sid = work.stream_id
        async for ev in finite_read(tenant, context, request, page=self.limits.read_page):
            await self._wait_credit(work)
            await self._send_event(sid, ev)
        if self.conn.is_live(sid):
            await self._write([self.conn.send_complete(sid)])

    async def _subscribe(
        self, work: StreamWork, tenant: Tenant, context: str, request: SubscribeRequest
    ) -> None:
        sid = work.stream_id
        sub = await tenant.subscribe(
            subscribe_command(context, request, buffer_size=self.limits.subscription_buffer),
            credit=True,
        )
        work.sub = sub
        if not self.conn.is_live(sid):  # CANCEL while the subscription opened
            return
        manual = self._acks_manually(sid, request, sub)
        # Initial Request N plus any REQUEST_N that came meanwhile (nothing has
        # been sent, so the connection's count is everything granted so far).
        sub.grant(self.conn.credits(sid))
        # No ack frame in the protocol: delivered to the transport counts as
        # acknowledged (the group's checkpoint moves on), unless the client
        # asked to ack itself (the draft's ack: "manual").
        auto_ack = sub if isinstance(sub, GroupMember) and not manual else None
        while True:
            events = await sub.next_batch(DELIVERY_BATCH)
            if not events or not self.conn.is_live(sid):
                return
            await self._send_events(sid, events)
            if auto_ack is not None:
                for ev in events:
                    auto_ack.ack(ev.position)

    # --- writing ----------------------------------------------------------------------

    async def _write(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            await self.out.send(chunk)
            self.stats.frames_out += 1

    async def _write_together(self, chunks: list[bytes]) -> None:
        """Frames in one write on TCP (one send each on a WebSocket, where
        a send is a message)."""
        if self.conn.transport == "tcp" and len(chunks) > 1:
            await self.out.send(b"".join(chunks))
            self.stats.frames_out += len(chunks)
        else:
            await self._write(chunks)

    async def _send_error(self, stream_id: int, code: str, message: str) -> None:
        frames = self._error_frames(stream_id, code, message)
        if frames:
            await self._write(frames)

    def _error_frames(self, stream_id: int, code: str, message: str) -> list[bytes]:
        """ERROR on a live stream (counted), or nothing once it has ended."""
        if not self.conn.is_live(stream_id) or self.conn.closed:
            return []
        try:
            wire = self.conn.send_error(stream_id, code, message)
        except LocalProtocolError:
            return []
        self.stats.error(code, message)
        return [wire]

    async def _fail_connection(
        self, code: str, message: str, wire_code: int | None = None
    ) -> None:
        """ERROR on stream 0, then close (codec faults, refused SETUP,
        lifetime).  ``wire_code``: the version's own error code, where it has
        one and the default does not fit."""
        if self.closing:
            return
        self.closing = True
        self.ctx.log.info("closing %s: %s: %s", self.out.peer, code, message)
        self._stop_all()
        self.stats.error(code, message)
        extra = () if wire_code is None else (wire_code,)
        try:
            wire = self.conn.send_error(CONNECTION_STREAM_ID, code, message, *extra)
        except LocalProtocolError:
            wire = b""
        if wire:
            with contextlib.suppress(ConnectionError, OSError):
                await self._write([wire])
        self.out.close()

    def _close(self) -> None:
        self.closing = True
        self._stop_all()
        self.out.close()
