"""WebSocket endpoints: heartbeat pings close a peer that does not answer,
and connections from one source address are limited together with the
listener's TCP connections."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

from polyport.gateway.app import Gateway

pytestmark = pytest.mark.timeout(60)


async def test_a_peer_that_does_not_answer_pings_is_closed(gateway_factory: Any) -> None:
    gw: Gateway = await gateway_factory(websocket_heartbeat=0.3, handshake_timeout=0)
    host, port = gw.http_address
    # autoping off: the client sees the server's pings and never pongs.
    async with aiohttp.ClientSession() as http, http.ws_connect(
        f"ws://{host}:{port}/reactivesocket", autoping=False
    ) as ws:
        first = await ws.receive(timeout=5)
        assert first.type is aiohttp.WSMsgType.PING
        while True:
            msg = await ws.receive(timeout=5)
            if msg.type is not aiohttp.WSMsgType.PING:
                break
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    stats = gw.listeners["reactivesocket"].stats
    assert stats.connections_open == 0


async def test_connections_per_address_count_tcp_and_websocket(gateway_factory: Any) -> None:
    gw: Gateway = await gateway_factory(max_connections_per_address=2)
    stats = gw.listeners["reactivesocket"].stats
    host, port = gw.http_address
    url = f"ws://{host}:{port}/reactivesocket"
    tcp = socket.create_connection(gw.listeners["reactivesocket"].address)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url):
                # One TCP and one WebSocket from 127.0.0.1: the third is refused.
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await http.ws_connect(url)
                assert refused.value.status == 503
                assert stats.connections_refused == 1
            # A closed one makes room again.
            async with asyncio.timeout(5):
                for _ in iter(lambda: stats.connections_open <= 1, True):
                    await asyncio.sleep(0.02)
            async with http.ws_connect(url):
                assert stats.connections_open == 2
    finally:
        tcp.close()
