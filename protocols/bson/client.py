"""A thin asyncio client for the BSON frames protocol, over the same codec.

::

    async with await BsonClient.connect(host, port, username="tim", password="1234") as c:
        await c.emit("orders", "add_item", {"sku": "A1", "qty": 2})
        async with c.transaction() as tx:          # STARTTX ... COMMITTX (ABORTTX on error)
            tx.emit("orders", "add_item", {...})
            tx.emit("stock", "reserved", {...})
        sub = await c.subscribe("orders", start_seq=0)
        async for ev in sub:                        # Recev frames; acked as you go
            ...
        docs = await c.query_all("baskets", {"total": {"$gt": 10}})
        await c.ping()

Requests may be pipelined: :meth:`BsonClient.send_emit` writes an EMIT at once
and returns a future for its RESPONSE; replies are matched to requests in
order, as the protocol requires.  Failures raise :class:`BsonError` with the
server's ``errCode`` and ``errMsg``.

Flow control: a subscription acknowledges RECEVs (ACKEV with ``bytes``) only
after they were taken from it, so the server's 4 MiB unacknowledged window
also bounds what the client buffers.  Query results are acknowledged
(QUERYACK) as they are consumed, for the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from ssl import SSLContext
from types import TracebackType
from typing import Any, cast

from polyport.core.aio import IterateUntilNone
from polyport.protocols.bson.connection import ClientConnection
from polyport.protocols.bson.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.bson.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_PORT,
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

READ_CHUNK = 64 * 1024
# Auto-acknowledge once this many RECEV bytes were consumed (or when the
# subscription runs dry), well inside the server's 2-4 MiB hysteresis.
DEFAULT_ACK_BYTES = 256 * 1024


class BsonError(Exception):
    """The server answered ok=false (or the connection failed)."""

    def __init__(self, err_code: str, err_msg: str) -> None:
        super().__init__(f"{err_code}: {err_msg}")
        self.err_code = err_code
        self.err_msg = err_msg


class ConnectionClosed(BsonError):
    def __init__(self, err_msg: str = "the connection is closed", err_code: str = "closed") -> None:
        super().__init__(err_code, err_msg)


def _check(reply: Frame) -> None:
    if isinstance(reply, (Response, SubResponse)) and not reply.ok:
        raise BsonError(reply.err_code or "unknown", reply.err_msg or "")


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Frame]
    # Runs in the reader as the reply arrives, before any later frame is
    # dispatched (so RECEVs right behind a SUBRESPONSE find their queue).
    on_reply: Callable[[Frame], None] | None = None


class BsonClient:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.conn = ClientConnection(max_frame_size=max_frame_size)
        self._waiters: deque[_Waiter] = deque()
        self._subs: dict[int, ClientSubscription] = {}
        self._queries: dict[int, QueryResults] = {}
        self._query_ids = itertools.count(1)
        self._sess_ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._error: BsonError | None = None
        self.closed = asyncio.Event()

    # --- lifecycle ---------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        username: str | None = None,
        password: str | None = None,
        version: str = "1.0",
        timeout: float | None = 30.0,
        ssl: SSLContext | None = None,
    ) -> BsonClient:
        """Open the connection (TLS with ``ssl``) and send CONNECT; raises
        BsonError if refused."""
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
        client = cls(reader, writer)
        client._task = asyncio.create_task(client._read_loop(), name="bson-client-reader")
        try:
            async with asyncio.timeout(timeout):
                reply = await client._request(
                    Connect(version=version, username=username, password=password))
            _check(reply)
        except BaseException:
            await client.close()
            raise
        return client

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._shutdown(ConnectionClosed())
        with contextlib.suppress(Exception):
            self._writer.close()
            await self._writer.wait_closed()

    async def __aenter__(self) -> BsonClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def error(self) -> BsonError | None:
        """Why the connection ended, once it has (e.g. the server's fatal error)."""
        return self._error

    # --- plumbing ------------------------------------------------------------------

    def _write(self, frame: Frame) -> None:
        if self._error is not None:
            raise self._error
        try:
            data = self.conn.send(frame)
        except LocalProtocolError as exc:
            raise BsonError(exc.code, exc.message) from exc
        self._writer.write(data)

    def _request(
        self, frame: Frame, on_reply: Callable[[Frame], None] | None = None
    ) -> asyncio.Future[Frame]:
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._write(frame)
        self._waiters.append(_Waiter(fut, on_reply))
        return fut

    async def _call(self, frame: Frame) -> Frame:
        fut = self._request(frame)
        await self.drain()
        reply = await fut
        _check(reply)
        return reply

    async def drain(self) -> None:
        """Wait until the socket buffer has room (backpressure for pipelining)."""
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._shutdown(ConnectionClosed(f"connection lost: {exc}"))
            raise ConnectionClosed(f"connection lost: {exc}") from exc

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    self._shutdown(ConnectionClosed("the server closed the connection"))
                    return
                try:
                    frames = self.conn.receive_sized(data)
                    while frames:
                        for frame, size in frames:
                            self._dispatch(frame, size)
                        frames = self.conn.receive_sized(b"")
                except RemoteProtocolError as exc:
                    self._shutdown(BsonError(exc.code, f"bad frame from server: {exc}"))
                    self._writer.close()
                    return
        except (ConnectionError, OSError) as exc:
            self._shutdown(ConnectionClosed(f"connection lost: {exc}"))

    def _dispatch(self, frame: Frame, size: int) -> None:
        if isinstance(frame, (Response, SubResponse, QueryResponse)):
            if not self._waiters:
                # A RESPONSE with nothing pending: the server's fatal-error
                # notice; the connection closes next.
                assert isinstance(frame, Response)
                self._shutdown(BsonError(frame.err_code or "unknown", frame.err_msg or ""))
                return
            waiter = self._waiters.popleft()
            if waiter.on_reply is not None:
                waiter.on_reply(frame)
            if not waiter.future.done():
                waiter.future.set_result(frame)
        elif isinstance(frame, Recev):
            sub = self._subs.get(frame.sub_id)
            if sub is not None:
                sub._push(frame, size)
        elif isinstance(frame, QueryResult):
            q = self._queries.get(frame.query_id)
            if q is not None:
                q._push(frame.result)

    def _shutdown(self, error: BsonError) -> None:
        if self._error is None:
            self._error = error
        self.conn.close()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.future.done():
                w.future.set_exception(self._error)
                w.future.exception()  # retrieved: nobody may be waiting any more
        for sub in self._subs.values():
            sub._end()
        for q in self._queries.values():
            q._end()
        self.closed.set()

    # --- requests ---------------------------------------------------------------------

    async def ping(self) -> None:
        await self._call(Ping())

    def send_emit(
        self,
        stream: str,
        event_type: str,
        event: Mapping[str, Any],
        sess_id: int | None = None,
    ) -> asyncio.Future[Response]:
        """Write an EMIT now; the future gets its RESPONSE (check ``.ok``).
        Call :meth:`drain` now and then when pipelining many."""
        # The codec only lets a RESPONSE answer an EMIT.
        return cast("asyncio.Future[Response]", self._request(Emit(stream, event_type,
                                                                   dict(event), sess_id)))

    async def emit(
        self,
        stream: str,
        event_type: str,
        event: Mapping[str, Any],
        sess_id: int | None = None,
    ) -> None:
        """EMIT and wait until the server confirms the event is stored."""
        await self._call(Emit(stream, event_type, dict(event), sess_id))

    async def start_tx(self, sess_id: int) -> None:
        await self._call(StartTx(sess_id))

    async def commit_tx(self, sess_id: int) -> None:
        await self._call(CommitTx(sess_id))

    async def abort_tx(self, sess_id: int) -> None:
        await self._call(AbortTx(sess_id))

    def transaction(self, sess_id: int | None = None) -> Transaction:
        """``async with client.transaction() as tx: tx.emit(...)``: commits on
        success, aborts on an exception."""
        return Transaction(self, next(self._sess_ids) if sess_id is None else sess_id)

    async def subscribe(
        self,
        stream: str,
        *,
        event_type: str | None = None,
        start_seq: int | None = None,
        start_timestamp: int | None = None,
        durable_id: str | None = None,
        matcher: Mapping[str, Any] | None = None,
        auto_ack: bool = True,
        ack_bytes: int = DEFAULT_ACK_BYTES,
    ) -> ClientSubscription:
        """SUBSCRIBE; returns an async iterator of RECEV frames.  With
        ``auto_ack`` consumed events are acknowledged as the iteration goes on;
        otherwise call :meth:`ClientSubscription.ack`."""
        sub = ClientSubscription(self, auto_ack=auto_ack, ack_bytes=ack_bytes)

        def registered(reply: Frame) -> None:
            if isinstance(reply, SubResponse) and reply.ok and reply.sub_id is not None:
                sub.sub_id = reply.sub_id
                self._subs[reply.sub_id] = sub

        frame = Subscribe(
            stream,
            event_type,
            start_seq,
            start_timestamp,
            durable_id,
            dict(matcher) if matcher is not None else None,
        )
        reply = await self._request(frame, registered)
        _check(reply)
        return sub

    async def query(
        self,
        binder: str,
        matcher: Mapping[str, Any] | None = None,
        *,
        query_id: int | None = None,
        auto_ack: bool = True,
    ) -> QueryResults:
        """QUERY; returns the results (``num_results`` and an async iterator of
        documents).  With ``auto_ack`` each consumed result is QUERYACKed."""
        qid = next(self._query_ids) if query_id is None else query_id
        results = QueryResults(self, qid, auto_ack=auto_ack)

        def registered(reply: Frame) -> None:
            if isinstance(reply, QueryResponse):
                results.num_results = reply.num_results
                if reply.num_results:
                    self._queries[qid] = results

        reply = await self._request(Query(qid, binder, dict(matcher or {})), registered)
        if isinstance(reply, Response):
            _check(reply)
        return results

    async def query_all(self, binder: str, matcher: Mapping[str, Any] | None = None) -> list[Any]:
        results = await self.query(binder, matcher)
        return [doc async for doc in results]


class Transaction:
    def __init__(self, client: BsonClient, sess_id: int) -> None:
        self.client = client
        self.sess_id = sess_id
        self._emits: list[asyncio.Future[Response]] = []

    def emit(self, stream: str, event_type: str, event: Mapping[str, Any]) -> None:
        """Pipelined; the EMIT replies are checked at commit."""
        self._emits.append(self.client.send_emit(stream, event_type, event, self.sess_id))

    async def __aenter__(self) -> Transaction:
        await self.client.start_tx(self.sess_id)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is not None:
            with contextlib.suppress(BsonError):
                await self.client.abort_tx(self.sess_id)
            return
        # COMMITTX fails by itself when one of the EMITs was rejected.
        try:
            await self.client.commit_tx(self.sess_id)
        finally:
            for fut in self._emits:
                if fut.done() and not fut.cancelled():
                    fut.exception()


class ClientSubscription(IterateUntilNone[Recev]):
    """RECEV frames of one subscription, oldest first."""

    def __init__(self, client: BsonClient, *, auto_ack: bool, ack_bytes: int) -> None:
        self.client = client
        self.sub_id = 0
        self.auto_ack = auto_ack
        self.ack_bytes = ack_bytes
        self._queue: deque[tuple[Recev, int]] = deque()
        self._readable = asyncio.Event()
        self._consumed_bytes = 0  # taken from the queue, not acknowledged yet
        self.received_bytes = 0
        self.received = 0
        self.ended = False

    @property
    def buffered(self) -> int:
        """RECEVs received and not taken yet."""
        return len(self._queue)

    def _push(self, frame: Recev, size: int) -> None:
        self._queue.append((frame, size))
        self.received += 1
        self.received_bytes += size
        self._readable.set()

    def _end(self) -> None:
        self.ended = True
        self._readable.set()

    async def next(self, timeout: float | None = None) -> Recev | None:
        """The next RECEV, or None on timeout or when the subscription ended."""
        if self.auto_ack and self._consumed_bytes and (
            not self._queue or self._consumed_bytes >= self.ack_bytes
        ):
            # Everything taken before this call has been processed.
            self.ack()
        while not self._queue:
            if self.ended:
                return None
            self._readable.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._readable.wait()
            except TimeoutError:
                return None
        frame, size = self._queue.popleft()
        self._consumed_bytes += size
        return frame

    def ack(self, *, with_bytes: bool = True) -> None:
        """ACKEV for the events taken so far (``bytes`` = their RECEV sizes);
        ``with_bytes=False`` acknowledges everything delivered."""
        if self.ended:
            return
        num = self._consumed_bytes if with_bytes else None
        self._consumed_bytes = 0
        self.client._write(AckEv(self.sub_id, num))

    async def unsubscribe(self) -> None:
        await self.client._call(Unsubscribe(self.sub_id))
        self.client._subs.pop(self.sub_id, None)
        self._end()



class QueryResults(IterateUntilNone[Any]):
    def __init__(self, client: BsonClient, query_id: int, *, auto_ack: bool) -> None:
        self.client = client
        self.query_id = query_id
        self.auto_ack = auto_ack
        self.num_results = 0
        self.taken = 0
        self._queue: deque[Any] = deque()
        self._readable = asyncio.Event()
        self._pending_acks = 0
        self.ended = False

    @property
    def buffered(self) -> int:
        return len(self._queue)

    def _push(self, doc: Any) -> None:
        self._queue.append(doc)
        self._readable.set()

    def _end(self) -> None:
        self.ended = True
        self._readable.set()

    async def next(self, timeout: float | None = None) -> Any | None:
        """The next document; None after the last one, on timeout, or on close."""
        if self.auto_ack and self._pending_acks:
            self.ack(self._pending_acks)
        if self.taken >= self.num_results:
            self.client._queries.pop(self.query_id, None)
            return None
        while not self._queue:
            if self.ended:
                if self.client.error is not None:
                    raise self.client.error
                return None
            self._readable.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._readable.wait()
            except TimeoutError:
                return None
        self.taken += 1
        self._pending_acks += 1
        return self._queue.popleft()

    def ack(self, count: int = 1) -> None:
        """QUERYACK ``count`` results (one frame each)."""
        for _ in range(count):
            self.client._write(QueryAck(self.query_id))
        self._pending_acks = max(0, self._pending_acks - count)

