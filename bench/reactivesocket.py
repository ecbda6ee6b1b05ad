"""ReactiveSocket front-end against raw PostgreSQL, from one run.

- Append throughput: ``--appenders`` concurrent REQUEST_RESPONSE appends of
  one event each, spread over ``--connections`` TCP connections (and the same
  over WebSocket), vs as many asyncpg clients inserting one row per
  transaction.  Batched: 100-event appends from 8 appenders vs binary COPY.
  The ReactiveSocket clients run in a separate process (as real clients do).
- Subscription delivery latency: one event appended at a time over
  ReactiveSocket and received by a REQUEST_SUB on another connection (append
  sent -> RESPONSE received), vs raw PostgreSQL's equivalent: INSERT
  (committed), NOTIFY after commit, the LISTENing connection fetches the row.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import statistics
import time
import uuid
from dataclasses import replace
from typing import Any

import asyncpg

from bench.common import (
    Progress,
    bench_cluster,
    fresh_database,
    percentile,
    raw_copy_rate,
    raw_single_row_rate,
    report,
    timed_rate,
)
from polyport.core import migrate
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient

BODY = b'{"amount": 42, "currency": "EUR", "note": "benchmark event"}'

_RAW_INSERT = """
INSERT INTO events (position, event_id, context, stream, version, type, headers, body,
                    content_type, client_time, recorded_at, origin, segment_offset)
VALUES (nextval('bench_latency_position'), $1, 'bench', $2, $3, 'bench', '{}'::jsonb, $4,
        'application/octet-stream', NULL, now(), 'raw', 0)
RETURNING position
"""
_RAW_FETCH = "SELECT body FROM events WHERE position = $1"


async def raw_delivery_latency(url: str, seconds: float) -> list[float]:
    """Seconds from INSERT sent to the row fetched by a LISTENing connection."""
    dsn = migrate.asyncpg_dsn(url)
    writer = await asyncpg.connect(dsn)
    listener = await asyncpg.connect(dsn)
    await writer.execute("CREATE SEQUENCE IF NOT EXISTS bench_latency_position START 100000000")
    arrived: asyncio.Queue[int] = asyncio.Queue()

    def on_notify(_c: object, _pid: int, _ch: str, payload: str) -> None:
        arrived.put_nowait(int(payload))

    await listener.add_listener("bench_latency", on_notify)
    samples: list[float] = []
    prog = Progress("raw INSERT + NOTIFY -> LISTEN + fetch")
    stream = f"lat-{uuid.uuid4().hex[:6]}"
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            pos = await writer.fetchval(_RAW_INSERT, uuid.uuid4(), stream, len(samples) + 1, BODY)
            # NOTIFY after the commit, as the store does.
            await writer.execute(f"NOTIFY bench_latency, '{pos}'")
            got = await asyncio.wait_for(arrived.get(), 5)
            await listener.fetchval(_RAW_FETCH, got)
            samples.append(time.perf_counter() - started)
            prog.update(len(samples))
    finally:
        prog.done(len(samples))
        await listener.close()
        await writer.close()
    return samples


async def rs_delivery_latency(gw: Gateway, seconds: float) -> list[float]:
    host, port = gw.listeners["reactivesocket"].address
    producer = await ReactiveSocketClient.connect(host, port)
    consumer = await ReactiveSocketClient.connect(host, port)
    stream = f"lat-{uuid.uuid4().hex[:6]}"
    samples: list[float] = []
    prog = Progress("reactivesocket append -> REQUEST_SUB RESPONSE")
    try:
        sub = await consumer.subscribe(stream=stream, start="beginning")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await producer.append(stream, [NewEvent("bench", BODY)])
            ev = await sub.next(5)
            if ev is None:
                raise RuntimeError("subscription delivered nothing within 5 s")
            samples.append(time.perf_counter() - started)
            prog.update(len(samples))
        await sub.cancel()
    finally:
        prog.done(len(samples))
        await producer.close()
        await consumer.close()
    return samples


async def _append_load(
    target: str, label: str, connections: int, appenders: int, seconds: float, batch: int
) -> float:
    """``target``: ``tcp://host:port`` or a ``ws://`` URL."""

    async def connect() -> ReactiveSocketClient:
        if target.startswith("tcp://"):
            host, port = target[6:].rsplit(":", 1)
            return await ReactiveSocketClient.connect(host, int(port))
        return await ReactiveSocketClient.connect_websocket(target)

    clients = [await connect() for _ in range(connections)]
    try:

        async def one(i: int) -> int:
            client = clients[i % connections]
            events = [NewEvent("bench", BODY) for _ in range(batch)]
            await client.append(f"rs-{batch}-{i}", events)
            return batch

        return await timed_rate(label, appenders, seconds, one)
    finally:
        for c in clients:
            await c.close()


def _append_load_process(args: tuple[str, str, int, int, float, int]) -> float:
    return asyncio.run(_append_load(*args))


async def rs_append_rate(
    target: str, label: str, connections: int, appenders: int, seconds: float, batch: int
) -> float:
    """The clients run in a process of their own, as they would in real use:
    in the gateway's process they would take its CPU (one Python thread)."""
    loop = asyncio.get_running_loop()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        args = (target, label, connections, appenders, seconds, batch)
        return await loop.run_in_executor(pool, _append_load_process, args)


async def run(seconds: float, connections: int, appenders: int) -> None:
    async with bench_cluster() as pg:
        raw_url = await fresh_database(pg)
        rs_url = await fresh_database(pg)
        raw_rate = await raw_single_row_rate(raw_url, appenders, seconds, BODY)
        raw_latency = await raw_delivery_latency(raw_url, seconds)
        # Only this protocol's listeners (TCP and the WebSocket on HTTP).
        ports: dict[str, Any] = {f"{name}_port": None for name in DEFAULT_PORTS}
        ports["reactivesocket_port"] = 0
        gw = Gateway(replace(GatewayConfig(database_url=rs_url, http_port=0), **ports))
        await gw.start()
        try:
            host, port = gw.listeners["reactivesocket"].address
            hhost, hport = gw.http_address or ("", 0)
            tcp = f"tcp://{host}:{port}"
            ws = f"ws://{hhost}:{hport}/reactivesocket"

            tcp_rate = await rs_append_rate(
                tcp,
                f"reactivesocket tcp, {appenders} appenders x 1 event",
                connections,
                appenders,
                seconds,
                1,
            )
            ws_rate = await rs_append_rate(
                ws,
                f"reactivesocket websocket, {appenders} appenders x 1 event",
                connections,
                appenders,
                seconds,
                1,
            )
            batch_rate = await rs_append_rate(
                tcp, "reactivesocket tcp, 8 appenders x 100 events", 8, 8, seconds, 100
            )
            rs_latency = await rs_delivery_latency(gw, seconds)
        finally:
            await gw.stop()
        copy_rate = await raw_copy_rate(raw_url, max(50_000, int(batch_rate * 2)), BODY)

    raw_p50, rs_p50 = statistics.median(raw_latency), statistics.median(rs_latency)
    raw_p99, rs_p99 = percentile(raw_latency, 0.99), percentile(rs_latency, 0.99)
    report(
        "ReactiveSocket vs raw PostgreSQL (fsync on; same cluster, same table)",
        [
            (f"raw asyncpg, {appenders} clients x 1 row/tx", raw_rate, "rows/s"),
            (f"reactivesocket tcp, {appenders} appenders x 1 event", tcp_rate, "events/s"),
            ("ratio tcp / raw single-row", tcp_rate / raw_rate, "x"),
            (f"reactivesocket websocket, {appenders} appenders x 1 event", ws_rate, "events/s"),
            ("ratio websocket / raw single-row", ws_rate / raw_rate, "x"),
            ("raw binary COPY", copy_rate, "rows/s"),
            ("reactivesocket tcp, 100-event appends x 8", batch_rate, "events/s"),
            ("ratio batched / COPY", batch_rate / copy_rate, "x"),
            ("raw INSERT+NOTIFY->fetch latency p50", raw_p50 * 1000, "ms"),
            ("reactivesocket append->subscriber p50", rs_p50 * 1000, "ms"),
            ("ratio latency p50 reactivesocket / raw", rs_p50 / raw_p50, "x"),
            ("raw latency p99", raw_p99 * 1000, "ms"),
            ("reactivesocket latency p99", rs_p99 * 1000, "ms"),
            ("ratio latency p99 reactivesocket / raw", rs_p99 / raw_p99, "x"),
        ],
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench reactivesocket")
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--appenders", type=int, default=32, help="concurrent single-event appends")
    args = p.parse_args(argv)
    asyncio.run(run(args.seconds, args.connections, args.appenders))
    return 0
