"""The TCP transport's own limits, with a stand-in session (no database):
connections per source address, the write deadline, TCP keepalive."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from polyport.gateway.transports.tcp import KEEPALIVE_IDLE, TcpListener, set_keepalive
from polyport.protocols.session import ListenerStats, Outbound

pytestmark = pytest.mark.timeout(30)


class _Flood:
    """Answers any input with ``size`` bytes (a peer asking for a lot)."""

    size = 32 << 20

    def __init__(self, out: Outbound) -> None:
        self.out = out

    async def data_received(self, data: bytes) -> None:
        chunk = b"x" * (1 << 20)
        for _ in range(self.size // len(chunk)):
            await self.out.send(chunk)
            if self.out.closed:
                return

    async def connection_lost(self) -> None:
        pass

    # No codec: nothing of a frame is ever buffered.
    input_buffer = None

    async def frame_timed_out(self, message: str) -> None:
        self.out.close()


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        for _ in iter(condition, True):
            await asyncio.sleep(0.05)


@pytest.fixture
async def listener() -> AsyncIterator[TcpListener]:
    stats = ListenerStats("test")
    tcp = TcpListener("test", _Flood, "127.0.0.1", 0, stats)
    await tcp.start()
    yield tcp
    await tcp.close()


async def test_connections_per_address_are_limited(listener: TcpListener) -> None:
    listener.stats.max_connections_per_address = 2
    host, port = listener.address
    kept = [await asyncio.open_connection(host, port) for _ in range(2)]
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection(host, port)
    # Refused: closed at once without a byte.
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert listener.stats.connections_refused == 1
    assert listener.stats.connections_open == 2
    # A closed one makes room again.
    kept[0][1].close()
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection(host, port)
    await asyncio.sleep(0.1)
    assert listener.stats.connections_open == 2 and listener.stats.connections_refused == 1
    writer.close()
    for _, w in kept[1:]:
        w.close()


async def test_a_peer_that_stops_reading_is_closed_after_write_timeout(
    listener: TcpListener,
) -> None:
    listener.stats.write_timeout = 0.5
    host, port = listener.address
    sock = socket.create_connection((host, port))
    sock.sendall(b"go")  # then never read
    await _until(lambda: listener.stats.connections_total == 1)
    await _until(lambda: listener.stats.connections_open == 0)
    assert listener.stats.errors["timeout"] == 1
    sock.close()


async def test_keepalive_is_set_on_accepted_sockets() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    _, writer = await asyncio.open_connection(host, port)
    set_keepalive(writer)
    sock = writer.get_extra_info("socket")
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if hasattr(socket, "TCP_KEEPIDLE"):
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE
    writer.close()
    server.close()
