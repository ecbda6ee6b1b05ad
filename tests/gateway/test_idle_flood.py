"""2,000 idle connections per byte-stream protocol and 2,000 Res01 peers:
each is refused (past ``max_connections_per_address``) or closed (it never
finishes its handshake within ``handshake_timeout``), never more than the
limit open at once; a normal client is served throughout.  What an open idle
connection costs in memory is measured with the connections open, in a
gateway process of its own: tests/gateway/test_idle_memory.py.

The flood comes from 127.0.0.1; the normal client connects from 127.0.0.2
(another loopback source address), so the per-address limit that stops the
flood does not stop it — as on a real network, where a flood from one
address leaves other clients alone."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from typing import Any

import pytest
import zmq
import zmq.asyncio

from polyport.gateway.app import Gateway
from polyport.protocols.bson.client import BsonClient

FLOOD = 2000
PER_ADDRESS = 256
HANDSHAKE = 1.5
BYTE_STREAMS = ("bson", "reactivesocket", "rsocket", "micromsg2", "segment")


async def _flood(address: tuple[str, int]) -> tuple[int, int]:
    """Open FLOOD idle connections; (refused at once, closed later by the
    server).  A connection counts as refused when the server closes it
    within 0.5 s, closed when it does so by the handshake deadline."""
    sem = asyncio.Semaphore(200)

    async def one() -> str:
        async with sem:
            try:
                reader, writer = await asyncio.open_connection(*address)
            except OSError:
                return "refused"
        started = time.monotonic()
        try:
            data = await asyncio.wait_for(reader.read(1 << 16), HANDSHAKE * 4 + 5)
            while data:  # some protocols say why before closing
                data = await asyncio.wait_for(reader.read(1 << 16), HANDSHAKE * 4 + 5)
        except ConnectionResetError:
            pass  # closed by the server too (uvloop reports an abort so)
        except (TimeoutError, OSError):
            return "open"
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        return "refused" if time.monotonic() - started < 0.5 else "closed"

    results = await asyncio.gather(*(one() for _ in range(FLOOD)))
    assert "open" not in results, results.count("open")
    return results.count("refused"), results.count("closed")


@pytest.mark.exclusive  # 12,000 sockets against a handshake deadline, both ends here
async def test_idle_floods_are_refused_or_closed_and_a_client_is_served(
    gateway_factory: Any,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 3 * FLOOD + 1000:
        pytest.skip(f"needs {3 * FLOOD + 1000} file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 6 * FLOOD)), hard))
    gw: Gateway = await gateway_factory(handshake_timeout=HANDSHAKE,
                                        max_connections_per_address=PER_ADDRESS)
    stop = asyncio.Event()
    served = 0

    async def normal_client() -> None:
        nonlocal served
        host, port = gw.listeners["bson"].address
        while not stop.is_set():
            _reader, writer = await asyncio.open_connection(
                host, port, local_addr=("127.0.0.2", 0))
            writer.close()
            served += 1
            await asyncio.sleep(0.2)

    background = asyncio.create_task(normal_client())
    try:
        for name in BYTE_STREAMS:
            stats = gw.listeners[name].stats
            refused_before, most_open = stats.connections_refused, 0

            async def watch(stats: Any = stats) -> None:
                nonlocal most_open
                while True:
                    most_open = max(most_open, stats.connections_open)
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch())
            try:
                refused, closed = await _flood(gw.listeners[name].address)
            finally:
                watcher.cancel()
            # Every connection ended: refused past the per-address limit, or
            # closed at its handshake deadline; never more than the limit
            # open at once from one address (plus the normal client's).
            assert refused + closed == FLOOD, (name, refused, closed)
            assert stats.connections_refused - refused_before > 0, name
            assert most_open <= PER_ADDRESS + 2, (name, most_open)
            assert stats.connections_open <= 1, name
        # Res01: 2,000 peers (DEALER sockets) that connect and send nothing.
        zctx = zmq.asyncio.Context()
        zctx.setsockopt(zmq.LINGER, 0)
        zctx.set(zmq.MAX_SOCKETS, FLOOD + 100)
        host, port = gw.listeners["res01"].address
        socks = []
        for i in range(FLOOD):
            sock = zctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.ROUTING_ID, b"flood-%d" % i)
            sock.connect(f"tcp://{host}:{port}")
            socks.append(sock)
        await asyncio.sleep(1.0)
        for sock in socks:
            sock.close(linger=0)
        zctx.term()
        # The normal client was served throughout, and a real one still is.
        assert served >= 3
        host, port = gw.listeners["bson"].address
        client = await BsonClient.connect(host, port)
        await client.ping()
        await client.close()
    finally:
        stop.set()
        await background
