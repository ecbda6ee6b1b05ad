"""Hostile clients against every listener at once: fuzzed input on many
connections, slowloris, half-open connections, a huge declared length that
then trickles, garbage WebSocket messages and Res01 multipart garbage.
Afterwards the gateway is alive, /healthz answers, a valid client of every
protocol still appends and reads, no connection is left open and memory
grew little."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio

from bench.fuzz import CODECS, generate
from polyport.core.commands import ReadStream
from polyport.gateway.app import Gateway
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactivesocket.client import NewEvent as RsEvent
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.res01.client import Res01Client
from polyport.protocols.res01.frames import NewEvent as Res01Event
from polyport.protocols.rsocket.client import NewEvent as RSocketEvent
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import SegmentWriter

pytestmark = pytest.mark.timeout(120)

TCP = {c.name: c for c in CODECS if c.stream}  # bson micromsg2 reactivesocket rsocket segment
HANDSHAKE_TIMEOUT = 1.0
# Every hostile connection must have been closed by the server within this.
CLOSED_WITHIN = 6.0
FUZZ_CONNECTIONS = 12


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Read (and drop) until the server closes, or give up."""
    try:
        async with asyncio.timeout(CLOSED_WITHIN):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def _fuzz(address: tuple[str, int], name: str, seed: int) -> None:
    codec = TCP[name]
    rng = random.Random(seed)
    reader, writer = await asyncio.open_connection(*address)
    try:
        for chunk in generate(codec, rng, codec.seeds()):
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0)
        # Whatever the server answers is read and dropped; valid input may
        # keep the connection open, so the client ends it (the check that
        # every connection is gone comes at the end).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.3):
                while await reader.read(65536):
                    pass
    except ConnectionError:
        pass  # reset by the server: also an end
    finally:
        writer.close()


async def _trickle(address: tuple[str, int], head: bytes, interval: float) -> bool:
    """Send ``head`` one byte at a time (slowloris); whether the server
    closes the connection."""
    reader, writer = await asyncio.open_connection(*address)
    closed = asyncio.create_task(_closed_by_server(reader))
    try:
        for byte in head:
            if closed.done():
                break
            writer.write(bytes([byte]))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await asyncio.sleep(interval)
        return await closed
    finally:
        writer.close()


async def _half_open(address: tuple[str, int]) -> bool:
    """Connect and never send nor close."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        return await _closed_by_server(reader)
    finally:
        writer.close()


async def _websocket_garbage(url: str, seed: int) -> None:
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        with contextlib.suppress(ConnectionError, RuntimeError):
            for _ in range(rng.randint(0, 5)):
                await ws.send_bytes(rng.randbytes(rng.randint(0, 300)))
        async with asyncio.timeout(CLOSED_WITHIN):
            async for _ in ws:
                pass


async def _res01_garbage(address: tuple[str, int], seed: int) -> None:
    codec = next(c for c in CODECS if c.name == "res01")
    rng = random.Random(seed)
    seeds = codec.seeds()
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{address[0]}:{address[1]}")
    try:
        for _ in range(100):
            # The ROUTER adds the routing part itself.
            parts = generate(codec, rng, seeds)[1:] or [b""]
            await sock.send_multipart(parts)
        await asyncio.sleep(0.5)
    finally:
        sock.close(linger=0)


async def _attack(gw: Gateway, base: int) -> None:
    """One round of every attack on every listener at once; seeds from ``base``."""
    host, http_port = gw.http_address  # type: ignore[misc]
    attacks: list[Any] = []
    for name in TCP:
        address = gw.listeners[name].address
        attacks += [_fuzz(address, name, base + seed) for seed in range(FUZZ_CONNECTIONS)]
    slow = {name: _trickle(gw.listeners[name].address, TCP[name].seeds()[-1][0], 0.5)
            for name in TCP}
    half_open = {name: _half_open(gw.listeners[name].address) for name in TCP}
    # A length prefix near every codec's limit, then the body one byte at a time.
    huge = {name: _trickle(gw.listeners[name].address, b"\x00\xff\xff\xf0" + b"x" * 20, 0.2)
            for name in TCP}
    for path in ("reactivesocket", "rsocket"):
        url = f"ws://{host}:{http_port}/{path}"
        attacks += [_websocket_garbage(url, base + seed) for seed in range(5)]
    attacks += [_res01_garbage(gw.listeners["res01"].address, base + seed) for seed in range(3)]

    async with asyncio.timeout(60):
        results = await asyncio.gather(
            *attacks, *slow.values(), *half_open.values(), *huge.values(),
            return_exceptions=True,
        )
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures
    # Slowloris, half-open and trickling connections were all closed by the
    # server (the handshake deadline, or a refused length).
    ends = results[len(attacks):]
    assert all(ends), dict(zip([*slow, *half_open, *huge], ends, strict=True))


async def test_the_gateway_survives_hostile_clients(gateway_factory: Any) -> None:
    gw: Gateway = await gateway_factory(handshake_timeout=HANDSHAKE_TIMEOUT, idle_timeout=60)
    host, http_port = gw.http_address  # type: ignore[misc]
    # A first round warms up what is allocated once: failed logins hash with
    # scrypt (16 MiB each) in executor threads, whose malloc arenas keep
    # that memory.  The second round must not add to it.
    await _attack(gw, 0)
    rss_before = _rss_mb()
    await _attack(gw, 1000)

    # Alive, and every protocol still appends and reads.
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{host}:{http_port}/healthz") as resp,
    ):
        assert resp.status == 200
    await _valid_clients(gw)

    # No connection is left behind (ZeroMQ's are counted from its monitor).
    stats = [listener.stats for name, listener in gw.listeners.items() if name != "res01"]
    async with asyncio.timeout(5):
        for _ in iter(lambda: all(s.connections_open == 0 for s in stats), True):
            await asyncio.sleep(0.05)
    assert _rss_mb() - rss_before < 50


async def _valid_clients(gw: Gateway) -> None:
    def address(name: str) -> tuple[str, int]:
        host, port = gw.listeners[name].address
        return host, port

    tag = uuid.uuid4().hex[:8]

    async def stored(stream: str) -> int:
        return len(await gw.store.read_stream(ReadStream("default", stream)))

    bson = await BsonClient.connect(*address("bson"))
    try:
        await bson.emit(f"bson-{tag}", "T", {"n": 1})
    finally:
        await bson.close()
    assert await stored(f"bson-{tag}") == 1

    rs = await ReactiveSocketClient.connect(*address("reactivesocket"))
    try:
        await rs.append(f"rs-{tag}", [RsEvent("T", b"{}")])
        assert len(await rs.read(f"rs-{tag}")) == 1
    finally:
        await rs.close()

    rsocket = await RSocketClient.connect(*address("rsocket"))
    try:
        await rsocket.append(f"rsocket-{tag}", [RSocketEvent("T", b"{}")])
        assert len(await rsocket.read(f"rsocket-{tag}")) == 1
    finally:
        await rsocket.close()

    mm2 = await MicroMsg2Client.connect(*address("micromsg2"))
    try:
        await mm2.publish(f"queue/mm2-{tag}", b"{}")
        await mm2.flush(timeout=5)
    finally:
        await mm2.close()
    # The ack window may be off: the append follows the flush shortly.
    async with asyncio.timeout(5):
        for _ in range(100):
            if await stored(f"mm2-{tag}") == 1:
                break
            await asyncio.sleep(0.05)
    assert await stored(f"mm2-{tag}") == 1

    writer = await SegmentWriter.connect(*address("segment"))
    try:
        segment = await writer.open_segment(f"seg-{tag}")
        await segment.append([b"e1"])
        await segment.flush(5)
    finally:
        await writer.close()
    assert await stored(f"seg-{tag}") == 1

    res01 = await Res01Client.connect(gw.listeners["res01"].address, timeout=10)
    try:
        event = Res01Event(uuid.uuid4(), datetime.now(UTC), "T", "{}", "{}")
        await res01.commit("default", f"res01-{tag}", -1, [event])
    finally:
        await res01.close()
    assert await stored(f"res01-{tag}") == 1
