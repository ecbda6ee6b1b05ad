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

Transports, stream queues and the read loop are shared with the RSocket 1.0
client (``protocols/reactive/client.py``); this module has the draft's frames
and MessagePack service calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from ssl import SSLContext
from typing import Any

from polyport.protocols.reactive.client import (
    Answer,
    ConnectionClosed,
    DecodedStream,
    NewEvent,
    RemoteError,
    ResponseStream,
    StreamClient,
    TcpTransport,
    append_request,
    open_websocket,
    subscribe_request,
)
from polyport.protocols.reactivesocket import payloads
from polyport.protocols.reactivesocket.connection import ClientConnection
from polyport.protocols.reactivesocket.errors import PayloadError
from polyport.protocols.reactivesocket.frames import (
    DEFAULT_MAX_FRAGMENT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_I64,
    ErrorFrame,
    Response,
)
from polyport.protocols.reactivesocket.payloads import (
    AckRequest,
    AppendResponse,
    EventMap,
    QueryRequest,
    ReadRequest,
    StartAt,
)

UNBOUNDED = MAX_I64


def _error_from(frame: ErrorFrame) -> RemoteError:
    try:
        data = payloads.decode_error_data(frame.data)
    except PayloadError:
        return RemoteError(
            "internal", f"undecodable ERROR data {frame.data[:100]!r}", frame.stream_id
        )
    return RemoteError(data.code, data.message, frame.stream_id)


class EventStream(DecodedStream[EventMap]):
    """A ResponseStream whose items are event maps."""

    def __init__(self, stream: ResponseStream) -> None:
        super().__init__(stream, payloads.decode_event)


# --- the client -----------------------------------------------------------------------


class ReactiveSocketClient(StreamClient):
    _conn: ClientConnection

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
        ssl: SSLContext | None = None,
    ) -> ReactiveSocketClient:
        """Connect over TCP (TLS with ``ssl``) and send SETUP.  A refused SETUP
        shows as :class:`RemoteError` (stream 0) on the first request."""
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
        conn = ClientConnection(
            "tcp",
            max_frame_size=max_frame_size,
            max_message_size=max_message_size,
            max_fragment=max_fragment,
        )
        client = cls(TcpTransport(reader, writer), conn)
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
        ssl: SSLContext | None = None,
    ) -> ReactiveSocketClient:
        """Connect to ``ws://host:port/reactivesocket`` (or ``wss://`` with
        ``ssl``) (aiohttp) and send SETUP."""
        transport = await open_websocket(url, max_frame_size, autoping=True, ssl=ssl or True)
        conn = ClientConnection(
            "websocket",
            max_frame_size=max_frame_size,
            max_message_size=max_message_size,
            max_fragment=max_fragment,
        )
        client = cls(transport, conn)
        await client._start(payloads.SetupData(user, password, context))
        return client

    async def _start(self, setup: payloads.SetupData) -> None:
        await self._transport.send([self._conn.setup(payloads.encode_setup_data(setup))])
        self._start_reading("rs-client-reader")

    @property
    def setup_accepted(self) -> bool:
        """True once the server answered anything (the spec's rule)."""
        return self._conn.setup_accepted

    # --- the draft's frames ------------------------------------------------------

    def _error_from(self, frame: ErrorFrame) -> RemoteError:
        return _error_from(frame)

    def _answer(self, ev: object) -> Answer | None:
        if not isinstance(ev, Response):
            return None
        # A COMPLETE without data ends a stream without an item.
        return Answer(ev.stream_id, ev.data, not ev.complete or bool(ev.data), ev.complete)

    # --- requests ----------------------------------------------------------------

    async def request_response(self, data: bytes) -> bytes:
        return await self._single(lambda: self._conn.request_response(data))

    async def fire_and_forget(self, data: bytes) -> None:
        await self._fire(lambda: self._conn.request_fnf(data))

    async def request_stream(self, data: bytes, initial_n: int = UNBOUNDED) -> ResponseStream:
        return await self._stream(lambda: self._conn.request_stream(data, initial_n))

    async def request_subscription(self, data: bytes, initial_n: int = UNBOUNDED) -> ResponseStream:
        return await self._stream(lambda: self._conn.request_sub(data, initial_n))

    # --- the polyport service ---------------------------------------------------

    async def append(
        self,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None = None,
    ) -> AppendResponse:
        """``expected_version``: as in :func:`append_request`."""
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
        """REQUEST_SUB: catch-up then live (``start``: see
        :func:`subscribe_request`).  ``manual_ack`` (a group only): settle
        events with :meth:`ack` / :meth:`nack` instead of on delivery."""
        request = subscribe_request(stream, prefix, types, start, group, manual_ack)
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
    return payloads.encode_request(append_request(stream, events, expected_version))


__all__ = [
    "ConnectionClosed",
    "EventStream",
    "NewEvent",
    "ReactiveSocketClient",
    "RemoteError",
    "ResponseStream",
]
