"""Res01 commit throughput over real ZeroMQ against raw asyncpg, from one run.

- 32 DEALER clients, each awaiting its single-event AC (group commit on the
  server) vs 32 asyncpg clients inserting one row per transaction.
- 100-event ACs from 8 DEALER clients vs binary COPY into the same table.

The gateway runs in a child process (``polyport serve``) by default, so the
clients' event loop and the server's do not share one; ``--in-process`` runs
it in this process instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from bench.common import (
    bench_cluster,
    fresh_database,
    raw_copy_rate,
    raw_single_row_rate,
    report,
    timed_rate,
)
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig
from polyport.protocols.res01.client import Res01Client, new_event

BODY = '{"amount": 42, "currency": "EUR", "note": "benchmark event"}'
BATCH = 100
BATCH_CLIENTS = 8


@contextlib.asynccontextmanager
async def gateway_process(url: str) -> AsyncIterator[tuple[str, int]]:
    """``polyport serve`` with only the Res01 listener, on a free port."""
    off = [a for n in DEFAULT_PORTS if n != "res01" for a in (f"--{n}-port", "off")]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve",
        "--res01-port", "0", "--http-port", "off", *off,
        stdout=asyncio.subprocess.PIPE,
        # The URL carries a password: environment, never argv.
        env={**os.environ, "POLYPORT_LOG_LEVEL": "warning", "POLYPORT_DATABASE_URL": url},
    )
    try:
        assert proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            if not line:
                raise RuntimeError("the gateway exited before listening")
            if line.startswith("polyport: res01 listening on "):
                host, _, port = line.rsplit(" ", 1)[1].strip().rpartition(":")
                break
        yield host, int(port)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@contextlib.asynccontextmanager
async def gateway_here(url: str) -> AsyncIterator[tuple[str, int]]:
    from polyport.gateway.app import Gateway

    ports: dict[str, Any] = {f"{n}_port": (0 if n == "res01" else None) for n in DEFAULT_PORTS}
    cfg = GatewayConfig(database_url=url, http_port=None, **ports)
    async with Gateway(cfg) as gw:
        yield gw.listeners["res01"].address


async def run(seconds: float, clients: int, in_process: bool) -> None:
    async with bench_cluster() as pg:
        raw_url = await fresh_database(pg)
        res01_url = await fresh_database(pg)
        raw_rate = await raw_single_row_rate(raw_url, clients, seconds, BODY.encode())
        serve = gateway_here if in_process else gateway_process
        async with serve(res01_url) as address:
            dealers = [await Res01Client.connect(address, timeout=60) for _ in range(clients)]
            try:
                async def single(i: int) -> int:
                    await dealers[i].commit("bench", f"s-{i}", -1, [new_event("bench", BODY)])
                    return 1

                single_rate = await timed_rate(
                    f"res01, {clients} DEALER clients, 1 event per AC", clients, seconds, single
                )

                async def batched(i: int) -> int:
                    events = [new_event("bench", BODY) for _ in range(BATCH)]
                    await dealers[i].commit("bench", f"b-{i}", -1, events)
                    return BATCH

                batch_rate = await timed_rate(
                    f"res01, {BATCH_CLIENTS} DEALER clients, {BATCH} events per AC",
                    BATCH_CLIENTS, seconds, batched,
                )
            finally:
                for d in dealers:
                    await d.close()
        copy_rate = await raw_copy_rate(raw_url, max(50_000, int(batch_rate * 2)), BODY.encode())
    where = "in-process gateway" if in_process else "gateway in a child process"
    report(
        f"res01 commit throughput (fsync on; same cluster, same table; {where})",
        [
            (f"raw asyncpg, {clients} clients x 1 row/tx", raw_rate, "rows/s"),
            (f"res01, {clients} DEALER clients x 1-event AC", single_rate, "events/s"),
            ("ratio res01 / raw single-row", single_rate / raw_rate, "x"),
            ("raw binary COPY", copy_rate, "rows/s"),
            (f"res01, {BATCH}-event ACs x {BATCH_CLIENTS} clients", batch_rate, "events/s"),
            (f"ratio res01 {BATCH}-event / COPY", batch_rate / copy_rate, "x"),
        ],
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench res01")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--in-process", action="store_true",
                   help="run the gateway in this process (shares the clients' event loop)")
    args = p.parse_args(argv)
    asyncio.run(run(args.seconds, args.clients, args.in_process))
    return 0
