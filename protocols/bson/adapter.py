"""BSON frames adapter: frames of one TCP connection ⇄ canonical core commands.

One :class:`BsonSession` per connection (the gateway's ``TcpListener`` feeds it
bytes).  The session handles CONNECT, PING and EMIT itself and hands the rest
to the parts it owns: :class:`~polyport.protocols.bson.transactions.Transactions`
(STARTTX / COMMITTX / ABORTTX), :class:`~polyport.protocols.bson.subscriptions.Subscriptions`
(SUBSCRIBE / UNSUBSCRIBE / ACKEV, RECEV delivery) and
:class:`~polyport.protocols.bson.queries.Queries` (QUERY / QUERYACK, QUERYRESULT).
How the pieces fit:

* **Replies in request order.**  RESPONSE carries no request id, so replies
  must leave in the order the requests came.  Every request becomes a
  ``Reply`` whose outcome is a future (already done for instant answers, an
  append task for EMIT, ...); one writer task sends them strictly in order.
  EMITs are therefore pipelined: many appends wait in the core's group commit
  at once, yet each RESPONSE is sent only after its commit.
* **Bounded.**  Requests in flight are capped by count and by event bytes;
  when the cap is reached ``data_received`` waits, so the transport stops
  reading (TCP backpressure).  Transactions, subscriptions and queries have
  per-connection caps; RECEV delivery pauses on the ACKEV byte window and a
  paused subscription's core buffer is bounded (it falls back to catch-up).
* **Fatal errors.**  A frame that cannot be parsed ends the connection: the
  replies already in flight are sent, then RESPONSE ok=false with the
  canonical ``errCode``, then the close.  Other connections never notice.

The parts call back into the session through ``reply``, ``queue_reply``,
``spawn``, ``fatal`` and ``closing``, and read ``tenant`` (the store as the
CONNECT's principal may use it), ``conn``,
``limits``, ``context``, ``out`` and ``ctx``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

import bson
import bson.binary

from polyport.core.access import Tenant
from polyport.core.aio import settled
from polyport.core.bodies import BSON
from polyport.core.commands import ANY, Append, AppendBatch, Principal, build_append
from polyport.core.errors import Malformed, PolyportError, Unsupported
from polyport.core.events import event_data, new_event_id
from polyport.core.limits import check_body_size
from polyport.protocols.bson.connection import ServerConnection
from polyport.protocols.bson.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    error_response,
    log,
)
from polyport.protocols.bson.frames import (
    PROTOCOL,
    AbortTx,
    AckEv,
    CommitTx,
    Connect,
    Emit,
    Frame,
    Ping,
    Query,
    QueryAck,
    Response,
    StartTx,
    SubResponse,
    Subscribe,
    Unsubscribe,
)
from polyport.protocols.bson.limits import Limits
from polyport.protocols.bson.queries import Queries
from polyport.protocols.bson.replies import (
    OK,
    Budget,
    Reply,
    done,
    reply_frame,
)
from polyport.protocols.bson.state import State
from polyport.protocols.bson.subscriptions import Subscriptions, recev_document
from polyport.protocols.bson.transactions import PendingCommit, Transactions
from polyport.protocols.bson.wire import ENCODE_OPTIONS, is_supported_version
from polyport.protocols.budgets import BudgetAccount
from polyport.protocols.errors import TIMEOUT
from polyport.protocols.errors import RemoteProtocolError as SharedRemoteProtocolError
from polyport.protocols.session import ByteStreamSession, Outbound, SessionContext, logged_in

ORIGIN = PROTOCOL
# Replies already decided that go out in one write.
REPLY_BATCH = 256


# --- bodies -------------------------------------------------------------------


EVENT_ID_FIELD = "eventID"


def encode_event(event: Mapping[str, Any]) -> bytes:
    """The stored body of an EMIT: the ``event`` document as BSON bytes.  The
    wire decoding is lossless, so these are the bytes the client sent."""
    try:
        return bson.encode(event, codec_options=ENCODE_OPTIONS)
    except Exception as exc:  # InvalidDocument, OverflowError, ...
        raise Malformed(f"EMIT: 'event' cannot be stored as BSON: {exc}") from exc


def emit_event_id(event: Mapping[str, Any]) -> uuid.UUID:
    """The event id of an EMIT: the event document's optional ``eventID`` (a
    UUID string, or BSON binary subtype 4), so that a client resending the
    same document after an unknown outcome cannot store it twice; without
    one, a fresh id (such an EMIT is not safe to resend: docs/errors.md)."""
    value = event.get(EVENT_ID_FIELD)
    if value is None:
        return new_event_id()
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bson.binary.Binary) and value.subtype == bson.binary.UUID_SUBTYPE \
            and len(value) == 16:
        return uuid.UUID(bytes=bytes(value))
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise Malformed(
        f"EMIT: 'event.{EVENT_ID_FIELD}' must be a UUID string or BSON binary subtype 4; "
        "nothing was stored"
    )


# --- the session -----------------------------------------------------------------


class BsonSession(ByteStreamSession[Limits, ServerConnection]):
    """Server side of one BSON frames connection (implements StreamSession)."""

    limits_type = Limits
    peer_fault = RemoteProtocolError

    def _connection(self) -> ServerConnection:
        s = self.limits
        return ServerConnection(
            max_frame_size=s.max_frame_bytes,
            flow_pause_bytes=s.flow_pause_bytes,
            flow_resume_bytes=s.flow_resume_bytes,
            max_unacked_query_results=s.query_window,
        )

    def _init_state(self) -> None:
        s = self.limits
        self._tenant: Tenant | None = None
        self.principal: Principal | None = None
        self.context = ""
        self.budget = Budget(s.max_inflight_requests, s.max_inflight_bytes)
        # Requests awaiting their reply, in request order (bounded by budget).
        self._replies: deque[Reply] = deque()
        # Replies go out from callbacks (_pump); a task of the session's,
        # the writer, takes over while a write must wait for the socket to
        # drain and to send the fatal error, then hands back.
        self._writer: asyncio.Task[None] | None = None
        # The unsettled outcome at the head whose callback will pump next.
        self._waiting: asyncio.Future[Any] | None = None
        self._pumping = False
        self.transactions = Transactions(
            self.conn.transactions,
            max_open=s.max_transactions,
            max_events=s.max_tx_events,
            max_bytes=s.max_tx_bytes,
        )
        self.subscriptions = Subscriptions(self)
        self.queries = Queries(self)
        self._lost = False

    # --- StreamSession ------------------------------------------------------------

    async def _undecodable(self, exc: SharedRemoteProtocolError) -> None:
        await self.fatal(cast(RemoteProtocolError, exc))  # a peer_fault

    async def _received(self, frames: list[Frame]) -> None:
        try:
            while frames:
                self.ctx.stats.frames_in += len(frames)
                for frame in frames:
                    await self._handle(frame)
                    if self.closing:
                        return
                frames = self.conn.receive_data(b"")
        except RemoteProtocolError as err:
            await self.fatal(err)
        except LocalProtocolError as err:
            # Our own bug, never the peer's fault: say so rather than blame them.
            log.error("%s: BSON adapter error: %s", self.out.peer, err)
            await self.fatal(ProtocolError(f"internal error: {err.message}", code="internal"))

    async def frame_timed_out(self, message: str) -> None:
        if self.closing:
            return  # a fatal error is on its way already
        # After the replies already due, as every fatal error.
        await self.fatal(ProtocolError(message, code=TIMEOUT))

    async def connection_lost(self) -> None:
        self._lost = True
        if self.conn.budget is not None:
            self.conn.budget.close()
        self.closing = True
        self._stop_streams()
        if self._writer is not None:
            self._writer.cancel()
        await self._tasks.close()
        self.transactions.clear()
        self.conn.close()

    # --- dispatch ---------------------------------------------------------------------

    async def _handle(self, frame: Frame) -> None:
        if isinstance(frame, Connect):
            await self._connect(frame)
        elif isinstance(frame, Emit):
            await self._emit(frame)
        elif isinstance(frame, AckEv):
            self.subscriptions.ack(frame)
        elif isinstance(frame, QueryAck):
            self.queries.ack(frame)
        elif isinstance(frame, Ping):
            await self.reply(done(OK))
        elif isinstance(frame, StartTx):
            await self.reply(done(self.transactions.start(frame.sess_id)))
        elif isinstance(frame, CommitTx):
            await self._commit(frame.sess_id)
        elif isinstance(frame, AbortTx):
            await self.reply(done(self.transactions.abort(frame.sess_id)))
        elif isinstance(frame, Subscribe):
            await self.subscriptions.subscribe(frame)
        elif isinstance(frame, Unsubscribe):
            await self.reply(done(self.subscriptions.unsubscribe(frame.sub_id)))
        elif isinstance(frame, Query):
            await self.queries.query(frame)
        else:  # the connection only lets client frames through
            raise LocalProtocolError(f"unexpected frame {frame!r}")

    async def reply(
        self,
        outcome: asyncio.Future[Frame],
        cost: int = 0,
        after: Callable[[Frame], None] | None = None,
    ) -> None:
        """Queue a request's reply; waits while the in-flight budget is spent."""
        await self.budget.acquire(cost)
        self.queue_reply(Reply(outcome, cost, after))

    def queue_reply(self, item: Reply) -> None:
        """Queue a reply whose budget the caller has already acquired."""
        self._replies.append(item)
        if self._writer is None and self._waiting is None and not self._pumping:
            self._pump()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """A task of this connection: cancelled when it is lost."""
        return self._tasks.spawn(coro)

    # Replies are sent strictly in request order, each once its outcome is
    # known; replies already decided behind the head go out in the same
    # write (one syscall for a whole group commit's RESPONSEs).  They are
    # sent from the outcome's done callback: a reply task woken by an event
    # and again by each outcome cost two task steps per EMIT.

    def _pump(self, _settled: object = None) -> None:
        """Send every reply whose outcome is known, in order; then wait for
        the head's outcome by callback, or hand over to the writer task."""
        self._waiting = None
        if self._lost or self._writer is not None:
            return
        self._pumping = True
        try:
            while self._replies:
                head = self._replies[0]
                if head.fatal is not None:
                    self._hand_over(None, [])
                    return
                if not head.outcome.done():
                    self._waiting = head.outcome
                    head.outcome.add_done_callback(self._pump)
                    return
                batch = self._settled_batch()
                data = self._encode_batch(batch)
                if data is None or not self.out.try_send(data):
                    self._hand_over(data, batch)
                    return
                self._sent(batch)
        except Exception:  # noqa: BLE001 - logged; the connection ends
            # A callback has no caller to report to: say so and end this
            # connection rather than leave its replies stalled.
            log.exception("%s: BSON reply failed", self.out.peer)
            self.closing = True
            self.out.close()
        finally:
            self._pumping = False

    def _hand_over(self, data: bytes | None, batch: list[tuple[Reply, Frame]]) -> None:
        self._writer = self._tasks.spawn(self._write_replies(data, batch), name="bson-replies")

    def _settled_batch(self) -> list[tuple[Reply, Frame]]:
        """The settled replies at the head (not a fatal one), taken off."""
        batch: list[tuple[Reply, Frame]] = []
        replies = self._replies
        while replies and len(batch) < REPLY_BATCH:
            head = replies[0]
            if head.fatal is not None or not head.outcome.done():
                break
            replies.popleft()
            batch.append((head, reply_frame(head.outcome, head.success)))
        return batch

    def _encode_batch(self, batch: list[tuple[Reply, Frame]]) -> bytes | None:
        """The batch's bytes; None when one cannot be encoded (our bug)."""
        try:
            return b"".join([self._encode(reply) for _item, reply in batch])
        except LocalProtocolError as err:
            log.error("%s: cannot send a reply: %s", self.out.peer, err)
            self._replies.appendleft(Reply(done(OK), fatal=ProtocolError(
                f"internal error: {err.message}", code="internal")))
            return None

    def _sent(self, batch: list[tuple[Reply, Frame]]) -> None:
        for item, reply in batch:
            self.budget.release(item.cost)
            if item.after is not None:
                item.after(reply)

    async def _write_replies(self, data: bytes | None, batch: list[tuple[Reply, Frame]]) -> None:
        """The writer: sends ``data`` (``batch``'s bytes), waiting for the
        socket to drain, then goes on as :meth:`_pump` does, awaiting each
        outcome, until no reply is left; then replies are pumped again."""
        if data is not None:
            await self.out.send(data)
            self._sent(batch)
        while self._replies:
            item = self._replies[0]
            if item.fatal is not None:
                self._replies.popleft()
                await self._send_fatal(item.fatal)
                return  # the connection is closed: the writer stays set
            await settled(item.outcome)
            if self._lost:
                return
            batch = self._settled_batch()
            data = self._encode_batch(batch)
            if data is not None:
                await self.out.send(data)
                self._sent(batch)
        self._writer = None

    def _encode(self, frame: Frame) -> bytes:
        data = self.conn.send(frame)
        if isinstance(frame, (Response, SubResponse)) and not frame.ok and frame.err_code:
            self.ctx.stats.error(frame.err_code, frame.err_msg)
        self.ctx.stats.frames_out += 1
        return data

    async def _send(self, frame: Frame) -> None:
        await self.out.send(self._encode(frame))

    async def _revoked(self, code: str, message: str) -> None:
        """The user's rights were revoked while connected: the error RESPONSE, then close."""
        await self.fatal(ProtocolError(message, code=code))

    async def fatal(self, err: ProtocolError) -> None:
        """Stop reading and delivering; the writer sends the replies in flight,
        then the error RESPONSE, then closes."""
        self.closing = True
        self._stop_streams()
        self.ctx.log.info("%s: closing after protocol error: %s", self.out.peer, err.message)
        self.queue_reply(Reply(done(OK), fatal=err))

    async def _send_fatal(self, err: ProtocolError) -> None:
        self.closing = True
        self._stop_streams()
        if self.conn.state is not State.CLOSED:
            self.ctx.stats.error(err.code, err.message)
            self.ctx.stats.frames_out += 1
            await self.out.send(self.conn.send_error(err))
        self.out.close()

    def _stop_streams(self) -> None:
        self.subscriptions.close_all()
        self.queries.cancel_all()

    @property
    def tenant(self) -> Tenant:
        """The store as the connection's principal may use it (after CONNECT)."""
        return logged_in(self._tenant, "CONNECT first")

    # --- CONNECT -----------------------------------------------------------------------

    async def _connect(self, frame: Connect) -> None:
        # The connection parses nothing more until this verdict is sent, so
        # pipelined requests are judged as the new state says.
        verdict: Response
        if not is_supported_version(frame.version):
            verdict = error_response(
                Unsupported(
                    f"client version {frame.version!r} is not supported: "
                    "this server speaks 0.x and 1.x"
                )
            )
        else:
            try:
                self._tenant = await self.ctx.authenticate(frame.username, frame.password)
                self.principal = self._tenant.principal
                self.context = self.principal.default_context
                verdict = OK
                self.out.handshake_done()
            except Exception as exc:  # noqa: BLE001 - translated for the client
                verdict = error_response(exc)
        await self._send(verdict)
        if not verdict.ok:
            self.closing = True
            self.out.close()

    # --- EMIT and COMMITTX ---------------------------------------------------------------

    def _event(self, frame: Emit) -> tuple[Append, int]:
        body = encode_event(frame.event)
        check_body_size(len(body), self.limits.max_event_bytes, "EMIT: event")
        event = event_data(frame.event_type, body, emit_event_id(frame.event), BSON)
        append = build_append(self.context, frame.stream_name, (event,), ANY, ORIGIN, None)
        return append, len(body)

    async def _emit(self, frame: Emit) -> None:
        tx = self.transactions.get(frame.sess_id)
        try:
            if not frame.stream_name:
                raise Malformed("EMIT: 'streamName' must not be empty")
            append, size = self._event(frame)
            if tx is not None:
                self.transactions.buffer(tx, append, size)
                await self.reply(done(OK))
                return
        except PolyportError as exc:
            if tx is not None:
                tx.doom(exc)
            await self.reply(done(error_response(exc)))
            return
        # The append is queued now (so pipelined EMITs share group commits);
        # its RESPONSE leaves, in order, once the commit is confirmed.  The
        # reply queue awaits the store's own future: no task per EMIT.
        await self.budget.acquire(size)
        try:
            outcome = self.tenant.start_append(append)
        except PolyportError as exc:
            self.queue_reply(Reply(done(error_response(exc)), size))
            return
        self.queue_reply(Reply(outcome, size, success=OK))

    async def _commit(self, sess_id: int) -> None:
        commit = self.transactions.commit(sess_id)
        if not isinstance(commit, PendingCommit):
            await self.reply(done(commit))
            return
        await self.budget.acquire(commit.size)
        task = self.spawn(self._append_batch(commit.batch))
        self.queue_reply(Reply(task, commit.size))

    async def _append_batch(self, batch: AppendBatch) -> Frame:
        try:
            await self.tenant.append_batch(batch)
        except Exception as exc:  # noqa: BLE001 - translated for the client
            return error_response(exc)
        return OK


def session_factory(
    ctx: SessionContext, budget: Callable[[], BudgetAccount] | None = None
) -> Callable[[Outbound], BsonSession]:
    """``budget``: makes each new connection's account in the gateway's
    input budget (called where the transport has set CURRENT_PEER)."""
    limits = Limits.from_settings(ctx.settings)
    return lambda out: BsonSession(ctx, out, limits, budget() if budget else None)


__all__ = [
    "BsonSession",
    "encode_event",
    "recev_document",
    "session_factory",
]
