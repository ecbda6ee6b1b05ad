"""BSON frames: pipelined EMIT throughput and delivery latency, as ratios to
raw PostgreSQL measured in the same run on the same cluster.

The gateway runs as its own process (``polyport serve``, BSON listener only),
as in production; the clients run here.

- Throughput: ``--connections`` BSON connections, each keeping ``--window``
  EMITs in flight (every RESPONSE confirms a commit), vs ``--raw-clients``
  asyncpg connections inserting one row per transaction into the same
  ``events`` table.
- Delivery latency: one EMIT at a time on one connection, timed from writing
  the EMIT to the RECEV arriving on a second, subscribed connection; vs raw
  PostgreSQL's equivalent wake-up path: INSERT (one-row transaction), then
  NOTIFY, timed until a LISTENing connection receives the notification.
  EMIT→RESPONSE (append acknowledgement) is also compared with a raw one-row
  INSERT.
- ``--tls``: the BSON port runs in dual mode with a throwaway certificate
  (trustme, a test extra), and the same measurements are repeated over TLS
  on the same gateway: the cost of TLS as a ratio to plain in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from ssl import SSLContext

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
from polyport.gateway.config import DEFAULT_PORTS
from polyport.protocols.bson.client import BsonClient

REPO = str(Path(__file__).resolve().parent.parent)
EVENT = {"amount": 42, "currency": "EUR", "note": "benchmark event"}
BODY = b'{"amount": 42, "currency": "EUR", "note": "benchmark event"}'


# --- raw PostgreSQL baselines ----------------------------------------------------------


async def raw_latencies(url: str, samples: int) -> tuple[list[float], list[float]]:
    """(INSERT+NOTIFY → LISTEN wake-up, INSERT alone) latencies in ms."""
    await _prepare_raw(url)
    dsn = migrate.asyncpg_dsn(url)
    writer = await asyncpg.connect(dsn)
    listener = await asyncpg.connect(dsn)
    got: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("bench_wake", lambda *a: got.put_nowait(a[3]))
    stream = f"lat-{uuid.uuid4().hex[:6]}"
    wake: list[float] = []
    insert: list[float] = []
    prog = Progress("raw INSERT + NOTIFY -> LISTEN", samples)
    try:
        for i in range(samples):
            t0 = time.perf_counter()
            await writer.execute(_INSERT_ONE, uuid.uuid4(), stream, i + 1, BODY)
            t1 = time.perf_counter()
            # After the commit, as the core does (never inside the transaction).
            await writer.execute(f"NOTIFY bench_wake, '{i}'")
            await asyncio.wait_for(got.get(), 10)
            t2 = time.perf_counter()
            insert.append((t1 - t0) * 1000)
            wake.append((t2 - t0) * 1000)
            prog.update(i + 1)
    finally:
        await writer.close()
        await listener.close()
    prog.done(samples)
    return wake, insert


# --- the gateway process ----------------------------------------------------------------


@asynccontextmanager
async def gateway_process(url: str, *extra: str) -> AsyncIterator[tuple[str, int]]:
    args = [sys.executable, "-m", "polyport.gateway.cli.main", "serve",
            "--host", "127.0.0.1", "--http-port", "off", "--bson-port", "0", *extra]
    for name in DEFAULT_PORTS:
        if name != "bson":
            args += [f"--{name}-port", "off"]
    # The URL carries a password: environment, never argv.
    env = {**os.environ, "POLYPORT_LOG_LEVEL": "warning", "POLYPORT_DATABASE_URL": url}
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None
    try:
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            if not line:
                raise RuntimeError("the gateway exited before listening")
            if line.startswith("polyport: bson listening on "):
                host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
                break
        yield host, int(port)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def _tls_setup(root: Path) -> tuple[tuple[str, ...], SSLContext]:
    """A throwaway CA and certificate: the gateway's flags and a client context."""
    import ssl

    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = root / "bench.pem", root / "bench.key"
    cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    key.chmod(0o600)
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ("--tls-cert", str(cert), "--tls-key", str(key), "--bson-tls", "dual"), ctx


# --- BSON measurements ----------------------------------------------------------------------


async def bson_throughput(
    addr: tuple[str, int], connections: int, window: int, seconds: float,
    ssl: SSLContext | None = None,
) -> float:
    clients = [await BsonClient.connect(*addr, ssl=ssl) for _ in range(connections)]
    over = " over TLS" if ssl else ""
    prog = Progress(f"BSON pipelined EMIT{over}, {connections} conns x {window} in flight")
    confirmed = [0]
    failed = [0]
    deadline = time.monotonic() + seconds

    async def pump(i: int, client: BsonClient) -> None:
        room = asyncio.Semaphore(window)
        inflight: set[asyncio.Future[object]] = set()

        def done(fut: asyncio.Future[object]) -> None:
            inflight.discard(fut)
            room.release()
            if not fut.cancelled() and fut.exception() is None and getattr(
                fut.result(), "ok", False
            ):
                confirmed[0] += 1
            else:
                failed[0] += 1
            prog.update(confirmed[0])

        n = 0
        while time.monotonic() < deadline:
            await room.acquire()
            fut = client.send_emit(f"tp-{i}", "bench", EVENT)
            inflight.add(fut)  # type: ignore[arg-type]
            fut.add_done_callback(done)  # type: ignore[arg-type]
            n += 1
            if n % 32 == 0:
                await client.drain()
        if inflight:
            await asyncio.wait(list(inflight), timeout=60)

    started = time.monotonic()
    try:
        await asyncio.gather(*(pump(i, c) for i, c in enumerate(clients)))
    finally:
        elapsed = time.monotonic() - started
        for c in clients:
            await c.close()
    prog.done(confirmed[0])
    if failed[0]:
        print(f"  warning: {failed[0]} EMITs failed", file=sys.stderr)
    return confirmed[0] / elapsed


async def bson_latencies(
    addr: tuple[str, int], samples: int, ssl: SSLContext | None = None
) -> tuple[list[float], list[float]]:
    """(EMIT → RECEV on another connection, EMIT → RESPONSE) latencies in ms."""
    producer = await BsonClient.connect(*addr, ssl=ssl)
    consumer = await BsonClient.connect(*addr, ssl=ssl)
    stream = f"lat-{uuid.uuid4().hex[:6]}"
    sub = await consumer.subscribe(stream)
    delivery: list[float] = []
    ack: list[float] = []
    prog = Progress("BSON EMIT -> RECEV" + (" over TLS" if ssl else ""), samples)
    try:
        for i in range(samples):
            acked_at: list[float] = []
            t0 = time.perf_counter()
            fut = producer.send_emit(stream, "bench", {**EVENT, "i": i})
            fut.add_done_callback(partial(_stamp, acked_at))
            recev = await sub.next(10)
            t1 = time.perf_counter()
            reply = await fut
            if recev is None or recev.event.get("i") != i or not getattr(reply, "ok", False):
                raise RuntimeError(f"sample {i}: no matching RECEV or a failed EMIT")
            delivery.append((t1 - t0) * 1000)
            ack.append((acked_at[0] - t0) * 1000)
            prog.update(i + 1)
    finally:
        await producer.close()
        await consumer.close()
    prog.done(samples)
    return delivery, ack


def _stamp(into: list[float], _fut: object) -> None:
    into.append(time.perf_counter())


# --- run ----------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    async with bench_cluster() as pg:
        raw_url = await fresh_database(pg)
        gw_url = await fresh_database(pg)
        # Latencies first, on a quiet cluster (a throughput phase leaves
        # checkpoint and vacuum work behind that would skew whatever follows);
        # then raw throughput before BSON's, so any such leftover costs BSON.
        raw_wake, raw_insert = await raw_latencies(raw_url, args.samples)
        tls_delivery: list[float] = []
        tls_ack: list[float] = []
        tls_rate = 0.0
        with tempfile.TemporaryDirectory() as tmp:
            tls_args, client_ssl = _tls_setup(Path(tmp)) if args.tls else ((), None)
            async with gateway_process(gw_url, *tls_args) as addr:
                delivery, ack = await bson_latencies(addr, args.samples)
                if client_ssl is not None:
                    tls_delivery, tls_ack = await bson_latencies(addr, args.samples, client_ssl)
                raw_rate = await raw_single_row_rate(
                    raw_url, args.raw_clients, args.seconds, BODY
                )
                bson_rate = await bson_throughput(
                    addr, args.connections, args.window, args.seconds
                )
                if client_ssl is not None:
                    tls_rate = await bson_throughput(
                        addr, args.connections, args.window, args.seconds, client_ssl
                    )

    def p(xs: list[float], q: float) -> float:
        return percentile(xs, q / 100)

    rows = [
        (f"raw asyncpg, {args.raw_clients} clients x 1 row/tx", raw_rate, "rows/s"),
        (f"BSON pipelined EMIT, {args.connections} conns x {args.window} in flight",
         bson_rate, "events/s"),
        ("ratio BSON EMIT / raw single-row", bson_rate / raw_rate, "x"),
        ("raw INSERT+NOTIFY -> LISTEN p50", p(raw_wake, 50), "ms"),
        ("raw INSERT+NOTIFY -> LISTEN p99", p(raw_wake, 99), "ms"),
        ("BSON EMIT -> RECEV (other conn) p50", p(delivery, 50), "ms"),
        ("BSON EMIT -> RECEV (other conn) p99", p(delivery, 99), "ms"),
        ("ratio delivery p50 BSON / raw", p(delivery, 50) / p(raw_wake, 50), "x"),
        ("ratio delivery p99 BSON / raw", p(delivery, 99) / p(raw_wake, 99), "x"),
        ("raw one-row INSERT p50", p(raw_insert, 50), "ms"),
        ("BSON EMIT -> RESPONSE p50", p(ack, 50), "ms"),
        ("ratio ack p50 BSON / raw INSERT", p(ack, 50) / p(raw_insert, 50), "x"),
    ]
    if args.tls:
        rows += [
            ("BSON over TLS pipelined EMIT", tls_rate, "events/s"),
            ("ratio TLS / plain EMIT throughput", tls_rate / bson_rate, "x"),
            ("BSON over TLS EMIT -> RECEV p50", p(tls_delivery, 50), "ms"),
            ("ratio TLS / plain delivery p50", p(tls_delivery, 50) / p(delivery, 50), "x"),
            ("BSON over TLS EMIT -> RESPONSE p50", p(tls_ack, 50), "ms"),
            ("ratio TLS / plain ack p50", p(tls_ack, 50) / p(ack, 50), "x"),
        ]
    report(
        "BSON frames (fsync on; gateway in its own process; same cluster, same table; "
        f"latency over {args.samples} sequential samples, mean delivery "
        f"{statistics.fmean(delivery):.2f} ms)",
        rows,
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench bson")
    p.add_argument("--seconds", type=float, default=5.0, help="throughput phase length")
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--window", type=int, default=256, help="EMITs in flight per connection")
    p.add_argument("--raw-clients", type=int, default=32)
    p.add_argument("--samples", type=int, default=300, help="latency samples")
    p.add_argument("--tls", action="store_true",
                   help="also measure over TLS (dual-mode port) and print TLS / plain ratios")
    args = p.parse_args(argv)
    asyncio.run(run(args))
    return 0
