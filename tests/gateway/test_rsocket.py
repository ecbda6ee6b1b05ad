"""RSocket 1.0 end to end through polyport's own client and raw frames: a
real gateway, real sockets, TCP and WebSocket.  KEEPALIVE answers, the
lifetime, refused setups, connection-level faults, our client over
WebSocket with MessagePack data.  The same gateway driven by rsocket-py
(the ``rsocket`` package, unchanged) is tests/gateway/test_rsocket_py.py,
which alone needs that library.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polyport.core.commands import ReadStream
from polyport.protocols.rsocket import frames as F
from polyport.protocols.rsocket.client import NewEvent, RSocketClient
from polyport.protocols.rsocket.metadata import COMPOSITE, request_metadata
from polyport.protocols.rsocket.wire import decode_frame, encode_frame

pytestmark = pytest.mark.timeout(60)

TRANSPORTS = ["tcp", "websocket"]
USER, PASSWORD, CTX = "rs-user", "rs-pw", "rs-ctx"
QUIET = 0.3  # how long "nothing more arrives" is watched
GatewayFactory = Callable[..., Awaitable[Any]]


def unique(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def gw(gateway_factory: GatewayFactory) -> Any:
    gateway = await gateway_factory()
    await gateway.store.users.add(USER, PASSWORD, default_context=CTX, contexts=[CTX, "shared"])
    return gateway



async def stored(gateway: Any, stream: str, context: str = CTX) -> list[Any]:
    return await gateway.store.read_stream(ReadStream(context, stream))



async def test_keepalive_answered_and_lifetime_enforced(gw: Any) -> None:
    host, port = gw.listeners["rsocket"].address
    client = await RSocketClient.connect(host, port, keepalive_ms=50, lifetime_ms=5000)
    try:
        await asyncio.sleep(0.4)
        assert client.keepalives_answered >= 3
        assert await client.read(unique()) == []
    finally:
        await client.close()
    # A client that sends no KEEPALIVE within its own max lifetime is cut off.
    raw = await RawConnection.open(gw, F.Setup(1000, 300, COMPOSITE, "application/json"))
    frame = await raw.next_frame(5)
    assert isinstance(frame, F.ErrorFrame) and frame.stream_id == 0
    assert frame.code == F.CONNECTION_ERROR and frame.text.startswith("timeout: ")
    assert await raw.at_eof()


class RawConnection:
    """Bytes on the wire over TCP, for frames a well-behaved client never sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, gateway: Any, first: F.Frame | None) -> RawConnection:
        host, port = gateway.listeners["rsocket"].address
        raw = cls(*await asyncio.open_connection(host, port))
        if first is not None:
            await raw.send(first)
        return raw

    async def send(self, frame: F.Frame) -> None:
        message = encode_frame(frame)
        self.writer.write(len(message).to_bytes(3, "big") + message)
        await self.writer.drain()

    async def next_frame(self, timeout: float) -> F.Frame:
        length = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(3), timeout), "big")
        return decode_frame(await asyncio.wait_for(self.reader.readexactly(length), timeout))

    async def at_eof(self) -> bool:
        data = await asyncio.wait_for(self.reader.read(), 5)
        self.writer.close()
        return data == b""


SETUP = F.Setup(30_000, 90_000, COMPOSITE, "application/json")


@pytest.mark.parametrize(
    ("first", "code", "text"),
    [
        (F.Setup(30_000, 90_000, COMPOSITE, "application/json", resume_token=b"tok"),
         F.REJECTED_SETUP, "unsupported: resumption"),
        (F.Resume(b"tok", 0, 0), F.REJECTED_RESUME, "unsupported: resumption"),
        (F.RequestResponse(1, None, b"{}"), F.INVALID_SETUP, "malformed: the first frame"),
        (F.Setup(30_000, 90_000, COMPOSITE, "application/json", major=2),
         F.UNSUPPORTED_SETUP, "unsupported: protocol version 2.0"),
        (F.Setup(30_000, 90_000, COMPOSITE, "text/csv"),
         F.UNSUPPORTED_SETUP, "unsupported: data MIME type 'text/csv'"),
        (F.Setup(30_000, 90_000, "application/json", "application/json"),
         F.UNSUPPORTED_SETUP, "unsupported: metadata MIME type"),
    ],
)
async def test_refused_setups(gw: Any, first: F.Frame, code: int, text: str) -> None:
    raw = await RawConnection.open(gw, first)
    frame = await raw.next_frame(5)
    assert isinstance(frame, F.ErrorFrame) and frame.stream_id == 0
    assert frame.code == code, frame
    assert frame.text.startswith(text), frame.text
    assert await raw.at_eof()


async def test_connection_level_faults(gw: Any) -> None:
    # An unknown frame type without I: ERROR[CONNECTION_ERROR] and close; with
    # I it is ignored and the connection serves on.
    raw = await RawConnection.open(gw, SETUP)
    await raw.send(F.UnknownFrame(0x20, F.FLAG_IGNORE, 0, b"x"))
    await raw.send(F.RequestResponse(1, request_metadata("events.read"), b'{"stream": "q"}'))
    answer = await raw.next_frame(5)
    assert isinstance(answer, F.Payload) and answer.complete and answer.next
    await raw.send(F.UnknownFrame(0x20, 0, 0, b"x"))
    err = await raw.next_frame(5)
    assert isinstance(err, F.ErrorFrame) and err.code == F.CONNECTION_ERROR
    assert err.text.startswith("unsupported: ")
    assert await raw.at_eof()
    # Request-channel is not served: ERROR on the stream, never silence.
    raw = await RawConnection.open(gw, SETUP)
    await raw.send(F.RequestChannel(1, 1, request_metadata("events.read"), b"{}"))
    err = await raw.next_frame(5)
    assert isinstance(err, F.ErrorFrame) and (err.stream_id, err.code) == (1, F.INVALID)
    raw.writer.close()


async def test_our_client_over_websocket_and_msgpack(gw: Any) -> None:
    host, port = gw.http_address
    client = await RSocketClient.connect_websocket(
        f"ws://{host}:{port}/rsocket", user=USER, password=PASSWORD)
    stream = unique()
    try:
        result = await client.append(stream, [NewEvent("T", b"\x00", {"a": "b"})])
        assert (result.first_version, result.last_version) == (1, 1)
        [got] = await client.read(stream)
        [ev] = await stored(gw, stream)
        assert (got.id, got.body, got.headers) == (ev.event_id, b"\x00", {"a": "b"})
        sub = await client.subscribe(stream=stream, start="beginning", initial_n=1)
        first = await sub.next(5)
        assert first is not None and first.version == 1
        await sub.cancel()
    finally:
        await client.close()
