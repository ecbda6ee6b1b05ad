"""TLS listeners count connections when they accept them (issue 27, item
5).  They used to count only after the TLS handshake, so connections that
never sent a ClientHello were held past ``max_connections`` (each waiting up
to 10 s, its peek polled every 5 ms).  Now the excess of a flood of silent
TCP connections is closed at once, a TLS client under the limit still gets
through, and a ClientHello that arrives in pieces is waited for without
polling."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polyport.gateway.config import TlsOptions
from polyport.protocols.bson.client import BsonClient
from tests.gateway.test_tcp_limits import _until
from tests.tlspki import Pki

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]
LIMIT = 4


async def _ping(host: str, port: int, client_ssl: ssl.SSLContext) -> None:
    client = await BsonClient.connect(host, port, ssl=client_ssl, timeout=10)
    try:
        await client.ping()
    finally:
        await client.close()


async def test_silent_connections_count_at_accept_and_the_excess_is_refused(
    gateway_factory: GatewayFactory, pki: Pki
) -> None:
    # A long handshake deadline: only admission can close the excess soon.
    gw = await gateway_factory(tls=TlsOptions(str(pki.cert), str(pki.key)),
                               max_connections=LIMIT, handshake_timeout=30)
    listener = gw.listeners["bson"]
    stats = listener.stats
    host, port = listener.address
    silent = [await asyncio.open_connection(host, port) for _ in range(LIMIT - 1)]
    try:
        # Counted before a byte of TLS: LIMIT - 1 open, none handshaken.
        await _until(lambda: stats.connections_open == LIMIT - 1)
        # One slot left: a real TLS client gets through.
        await _ping(host, port, pki.client())
        await _until(lambda: stats.connections_open == LIMIT - 1)

        silent.append(await asyncio.open_connection(host, port))
        await _until(lambda: stats.connections_open == LIMIT)
        refused_before = stats.connections_refused
        # The flood goes on: every further connection is closed at once,
        # without waiting for a ClientHello.
        for _ in range(3):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                assert await asyncio.wait_for(reader.read(), 5) == b""
            finally:
                writer.close()
        assert stats.connections_refused >= refused_before + 3
        assert stats.connections_open == LIMIT
    finally:
        for _, writer in silent:
            writer.close()
    # Their slots come back once they are gone.
    await _until(lambda: stats.connections_open == 0)
    await _ping(host, port, pki.client())


async def test_a_client_hello_in_pieces_is_waited_for(
    gateway_factory: GatewayFactory, pki: Pki
) -> None:
    """The first three bytes alone, then the rest: the accept side waits for
    the whole record header (readiness, not a poll) and the handshake and
    the protocol then work as usual."""
    gw = await gateway_factory(tls=TlsOptions(str(pki.cert), str(pki.key)))
    host, port = gw.listeners["bson"].address
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = pki.client().wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    loop = asyncio.get_running_loop()
    sock = socket.create_connection((host, port))
    sock.setblocking(False)
    try:
        await loop.sock_sendall(sock, hello[:3])
        await asyncio.sleep(0.5)
        await loop.sock_sendall(sock, hello[3:])
        async with asyncio.timeout(10):
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    pass
                if outgoing.pending:
                    await loop.sock_sendall(sock, outgoing.read())
                data = await loop.sock_recv(sock, 65536)
                assert data, "the gateway closed the connection during the handshake"
                incoming.write(data)
            if outgoing.pending:
                await loop.sock_sendall(sock, outgoing.read())
        assert tls.version() is not None
    finally:
        sock.close()
