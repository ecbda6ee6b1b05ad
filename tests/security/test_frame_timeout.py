"""A frame that has started must complete within ``frame_timeout`` (issue 27,
item 7).  Every byte used to restart the idle timer, so a client trickling
one byte of a frame at a time (slowloris) held its connection for as long as
it liked.  Here the gateway's idle and handshake timeouts are a minute and
``frame_timeout`` is one second: every TCP listener (plain and TLS) and the
WebSocket endpoint cut the trickle, with the protocol's error form, while
whole frames with long gaps between them are served as before."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bench.fuzz import CODECS
from polyport.gateway.config import TlsOptions
from polyport.protocols.bson import connection as bson_conn
from polyport.protocols.bson.frames import Connect, Ping
from polyport.protocols.rsocket import connection as rsocket_conn
from polyport.protocols.rsocket import metadata as rsocket_metadata
from polyport.protocols.rsocket.frames import Setup
from polyport.protocols.segment import connection as segment_conn
from polyport.protocols.segment.frames import KeepAlive
from tests.tlspki import Pki

pytestmark = pytest.mark.timeout(90)

GatewayFactory = Callable[..., Awaitable[Any]]
TCP = {c.name: c for c in CODECS if c.stream}  # bson micromsg2 reactivesocket rsocket segment
FRAME_TIMEOUT = 1.0
# Far above FRAME_TIMEOUT: only the frame deadline can end a trickle this soon.
SLOW_LIMITS = {"idle_timeout": 60, "handshake_timeout": 60, "frame_timeout": FRAME_TIMEOUT}
CUT_WITHIN = 15.0
# One byte this often: each restarted the idle timer.
TRICKLE_INTERVAL = 0.2
# What every protocol's error carries (the session's message).
ERROR_TEXT = b"frame not completed within 1 seconds"

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter


async def _trickle(reader: Reader, writer: Writer, frame: bytes) -> bytes | None:
    """Send all but the last byte of ``frame``, one byte at a time, until the
    server closes the connection; what it sent meanwhile, or None when it
    did not close within CUT_WITHIN."""

    async def drain_to_end() -> bytes:
        got = bytearray()
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                got += chunk
        return bytes(got)

    received = asyncio.create_task(drain_to_end())
    try:
        async with asyncio.timeout(CUT_WITHIN):
            for byte in frame[:-1]:
                if received.done():
                    break
                writer.write(bytes([byte]))
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                await asyncio.sleep(TRICKLE_INTERVAL)
            return await received
    except TimeoutError:
        return None
    finally:
        received.cancel()
        writer.close()


@pytest.mark.parametrize("name", sorted(TCP))
async def test_a_trickled_first_frame_is_cut_on_every_tcp_listener(
    gateway_factory: GatewayFactory, name: str
) -> None:
    gw = await gateway_factory(**SLOW_LIMITS)
    stats = gw.listeners[name].stats
    first_frame = TCP[name].seeds()[0][0]  # the protocol's handshake frame
    # Long enough to outlast FRAME_TIMEOUT at TRICKLE_INTERVAL a byte.
    assert len(first_frame) * TRICKLE_INTERVAL > 2 * FRAME_TIMEOUT
    reader, writer = await asyncio.open_connection(*gw.listeners[name].address)
    sent_back = await _trickle(reader, writer, first_frame)
    assert sent_back is not None, f"{name}: a trickled frame held its connection"
    assert ERROR_TEXT in sent_back, sent_back
    assert stats.errors["timeout"] >= 1


async def _bson_connected(reader: Reader, writer: Writer) -> bson_conn.ClientConnection:
    """An anonymous CONNECT, accepted: the protocol's handshake is done."""
    client = bson_conn.ClientConnection()
    writer.write(client.send(Connect(version="1.0")))
    async with asyncio.timeout(10):
        while not (frames := client.receive_data(await reader.read(65536))):
            pass
    assert getattr(frames[0], "ok", False), frames
    return client


async def test_after_the_handshake_a_trickled_frame_is_cut_over_tls(
    gateway_factory: GatewayFactory, pki: Pki
) -> None:
    gw = await gateway_factory(tls=TlsOptions(str(pki.cert), str(pki.key)), **SLOW_LIMITS)
    host, port = gw.listeners["bson"].address
    reader, writer = await asyncio.open_connection(host, port, ssl=pki.client(),
                                                   server_hostname="127.0.0.1")
    client = await _bson_connected(reader, writer)
    # A PING (a frame of a few dozen bytes), all but its last byte.
    sent_back = await _trickle(reader, writer, client.send(Ping()))
    assert sent_back is not None, "a trickled frame held a TLS connection"
    assert ERROR_TEXT in sent_back, sent_back


async def test_whole_frames_with_long_gaps_are_served(gateway_factory: GatewayFactory) -> None:
    """The idle timeout, not frame_timeout, governs the time between frames."""
    gw = await gateway_factory(**SLOW_LIMITS)
    reader, writer = await asyncio.open_connection(*gw.listeners["segment"].address)
    client = segment_conn.ClientConnection()
    try:
        for n in range(3):
            writer.write(client.send(KeepAlive(f"ka-{n}".encode())))
            async with asyncio.timeout(10):
                while not client.receive_data(await reader.read(65536)):
                    pass
            await asyncio.sleep(FRAME_TIMEOUT * 1.5)
        assert not reader.at_eof()
    finally:
        writer.close()


def _ws_frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """A masked (client) WebSocket frame."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = bytes([0x80 | opcode, 0x80 | size])
    else:
        head = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_a_trickled_websocket_message_is_cut(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(**SLOW_LIMITS)
    host, port = gw.http_address
    reader, writer = await asyncio.open_connection(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /rsocket HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    client = rsocket_conn.ClientConnection("websocket")
    writer.write(_ws_frame(client.setup(
        Setup(30_000, 90_000, rsocket_metadata.COMPOSITE, "application/json"))))
    _, request = client.request_response(None, b'{"stream": "s", "events": []}')
    for message in request:
        writer.write(_ws_frame(message))
    async with asyncio.timeout(10):  # any answer: the SETUP was taken
        assert await reader.read(65536)
    sent_back = await _trickle(reader, writer, _ws_frame(b"x" * 100))
    assert sent_back is not None, "a trickled WebSocket message held its connection"
    assert ERROR_TEXT in sent_back, sent_back
