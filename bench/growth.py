"""How polyport's figures move as the log grows, beside NATS JetStream in the
same run (issue 30).

One log is filled to each of ``--sizes`` in turn (200-byte JSON bodies
round-robin over 100 streams, and the first 1,000 events into one stream of
their own); at each size, both systems:

- fill: the events/s of that fill, pipelined (polyport: one BSON connection
  with 1,000 EMITs in flight; NATS: ``publish_async``, 1,000 pending);
- W1: 32 closed-loop publishers, each awaiting its ack (BSON; ``js.publish``);
- whole-log catch-up: a new subscriber reads every event from the start
  (RSocket ``events.subscribe`` from the beginning: BSON subscribes to one
  stream only; NATS: an ordered consumer on every subject);
- one-stream catch-up: the 1,000-event stream from its start (BSON
  SUBSCRIBE startSeq 0; NATS: an ordered consumer on its subject), ms;
- last 100 events of a stream (fewer while it has fewer): p50 of 50 reads (RSocket ``events.read``;
  NATS: an ordered consumer from the stream sequence of the 100th-last), ms;
- bytes per event on disk: the events table with its indexes and TOAST
  (and, apart, its indexes); NATS: its store directory;
- RSS of the ``polyport serve`` and ``nats-server`` process trees, MiB.

Each polyport figure comes with its ratio to NATS's (higher is better for
rates; for times, sizes and memory, lower), and a last table gives each
figure's growth from the first size to the last.  ``--analyze`` (default)
runs ANALYZE on the events table before each size's reads; ``--no-analyze``
turns autovacuum off for it, so that the reads run on a table never analyzed
after its rows arrived.

A read that gets nothing for ``STALL_S`` seconds leaves its figure empty
and says how far it got.  A NATS ordered consumer that stalls is made again
once (said on stderr) and only the new one is timed; a polyport read is
never retried, since a stall there would be a subscriber missing events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import zmq.asyncio

from bench.common import bench_cluster, fresh_database
from bench.peers import (
    CONTEXT,
    BenchError,
    Env,
    Meter,
    NatsServer,
    Roots,
    ServeProcess,
    _find_nats,
    _nats_connect,
    _start_nats,
    body,
    client_loop,
    one_line,
    run_command,
    say,
    tree_rss_kib,
    w1_nats,
    w1_polyport,
)
from polyport.core import migrate
from polyport.core.aio import wait_event
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.rsocket.client import RSocketClient

DEFAULT_SIZES = "100000,500000,1000000"
STREAMS = 100
ONE_STREAM = "one"
ONE_EVENTS = 1000
LAST_N = 100
LAST_N_READS = 50
IN_FLIGHT = 1000
W1_PUBLISHERS = 32
NATS_PREFIX = "bench.g"  # inside peers' NATS stream, subjects bench.>
# A read that gets nothing for this long has stalled: its figure fails with
# how far it got, instead of the run hanging (a CI run once did, with no
# word of which reader stopped).
STALL_S = 30.0


def stream_of(i: int) -> str:
    """The stream of the i-th event of the whole fill (0-based)."""
    return ONE_STREAM if i < ONE_EVENTS else f"s-{i % STREAMS}"


@dataclass
class Figures:
    """One system at one size; None where it was not measured."""

    events: int = 0
    fill: float | None = None
    w1: float | None = None
    catch_up_all: float | None = None
    catch_up_one_ms: float | None = None
    last_n_ms: float | None = None
    bytes_per_event: float | None = None
    index_bytes_per_event: float | None = None
    rss_mib: float | None = None


@dataclass
class Row:
    size: int
    polyport: Figures = field(default_factory=Figures)
    nats: Figures = field(default_factory=Figures)


# name, label, format, higher is better
COLUMNS = (
    ("fill", "fill (ev/s)", ",.0f", True),
    ("w1", f"W1 {W1_PUBLISHERS} pubs (ev/s)", ",.0f", True),
    ("catch_up_all", "whole-log catch-up (ev/s)", ",.0f", True),
    ("catch_up_one_ms", f"one {ONE_EVENTS:,}-event stream (ms)", ",.1f", False),
    ("last_n_ms", f"last {LAST_N} p50 (ms)", ",.2f", False),
    ("bytes_per_event", "bytes/event", ",.0f", False),
    ("rss_mib", "RSS (MiB)", ",.0f", False),
)


# --- polyport ---------------------------------------------------------------------------------


class Polyport:
    def __init__(self, env: Env, dsn: str) -> None:
        self.env = env
        self.dsn = dsn
        self.filled = 0  # events of the fill, W1's apart
        self.s0_events = 0

    async def fill(self, upto: int) -> float:
        client = await BsonClient.connect(*self.env.addr("bson"), timeout=60)
        start, self.filled = self.filled, max(self.filled, upto)
        counter = iter(range(start, upto))

        async def loop() -> None:
            for i in counter:
                await client.emit(stream_of(i), "bench", json.loads(body(i)))

        try:
            t0 = time.monotonic()
            await asyncio.gather(*(loop() for _ in range(IN_FLIGHT)))
            elapsed = time.monotonic() - t0
        finally:
            await client.close()
        self.s0_events = sum(1 for i in range(ONE_EVENTS, upto) if i % STREAMS == 0)
        return (upto - start) / elapsed if upto > start else 0.0

    async def sql(self, query: str) -> Any:
        conn = await asyncpg.connect(self.dsn)
        try:
            return await conn.fetchval(query)
        finally:
            await conn.close()

    async def catch_up_all(self, total: int) -> float:
        client = await RSocketClient.connect(*self.env.addr("rsocket"))
        try:
            t0 = time.monotonic()
            events = await client.subscribe(start="beginning")
            seen = 0
            while seen < total and await events.next(STALL_S) is not None:
                seen += 1
            elapsed = time.monotonic() - t0
        finally:
            await client.close()
        if seen < total:
            raise BenchError(f"whole-log catch-up ended after {seen:,} of {total:,} events "
                             f"(completed, or nothing for {STALL_S:.0f} s)")
        return total / elapsed

    async def catch_up_one(self) -> float:
        client = await BsonClient.connect(*self.env.addr("bson"), timeout=60)
        try:
            t0 = time.monotonic()
            sub = await client.subscribe(ONE_STREAM, start_seq=0)
            for i in range(ONE_EVENTS):
                if await sub.next(STALL_S) is None:
                    raise BenchError(f"one-stream catch-up stopped after {i:,} of "
                                     f"{ONE_EVENTS:,} events")
            return (time.monotonic() - t0) * 1000
        finally:
            await client.close()

    async def last_n(self) -> float:
        client = await RSocketClient.connect(*self.env.addr("rsocket"))
        try:
            n = min(LAST_N, self.s0_events)
            times = []
            for _ in range(LAST_N_READS):
                t0 = time.monotonic()
                got = await asyncio.wait_for(
                    client.read("s-0", from_version=self.s0_events - n + 1, max=n), STALL_S)
                times.append((time.monotonic() - t0) * 1000)
                if len(got) != n:
                    raise BenchError(f"read {len(got)} of the last {n} events")
            return statistics.median(times)
        finally:
            await client.close()


# --- NATS ---------------------------------------------------------------------------------------


class _Stalled(BenchError):
    def __init__(self, seen: int, count: int) -> None:
        super().__init__(f"the ordered consumer stalled after {seen:,} of {count:,} messages")
        self.seen = seen


class Nats:
    def __init__(self, server: NatsServer, store: Path) -> None:
        self.server = server
        self.store = store
        self.filled = 0
        self.s0_seqs: list[int] = []

    async def fill(self, upto: int) -> float:
        nc = await _nats_connect(self.server.url)
        start, self.filled = self.filled, max(self.filled, upto)
        try:
            js = nc.jetstream(publish_async_max_pending=IN_FLIGHT)
            s0: list[asyncio.Future[Any]] = []
            t0 = time.monotonic()
            for i in range(start, upto):
                fut = await js.publish_async(f"{NATS_PREFIX}.{stream_of(i)}", body(i))
                if stream_of(i) == "s-0":
                    s0.append(fut)
            await asyncio.wait_for(js.publish_async_completed(), 300)
            elapsed = time.monotonic() - t0
            self.s0_seqs += [f.result().seq for f in s0]
        finally:
            await nc.close()
        return (upto - start) / elapsed if upto > start else 0.0

    async def messages(self) -> int:
        nc = await _nats_connect(self.server.url)
        try:
            info = await nc.jetstream().stream_info("BENCH")
            return int(info.state.messages)
        finally:
            await nc.close()

    async def _consume(self, subject: str, count: int, **opts: Any) -> float:
        """Seconds an ordered consumer takes to deliver ``count`` messages.
        An ordered consumer is built to be dropped and made again when it
        goes wrong, and nats.py does not remake one that stops short
        (nats-io/nats.py#510): a stalled one is made again once, said on
        stderr, and only the second one's time counts."""
        try:
            return await self._consume_once(subject, count, **opts)
        except _Stalled as stalled:
            say(f"  NATS ordered consumer on {subject} stalled after {stalled.seen:,} of "
                f"{count:,} messages; timing a new one")
            return await self._consume_once(subject, count, **opts)

    async def _consume_once(self, subject: str, count: int, **opts: Any) -> float:
        nc = await _nats_connect(self.server.url)
        try:
            done = asyncio.Event()
            seen = 0

            async def cb(_msg: Any) -> None:
                nonlocal seen
                seen += 1
                if seen >= count:
                    done.set()

            t0 = time.monotonic()
            sub = await nc.jetstream().subscribe(subject, cb=cb, ordered_consumer=True, **opts)
            while not done.is_set():
                before = seen
                if not await wait_event(done, STALL_S) and seen == before:
                    await sub.unsubscribe()
                    raise _Stalled(seen, count)
            elapsed = time.monotonic() - t0
            await sub.unsubscribe()
            return elapsed
        finally:
            await nc.close()

    async def catch_up_all(self, total: int) -> float:
        from nats.js.api import DeliverPolicy

        return total / await self._consume("bench.>", total, deliver_policy=DeliverPolicy.ALL)

    async def catch_up_one(self) -> float:
        from nats.js.api import DeliverPolicy

        return 1000 * await self._consume(f"{NATS_PREFIX}.{ONE_STREAM}", ONE_EVENTS,
                                          deliver_policy=DeliverPolicy.ALL)

    async def last_n(self) -> float:
        from nats.js.api import ConsumerConfig, DeliverPolicy

        n = min(LAST_N, len(self.s0_seqs))
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=self.s0_seqs[-n])
        times = [
            1000 * await self._consume(f"{NATS_PREFIX}.s-0", n, config=config)
            for _ in range(LAST_N_READS)
        ]
        return statistics.median(times)

    def store_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.store.rglob("*") if p.is_file())


# --- the run ------------------------------------------------------------------------------------


async def _timed(label: str, fn: Callable[[], Awaitable[float]]) -> float | None:
    """One figure; a failure is one line and leaves the cell empty."""
    try:
        return await fn()
    except Exception as exc:  # noqa: BLE001 - one line, go on
        say(f"  {label}: failed: {one_line(exc)}")
        return None


async def measure_size(size: int, args: argparse.Namespace, env: Env, pp: Polyport,
                       nats: Nats | None) -> Row:
    row = Row(size)
    say(f"[{size:,}] filling polyport...")
    row.polyport.fill = await pp.fill(size)
    if nats is not None:
        say(f"[{size:,}] filling NATS...")
        row.nats.fill = await nats.fill(size)
    if args.analyze:
        await pp.sql("ANALYZE events")
    total = int(await pp.sql("SELECT last_position FROM log_head WHERE id = 1"))
    row.polyport.events = total
    say(f"[{size:,}] reads ({total:,} events in polyport's log)...")
    row.polyport.catch_up_all = await _timed("polyport catch-up", lambda: pp.catch_up_all(total))
    row.polyport.catch_up_one_ms = await _timed("polyport one stream", pp.catch_up_one)
    row.polyport.last_n_ms = await _timed("polyport last-N", pp.last_n)
    size_bytes = int(await pp.sql("SELECT pg_total_relation_size('events')"))
    index_bytes = int(await pp.sql("SELECT pg_indexes_size('events')"))
    row.polyport.bytes_per_event = size_bytes / total
    row.polyport.index_bytes_per_event = index_bytes / total
    assert env.gateway is not None
    row.polyport.rss_mib = tree_rss_kib(env.gateway.pid) / 1024
    if nats is not None:
        n = await nats.messages()
        row.nats.events = n
        row.nats.catch_up_all = await _timed("NATS catch-up", lambda: nats.catch_up_all(n))
        row.nats.catch_up_one_ms = await _timed("NATS one stream", nats.catch_up_one)
        row.nats.last_n_ms = await _timed("NATS last-N", nats.last_n)
        row.nats.bytes_per_event = nats.store_bytes() / n
        row.nats.rss_mib = tree_rss_kib(nats.server.pid) / 1024
    if args.seconds > 0:
        say(f"[{size:,}] W1...")
        row.polyport.w1 = await _timed("polyport W1", lambda: w1_polyport(
            env, Meter(env.roots), "bson", W1_PUBLISHERS, args.seconds))
        if nats is not None:
            row.nats.w1 = await _timed("NATS W1", lambda: w1_nats(
                env, Meter(env.roots), W1_PUBLISHERS, args.seconds))
    return row


def _cell(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def print_tables(rows: list[Row], args: argparse.Namespace) -> None:
    state = "ANALYZE before each size's reads" if args.analyze else "never analyzed"
    print(f"\n## growth: polyport (BSON / RSocket) vs NATS JetStream, {state}, "
          f"{os.cpu_count()} cores\n")
    print("| size | figure | polyport | NATS | polyport / NATS |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        for name, label, fmt, _ in COLUMNS:
            a, b = getattr(r.polyport, name), getattr(r.nats, name)
            shown = label
            if name == "bytes_per_event" and r.polyport.index_bytes_per_event is not None:
                shown += f" (indexes {r.polyport.index_bytes_per_event:,.0f})"
            print(f"| {r.size:,} | {shown} | {_cell(a, fmt)} | {_cell(b, fmt)} | "
                  f"{_ratio(a, b)} |")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(f"\n### growth from {first.size:,} to {last.size:,} events (last / first)\n")
        print("| figure | polyport | NATS |")
        print("| --- | ---: | ---: |")
        for name, label, _, _ in COLUMNS:
            print(f"| {label} | "
                  f"{_ratio(getattr(last.polyport, name), getattr(first.polyport, name))} | "
                  f"{_ratio(getattr(last.nats, name), getattr(first.nats, name))} |")


async def run(args: argparse.Namespace) -> int:
    nats_bin = _find_nats()
    root = Path(tempfile.mkdtemp(prefix="polyport-growth-", dir="/tmp"))
    root.chmod(0o755)
    zmq_ctx = zmq.asyncio.Context()
    gateway: ServeProcess | None = None
    nats_server: NatsServer | None = None
    rows: list[Row] = []
    try:
        async with bench_cluster() as pg:
            url = await fresh_database(pg)
            dsn = migrate.asyncpg_dsn(url)
            roots = Roots(pg=int((pg.pgdata / "postmaster.pid").read_text().split()[0]))
            nats: Nats | None = None
            if nats_bin is not None:
                nats_server = await _start_nats(nats_bin, root / "nats")
                roots.nats = nats_server.pid
                nats = Nats(nats_server, root / "nats" / "store")
            gateway = ServeProcess(root / "gateway", url, ["bson", "rsocket"], None)
            try:
                say("starting polyport serve...")
                await gateway.start()
                roots.gateway = gateway.pid
                env = Env(dsn, gateway, nats_server, zmq_ctx, roots)
                pp = Polyport(env, dsn)
                if not args.analyze:
                    await pp.sql("ALTER TABLE events SET (autovacuum_enabled = false)")
                for size in args.sizes:
                    rows.append(await measure_size(size, args, env, pp, nats))
            finally:
                # Before the cluster stops: its pool would retry, loudly.
                await gateway.stop()
    finally:
        if nats_server is not None:
            await nats_server.stop()
        zmq_ctx.destroy(linger=0)
        shutil.rmtree(root, ignore_errors=True)
    print_tables(rows, args)
    if os.environ.get("POLYPORT_BENCH_JSON"):
        print(json.dumps({"context": CONTEXT, "rows": [asdict(r) for r in rows]}))
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench growth",
        description="polyport and NATS JetStream as one log grows through --sizes")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"log sizes to fill to and measure at, comma-separated, rising "
                        f"(default {DEFAULT_SIZES})")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="length of each W1 measurement (0: no W1)")
    p.add_argument("--analyze", action=argparse.BooleanOptionalAction, default=True,
                   help="ANALYZE the events table before each size's reads (default), or "
                        "turn autovacuum off for it and never analyze")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        args.sizes = []
    least = ONE_EVENTS + STREAMS  # the one stream, and an event in each other
    if (not args.sizes or args.sizes[0] < least
            or args.sizes != sorted(set(args.sizes)) or args.seconds < 0):
        print(f"python -m bench growth: --sizes: rising integers from {least:,}, "
              "comma-separated; --seconds >= 0",
              file=sys.stderr)
        return 2
    factory, _loop = client_loop()
    return run_command("python -m bench growth", factory, lambda: run(args))
