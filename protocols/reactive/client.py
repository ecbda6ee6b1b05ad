"""The asyncio client core both ReactiveSocket versions share.

Transports (TCP, WebSocket), the per-stream queue (:class:`ResponseStream`),
the errors a caller sees and :class:`StreamClient`: the read loop, answer
delivery to waiters and stream queues, CANCEL on give-up and REQUEST_N.  Each
version's ``client.py`` subclasses :class:`StreamClient` with its connection
object and says how its answer frames look (the draft's RESPONSE with C and
data, RSocket's PAYLOAD with N and C), how its ERROR data reads, and what
else its connection delivers (RSocket's LEASE and KEEPALIVE).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from polyport.core.aio import IterateUntilNone
from polyport.protocols.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.reactive.connection import StreamError
from polyport.protocols.reactive.frames import CONNECTION_STREAM_ID
from polyport.protocols.reactive.payloads import (
    AppendEvent,
    AppendRequest,
    StartAt,
    SubscribeRequest,
)

READ_CHUNK = 64 * 1024


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


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append; ``id`` (the idempotency key) is chosen by the server
    when absent."""

    type: str
    body: bytes
    headers: Mapping[str, str] | None = None
    content_type: str | None = None
    id: Any = None  # uuid.UUID


def append_request(
    stream: str, events: Sequence[NewEvent], expected_version: int | None
) -> AppendRequest:
    """``expected_version``: the stream's current last version (0 = the
    stream must not exist; None = no check)."""
    return AppendRequest(
        stream,
        tuple(
            AppendEvent(e.type, e.body, e.id, dict(e.headers or {}), e.content_type)
            for e in events
        ),
        expected_version,
    )


def subscribe_request(
    stream: str | None,
    prefix: str | None,
    types: Iterable[str],
    start: StartAt | str | None,
    group: str | None,
    manual_ack: bool = False,
) -> SubscribeRequest:
    """``start``: "beginning", "end", or ``StartAt("position" | "version" |
    "time", n)``; None = the end (a group: its checkpoint)."""
    at = StartAt(start) if isinstance(start, str) else start
    return SubscribeRequest(stream, prefix, tuple(types), at, group, manual_ack)


# --- transports -------------------------------------------------------------------


class Transport(Protocol):
    async def send(self, chunks: list[bytes]) -> None: ...

    async def receive(self) -> bytes | None:
        """Bytes (TCP) or one message (WebSocket); None at the end."""

    async def close(self) -> None: ...


class TcpTransport:
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


class WebSocketTransport:
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
                continue  # not a ReactiveSocket frame; ignored
            return None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()
        await self._session.close()


async def open_websocket(url: str, max_msg_size: int, **kw: Any) -> WebSocketTransport:
    """A WebSocket transport to ``url`` (aiohttp); the session is closed if
    the handshake fails."""
    import aiohttp

    session = aiohttp.ClientSession()
    try:
        ws = await session.ws_connect(url, max_msg_size=max_msg_size, **kw)
    except BaseException:
        await session.close()
        raise
    return WebSocketTransport(session, ws)


# --- streams ------------------------------------------------------------------------


class _End:
    pass


END = _End()
_Item = bytes | _End | BaseException


class ResponseStream(IterateUntilNone[bytes]):
    """The answers of one credited stream (REQUEST_STREAM, REQUEST_SUB), in
    order."""

    def __init__(self, client: StreamClient, stream_id: int) -> None:
        self._client = client
        self.stream_id = stream_id
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.done = False

    def _put(self, item: _Item) -> None:
        self._queue.put_nowait(item)

    async def next(self, timeout: float | None = None) -> bytes | None:
        """The next answer's data; None at COMPLETE, after CANCEL, or when
        ``timeout`` passes.  Raises :class:`RemoteError` on ERROR."""
        if self.done and self._queue.empty():
            return None
        if not self._queue.empty():  # no waiting, no timer: a catch-up's usual case
            item = self._queue.get_nowait()
        else:
            try:
                async with asyncio.timeout(timeout):
                    item = await self._queue.get()
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
        """Grant ``n`` more answers (REQUEST_N)."""
        await self._client._send_request_n(self.stream_id, n)

    async def cancel(self) -> None:
        """CANCEL: the server stops at once; nothing more is delivered here."""
        await self._client._send_cancel(self.stream_id)
        self.done = True
        self._put(END)


T = TypeVar("T")


class DecodedStream(IterateUntilNone[T], Generic[T]):
    """A :class:`ResponseStream` whose items go through ``decode``."""

    def __init__(self, stream: ResponseStream, decode: Callable[[bytes], T]) -> None:
        self.raw = stream
        self._decode = decode

    @property
    def stream_id(self) -> int:
        return self.raw.stream_id

    async def next(self, timeout: float | None = None) -> T | None:
        data = await self.raw.next(timeout)
        return None if data is None else self._decode(data)

    async def request(self, n: int) -> None:
        await self.raw.request(n)

    async def cancel(self) -> None:
        await self.raw.cancel()


@dataclass(frozen=True, slots=True)
class Answer:
    """What one answer frame means to the client."""

    stream_id: int
    data: bytes
    item: bool  # carries an item for a stream (NEXT)
    complete: bool


# --- the client ---------------------------------------------------------------------


class StreamClient:
    """Waiters for single answers, queues for streams, the read loop."""

    def __init__(self, transport: Transport, conn: Any) -> None:
        self._transport = transport
        self._conn = conn
        self._lock = asyncio.Lock()  # codec call + write, in one order
        self._waiters: dict[int, asyncio.Future[bytes]] = {}
        self._streams: dict[int, ResponseStream] = {}
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        # Why the connection ended (ERROR on stream 0, EOF, protocol fault).
        self.error: BaseException | None = None

    # --- the version's frames ----------------------------------------------------------

    def _error_from(self, frame: Any) -> RemoteError:
        """The caller's exception for an ERROR frame."""
        raise NotImplementedError

    def _stream_error(self, stream_id: int, code: str, message: str) -> RemoteError:
        """The caller's exception when the server broke a stream's rules."""
        return RemoteError(code, message, stream_id)

    def _protocol_error_frame(self, exc: Any) -> bytes:
        """ERROR on stream 0 answering the server's protocol fault."""
        return bytes(self._conn.send_error(CONNECTION_STREAM_ID, exc.code, exc.message))

    def _answer(self, ev: object) -> Answer | None:
        """``ev`` as an answer, or None when it is not one."""
        raise NotImplementedError

    async def _deliver_other(self, ev: object) -> None:
        """Connection events beyond answers, ERRORs and stream faults."""

    # --- connecting ------------------------------------------------------------------

    def _start_reading(self, name: str) -> None:
        self._reader = asyncio.create_task(self._read_loop(), name=name)

    async def _stop(self, *tasks: asyncio.Task[None] | None) -> None:
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._transport.close()
        self._finish(ConnectionClosed("the client closed the connection"))

    async def close(self) -> None:
        await self._stop(self._reader)

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- receiving -------------------------------------------------------------------

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
                            await self._transport.send([self._protocol_error_frame(exc)])
                    break
                for ev in events:
                    if (
                        isinstance(ev, self._conn.error_frame_type)
                        and ev.stream_id == CONNECTION_STREAM_ID
                    ):
                        reason = self._error_from(ev)
                    else:
                        await self._deliver(ev)
                if isinstance(reason, RemoteError):
                    break
        except (ConnectionError, OSError) as exc:
            reason = ConnectionClosed(str(exc))
        finally:
            self._finish(reason)

    async def _deliver(self, ev: object) -> None:
        answer = self._answer(ev)
        if answer is not None:
            sid = answer.stream_id
            waiter = self._waiters.pop(sid, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(answer.data)
                return
            stream = self._streams.get(sid)
            if stream is None:
                return
            if answer.item:
                stream._put(answer.data)
            if answer.complete:
                stream._put(END)
                self._streams.pop(sid, None)
        elif isinstance(ev, self._conn.error_frame_type):
            self._fail(ev.stream_id, self._error_from(ev))
        elif isinstance(ev, StreamError):
            # The server broke this stream's rules: give up on it.
            self._fail(ev.stream_id, self._stream_error(ev.stream_id, ev.code, ev.message))
            await self._send_cancel(ev.stream_id)
        else:
            await self._deliver_other(ev)

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

    # --- sending ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise (
                self.error
                if isinstance(self.error, RemoteError)
                else ConnectionClosed(f"connection closed: {self.error}")
            )

    async def _ready(self) -> None:
        """Wait until requests may go out; raise when they never will."""
        self._check_open()

    async def _single(self, request: Callable[[], tuple[int, list[bytes]]]) -> bytes:
        """Send ``request()`` (the connection's call) and await its one answer."""
        await self._ready()
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        async with self._lock:
            sid, wire = request()
            self._waiters[sid] = fut
            await self._transport.send(wire)
        try:
            return await fut
        except asyncio.CancelledError:
            # The caller gave up: tell the server (CANCEL).
            self._waiters.pop(sid, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._send_cancel(sid))
            raise

    async def _fire(self, request: Callable[[], tuple[int, list[bytes]]]) -> None:
        await self._ready()
        async with self._lock:
            _, wire = request()
            await self._transport.send(wire)

    async def _stream(self, request: Callable[[], tuple[int, list[bytes]]]) -> ResponseStream:
        await self._ready()
        async with self._lock:
            sid, wire = request()
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
