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
transports, stream queues and read loop are shared with the ReactiveSocket
draft client (``protocols/reactive/client.py``): only the frames differ.  The
client sends KEEPALIVE every ``keepalive_ms`` and, when it asked for a LEASE,
waits for one before its first request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from ssl import SSLContext
from typing import Any

from polyport.protocols.reactive import client as core
from polyport.protocols.reactive.client import (
    ConnectionClosed,
    NewEvent,
    RemoteError,
    ResponseStream,
    append_request,
    subscribe_request,
)
from polyport.protocols.reactive.payloads import (
    AppendResponse,
    EventMap,
    QueryRequest,
    ReadRequest,
    StartAt,
)
from polyport.protocols.rsocket import metadata, payloads
from polyport.protocols.rsocket.connection import ClientConnection
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


class EventStream(core.DecodedStream[EventMap]):
    """A ResponseStream whose items are event maps."""

    def __init__(self, stream: ResponseStream, fmt: str) -> None:
        super().__init__(stream, lambda data: payloads.decode_event(data, fmt))


class RSocketClient(core.StreamClient):
    _conn: ClientConnection

    def __init__(self, transport: core.Transport, conn: ClientConnection, fmt: str) -> None:
        super().__init__(transport, conn)
        self.data_format = fmt
        self._keepalive: asyncio.Task[None] | None = None
        self._lease = asyncio.Event()
        self.lease: Lease | None = None
        self.keepalives_answered = 0

    # --- connecting ---------------------------------------------------------------

    @classmethod
    async def connect(
        cls, host: str, port: int, *, ssl: SSLContext | None = None, **kw: Any
    ) -> RSocketClient:
        """Connect over TCP (TLS with ``ssl``) and send SETUP.  Keywords as
        :meth:`connect_websocket`."""
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
        return await cls._open(core.TcpTransport(reader, writer), "tcp", **kw)

    @classmethod
    async def connect_websocket(
        cls, url: str, *, ssl: SSLContext | None = None, **kw: Any
    ) -> RSocketClient:
        """Connect to ``ws://host:port/rsocket`` (or ``wss://`` with ``ssl``)
        (aiohttp) and send SETUP."""
        transport = await core.open_websocket(url, DEFAULT_MAX_FRAME_SIZE + 1024, ssl=ssl or True)
        return await cls._open(transport, "websocket", **kw)

    @classmethod
    async def _open(
        cls,
        transport: core.Transport,
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
        client._start_reading("rsocket-client-reader")
        client._keepalive = asyncio.create_task(
            client._keepalive_loop(keepalive_ms / 1000), name="rsocket-client-keepalive"
        )
        return client

    async def close(self) -> None:
        await self._stop(self._keepalive, self._reader)

    # --- RSocket's frames --------------------------------------------------------------

    async def _keepalive_loop(self, every: float) -> None:
        while not self.closed:
            await asyncio.sleep(every)
            await self._send_frame(Keepalive(respond=True))

    def _error_from(self, frame: ErrorFrame) -> RSocketError:
        return _error_from(frame)

    def _stream_error(self, stream_id: int, code: str, message: str) -> RSocketError:
        return RSocketError(code, message, stream_id, 0)

    def _protocol_error_frame(self, exc: RemoteProtocolError) -> bytes:
        return self._conn.send_error(CONNECTION_STREAM_ID, exc.code, exc.message, exc.error_code)

    def _answer(self, ev: object) -> core.Answer | None:
        if not isinstance(ev, Payload):
            return None
        return core.Answer(ev.stream_id, ev.data, ev.next, ev.complete)

    async def _deliver_other(self, ev: object) -> None:
        if isinstance(ev, Lease):
            self.lease = ev
            self._lease.set()
        elif isinstance(ev, Keepalive) and not ev.respond:
            self.keepalives_answered += 1

    def _finish(self, reason: BaseException) -> None:
        if not self.closed:
            self._lease.set()  # wake requests waiting for a lease: they fail
        super()._finish(reason)

    # --- sending ------------------------------------------------------------------------

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
        return await self._single(
            lambda: self._conn.request_response(self._metadata(route, user, password), data)
        )

    async def fire_and_forget(self, route: str, data: bytes) -> None:
        await self._fire(lambda: self._conn.request_fnf(self._metadata(route, None, None), data))

    async def request_stream(
        self, route: str, data: bytes, initial_n: int = UNBOUNDED
    ) -> ResponseStream:
        return await self._stream(
            lambda: self._conn.request_stream(self._metadata(route, None, None), data, initial_n)
        )

    # --- the polyport routes -------------------------------------------------------------

    def _data(self, route: str, request: Any, context: str | None) -> bytes:
        return payloads.encode_request(route, request, self.data_format, context)

    async def append(
        self, stream: str, events: Sequence[NewEvent],
        *, expected_version: int | None = None, context: str | None = None,
    ) -> AppendResponse:
        """``expected_version``: as in :func:`append_request`."""
        request = append_request(stream, events, expected_version)
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
        self, *, stream: str | None = None, prefix: str | None = None,
        types: Iterable[str] = (), start: StartAt | str | None = None,
        group: str | None = None, initial_n: int = UNBOUNDED, context: str | None = None,
    ) -> EventStream:
        """events.subscribe: catch-up then live (``start``: see
        :func:`subscribe_request`)."""
        route = payloads.ROUTE_SUBSCRIBE
        request = subscribe_request(stream, prefix, types, start, group)
        raw = await self.request_stream(route, self._data(route, request, context), initial_n)
        return EventStream(raw, self.data_format)
