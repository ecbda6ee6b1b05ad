"""Core append throughput against raw asyncpg, from one run.

- 32 concurrent appenders, each awaiting its single-event append (group
  commit) vs 32 asyncpg clients inserting one row per transaction.
- Batched appends (100 events each, 8 appenders) vs binary COPY.

The single-event comparison alternates raw and core phases over several
rounds: a shared two-core machine drifts by tens of percent within a minute,
and alternating gives both sides the same share of good and bad moments.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench.common import (
    bench_cluster,
    fresh_database,
    raw_copy_rate,
    raw_single_row_rate,
    report,
    timed_rate,
)
from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.core.store import EventStore, StoreConfig

BODY = b'{"amount": 42, "currency": "EUR", "note": "benchmark event"}'


async def run(seconds: float, clients: int, rounds: int) -> None:
    async with bench_cluster() as pg:
        raw_url = await fresh_database(pg)
        core_url = await fresh_database(pg)
        store = EventStore(StoreConfig(core_url, pool_max=8, run_binders=False))
        await store.start()
        try:
            async def single(i: int) -> int:
                await store.append(Append("bench", f"s-{i}", (EventData("bench", BODY),)))
                return 1

            # Warm both sides (connections, caches, prepared statements).
            await raw_single_row_rate(raw_url, clients, 1.0, BODY)
            await timed_rate("core warm-up", clients, 1.0, single)
            raw_rates: list[float] = []
            core_rates: list[float] = []
            for r in range(1, rounds + 1):
                raw_rates.append(await raw_single_row_rate(raw_url, clients, seconds, BODY))
                core_rates.append(await timed_rate(
                    f"core, {clients} appenders, 1 event each (round {r}/{rounds})",
                    clients, seconds, single,
                ))

            async def batched(i: int) -> int:
                events = tuple(EventData("bench", BODY) for _ in range(100))
                await store.append(Append("bench", f"b-{i}", events))
                return 100

            batch_rate = await timed_rate("core, 8 appenders, 100 events each", 8, seconds, batched)
        finally:
            await store.close()
        copy_rate = await raw_copy_rate(raw_url, max(50_000, int(batch_rate * 2)), BODY)
    raw_mean = statistics.fmean(raw_rates)
    core_mean = statistics.fmean(core_rates)
    per_round = [c / r for c, r in zip(core_rates, raw_rates, strict=True)]
    report(
        f"core append throughput (fsync on; same cluster, same table; "
        f"{rounds} alternating rounds of {seconds:g}s)",
        [
            (f"raw asyncpg, {clients} clients x 1 row/tx", raw_mean, "rows/s"),
            (f"core, {clients} appenders x 1 event", core_mean, "events/s"),
            ("ratio core / raw single-row", core_mean / raw_mean, "x"),
            ("  lowest round ratio", min(per_round), "x"),
            ("  highest round ratio", max(per_round), "x"),
            ("raw binary COPY", copy_rate, "rows/s"),
            ("core, 100-event appends x 8", batch_rate, "events/s"),
            ("ratio batched core / COPY", batch_rate / copy_rate, "x"),
        ],
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench core")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    p.add_argument("--rounds", type=int, default=3, help="alternating raw/core rounds")
    p.add_argument("--clients", type=int, default=32)
    args = p.parse_args(argv)
    asyncio.run(run(args.seconds, args.clients, args.rounds))
    return 0
