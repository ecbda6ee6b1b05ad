"""A thin asyncio ReactiveSocket client over TCP or WebSocket.

Frame level::

    client = await ReactiveSocketClient.connect("127.0.0.1", 7070, user=..., password=...)
    # or: await ReactiveSocketClient.connect_websocket("ws://127.0.0.1:8080/reactivesocket")
    data = await client.request_response(payload)          # bytes of the answer
    await client.fire_and_forget(payload)
    stream = await client.request_stream(payload, initial_n=16)
    async for item in stream: ...                           # ends at COMPLETE
    sub = await client.request_subscription(payload, initial_n=1)
    item = await sub.next(timeout=1.0); await sub.request(10); await sub.cancel()

Service level (polyport's MessagePack schema): :meth:`append`,
:meth:`append_fire_and_forget`, :meth:`read`, :meth:`query`,
:meth:`read_stream`, :meth:`subscribe`.  ERROR frames raise
:class:`RemoteError` with the canonical ``code``.

Memory: a stream's queue holds at most what the client granted (the server
never sends beyond the credits), so grant in proportion to what you consume.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from polyport.core.aio import IterateUntilNone
from polyport.protocols.reactivesocket import payloads
from polyport.protocols.reactivesocket.connection import ClientConnection, StreamError
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
    MAX_I64,
    ErrorFrame,
    Response,
)
from polyport.protocols.reactivesocket.payloads import (
    AckRequest,
    AppendEvent,
    AppendRequest,
    AppendResponse,
    EventMap,
    QueryRequest,
    ReadRequest,
    StartAt,
    SubscribeRequest,
)

READ_CHUNK = 64 * 1024
UNBOUNDED = MAX_I64


class RemoteError(Exception):
    """The server answered with ERROR: ``code`` is the canonical error name.
    ``stream_id`` 0 means the whole connection was refused or failed."""

    def __init__(self, code: str, message: str, stream_id: int = 0) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.stream_id = stream_id


class ConnectionClosed(ConnectionError):
    """The connection ended before the answer came."""


def _error_from(frame: ErrorFrame) -> RemoteError:
    try:
        data = payloads.decode_error_data(frame.data)
    except PayloadError:
        return RemoteError(
            "internal", f"undecodable ERROR data {frame.data[:100]!r}", frame.stream_id
        )
    return RemoteError(data.code, data.message, frame.stream_id)


# --- transports -------------------------------------------------------------------


class _Transport(Protocol):
    async def send(self, chunks: list[bytes]) -> None: ...

    async def receive(self) -> bytes | None:
        """Bytes (TCP) or one message (WebSocket); None at the end."""

    async def close(self) -> None: ...


class _TcpTransport:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def send(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self._writer.write(chunk)
        await self._writer.drain()

    async def receive(self) -> bytes | None:
        data = await self._reader.read(READ_CHUNK)
        return data or None

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class _WebSocketTransport:
    def __init__(self, session: Any, ws: Any) -> None:
        self._session = session
        self._ws = ws

    async def send(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            await self._ws.send_bytes(chunk)

    async def receive(self) -> bytes | None:
        from aiohttp import WSMsgType

        while True:
            msg = await self._ws.receive()
            if msg.type == WSMsgType.BINARY:
                data: bytes = msg.data
                return data
            if msg.type == WSMsgType.TEXT:
                continue  # not ReactiveSocket; ignored
            return None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()
        await self._session.close()


# --- streams ------------------------------------------------------------------------


class _End:
    pass


_END = _End()
_Item = bytes | _End | BaseException


class ResponseStream(IterateUntilNone[bytes]):
    """The responses of one REQUEST_STREAM or REQUEST_SUB, in order."""

    def __init__(self, client: ReactiveSocketClient, stream_id: int) -> None:
        self._client = client
        self.stream_id = stream_id
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.done = False

    def _put(self, item: _Item) -> None:
        self._queue.put_nowait(item)

    async def next(self, timeout: float | None = None) -> bytes | None:  # noqa: ASYNC109
        """The next response's data; None at COMPLETE, after CANCEL, or when
        ``timeout`` passes.  Raises :class:`RemoteError` on ERROR."""
        if self.done and self._queue.empty():
            return None
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
        if isinstance(item, _End):
            self.done = True
            return None
        if isinstance(item, BaseException):
            self.done = True
            raise item
        return item


    async def request(self, n: int) -> None:
        """Grant ``n`` more responses (REQUEST_N)."""
        await self._client._send_request_n(self.stream_id, n)

    async def cancel(self) -> None:
        """CANCEL: the server stops at once; nothing more is delivered here."""
        await self._client._send_cancel(self.stream_id)
        self.done = True
        self._put(_END)


class EventStream(IterateUntilNone[EventMap]):
    """A ResponseStream whose items are event maps."""

    def __init__(self, stream: ResponseStream) -> None:
        self.raw = stream

    @property
    def stream_id(self) -> int:
        return self.raw.stream_id

    async def next(self, timeout: float | None = None) -> EventMap | None:  # noqa: ASYNC109
        data = await self.raw.next(timeout)
        return None if data is None else payloads.decode_event(data)


    async def request(self, n: int) -> None:
        await self.raw.request(n)

    async def cancel(self) -> None:
        await self.raw.cancel()


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append; ``id`` (the idempotency key) is chosen by the server
    when absent."""

    type: str
    body: bytes
    headers: Mapping[str, str] | None = None
    content_type: str | None = None
    id: Any = None  # uuid.UUID


# --- the client -----------------------------------------------------------------------


class ReactiveSocketClient:
    def __init__(self, transport: _Transport, conn: ClientConnection) -> None:
        self._transport = transport
        self._conn = conn
        self._lock = asyncio.Lock()  # codec call + write, in one order
        self._waiters: dict[int, asyncio.Future[bytes]] = {}
        self._streams: dict[int, ResponseStream] = {}
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        # Why the connection ended (ERROR on stream 0, EOF, protocol fault).
        self.error: BaseException | None = None

    # --- connecting ------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        user: str | None = None,
        password: str | None = None,
        context: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_fragment: int = DEFAULT_MAX_FRAGMENT,
    ) -> ReactiveSocketClient:
        """Connect over TCP and send SETUP.  A refused SETUP shows as
        :class:`RemoteError` (stream 0) on the first request."""
        reader, writer = await asyncio.open_connection(host, port)
        conn = ClientConnection(
            "tcp",
            max_frame_size=max_frame_size,
            max_message_size=max_message_size,
            max_fragment=max_fragment,
        )
        client = cls(_TcpTransport(reader, writer), conn)
        await client._start(payloads.SetupData(user, password, context))
        return client

    @classmethod
    async def connect_websocket(
        cls,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        context: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_fragment: int = DEFAULT_MAX_FRAGMENT,
    ) -> ReactiveSocketClient:
        """Connect to ``ws://host:port/reactivesocket`` (aiohttp) and send SETUP."""
        import aiohttp

        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(url, max_msg_size=max_frame_size, autoping=True)
        except BaseException:
            await session.close()
            raise
        conn = ClientConnection(
            "websocket",
            max_frame_size=max_frame_size,
            max_message_size=max_message_size,
            max_fragment=max_fragment,
        )
        client = cls(_WebSocketTransport(session, ws), conn)
        await client._start(payloads.SetupData(user, password, context))
        return client

    async def _start(self, setup: payloads.SetupData) -> None:
        await self._transport.send([self._conn.setup(payloads.encode_setup_data(setup))])
        self._reader = asyncio.create_task(self._read_loop(), name="rs-client-reader")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        await self._transport.close()
        self._finish(ConnectionClosed("the client closed the connection"))

    async def __aenter__(self) -> ReactiveSocketClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def setup_accepted(self) -> bool:
        """True once the server answered anything (the spec's rule)."""
        return self._conn.setup_accepted

    # --- receiving -------------------------------------------------------------

    async def _read_loop(self) -> None:
        reason: BaseException = ConnectionClosed("the server closed the connection")
        try:
            while True:
                data = await self._transport.receive()
                if data is None:
                    break
                try:
                    events = self._conn.receive_data(data)
                except RemoteProtocolError as exc:
                    reason = exc
                    with contextlib.suppress(Exception):
                        async with self._lock:
                            wire = self._conn.send_error(
                                CONNECTION_STREAM_ID, exc.code, exc.message
                            )
                            await self._transport.send([wire])
                    break
                for ev in events:
                    if isinstance(ev, ErrorFrame) and ev.stream_id == CONNECTION_STREAM_ID:
                        reason = _error_from(ev)
                    else:
                        await self._deliver(ev)
                if isinstance(reason, RemoteError):
                    break
        except (ConnectionError, OSError) as exc:
            reason = ConnectionClosed(str(exc))
        finally:
            self._finish(reason)

    async def _deliver(self, ev: object) -> None:
        if isinstance(ev, Response):
            sid = ev.stream_id
            waiter = self._waiters.pop(sid, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(ev.data)
                return
            stream = self._streams.get(sid)
            if stream is None:
                return
            if not ev.complete or ev.data:
                stream._put(ev.data)
            if ev.complete:
                stream._put(_END)
                self._streams.pop(sid, None)
        elif isinstance(ev, ErrorFrame):
            self._fail(ev.stream_id, _error_from(ev))
        elif isinstance(ev, StreamError):
            # The server broke this stream's rules: give up on it.
            self._fail(ev.stream_id, RemoteError(ev.code, ev.message, ev.stream_id))
            await self._send_cancel(ev.stream_id)

    def _fail(self, sid: int, exc: BaseException) -> None:
        waiter = self._waiters.pop(sid, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        stream = self._streams.pop(sid, None)
        if stream is not None:
            stream._put(exc)

    def _finish(self, reason: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = reason
        for sid in list(self._waiters):
            self._fail(sid, reason)
        for sid in list(self._streams):
            self._fail(sid, reason)

    # --- sending ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise (
                self.error
                if isinstance(self.error, RemoteError)
                else ConnectionClosed(f"connection closed: {self.error}")
            )

    async def request_response(self, data: bytes) -> bytes:
        self._check_open()
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        async with self._lock:
            sid, wire = self._conn.request_response(data)
            self._waiters[sid] = fut
            await self._transport.send(wire)
        try:
            return await fut
        except asyncio.CancelledError:
            # The caller gave up: tell the server (spec: CANCEL).
            self._waiters.pop(sid, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._send_cancel(sid))
            raise

    async def fire_and_forget(self, data: bytes) -> None:
        self._check_open()
        async with self._lock:
            _, wire = self._conn.request_fnf(data)
            await self._transport.send(wire)

    async def request_stream(self, data: bytes, initial_n: int = UNBOUNDED) -> ResponseStream:
        self._check_open()
        async with self._lock:
            sid, wire = self._conn.request_stream(data, initial_n)
            stream = ResponseStream(self, sid)
            self._streams[sid] = stream
            await self._transport.send(wire)
        return stream

    async def request_subscription(self, data: bytes, initial_n: int = UNBOUNDED) -> ResponseStream:
        self._check_open()
        async with self._lock:
            sid, wire = self._conn.request_sub(data, initial_n)
            stream = ResponseStream(self, sid)
            self._streams[sid] = stream
            await self._transport.send(wire)
        return stream

    async def _send_request_n(self, sid: int, n: int) -> None:
        if self.closed:
            return
        async with self._lock:
            wire = self._conn.request_n(sid, n)
            if wire:
                await self._transport.send([wire])

    async def _send_cancel(self, sid: int) -> None:
        self._streams.pop(sid, None)
        if self.closed:
            return
        async with self._lock:
            try:
                wire = self._conn.cancel(sid)
            except LocalProtocolError:
                return
            if wire:
                await self._transport.send([wire])

    # --- the polyport service ---------------------------------------------------

    async def append(
        self,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None = None,
    ) -> AppendResponse:
        """``expected_version``: the stream's current last version (0 = the
        stream must not exist; None = no check)."""
        data = await self.request_response(_append_payload(stream, events, expected_version))
        return payloads.decode_append_response(data)

    async def append_fire_and_forget(
        self, stream: str, events: Sequence[NewEvent], *, expected_version: int | None = None
    ) -> None:
        await self.fire_and_forget(_append_payload(stream, events, expected_version))

    async def read(
        self, stream: str, from_version: int = 1, max: int | None = None
    ) -> list[EventMap]:
        data = await self.request_response(
            payloads.encode_request(ReadRequest(stream, from_version, max))
        )
        return list(payloads.decode_read_response(data).events)

    async def query(self, binder: str, matcher: Mapping[str, Any] | None = None) -> list[Any]:
        data = await self.request_response(
            payloads.encode_request(QueryRequest(binder, dict(matcher or {})))
        )
        return list(payloads.decode_query_response(data).documents)

    async def read_stream(
        self,
        stream: str,
        from_version: int = 1,
        max: int | None = None,
        *,
        initial_n: int = UNBOUNDED,
    ) -> EventStream:
        """REQUEST_STREAM: events up to the stream's end when asked, then the
        iteration ends (COMPLETE)."""
        raw = await self.request_stream(
            payloads.encode_request(ReadRequest(stream, from_version, max)), initial_n
        )
        return EventStream(raw)

    async def subscribe(
        self,
        *,
        stream: str | None = None,
        prefix: str | None = None,
        types: Iterable[str] = (),
        start: StartAt | str | None = None,
        group: str | None = None,
        initial_n: int = UNBOUNDED,
        manual_ack: bool = False,
    ) -> EventStream:
        """REQUEST_SUB: catch-up then live.  ``start``: "beginning", "end",
        or ``StartAt("position" | "version" | "time", n)``; None = the end (a
        group: its checkpoint).  ``manual_ack`` (a group only): settle events
        with :meth:`ack` / :meth:`nack` instead of on delivery."""
        at = StartAt(start) if isinstance(start, str) else start
        request = SubscribeRequest(stream, prefix, tuple(types), at, group, manual_ack)
        raw = await self.request_subscription(payloads.encode_subscribe_request(request), initial_n)
        return EventStream(raw)

    async def ack(self, subscription: EventStream, *positions: int) -> None:
        """Acknowledge events of a ``manual_ack`` group subscription (REQUEST_FNF)."""
        await self.fire_and_forget(
            payloads.encode_request(AckRequest(subscription.stream_id, positions)))

    async def nack(self, subscription: EventStream, *positions: int) -> None:
        """Give events back as failed: retried, or parked past the subscription's
        ``max_retries``."""
        await self.fire_and_forget(
            payloads.encode_request(AckRequest(subscription.stream_id, positions, negative=True)))


def _append_payload(stream: str, events: Sequence[NewEvent], expected_version: int | None) -> bytes:
    return payloads.encode_request(
        AppendRequest(
            stream,
            tuple(
                AppendEvent(e.type, e.body, e.id, dict(e.headers or {}), e.content_type)
                for e in events
            ),
            expected_version,
        )
    )


__all__ = [
    "ConnectionClosed",
    "EventStream",
    "NewEvent",
    "ReactiveSocketClient",
    "RemoteError",
    "ResponseStream",
]
