"""``python -m bench logins``: what a failed login costs for a user that
exists and for one that does not (the same scrypt work, so timing does not
tell which names exist), and what a correct login costs.

Each kind runs ``--attempts`` logins through :meth:`UserService.authenticate`,
the kinds taking turns, each from its own source address so the
failed-login throttle (which would add its delay after ten failures from one
address) stays out of the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time

from bench.common import bench_cluster, fresh_database
from polyport.core.errors import Unauthenticated
from polyport.core.store import EventStore, StoreConfig
from polyport.core.users import dummy_hash


async def _timings(
    store: EventStore, logins: list[tuple[str, str]], attempts: int
) -> list[list[float]]:
    """Per login, ``attempts`` timings, the logins taking turns so that the
    machine's other load falls on each alike."""
    out: list[list[float]] = [[] for _ in logins]
    for i in range(attempts):
        for j, (user, password) in enumerate(logins):
            n = i * len(logins) + j
            peer = f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"
            started = time.perf_counter()
            with contextlib.suppress(Unauthenticated):
                await store.users.authenticate(user, password, peer=peer)
            out[j].append(time.perf_counter() - started)
    return out


def _line(label: str, timings: list[float]) -> str:
    ms = sorted(t * 1000 for t in timings)
    return (f"  {label:<28} n={len(ms):<4} mean {statistics.fmean(ms):7.2f} ms   "
            f"p50 {ms[len(ms) // 2]:7.2f} ms   max {ms[-1]:7.2f} ms")


async def run(attempts: int) -> None:
    async with bench_cluster() as pg:
        url = await fresh_database(pg)
        store = EventStore(StoreConfig(url, pool_max=4, run_binders=False))
        await store.start()
        try:
            await store.users.add("bench-user", "right password")
            dummy_hash()  # made once per process: not part of any login
            await _timings(store, [("bench-user", "warm-up")], 3)
            unknown, known, good = await _timings(store, [
                ("no-such-user", "wrong password"),
                ("bench-user", "wrong password"),
                ("bench-user", "right password"),
            ], attempts)
        finally:
            await store.close()
    print(f"logins ({attempts} attempts each, taking turns):")
    print(_line("failed, unknown user", unknown))
    print(_line("failed, known user", known))
    print(_line("succeeded", good))
    ratio = statistics.fmean(unknown) / statistics.fmean(known)
    print(f"  unknown / known failure time: {ratio:.3f}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench logins")
    p.add_argument("--attempts", type=int, default=50)
    args = p.parse_args(argv)
    asyncio.run(run(args.attempts))
    return 0
