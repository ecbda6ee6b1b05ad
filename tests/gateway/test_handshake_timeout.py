"""handshake_timeout: a connection that has not completed its protocol's
handshake (login, SETUP, the MicroMsg2 final handshake, segment's first
request) by the deadline is closed; one that has stays open."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

from polyport.gateway.app import Gateway
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import SegmentWriter

pytestmark = pytest.mark.timeout(60)

DEADLINE = 0.5
TCP_LISTENERS = ["bson", "reactivesocket", "rsocket", "micromsg2", "segment"]


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass  # an error reply before the close is fine
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def _closed(address: tuple[str, int], send: bytes, within: float) -> bool:
    sock = socket.create_connection(address)
    try:
        if send:
            sock.sendall(send)
        return await asyncio.to_thread(_closed_by_server, sock, within)
    finally:
        sock.close()


async def test_silent_and_half_handshakes_are_closed(gateway_factory: Any) -> None:
    gw: Gateway = await gateway_factory(handshake_timeout=DEADLINE, idle_timeout=60)
    for name in TCP_LISTENERS:
        address = gw.listeners[name].address
        # Nothing at all, then half a length prefix: both closed at the deadline,
        # long before the idle timeout.
        assert await _closed(address, b"", 5 * DEADLINE + 2), name
        assert await _closed(address, b"\x00\x00", 5 * DEADLINE + 2), name
        assert gw.listeners[name].stats.errors["timeout"] == 2, name


async def test_a_silent_websocket_is_closed(gateway_factory: Any) -> None:
    gw: Gateway = await gateway_factory(handshake_timeout=DEADLINE, idle_timeout=60)
    host, port = gw.http_address
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"ws://{host}:{port}/reactivesocket") as ws,
    ):
        msg = await ws.receive(timeout=5 * DEADLINE + 2)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert gw.listeners["reactivesocket"].stats.errors["timeout"] == 1


async def test_clients_that_completed_the_handshake_stay(gateway_factory: Any) -> None:
    gw: Gateway = await gateway_factory(handshake_timeout=DEADLINE, idle_timeout=60)

    def address(name: str) -> tuple[str, int]:
        host, port = gw.listeners[name].address
        return host, port

    bson = await BsonClient.connect(*address("bson"))
    rs = await ReactiveSocketClient.connect(*address("reactivesocket"))
    rsocket = await RSocketClient.connect(*address("rsocket"))
    mm2 = await MicroMsg2Client.connect(*address("micromsg2"))
    segment = await SegmentWriter.connect(*address("segment"))
    try:
        await segment.keep_alive(b"hello")
        await asyncio.sleep(3 * DEADLINE)
        # Every one still works past the deadline.
        await bson.ping()
        assert await rs.read("nothing-here") == []
        assert await rsocket.read("nothing-here") == []
        await mm2.publish("topic/alive", b"{}")
        await mm2.flush(timeout=5)
        assert await segment.keep_alive(b"again") == b"again"
    finally:
        for client in (bson, rs, rsocket, mm2, segment):
            await client.close()
    for name in TCP_LISTENERS:
        assert gw.listeners[name].stats.errors["timeout"] == 0, name
