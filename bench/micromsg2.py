"""MicroMsg2 against raw PostgreSQL, from one run (fsync on, same cluster).

- Publish throughput: N MicroMsg2 publishers with ``batch-ack`` (a MESSAGE
  counts once the server acked it, i.e. after its commit), driven from a child
  process as real clients would be, vs N asyncpg clients inserting one row per
  transaction.
- Delivery latency: one publisher, one ``topic/`` subscriber, one message at
  a time, publish call to receipt; vs raw PostgreSQL delivery: INSERT + NOTIFY
  in one transaction on one connection, LISTEN on another, until the
  notification arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from dataclasses import replace
from typing import Any

import asyncpg

from bench.common import (
    _INSERT_ONE,
    Progress,
    _prepare_raw,
    bench_cluster,
    fresh_database,
    percentile,
    raw_single_row_rate,
    report,
)
from polyport.core import migrate
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.micromsg2.frames import PropertyValue

BODY = b'{"amount": 42, "currency": "EUR", "note": "benchmark event"}'
PROPS: dict[str, PropertyValue] = {"type": "BenchEvent", "amount": 42}


async def raw_notify_latencies(url: str, seconds: float) -> list[float]:
    """Seconds from starting an INSERT + NOTIFY transaction to the LISTENing
    connection receiving the notification, one at a time."""
    await _prepare_raw(url)
    dsn = migrate.asyncpg_dsn(url)
    writer = await asyncpg.connect(dsn)
    listener = await asyncpg.connect(dsn)
    arrived: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("bench_raw", lambda *args: arrived.put_nowait(args[3]))
    stream = f"lat-{uuid.uuid4().hex[:6]}"
    out: list[float] = []
    prog = Progress("raw INSERT+NOTIFY -> LISTEN, one at a time")
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            async with writer.transaction():
                await writer.execute(_INSERT_ONE, uuid.uuid4(), stream, len(out) + 1, BODY)
                await writer.execute("SELECT pg_notify('bench_raw', $1)", str(len(out)))
            await asyncio.wait_for(arrived.get(), 10)
            out.append(time.perf_counter() - started)
            prog.update(len(out))
    finally:
        await writer.close()
        await listener.close()
    prog.done(len(out))
    return out


async def publish_worker(
    host: str, port: int, publishers: int, window: int, seconds: float
) -> tuple[int, float]:
    """Runs in a child process, so the gateway's event loop serves and does not
    also drive the clients: (messages acked, seconds)."""
    clients = [
        await MicroMsg2Client.connect(host, port, required=[f"batch-ack:max-count={window}"])
        for _ in range(publishers)
    ]
    counts = [0] * publishers
    prog = Progress(f"micromsg2, {publishers} publishers, batch-ack window {window}")
    deadline = time.monotonic() + seconds

    async def publisher(i: int) -> None:
        client = clients[i]
        destination = f"topic/pub-{i}"
        while time.monotonic() < deadline:
            await client.publish(destination, BODY, PROPS)
            counts[i] += 1
            prog.update(sum(counts))
        await client.flush(timeout=60)  # counted only once acked (= committed)

    started = time.monotonic()
    try:
        await asyncio.gather(*(publisher(i) for i in range(publishers)))
        elapsed = time.monotonic() - started
    finally:
        for c in clients:
            await c.close()
    prog.done(sum(counts))
    return sum(counts), elapsed


async def publish_rate(gw: Gateway, publishers: int, window: int, seconds: float) -> float:
    host, port = gw.listeners["micromsg2"].address
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench",
        "micromsg2",
        "--publish-worker",
        f"{host}:{port}",
        "--publishers",
        str(publishers),
        "--window",
        str(window),
        "--seconds",
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"publish worker failed with exit code {proc.returncode}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    stored = await gw.store.read_all(0, 1)
    if not stored:
        raise RuntimeError("the publish worker's messages are not in the store")
    return float(result["acked"]) / float(result["seconds"])


async def delivery_latencies(gw: Gateway, seconds: float) -> list[float]:
    host, port = gw.listeners["micromsg2"].address
    sub = await MicroMsg2Client.connect(host, port, required=["pubsub"])
    pub = await MicroMsg2Client.connect(host, port)
    out: list[float] = []
    prog = Progress("micromsg2 publish -> topic subscriber, one at a time")
    try:
        await sub.subscribe("topic/latency")
        # subscribe has no reply: wait until a probe arrives.
        while True:
            await pub.publish("topic/latency", b"probe")
            try:
                await sub.receive(timeout=0.2)
                break
            except TimeoutError:
                continue
        while True:  # drain probes still in flight
            try:
                await sub.receive(timeout=0.3)
            except TimeoutError:
                break
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await pub.publish("topic/latency", BODY, PROPS)
            await sub.receive(timeout=10)
            out.append(time.perf_counter() - started)
            prog.update(len(out))
    finally:
        await sub.close()
        await pub.close()
    prog.done(len(out))
    return out


async def run(seconds: float, publishers: int, window: int) -> None:
    async with bench_cluster() as pg:
        raw_url = await fresh_database(pg)
        gw_url = await fresh_database(pg)
        raw_rate = await raw_single_row_rate(raw_url, publishers, seconds, BODY)
        raw_lat = await raw_notify_latencies(raw_url, seconds)
        ports: dict[str, Any] = {f"{n}_port": None for n in DEFAULT_PORTS}
        ports["micromsg2_port"] = 0
        gw = Gateway(replace(GatewayConfig(database_url=gw_url, http_port=None), **ports))
        await gw.start()
        try:
            mm_rate = await publish_rate(gw, publishers, window, seconds)
            mm_lat = await delivery_latencies(gw, seconds)
        finally:
            await gw.stop()
    raw_p50, mm_p50 = statistics.median(raw_lat), statistics.median(mm_lat)
    raw_p99, mm_p99 = percentile(raw_lat, 0.99), percentile(mm_lat, 0.99)
    report(
        "micromsg2 vs raw PostgreSQL (fsync on; same cluster, same run)",
        [
            (f"raw asyncpg, {publishers} clients x 1 row/tx", raw_rate, "rows/s"),
            (f"micromsg2 publish, {publishers} clients, acked", mm_rate, "msgs/s"),
            ("ratio publish / raw single-row", mm_rate / raw_rate, "x"),
            ("raw INSERT+NOTIFY -> LISTEN p50", raw_p50 * 1000, "ms"),
            ("micromsg2 publish -> receive p50", mm_p50 * 1000, "ms"),
            ("ratio latency p50 micromsg2 / raw", mm_p50 / raw_p50, "x"),
            ("raw INSERT+NOTIFY -> LISTEN p99", raw_p99 * 1000, "ms"),
            ("micromsg2 publish -> receive p99", mm_p99 * 1000, "ms"),
            ("ratio latency p99 micromsg2 / raw", mm_p99 / raw_p99, "x"),
        ],
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench micromsg2")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--publishers", type=int, default=8)
    p.add_argument("--window", type=int, default=100, help="batch-ack max-count per publisher")
    p.add_argument("--publish-worker", metavar="HOST:PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.publish_worker:
        host, _, port = args.publish_worker.rpartition(":")
        acked, elapsed = asyncio.run(
            publish_worker(host, int(port), args.publishers, args.window, args.seconds)
        )
        print(json.dumps({"acked": acked, "seconds": elapsed}))
        return 0
    asyncio.run(run(args.seconds, args.publishers, args.window))
    return 0
