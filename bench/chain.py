"""``python -m bench chain``: the commit chain alone, fed harder than any
set of workers could feed it on this machine.

``bench workers`` prints what the chain *could* carry ("chain max ev/s"),
worked out from its CPU per event while real workers feed it.  That is an
extrapolation, and on a machine where the workers run out of CPU first it
is all one can get.  Here the chain process of a real ``polyport serve
--workers 2`` (its two workers idle) is fed directly on its unix socket, in
its own wire format, by N feeder processes (``python -m bench.chain``, the
database URL never on argv) that do nothing but keep K one-event appends in
flight each, every slot on its own stream, as W1's publishers do.  What it
prints is the chain's measured throughput, its CPU per event, and the cores
of everyone else: with a core to spare for every party, the events/s at the
largest feeder count is the ceiling of one commit chain on this machine
(issue 26: does one chain reach the peers' ~100,000 events/s on 16 cores?).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from bench.common import bench_cluster, fresh_database
from bench.peers import (
    BenchError,
    Meter,
    Roots,
    ServeProcess,
    client_loop,
    one_line,
    positive_counts,
    run_command,
    say,
)
from bench.spread import Children, tell_parent
from polyport.core.chain_wire import APPEND, FAILED, RESULT, encode_append
from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.core.limits import EventLimits, check_appends
from polyport.gateway.process.workers import chain_socket_path

# A W1-sized event.
BODY_BYTES = 100
# Before each measured window: connections, prepared statements, caches.
WARMUP_SECONDS = 1.0
# See _Feeder.run: how long a window with no answer in it is held open.
STALLED_WINDOW_SECONDS = 30.0


@dataclass(frozen=True)
class Run:
    feeders: int
    events_per_s: float
    cores: dict[str, float]
    failed: int

    def us_per_event(self, group: str) -> float:
        return self.cores[group] / self.events_per_s * 1e6 if self.events_per_s else 0.0


async def _feed(pg_url: str, pg_pid: int, root: Path, args: argparse.Namespace) -> list[Run]:
    gateway = ServeProcess(root / "gateway", pg_url, ["bson"], 2, "process")
    say("starting polyport serve --workers 2 (commit chain: process), its workers idle...")
    await gateway.start()
    socket = chain_socket_path(str(gateway.run_dir))
    runs: list[Run] = []
    try:
        for rep in range(args.repeat):
            for n in args.feeders:
                run = await _one_run(socket, n, args, Roots(pg=pg_pid, gateway=gateway.pid))
                runs.append(run)
                say(f"  [{rep + 1}/{args.repeat}] {n} feeder(s): {run.events_per_s:,.0f} events/s,"
                    f" chain {run.cores['chain']:.2f} cores"
                    + (f", {run.failed} failed" if run.failed else ""))
    finally:
        await gateway.stop()
    return runs


async def _one_run(socket: Path, n: int, args: argparse.Namespace, roots: Roots) -> Run:
    spec = {"socket": str(socket), "outstanding": args.outstanding, "events": args.events,
            "seconds": args.seconds}
    children = Children("bench.chain", "feeder")
    meter = Meter(roots)
    try:
        await children.start([{**spec, "index": i} for i in range(n)])
        await children.go()
        await asyncio.sleep(WARMUP_SECONDS)
        meter.start()
        await asyncio.sleep(args.seconds)
        meter.stop()
        # A feeder holds a window with no answer in it open (up to 30 s).
        async with asyncio.timeout(args.seconds + 60):
            done = await children.results()
    finally:
        await children.close()
    cores = dict(meter.cores)
    cores["feeders"] = sum(d["cpu"] / d["window"] for d in done)
    # The gateway's tree holds the chain and the two idle workers.
    cores["workers"] = max(0.0, cores["gateway"] - cores["chain"])
    return Run(n, float(sum(d["rate"] for d in done)), cores, sum(d["failed"] for d in done))


def _table(runs: list[Run], args: argparse.Namespace) -> None:
    print(f"\nThe commit chain alone, fed on its socket: {args.outstanding} one-stream slots per "
          f"feeder process, {args.events} event(s) per append, {BODY_BYTES}-byte bodies "
          f"(median of {args.repeat} run(s) of {args.seconds:g} s); {os.cpu_count()} CPUs")
    print(f"  {'feeders':>7} {'events/s':>10} {'chain':>6} {'us CPU':>7} {'chain max':>10} "
          f"{'workers':>8} {'PG':>6} {'feeders':>8} {'failed':>7}")
    print(f"  {'':>7} {'':>10} {'cores':>6} {'/event':>7} {'ev/s':>10} "
          f"{'cores':>8} {'cores':>6} {'cores':>8} {'':>7}")
    med = statistics.median
    for n in args.feeders:
        got = [r for r in runs if r.feeders == n]
        rate = med(r.events_per_s for r in got)
        us = med(r.us_per_event("chain") for r in got)
        c = {k: med(r.cores[k] for r in got) for k in ("chain", "workers", "pg", "feeders")}
        print(f"  {n:>7} {rate:>10,.0f} {c['chain']:>6.2f} {us:>7.1f} "
              f"{(1e6 / us if us else 0):>10,.0f} {c['workers']:>8.2f} {c['pg']:>6.2f} "
              f"{c['feeders']:>8.2f} {sum(r.failed for r in got):>7}")
    print("  us CPU/event: the chain process's; chain max ev/s: what it would carry at one full "
          "core at that cost (when 'chain cores' is near 1.00, events/s is that ceiling, "
          "measured)")
    print("  workers cores: the gateway's two idle workers, which still hear of every commit")


async def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="polyport-chain-", dir="/tmp"))
    root.chmod(0o755)
    try:
        async with bench_cluster() as pg:
            url = await fresh_database(pg)
            pg_pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
            runs = await _feed(url, pg_pid, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _table(runs, args)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench chain",
        description="the commit chain alone, fed on its socket by feeder processes")
    p.add_argument("--feeders", default=str(max(1, (os.cpu_count() or 1) // 4)),
                   help="feeder process counts, comma-separated (default: one per 4 cores)")
    p.add_argument("--outstanding", type=int, default=128,
                   help="appends each feeder keeps in flight, one stream each (default 128)")
    p.add_argument("--events", type=int, default=1, help="events per append (default 1)")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--repeat", type=int, default=1, help="runs per feeder count; medians")
    args = p.parse_args(argv)
    try:
        args.feeders = positive_counts(args.feeders, "--feeders")
        if min(args.outstanding, args.events, args.repeat) < 1 or args.seconds <= 0:
            raise BenchError("--outstanding, --events, --repeat and --seconds must be positive")
    except (BenchError, ValueError) as exc:
        print(f"python -m bench chain: {one_line(exc)}", file=sys.stderr)
        return 2
    factory, _name = client_loop()
    return run_command("python -m bench chain", factory, lambda: run(args))


# --- a feeder process ---------------------------------------------------------------------


class _Feeder:
    """One feeder: ``outstanding`` slots, each with one append in flight on
    its own stream, and the next sent as soon as its answer arrives."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.events = int(spec["events"])
        self.tag = f"chain{os.getpid()}x{spec['index']}"
        self.pack = msgpack.Packer().pack
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.in_flight: dict[int, int] = {}  # uid -> its slot
        self.checked: dict[int, tuple[int, int]] = {}  # slot -> (size, cost)
        self.next_uid = 0
        self.counted = self.failed = 0
        self.first_error = ""

    def unit(self, slot: int) -> list[Any]:
        append = Append("bench", f"{self.tag}-{slot}",
                        tuple(EventData("BenchEvent", b"x" * BODY_BYTES)
                              for _ in range(self.events)),
                        origin="bench")
        # A slot's appends differ only in their event ids: checked once.
        checked = self.checked.get(slot)
        if checked is None:
            checked = self.checked[slot] = check_appends([append], EventLimits(), 16 << 20)
        size, cost = checked
        uid, self.next_uid = self.next_uid, self.next_uid + 1
        self.in_flight[uid] = slot
        return [APPEND, uid, [encode_append(append)], size, cost]

    def answered(self, data: bytes, *, counting: bool, more: bool) -> list[list[Any]]:
        """The units to send for the answers in ``data``."""
        self.unpacker.feed(data)
        out = []
        for msg in (m for batch in self.unpacker for m in batch):
            if msg[0] not in (RESULT, FAILED) or msg[1] not in self.in_flight:
                continue  # COMMIT: every peer hears of every commit
            slot = self.in_flight.pop(msg[1])
            if msg[0] == FAILED:
                self.failed += 1
                self.first_error = self.first_error or f"{msg[2]}: {msg[3]}"
            elif counting:
                self.counted += self.events
            if more:
                out.append(self.unit(slot))
        return out

    async def run(self, stdin: asyncio.StreamReader) -> dict[str, Any]:
        try:
            reader, writer = await asyncio.open_unix_connection(self.spec["socket"])
        except OSError as exc:
            return {"error": f"cannot reach the chain at {self.spec['socket']}: {exc}"}
        tell_parent({"ready": True})
        await stdin.readline()  # go
        t0 = time.monotonic() + WARMUP_SECONDS
        t1 = t0 + float(self.spec["seconds"])
        cpu0 = None
        writer.write(self.pack([self.unit(slot) for slot in range(self.spec["outstanding"])]))
        # Answers count by when they arrive.  A window in which none arrived
        # (a flush stalled on a busy disk, as beside the test suite) stays
        # open until one does, up to STALLED_WINDOW_SECONDS, rather than
        # reading 0 events/s; the rate is over the window as it was.
        while (now := time.monotonic()) < t1 or (
                not self.counted and now < t1 + STALLED_WINDOW_SECONDS):
            if cpu0 is None and now >= t0:
                cpu0 = time.process_time()
            data = await reader.read(1 << 20)
            if not data:
                return {"error": "the chain closed the connection"}
            out = self.answered(data, counting=time.monotonic() >= t0, more=True)
            if out:
                writer.write(self.pack(out))
        window = time.monotonic() - t0
        cpu = time.process_time() - (cpu0 or time.process_time())
        # Let what is in flight be answered before leaving, then say so and
        # read until the chain closes its side: it keeps telling every peer
        # of every commit, and closing with those unread would reset the
        # connection under it (a warning in its log) rather than end it.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                while self.in_flight and (data := await reader.read(1 << 20)):
                    self.answered(data, counting=False, more=False)
                writer.write_eof()
                while await reader.read(1 << 20):
                    pass
        writer.close()
        if self.failed and not self.counted:
            return {"error": f"every append failed: {self.first_error}"}
        return {"rate": self.counted / window, "cpu": cpu, "failed": self.failed,
                "window": window}


async def _feeder() -> int:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    result = await _Feeder(json.loads(await stdin.readline())).run(stdin)
    tell_parent(result)
    return 1 if result.get("error") else 0


def _feeder_main() -> int:
    factory, _name = client_loop()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_feeder())


if __name__ == "__main__":
    sys.exit(_feeder_main())
