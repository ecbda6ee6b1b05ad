"""``python -m bench commits``: PostgreSQL's side of a commit alone, the head
row taken first against commits at planned positions (migration 0011).

Whatever the gateway's Python costs, every commit of the fast path ends in
one statement, and how many of those PostgreSQL takes per second is a
ceiling of its own.  Moving the head first holds the head row through the
statement's inserts and COMMIT's WAL flush, so one backend inserts at a
time however many connections send; at planned positions each commit
inserts on its own connection and only the head's move and the flush take
turns.  Here one client process sends ``--events``-event batches back to
back on K connections (``--connections``), both ways, each into a fresh
database, with the real statements (core/sql.py FAST_APPEND and
APPEND_AT) and nothing of the gateway: events/s and the cores of
PostgreSQL and of the client.  A client near one core means it, not
PostgreSQL, was the limit.  After each run the log is checked: as many
events as positions, the head at the last one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson

from bench.common import bench_cluster, fresh_database
from bench.peers import (
    BenchError,
    Meter,
    Roots,
    client_loop,
    one_line,
    positive_counts,
    run_command,
    say,
)
from polyport.core import migrate, sql
from polyport.core.writer import at_args, fast_statement

BODY_BYTES = 100
WARMUP_SECONDS = 0.5
MODES = ("head first", "planned")
# A commit at planned positions that finds the one before it not yet started
# is refused (migration 0011); here it is simply sent again.
MAX_RESENDS = 100
# A measurement in which no commit ended (a flush stalled on a busy disk, as
# in a short run beside the test suite) is held open up to this long for one
# to end, rather than reading 0 events/s.
STALLED_WINDOW_SECONDS = 30.0


@dataclass(frozen=True)
class Run:
    mode: str
    connections: int
    events_per_s: float
    pg_cores: float
    client_cores: float
    refused: int


class _Sender:
    """K connections sending batches in the order they were numbered."""

    def __init__(self, mode: str, events: int, head: int, start: uuid.UUID,
                 t0: datetime) -> None:
        self.mode, self.events = mode, events
        self.head, self.t0 = head, t0
        self.tokens: dict[int, uuid.UUID] = {-1: start}
        self.next = 0
        self.sent_events = 0
        self.refused = 0
        self.counting = False
        self.counted = asyncio.Event()  # a commit ended while counting
        self.running = True
        self.body = b"x" * BODY_BYTES

    def _batch(self, seq: int) -> tuple[str, list[object], list[object]]:
        rows: list[list[object]] = [
            [str(uuid.uuid4()), "bench", {}, "application/octet-stream", None, "bench",
             "bench", f"b{seq}-{i}", 1, 0, i * BODY_BYTES, BODY_BYTES]
            for i in range(self.events)]
        return fast_statement(self.events, orjson.dumps(rows).decode(),
                              self.body * self.events, [], [], [], [], [])

    async def run(self, conn: asyncpg.Connection) -> None:
        while self.running:
            seq = self.next
            self.next += 1
            this = self.tokens[seq] = uuid.uuid4()
            statement, args, parts = self._batch(seq)
            if self.mode == "head first":
                await conn.fetchrow(statement, *args, this)
            else:
                base = self.head + seq * self.events
                first = self.t0 + timedelta(microseconds=seq * self.events)
                call = at_args(parts, base, first, self.tokens[seq - 1], this)
                for _ in range(MAX_RESENDS):
                    try:
                        await conn.execute(sql.APPEND_AT, *call)
                        break
                    except asyncpg.SerializationError:
                        self.refused += 1
                else:
                    raise BenchError(f"a commit at planned positions was refused "
                                     f"{MAX_RESENDS} times")
            self.tokens.pop(seq - 2, None)
            if self.counting:
                self.sent_events += self.events
                self.counted.set()


async def _one_run(url: str, pg_pid: int, mode: str, k: int,
                   args: argparse.Namespace) -> Run:
    dsn = migrate.asyncpg_dsn(url)
    conns = [await asyncpg.connect(dsn) for _ in range(k)]
    try:
        head = await conns[0].fetchrow(
            "SELECT last_position, last_recorded_at FROM log_head WHERE id = 1")
        start = uuid.uuid4()
        await conns[0].execute("UPDATE log_head SET last_commit = $1 WHERE id = 1", start)
        t0 = max(head["last_recorded_at"], datetime.now(UTC)) + timedelta(microseconds=1)
        sender = _Sender(mode, args.events, head["last_position"], start, t0)
        meter = Meter(Roots(pg=pg_pid))

        async def measure() -> None:
            await asyncio.sleep(WARMUP_SECONDS)
            sender.counting = True
            meter.start()
            await asyncio.sleep(args.seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sender.counted.wait(), STALLED_WINDOW_SECONDS)
            meter.stop()
            sender.counting = False
            sender.running = False

        async with asyncio.timeout(WARMUP_SECONDS + args.seconds + STALLED_WINDOW_SECONDS + 120):
            await asyncio.gather(measure(), *(sender.run(c) for c in conns))
        await _check_gapless(conns[0])
    finally:
        for c in conns:
            await c.close()
    return Run(mode, k, sender.sent_events / meter.wall, meter.cores["pg"],
               meter.cores["client"], sender.refused)


async def _check_gapless(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(max(position), 0) AS last, "
        "(SELECT last_position FROM log_head WHERE id = 1) AS head FROM events")
    if not row["n"] == row["last"] == row["head"]:
        raise BenchError(f"the log is not gapless: {row['n']} events, last position "
                         f"{row['last']}, head {row['head']}")


def _table(runs: list[Run], args: argparse.Namespace) -> None:
    print(f"\nPostgreSQL's side of a commit alone: one client process sending "
          f"{args.events}-event batches back to back on each connection, {BODY_BYTES}-byte "
          f"bodies, fsync on ({args.seconds:g} s each); {os.cpu_count()} CPUs")
    print(f"  {'connections':>11}  {'head first':>10} {'PG':>5} {'client':>6}  "
          f"{'planned':>10} {'PG':>5} {'client':>6} {'refused':>7}  {'planned /':>9}")
    print(f"  {'':>11}  {'events/s':>10} {'cores':>5} {'cores':>6}  "
          f"{'events/s':>10} {'cores':>5} {'cores':>6} {'':>7}  {'head first':>9}")
    for k in args.connections:
        by = {r.mode: r for r in runs if r.connections == k}
        a, b = by["head first"], by["planned"]
        ratio = b.events_per_s / a.events_per_s if a.events_per_s else 0.0
        print(f"  {k:>11}  {a.events_per_s:>10,.0f} {a.pg_cores:>5.2f} {a.client_cores:>6.2f}  "
              f"{b.events_per_s:>10,.0f} {b.pg_cores:>5.2f} {b.client_cores:>6.2f} "
              f"{b.refused:>7}  {ratio:>9.2f}")
    print("  refused: commits at planned positions sent before the one before them had "
          "started, sent again")


async def run(args: argparse.Namespace) -> int:
    runs: list[Run] = []
    async with bench_cluster() as pg:
        pg_pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
        for k in args.connections:
            for mode in MODES:
                url = await fresh_database(pg)
                r = await _one_run(url, pg_pid, mode, k, args)
                runs.append(r)
                say(f"  {k} connection(s), {mode}: {r.events_per_s:,.0f} events/s, "
                    f"PostgreSQL {r.pg_cores:.2f} cores")
    _table(runs, args)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench commits",
        description="PostgreSQL's side of a commit alone: the head row taken first against "
                    "commits at planned positions")
    p.add_argument("--connections", default="1,2,4,8",
                   help="connection counts, comma-separated (default 1,2,4,8)")
    p.add_argument("--events", type=int, default=256, help="events per batch (default 256)")
    p.add_argument("--seconds", type=float, default=4.0, help="length of each measurement")
    args = p.parse_args(argv)
    try:
        args.connections = positive_counts(args.connections, "--connections")
        if args.events < 1 or args.seconds <= 0:
            raise BenchError("--events and --seconds must be positive")
    except (BenchError, ValueError) as exc:
        print(f"python -m bench commits: {one_line(exc)}", file=sys.stderr)
        return 2
    factory, _name = client_loop()
    return run_command("python -m bench commits", factory, lambda: run(args))
