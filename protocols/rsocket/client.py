"""A thin asyncio RSocket 1.0 client over TCP or WebSocket, for polyport's
routes (and for the tests; real applications use rsocket-py, rsocket-js or
rsocket-java).

::

    client = await RSocketClient.connect("127.0.0.1", 7878, user=..., password=...)
    # or: await RSocketClient.connect_websocket("ws://127.0.0.1:8080/rsocket", ...)
    result = await client.append("orders-1", [NewEvent("Created", b"...")])
    events = await client.read("orders-1")
    sub = await client.subscribe(stream="orders-1", start="beginning", initial_n=5)
    ev = await sub.next(timeout=1.0); await sub.request(5); await sub.cancel()

ERROR frames raise :class:`RSocketError` with the canonical ``code``.  The
transports and the stream queue are the ReactiveSocket draft client's: only
the frames differ.  The client sends KEEPALIVE every ``keepalive_ms`` and,
when it asked for a LEASE, waits for one before its first request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from ssl import SSLContext
from typing import Any

from polyport.core.aio import IterateUntilNone
from polyport.protocols.reactivesocket.client import (
    _END,
    ConnectionClosed,
    NewEvent,
    RemoteError,
    ResponseStream,
    _TcpTransport,
    _Transport,
    _WebSocketTransport,
)
from polyport.protocols.reactivesocket.payloads import (
    AppendEvent,
    AppendRequest,
    AppendResponse,
    EventMap,
    QueryRequest,
    ReadRequest,
    StartAt,
    SubscribeRequest,
)
from polyport.protocols.rsocket import metadata, payloads
from polyport.protocols.rsocket.connection import ClientConnection, StreamError
from polyport.protocols.rsocket.errors import (
    LocalProtocolError,
    RemoteProtocolError,
    parse_error_text,
)
from polyport.protocols.rsocket.frames import (
    CONNECTION_STREAM_ID,
    DEFAULT_MAX_FRAGMENT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_REQUEST_N,
    ErrorFrame,
    Keepalive,
    Lease,
    Payload,
    Setup,
)

__all__ = [
    "ConnectionClosed",
    "EventStream",
    "NewEvent",
    "RSocketClient",
    "RSocketError",
]

UNBOUNDED = MAX_REQUEST_N


class RSocketError(RemoteError):
    """ERROR from the server: ``code`` is the canonical error name,
    ``error_code`` the RSocket code; ``stream_id`` 0 = the connection."""

    def __init__(self, code: str, message: str, stream_id: int, error_code: int) -> None:
        super().__init__(code, message, stream_id)
        self.error_code = error_code


def _error_from(frame: ErrorFrame) -> RSocketError:
    code, message = parse_error_text(frame.data)
    return RSocketError(code, message, frame.stream_id, frame.code)


class EventStream(IterateUntilNone[EventMap]):
    """A ResponseStream whose items are event maps."""

    def __init__(self, stream: ResponseStream, fmt: str) -> None:
        self.raw = stream
        self._fmt = fmt

    @property
    def stream_id(self) -> int:
        return self.raw.stream_id

    async def next(self, timeout: float | None = None) -> EventMap | None:  # noqa: ASYNC109
        data = await self.raw.next(timeout)
        return None if data is None else payloads.decode_event(data, self._fmt)

    async def request(self, n: int) -> None:
        await self.raw.request(n)

    async def cancel(self) -> None:
        await self.raw.cancel()


class RSocketClient:
    def __init__(self, transport: _Transport, conn: ClientConnection, fmt: str) -> None:
        self._transport = transport
        self._conn = conn
        self.data_format = fmt
        self._lock = asyncio.Lock()  # codec call + write, in one order
        self._waiters: dict[int, asyncio.Future[bytes]] = {}
        self._streams: dict[int, ResponseStream] = {}
        self._reader: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._lease = asyncio.Event()
        self.lease: Lease | None = None
        self.keepalives_answered = 0
        self.closed = False
        self.error: BaseException | None = None

    # --- connecting ---------------------------------------------------------------

    @classmethod
    async def connect(
        cls, host: str, port: int, *, ssl: SSLContext | None = None, **kw: Any
    ) -> RSocketClient:
        """Connect over TCP (TLS with ``ssl``) and send SETUP.  Keywords as
        :meth:`connect_websocket`."""
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
        return await cls._open(_TcpTransport(reader, writer), "tcp", **kw)

    @classmethod
    async def connect_websocket(
        cls, url: str, *, ssl: SSLContext | None = None, **kw: Any
    ) -> RSocketClient:
        """Connect to ``ws://host:port/rsocket`` (``wss://`` with ``ssl``)
        (aiohttp) and send SETUP."""
        import aiohttp

        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(
                url, max_msg_size=DEFAULT_MAX_FRAME_SIZE + 1024, ssl=ssl or True
            )
        except BaseException:
            await session.close()
            raise
        return await cls._open(_WebSocketTransport(session, ws), "websocket", **kw)

    @classmethod
    async def _open(
        cls,
        transport: _Transport,
        kind: str,
        *,
        user: str | None = None,
        password: str | None = None,
        data_format: str = "msgpack",
        keepalive_ms: int = 20_000,
        lifetime_ms: int = 90_000,
        lease: bool = False,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_fragment: int = DEFAULT_MAX_FRAGMENT,
    ) -> RSocketClient:
        conn = ClientConnection(
            kind,
            max_frame_size=max_frame_size,
            max_message_size=max_message_size,
            max_fragment=max_fragment,
        )
        client = cls(transport, conn, data_format)
        mime = payloads.JSON_MIME if data_format == "json" else payloads.MSGPACK_MIME
        setup = Setup(
            keepalive_ms,
            lifetime_ms,
            metadata.COMPOSITE,
            mime,
            metadata=metadata.request_metadata(user=user, password=password) if user else None,
            lease=lease,
        )
        if not lease:
            client._lease.set()
        await transport.send([conn.setup(setup)])
        client._reader = asyncio.create_task(client._read_loop(), name="rsocket-client-reader")
        client._keepalive = asyncio.create_task(
            client._keepalive_loop(keepalive_ms / 1000), name="rsocket-client-keepalive"
        )
        return client

    async def close(self) -> None:
        for task in (self._keepalive, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._transport.close()
        self._finish(ConnectionClosed("the client closed the connection"))

    async def __aenter__(self) -> RSocketClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- receiving -------------------------------------------------------------------

    async def _keepalive_loop(self, every: float) -> None:
        while not self.closed:
            await asyncio.sleep(every)
            await self._send_frame(Keepalive(respond=True))

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
                                CONNECTION_STREAM_ID, exc.code, exc.message, exc.error_code
                            )
                            await self._transport.send([wire])
                    break
                for ev in events:
                    if isinstance(ev, ErrorFrame) and ev.stream_id == CONNECTION_STREAM_ID:
                        reason = _error_from(ev)
                    else:
                        await self._deliver(ev)
                if isinstance(reason, RSocketError):
                    break
        except (ConnectionError, OSError) as exc:
            reason = ConnectionClosed(str(exc))
        finally:
            self._finish(reason)

    async def _deliver(self, ev: object) -> None:
        if isinstance(ev, Payload):
            sid = ev.stream_id
            waiter = self._waiters.pop(sid, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(ev.data)
                return
            stream = self._streams.get(sid)
            if stream is None:
                return
            if ev.next:
                stream._put(ev.data)
            if ev.complete:
                stream._put(_END)
                self._streams.pop(sid, None)
        elif isinstance(ev, ErrorFrame):
            self._fail(ev.stream_id, _error_from(ev))
        elif isinstance(ev, StreamError):
            self._fail(ev.stream_id, RSocketError(ev.code, ev.message, ev.stream_id, 0))
            await self._send_cancel(ev.stream_id)
        elif isinstance(ev, Lease):
            self.lease = ev
            self._lease.set()
        elif isinstance(ev, Keepalive) and not ev.respond:
            self.keepalives_answered += 1

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
        self._lease.set()  # wake requests waiting for a lease: they fail
        for sid in list(self._waiters):
            self._fail(sid, reason)
        for sid in list(self._streams):
            self._fail(sid, reason)

    # --- sending ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise (
                self.error
                if isinstance(self.error, RemoteError)
                else ConnectionClosed(f"connection closed: {self.error}")
            )

    async def _ready(self) -> None:
        await self._lease.wait()
        self._check_open()

    async def _send_frame(self, frame: Keepalive) -> None:
        if self.closed:
            return
        async with self._lock:
            with contextlib.suppress(LocalProtocolError):
                await self._transport.send([self._conn.send(frame)])

    def _metadata(self, route: str, user: str | None, password: str | None) -> bytes:
        return metadata.request_metadata(route, user=user, password=password)

    async def request_response(
        self, route: str, data: bytes, *, user: str | None = None, password: str | None = None
    ) -> bytes:
        """One request, one answer.  ``user``/``password`` add an
        authentication entry for this request only."""
        await self._ready()
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        async with self._lock:
            sid, wire = self._conn.request_response(self._metadata(route, user, password), data)
            self._waiters[sid] = fut
            await self._transport.send(wire)
        try:
            return await fut
        except asyncio.CancelledError:
            self._waiters.pop(sid, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._send_cancel(sid))
            raise

    async def fire_and_forget(self, route: str, data: bytes) -> None:
        await self._ready()
        async with self._lock:
            _, wire = self._conn.request_fnf(self._metadata(route, None, None), data)
            await self._transport.send(wire)

    async def request_stream(
        self, route: str, data: bytes, initial_n: int = UNBOUNDED
    ) -> ResponseStream:
        await self._ready()
        async with self._lock:
            sid, wire = self._conn.request_stream(
                self._metadata(route, None, None), data, initial_n
            )
            stream = ResponseStream(self, sid)  # type: ignore[arg-type]
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

    # --- the polyport routes -------------------------------------------------------------

    def _data(self, route: str, request: Any, context: str | None) -> bytes:
        return payloads.encode_request(route, request, self.data_format, context)

    async def append(
        self,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None = None,
        context: str | None = None,
    ) -> AppendResponse:
        """``expected_version``: the stream's current last version (0 = the
        stream must not exist; None = no check)."""
        request = AppendRequest(
            stream,
            tuple(
                AppendEvent(e.type, e.body, e.id, dict(e.headers or {}), e.content_type)
                for e in events
            ),
            expected_version,
        )
        route = payloads.ROUTE_APPEND
        data = await self.request_response(route, self._data(route, request, context))
        return payloads.decode_append_response(data, self.data_format)

    async def read(
        self, stream: str, from_version: int = 1, max: int | None = None,
        *, context: str | None = None,
    ) -> list[EventMap]:
        route = payloads.ROUTE_READ
        request = ReadRequest(stream, from_version, max)
        data = await self.request_response(route, self._data(route, request, context))
        return list(payloads.decode_read_response(data, self.data_format).events)

    async def query(self, binder: str, matcher: Mapping[str, Any] | None = None) -> list[Any]:
        route = payloads.ROUTE_QUERY
        request = QueryRequest(binder, dict(matcher or {}))
        data = await self.request_response(route, self._data(route, request, None))
        return list(payloads.decode_query_response(data, self.data_format).documents)

    async def read_stream(
        self, stream: str, from_version: int = 1, max: int | None = None,
        *, initial_n: int = UNBOUNDED, context: str | None = None,
    ) -> EventStream:
        """events.stream: the stream's events up to its end when asked, then
        the iteration ends (COMPLETE)."""
        route = payloads.ROUTE_STREAM
        request = ReadRequest(stream, from_version, max)
        raw = await self.request_stream(route, self._data(route, request, context), initial_n)
        return EventStream(raw, self.data_format)

    async def subscribe(
        self,
        *,
        stream: str | None = None,
        prefix: str | None = None,
        types: Iterable[str] = (),
        start: StartAt | str | None = None,
        group: str | None = None,
        initial_n: int = UNBOUNDED,
        context: str | None = None,
    ) -> EventStream:
        """events.subscribe: catch-up then live.  ``start``: "beginning",
        "end", or ``StartAt("position" | "version" | "time", n)``; None = the
        end (a group: its checkpoint)."""
        at = StartAt(start) if isinstance(start, str) else start
        route = payloads.ROUTE_SUBSCRIBE
        request = SubscribeRequest(stream, prefix, tuple(types), at, group)
        raw = await self.request_stream(route, self._data(route, request, context), initial_n)
        return EventStream(raw, self.data_format)
