"""BSON frames adapter: frames of one TCP connection ⇄ canonical core commands.

One :class:`BsonSession` per connection (the gateway's ``TcpListener`` feeds it
bytes).  How the pieces fit:

* **Replies in request order.**  RESPONSE carries no request id, so replies
  must leave in the order the requests came.  Every request becomes a
  ``_Reply`` whose outcome is a future (already done for instant answers, an
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
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import bson
from bson.binary import Binary

from polyport.core.binders import BinderQuery, to_jsonable
from polyport.core.bodies import BSON, event_document, media_type
from polyport.core.commands import (
    END,
    Append,
    AppendBatch,
    FromTime,
    FromVersion,
    Principal,
    Selector,
    Start,
)
from polyport.core.commands import (
    Subscribe as CoreSubscribe,
)
from polyport.core.errors import Busy, Malformed, NotFound, PolyportError, TooLarge, Unsupported
from polyport.core.events import EventData, RecordedEvent
from polyport.core.groups import GroupMember
from polyport.core.matcher import compile_matcher
from polyport.core.subscriptions import Subscription
from polyport.protocols.bson.connection import ServerConnection
from polyport.protocols.bson.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestError,
)
from polyport.protocols.bson.frames import (
    DEFAULT_FLOW_PAUSE_BYTES,
    DEFAULT_FLOW_RESUME_BYTES,
    DEFAULT_MAX_EVENT_SIZE,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_UNACKED_QUERY_RESULTS,
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
    QueryResponse,
    QueryResult,
    Recev,
    Response,
    StartTx,
    SubResponse,
    Subscribe,
    Unsubscribe,
)
from polyport.protocols.bson.state import State
from polyport.protocols.bson.wire import DECODE_OPTIONS, ENCODE_OPTIONS, is_supported_version
from polyport.protocols.errors import TOO_LARGE
from polyport.protocols.session import Outbound, SessionContext
from polyport.protocols.settings import settings_from

log = logging.getLogger("polyport.bson")

MIB = 1024 * 1024
ORIGIN = PROTOCOL
# Replies already decided that go out in one write.
REPLY_BATCH = 256


@dataclass(frozen=True, slots=True)
class BsonSettings:
    """Per-connection limits, from the gateway settings (``gw.settings``):
    each field ``<name>`` is read from the setting ``bson_<name>``;
    ``max_event_bytes`` falls back on the gateway-wide one."""

    max_event_bytes: int = DEFAULT_MAX_EVENT_SIZE
    query_window: int = DEFAULT_MAX_UNACKED_QUERY_RESULTS
    flow_pause_bytes: int = DEFAULT_FLOW_PAUSE_BYTES
    flow_resume_bytes: int = DEFAULT_FLOW_RESUME_BYTES
    max_frame_bytes: int = DEFAULT_MAX_FRAME_SIZE
    # Requests whose reply has not been sent yet, and the event bytes they hold.
    max_inflight_requests: int = 1024
    max_inflight_bytes: int = 16 * MIB
    max_transactions: int = 64
    max_tx_events: int = 10_000
    # Event bytes buffered in all open transactions of one connection.
    max_tx_bytes: int = 32 * MIB
    max_subscriptions: int = 256
    max_queries: int = 16
    # Events the core buffers per subscription before it falls back to catch-up.
    subscription_buffer: int = 64

    def __post_init__(self) -> None:
        # A window of 0 would never let a QUERYRESULT out.
        if self.query_window < 1:
            object.__setattr__(self, "query_window", 1)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> BsonSettings:
        return settings_from(cls, settings, prefix=PROTOCOL, shared=("max_event_bytes",))


# --- bodies -------------------------------------------------------------------


def encode_event(event: Mapping[str, Any]) -> bytes:
    """The stored body of an EMIT: the ``event`` document as BSON bytes.  The
    wire decoding is lossless, so these are the bytes the client sent."""
    try:
        return bson.encode(event, codec_options=ENCODE_OPTIONS)
    except Exception as exc:  # InvalidDocument, OverflowError, ...
        raise Malformed(f"EMIT: 'event' cannot be stored as BSON: {exc}") from exc


def recev_document(ev: RecordedEvent) -> dict[str, Any]:
    """The RECEV ``event`` document of a stored event (design brief, "Bodies
    across protocols", via core.bodies).  BSON bodies are decoded with the
    wire options so that dates outside Python's range survive the round
    trip instead of degrading to ``{"data": <bytes>}``."""
    if media_type(ev.content_type) == BSON:
        try:
            return dict(bson.decode(ev.body, codec_options=DECODE_OPTIONS))
        except Exception:
            pass
    return event_document(ev)


def _error_response(exc: BaseException) -> Response:
    if isinstance(exc, PolyportError):
        return Response(ok=False, err_code=exc.code, err_msg=exc.message)
    if isinstance(exc, RemoteProtocolError):
        return exc.to_response()
    log.error("unexpected error in the BSON adapter", exc_info=exc)
    return Response(ok=False, err_code="internal", err_msg=f"internal error: {exc}")


def _sub_error(exc: BaseException) -> SubResponse:
    r = _error_response(exc)
    return SubResponse(ok=False, err_code=r.err_code, err_msg=r.err_msg)


def _outcome(fut: asyncio.Future[Frame]) -> Frame:
    """The reply a finished outcome future stands for."""
    if fut.cancelled():
        return Response(ok=False, err_code="internal", err_msg="request cancelled")
    exc = fut.exception()
    return _error_response(exc) if exc is not None else fut.result()


def _done(frame: Frame) -> asyncio.Future[Frame]:
    fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
    fut.set_result(frame)
    return fut


OK = Response(ok=True)


# --- per-connection bookkeeping ----------------------------------------------------


@dataclass(slots=True)
class _Reply:
    outcome: asyncio.Future[Frame]
    # Event bytes this request holds against the in-flight budget.
    cost: int = 0
    # Runs right after the reply was sent (e.g. start RECEV delivery).
    after: Callable[[Frame], None] | None = None
    # Set on the sentinel that ends the connection after the replies before it.
    fatal: ProtocolError | None = None


@dataclass(slots=True)
class _Transaction:
    appends: list[Append] = field(default_factory=list)
    events: int = 0
    size: int = 0
    # The first rejected EMIT dooms the transaction: COMMITTX then fails with it,
    # so a client that pipelines EMITs never commits half a transaction.
    failure: PolyportError | None = None


@dataclass(eq=False, slots=True)
class _Sub:
    sub_id: int
    source: Subscription | GroupMember | None = None
    task: asyncio.Task[None] | None = None
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    # Durable only: (position, RECEV bytes) delivered and not yet acknowledged,
    # oldest first, and bytes acknowledged beyond the last whole event.
    unacked: deque[tuple[int, int]] = field(default_factory=deque)
    ack_credit: int = 0
    closed: bool = False

    @property
    def durable(self) -> bool:
        return isinstance(self.source, GroupMember)

    def close(self) -> None:
        self.closed = True
        if self.task is not None:
            self.task.cancel()
        if self.source is not None:
            self.source.close()


@dataclass(eq=False, slots=True)
class _Query:
    query_id: int
    # The core's result, between the QUERYRESPONSE and the result task.
    result: BinderQuery | None = None
    task: asyncio.Task[None] | None = None
    acked: asyncio.Event = field(default_factory=asyncio.Event)


class _Budget:
    """In-flight requests (count and bytes).  Only ``data_received`` acquires,
    so one event is enough to wake it."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max(1, max_count)
        self.max_bytes = max(1, max_bytes)
        self.count = 0
        self.bytes = 0
        self._freed = asyncio.Event()

    async def acquire(self, size: int) -> None:
        # A single request larger than the byte budget still goes through alone.
        while self.count >= self.max_count or (self.count and self.bytes + size > self.max_bytes):
            self._freed.clear()
            await self._freed.wait()
        self.count += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size
        self._freed.set()


# --- the session -----------------------------------------------------------------


class BsonSession:
    """Server side of one BSON frames connection (implements StreamSession)."""

    def __init__(
        self, ctx: SessionContext, out: Outbound, settings: BsonSettings | None = None
    ) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.out = out
        self.settings = settings or BsonSettings.from_settings(ctx.settings)
        s = self.settings
        self.conn = ServerConnection(
            max_frame_size=s.max_frame_bytes,
            flow_pause_bytes=s.flow_pause_bytes,
            flow_resume_bytes=s.flow_resume_bytes,
            max_unacked_query_results=s.query_window,
        )
        self.principal: Principal | None = None
        self.context = ""
        self._budget = _Budget(s.max_inflight_requests, s.max_inflight_bytes)
        # Requests awaiting their reply, in request order (bounded by _budget).
        self._replies: deque[_Reply] = deque()
        self._replies_wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._txs: dict[int, _Transaction] = {}
        self._tx_bytes = 0
        self._subs: dict[int, _Sub] = {}
        self._next_sub_id = 1
        self._queries: dict[int, _Query] = {}
        self._closing = False
        self._lost = False

    # --- StreamSession ------------------------------------------------------------

    async def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            frames = self.conn.receive_data(data)
            while frames:
                self.ctx.stats.frames_in += len(frames)
                for frame in frames:
                    await self._handle(frame)
                    if self._closing:
                        return
                frames = self.conn.receive_data(b"")
        except RemoteProtocolError as err:
            await self._fatal(err)
        except LocalProtocolError as err:
            # Our own bug, never the peer's fault: say so rather than blame them.
            log.error("%s: BSON adapter error: %s", self.out.peer, err)
            await self._fatal(ProtocolError(f"internal error: {err.message}", code="internal"))

    async def connection_lost(self) -> None:
        self._lost = True
        self._closing = True
        self._stop_streams()
        tasks = list(self._tasks)
        if self._writer is not None:
            tasks.append(self._writer)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._txs.clear()
        self.conn.transactions.clear()
        self.conn.close()

    # --- dispatch ---------------------------------------------------------------------

    async def _handle(self, frame: Frame) -> None:
        if isinstance(frame, Connect):
            await self._connect(frame)
        elif isinstance(frame, Emit):
            await self._emit(frame)
        elif isinstance(frame, AckEv):
            self._ackev(frame)
        elif isinstance(frame, QueryAck):
            q = self._queries.get(frame.query_id)
            if q is not None:
                q.acked.set()
        elif isinstance(frame, Ping):
            await self._reply(_done(OK))
        elif isinstance(frame, StartTx):
            await self._reply(_done(self._start_tx(frame.sess_id)))
        elif isinstance(frame, CommitTx):
            await self._commit_tx(frame.sess_id)
        elif isinstance(frame, AbortTx):
            await self._reply(_done(self._abort_tx(frame.sess_id)))
        elif isinstance(frame, Subscribe):
            await self._subscribe(frame)
        elif isinstance(frame, Unsubscribe):
            await self._reply(_done(self._unsubscribe(frame.sub_id)))
        elif isinstance(frame, Query):
            await self._query(frame)
        else:  # the codec only lets client frames through
            raise LocalProtocolError(f"unexpected frame {frame!r}")

    async def _reply(
        self,
        outcome: asyncio.Future[Frame],
        cost: int = 0,
        after: Callable[[Frame], None] | None = None,
    ) -> None:
        await self._budget.acquire(cost)
        self._queue_reply(_Reply(outcome, cost, after))

    def _queue_reply(self, item: _Reply) -> None:
        self._ensure_writer()
        self._replies.append(item)
        self._replies_wake.set()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _ensure_writer(self) -> None:
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_replies(), name="bson-replies")

    async def _write_replies(self) -> None:
        """Send replies strictly in request order, each once its outcome is
        known.  Replies already decided behind the one awaited go out in the
        same write (one syscall for a whole group commit's RESPONSEs)."""
        while True:
            while not self._replies:
                self._replies_wake.clear()
                await self._replies_wake.wait()
            item = self._replies.popleft()
            if item.fatal is not None:
                await self._send_fatal(item.fatal)
                return
            try:
                frame = await item.outcome
            except asyncio.CancelledError:
                if self._lost:
                    raise
                frame = Response(ok=False, err_code="internal", err_msg="request cancelled")
            except Exception as exc:
                frame = _error_response(exc)
            batch = [(item, frame)]
            while self._replies and len(batch) < REPLY_BATCH:
                head = self._replies[0]
                if head.fatal is not None or not head.outcome.done():
                    break
                self._replies.popleft()
                batch.append((head, _outcome(head.outcome)))
            chunks: list[bytes] = []
            try:
                for _item, reply in batch:
                    chunks.append(self._encode(reply))
            except LocalProtocolError as err:
                log.error("%s: cannot send a reply: %s", self.out.peer, err)
                await self._send_fatal(
                    ProtocolError(f"internal error: {err.message}", code="internal")
                )
                return
            await self.out.send(b"".join(chunks))
            for done_item, reply in batch:
                self._budget.release(done_item.cost)
                if done_item.after is not None:
                    done_item.after(reply)

    def _encode(self, frame: Frame) -> bytes:
        data = self.conn.send(frame)
        if isinstance(frame, (Response, SubResponse)) and not frame.ok and frame.err_code:
            self.ctx.stats.error(frame.err_code)
        self.ctx.stats.frames_out += 1
        return data

    async def _send(self, frame: Frame) -> None:
        await self.out.send(self._encode(frame))

    async def _fatal(self, err: ProtocolError) -> None:
        """Stop reading and delivering; the writer sends the replies in flight,
        then the error RESPONSE, then closes."""
        self._closing = True
        self._stop_streams()
        self.ctx.log.info("%s: closing after protocol error: %s", self.out.peer, err.message)
        self._queue_reply(_Reply(_done(OK), fatal=err))

    async def _send_fatal(self, err: ProtocolError) -> None:
        self._closing = True
        self._stop_streams()
        if self.conn.state is not State.CLOSED:
            self.ctx.stats.error(err.code)
            self.ctx.stats.frames_out += 1
            await self.out.send(self.conn.send_error(err))
        self.out.close()

    def _stop_streams(self) -> None:
        for sub in self._subs.values():
            sub.close()
        self._subs.clear()
        for q in self._queries.values():
            if q.task is not None:
                q.task.cancel()
        self._queries.clear()

    # --- CONNECT -----------------------------------------------------------------------

    async def _connect(self, frame: Connect) -> None:
        # The codec parses nothing more until this verdict is sent, so
        # pipelined requests are judged as the new state says.
        verdict: Response
        if not is_supported_version(frame.version):
            verdict = _error_response(
                Unsupported(
                    f"client version {frame.version!r} is not supported: "
                    "this server speaks 0.x and 1.x"
                )
            )
        else:
            try:
                self.principal = await self.store.authenticate(frame.username, frame.password)
                self.context = self.principal.default_context
                verdict = OK
            except Exception as exc:
                verdict = _error_response(exc)
        await self._send(verdict)
        if not verdict.ok:
            self._closing = True
            self.out.close()

    # --- EMIT and transactions ---------------------------------------------------------

    def _event(self, frame: Emit) -> tuple[Append, int]:
        body = encode_event(frame.event)
        limit = self.settings.max_event_bytes
        if len(body) > limit:
            raise TooLarge(
                f"EMIT: event of {len(body)} bytes exceeds the limit of {limit} bytes; "
                "nothing was stored"
            )
        event = EventData(type=frame.event_type, body=body, content_type=BSON)
        append = Append(self.context, frame.stream_name, (event,), origin=ORIGIN)
        return append, len(body)

    async def _emit(self, frame: Emit) -> None:
        tx = self._txs.get(frame.sess_id) if frame.sess_id is not None else None
        try:
            if not frame.stream_name:
                raise Malformed("EMIT: 'streamName' must not be empty")
            append, size = self._event(frame)
            if tx is not None:
                self._buffer_in_tx(tx, append, size)
                await self._reply(_done(OK))
                return
        except PolyportError as exc:
            if tx is not None and tx.failure is None:
                tx.failure = exc
            await self._reply(_done(_error_response(exc)))
            return
        # The append starts now (so pipelined EMITs share group commits); its
        # RESPONSE leaves, in order, once the commit is confirmed.
        await self._budget.acquire(size)
        task = self._spawn(self._append(append))
        self._queue_reply(_Reply(task, size))

    async def _append(self, append: Append) -> Frame:
        try:
            await self.store.append(append)
        except Exception as exc:
            return _error_response(exc)
        return OK

    def _buffer_in_tx(self, tx: _Transaction, append: Append, size: int) -> None:
        s = self.settings
        if tx.failure is not None:
            raise Malformed(
                f"EMIT: the transaction already failed ({tx.failure.code}); "
                "it can only be aborted"
            )
        if tx.events + 1 > s.max_tx_events:
            raise TooLarge(f"EMIT: a transaction holds at most {s.max_tx_events} events")
        if self._tx_bytes + size > s.max_tx_bytes:
            raise TooLarge(
                f"EMIT: open transactions of this connection would exceed {s.max_tx_bytes} bytes"
            )
        last = tx.appends[-1] if tx.appends else None
        if last is not None and last.stream == append.stream:
            # Consecutive events of one stream become one append.
            tx.appends[-1] = Append(
                last.context, last.stream, last.events + append.events, origin=ORIGIN
            )
        else:
            tx.appends.append(append)
        tx.events += 1
        tx.size += size
        self._tx_bytes += size

    def _start_tx(self, sess_id: int) -> Response:
        try:
            if not self.conn.transactions.is_open(sess_id) and (
                len(self._txs) >= self.settings.max_transactions
            ):
                raise Busy(
                    f"STARTTX: at most {self.settings.max_transactions} open transactions "
                    "per connection"
                )
            self.conn.transactions.start(sess_id)
        except (RequestError, PolyportError) as exc:
            return _error_response(exc)
        self._txs[sess_id] = _Transaction()
        return OK

    def _finish_tx(self, sess_id: int, commit: bool) -> _Transaction:
        if commit:
            self.conn.transactions.commit(sess_id)
        else:
            self.conn.transactions.abort(sess_id)
        tx = self._txs.pop(sess_id)
        self._tx_bytes -= tx.size
        return tx

    def _abort_tx(self, sess_id: int) -> Response:
        try:
            self._finish_tx(sess_id, commit=False)
        except RequestError as exc:
            return _error_response(exc)
        return OK

    async def _commit_tx(self, sess_id: int) -> None:
        try:
            tx = self._finish_tx(sess_id, commit=True)
        except RequestError as exc:
            await self._reply(_done(_error_response(exc)))
            return
        if tx.failure is not None:
            await self._reply(
                _done(
                    Response(
                        ok=False,
                        err_code=tx.failure.code,
                        err_msg=f"COMMITTX: transaction {sess_id} not committed, an EMIT in it "
                        f"was rejected: {tx.failure.message}",
                    )
                )
            )
            return
        if not tx.appends:
            await self._reply(_done(OK))
            return
        await self._budget.acquire(tx.size)
        task = self._spawn(self._append_batch(AppendBatch(tuple(tx.appends))))
        self._queue_reply(_Reply(task, tx.size))

    async def _append_batch(self, batch: AppendBatch) -> Frame:
        try:
            await self.store.append_batch(batch)
        except Exception as exc:
            return _error_response(exc)
        return OK

    # --- subscriptions -------------------------------------------------------------

    def _selector(self, frame: Subscribe) -> tuple[Selector, Start]:
        if not frame.stream_name:
            raise Malformed("SUBSCRIBE: 'streamName' must not be empty")
        if frame.start_seq is not None and frame.start_timestamp is not None:
            raise Malformed("SUBSCRIBE: give startSeq or startTimestamp, not both")
        start: Start = END
        if frame.start_seq is not None:
            if frame.start_seq < 0:
                raise Malformed(f"SUBSCRIBE: startSeq must be >= 0, got {frame.start_seq}")
            start = FromVersion(frame.start_seq + 1)  # seqNo = version - 1
        elif frame.start_timestamp is not None:
            try:
                when = datetime.fromtimestamp(frame.start_timestamp / 1000, UTC)
            except (OverflowError, OSError, ValueError):
                raise Malformed(
                    f"SUBSCRIBE: startTimestamp {frame.start_timestamp} is out of range"
                ) from None
            start = FromTime(when)
        matcher = None
        spec = None
        if frame.matcher is not None:
            predicate = compile_matcher(frame.matcher)  # Malformed names the bad part

            def matcher(ev: RecordedEvent) -> bool:
                return predicate(recev_document(ev))

            # The JSON-able form: durable subscriptions persist it.
            spec = to_jsonable(frame.matcher)
        selector = Selector(
            context=self.context,
            stream=frame.stream_name,
            types=frozenset({frame.event_type}) if frame.event_type is not None else frozenset(),
            matcher=matcher,
            matcher_spec=spec,
        )
        return selector, start

    async def _subscribe(self, frame: Subscribe) -> None:
        if len(self._subs) >= self.settings.max_subscriptions:
            exc = Busy(f"SUBSCRIBE: at most {self.settings.max_subscriptions} subscriptions")
            await self._reply(_done(_sub_error(exc)))
            return
        try:
            selector, start = self._selector(frame)
        except PolyportError as exc:
            await self._reply(_done(_sub_error(exc)))
            return
        sub = _Sub(self._next_sub_id)
        self._next_sub_id += 1
        self._subs[sub.sub_id] = sub
        command = CoreSubscribe(
            selector,
            start,
            durable=frame.durable_id,
            buffer_size=self.settings.subscription_buffer,
        )
        task = self._spawn(self._open(sub, command))
        await self._reply(task, after=lambda reply: self._start_delivery(sub, reply))

    async def _open(self, sub: _Sub, command: CoreSubscribe) -> Frame:
        try:
            if command.durable is not None and not command.durable:
                raise Malformed("SUBSCRIBE: 'durableID' must not be empty")
            source = await self.store.subscribe(command)
        except Exception as exc:
            self._subs.pop(sub.sub_id, None)
            return _sub_error(exc)
        if sub.closed:  # unsubscribed or connection ending meanwhile
            source.close()
            return _sub_error(NotFound(f"subscription {sub.sub_id} was closed"))
        sub.source = source
        return SubResponse(ok=True, sub_id=sub.sub_id)

    def _start_delivery(self, sub: _Sub, reply: Frame) -> None:
        if isinstance(reply, SubResponse) and reply.ok and not sub.closed:
            sub.task = self._spawn(self._deliver(sub))

    async def _deliver(self, sub: _Sub) -> None:
        source = sub.source
        assert source is not None
        while not sub.closed:
            while self.conn.is_delivery_paused(sub.sub_id):
                # Above the unacknowledged-bytes limit: wait for ACKEV.  The
                # core buffer behind us fills, then that subscription drops
                # back to catch-up reads: nothing else waits for us.
                sub.resume.clear()
                await sub.resume.wait()
            ev = await source.next()
            if ev is None or sub.closed or self.conn.state is not State.CONNECTED:
                return
            try:
                data = self._recev_bytes(sub, ev)
            except LocalProtocolError as err:
                # Only an event too large for any frame gets here; it cannot
                # be skipped silently, so the connection ends with the reason.
                self._subs.pop(sub.sub_id, None)
                await self._fatal(
                    ProtocolError(
                        f"subscription {sub.sub_id}: event at position {ev.position} cannot "
                        f"be delivered: {err.message}",
                        code=err.code,
                    )
                )
                return
            if sub.durable:
                sub.unacked.append((ev.position, len(data)))
            self.ctx.stats.frames_out += 1
            await self.out.send(data)

    def _recev_bytes(self, sub: _Sub, ev: RecordedEvent) -> bytes:
        def frame(doc: dict[str, Any]) -> Recev:
            return Recev(
                sub_id=sub.sub_id,
                stream_name=ev.stream,
                event_type=ev.type,
                timestamp=ev.recorded_at_ms,
                seq_no=ev.version - 1,
                event=doc,
            )

        try:
            return self.conn.send(frame(recev_document(ev)))
        except LocalProtocolError as err:
            if err.code == TOO_LARGE:
                raise
            # A body document BSON cannot hold (integers beyond int64 in JSON,
            # non-string MessagePack keys, ...): the raw form of "Bodies across
            # protocols", the body as a string when it is UTF-8, else binary.
            try:
                raw: Any = ev.body.decode("utf-8")
            except UnicodeDecodeError:
                raw = Binary(ev.body)
            return self.conn.send(frame({"data": raw}))

    def _ackev(self, frame: AckEv) -> None:
        # The codec has already updated the byte window.
        sub = self._subs.get(frame.sub_id)
        if sub is None:
            return  # can cross an UNSUBSCRIBE
        if isinstance(sub.source, GroupMember) and sub.unacked:
            position = self._acked_position(sub, frame.num_bytes)
            if position is not None:
                sub.source.ack_through(position)
        if not self.conn.is_delivery_paused(sub.sub_id):
            sub.resume.set()

    @staticmethod
    def _acked_position(sub: _Sub, num_bytes: int | None) -> int | None:
        """The last delivered event the ACKEV covers: all of them without
        ``bytes``; else as many whole RECEVs, oldest first, as the bytes pay for."""
        position = None
        if num_bytes is None:
            position = sub.unacked[-1][0]
            sub.unacked.clear()
            sub.ack_credit = 0
            return position
        sub.ack_credit += num_bytes
        while sub.unacked and sub.unacked[0][1] <= sub.ack_credit:
            position, size = sub.unacked.popleft()
            sub.ack_credit -= size
        if not sub.unacked:
            sub.ack_credit = 0
        return position

    def _unsubscribe(self, sub_id: int) -> Response:
        sub = self._subs.pop(sub_id, None)
        if sub is None:
            return _error_response(NotFound(f"UNSUBSCRIBE: no subscription with subID {sub_id}"))
        # Unacknowledged events of a durable subscription stay due: the next
        # subscriber with that durableID gets them.
        sub.close()
        return OK

    # --- QUERY ---------------------------------------------------------------------

    async def _query(self, frame: Query) -> None:
        qid = frame.query_id
        if qid in self._queries:
            exc: PolyportError = Malformed(f"QUERY: queryID {qid} is still active")
            await self._reply(_done(_error_response(exc)))
            return
        if len(self._queries) >= self.settings.max_queries:
            exc = Busy(f"QUERY: at most {self.settings.max_queries} queries at a time")
            await self._reply(_done(_error_response(exc)))
            return
        q = _Query(qid)
        self._queries[qid] = q
        task = self._spawn(self._run_query(q, frame))
        await self._reply(task, after=lambda reply: self._start_results(q, reply))

    async def _run_query(self, q: _Query, frame: Query) -> Frame:
        try:
            if not frame.binder:
                raise Malformed("QUERY: 'binder' must not be empty")
            q.result = await self.store.query(frame.binder, frame.matcher)
        except Exception as exc:
            return _error_response(exc)
        return QueryResponse(query_id=frame.query_id, num_results=q.result.count)

    def _start_results(self, q: _Query, reply: Frame) -> None:
        result, q.result = q.result, None
        mine = self._queries.get(q.query_id) is q
        if not mine or result is None or not isinstance(reply, QueryResponse):
            if mine:
                del self._queries[q.query_id]
            return
        if reply.num_results == 0:
            del self._queries[q.query_id]
            return
        q.task = self._spawn(self._send_results(q, result, reply.num_results))

    async def _send_results(self, q: _Query, result: BinderQuery, count: int) -> None:
        qid = q.query_id
        sent = 0
        try:
            async for doc in result:
                if sent == count:
                    break
                while not self.conn.can_send_query_result(qid):
                    # At most ``bson_query_window`` unacknowledged: wait for QUERYACK.
                    q.acked.clear()
                    await q.acked.wait()
                self.ctx.stats.frames_out += 1
                await self.out.send(self.conn.send(QueryResult(query_id=qid, result=doc)))
                sent += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: QUERY %d failed after %d results: %s", self.out.peer, qid, sent, exc)
        finally:
            if self._queries.get(qid) is q:
                del self._queries[qid]
        if sent < count and not self._closing:
            # numResults was promised and cannot be kept (the binder was
            # dropped or rebuilt meanwhile, or storage failed): there is no
            # frame to say so but the fatal RESPONSE.
            await self._fatal(
                ProtocolError(
                    f"QUERY {qid}: only {sent} of {count} results could be sent "
                    "(binder changed or storage failed)",
                    code="storage_unavailable",
                )
            )


def session_factory(ctx: SessionContext) -> Callable[[Outbound], BsonSession]:
    settings = BsonSettings.from_settings(ctx.settings)
    return lambda out: BsonSession(ctx, out, settings)


__all__ = [
    "BsonSession",
    "BsonSettings",
    "encode_event",
    "recev_document",
    "session_factory",
]
