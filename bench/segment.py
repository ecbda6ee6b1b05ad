"""Segment wire block-append throughput against binary COPY, from one run.

A gateway (segment listener only) on a fresh database of a throwaway cluster
(fsync on); writers on their own connections append blocks of many events
with the asyncio client (pipelined, acknowledged after commit) for
``--seconds``; the rate counts acknowledged events.  Then binary COPY of the
same bodies into the ``events`` table of another database on the same cluster.
Client and gateway share this process (and the machine's cores with
PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.common import Progress, bench_cluster, fresh_database, raw_copy_rate, report
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig
from polyport.protocols.segment.client import SegmentWriter

BODY = b'{"amount": 42, "currency": "EUR", "note": "benchmark event"}'
FRAMED = 8 + len(BODY)


async def segment_rate(
    address: tuple[str, int], writers: int, block_events: int, seconds: float
) -> float:
    """Acknowledged events/s of ``writers`` connections appending blocks."""
    block = [BODY] * block_events
    prog = Progress(f"segment, {writers} writer(s), {block_events}-event blocks")
    clients = [await SegmentWriter.connect(*address) for _ in range(writers)]
    appenders = [
        await c.open_segment(f"bench/segment-{i}-{time.monotonic_ns()}")
        for i, c in enumerate(clients)
    ]

    def acked() -> int:
        return sum(a.ack_level for a in appenders) // FRAMED

    async def write(i: int) -> None:
        app = appenders[i]
        while time.monotonic() < deadline:
            await app.append(block)
            prog.update(acked())
        await app.flush(60)

    started = time.monotonic()
    deadline = started + seconds
    await asyncio.gather(*(write(i) for i in range(writers)))
    elapsed = time.monotonic() - started
    total = acked()
    prog.done(total)
    for c in clients:
        await c.close()
    return total / elapsed


async def run(seconds: float, writers: int, block_events: int) -> None:
    async with bench_cluster() as pg:
        raw_url = await fresh_database(pg)
        seg_url = await fresh_database(pg)
        ports: dict[str, Any] = {f"{name}_port": None for name in DEFAULT_PORTS}
        ports["segment_port"] = 0  # only the segment listener, on a free port
        gw = Gateway(GatewayConfig(database_url=seg_url, http_port=None, **ports))
        await gw.start()
        try:
            address = gw.listeners["segment"].address
            one = await segment_rate(address, 1, block_events, seconds)
            many = await segment_rate(address, writers, block_events, seconds)
        finally:
            await gw.stop()
        copy_rate = await raw_copy_rate(raw_url, max(50_000, int(max(one, many) * 2)), BODY)
    report(
        "segment wire block appends (fsync on; same cluster, same table)",
        [
            ("raw binary COPY", copy_rate, "rows/s"),
            (f"segment, 1 writer x {block_events}-event blocks", one, "events/s"),
            ("ratio segment 1 writer / COPY", one / copy_rate, "x"),
            (f"segment, {writers} writers x {block_events}-event blocks", many, "events/s"),
            (f"ratio segment {writers} writers / COPY", many / copy_rate, "x"),
        ],
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench segment")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--block-events", type=int, default=1000)
    args = p.parse_args(argv)
    asyncio.run(run(args.seconds, args.writers, args.block_events))
    return 0
