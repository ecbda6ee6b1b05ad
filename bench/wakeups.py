"""``python -m bench wakeups``: what it costs this machine to wake one process
from another, the price every hop between processes pays.

A request to polyport crosses processes several times (client → worker;
with several workers, worker → commit chain → worker; worker → PostgreSQL
and back; worker → subscriber), and each crossing wakes a process that was
blocked.  How much CPU and time a wake-up costs is a property of the
machine, not of polyport: on the 2-vCPU virtual machines most of
docs/performance.md was measured on, a wake-up from the other CPU cost
several times what one on the same CPU did, and more again when the woken
CPU had been idle.  This bench measures it without polyport or PostgreSQL,
so that figures from two machines (`bench workers`' "waits /event" column,
say) can be read against each machine's own price.

Two processes bounce one byte over a unix socket pair, blocking on each
read, in four placements: both pinned to one CPU, pinned to two CPUs, on
two CPUs with a pause between round trips (the other CPU idles, as at light
load), and wherever the scheduler puts them.  A last row prices a timer
wake-up: the CPU a 1 ms sleep costs the sleeper.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass

from bench.common import say

# Control bytes on the socket pair: a round trip, the start and the end of
# the measured window (the responder answers both with its CPU clock).
PING = b"p"
MARK = b"m"
QUIT = b"q"
WARMUP_ROUND_TRIPS = 200
GAP_SECONDS = 0.001


@dataclass(frozen=True, slots=True)
class Placement:
    label: str
    initiator_cpu: int | None
    responder_cpu: int | None
    gap: float = 0.0


@dataclass(frozen=True, slots=True)
class Result:
    placement: Placement
    round_trips: int
    wall_us: float  # per round trip, from send to answer
    initiator_cpu_us: float  # per round trip
    responder_cpu_us: float  # per round trip


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _respond(sock: socket.socket, cpu: int | None) -> None:
    """The woken side: answer every byte; at each mark, its CPU clock."""
    _pin(cpu)
    while True:
        b = sock.recv(1)
        if b == PING:
            sock.send(PING)
        elif b == MARK:
            sock.send(struct.pack("!q", time.process_time_ns()))
        else:  # QUIT, or the initiator gone
            return


def _mark(sock: socket.socket) -> int:
    sock.send(MARK)
    data = b""
    while len(data) < 8:
        chunk = sock.recv(8 - len(data))
        if not chunk:
            raise RuntimeError("the responding process left")
        data += chunk
    value: int = struct.unpack("!q", data)[0]
    return value


def measure(placement: Placement, seconds: float) -> Result:
    """Round trips for ``seconds`` (at least 100) in one placement."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        mine.close()
        try:
            _respond(theirs, placement.responder_cpu)
        finally:
            os._exit(0)
    theirs.close()
    before = os.sched_getaffinity(0)
    try:
        _pin(placement.initiator_cpu)
        for _ in range(WARMUP_ROUND_TRIPS):
            mine.send(PING)
            mine.recv(1)
        theirs_started = _mark(mine)
        cpu_started = time.process_time_ns()
        clock = time.perf_counter
        deadline = clock() + seconds
        n = 0
        wall = 0.0  # the round trips' own, not the pauses' (a sleep overruns)
        while n < 100 or clock() < deadline:
            sent = clock()
            mine.send(PING)
            mine.recv(1)
            wall += clock() - sent
            n += 1
            if placement.gap:
                time.sleep(placement.gap)
        cpu = time.process_time_ns() - cpu_started
        theirs_cpu = _mark(mine) - theirs_started
        mine.send(QUIT)
    finally:
        os.sched_setaffinity(0, before)
        mine.close()
        os.waitpid(pid, 0)
    return Result(
        placement, n,
        wall_us=wall / n * 1e6,
        initiator_cpu_us=cpu / n / 1000,
        responder_cpu_us=theirs_cpu / n / 1000,
    )


def timer_wakeup_cpu_us(seconds: float) -> tuple[int, float]:
    """CPU per 1 ms sleep, the sleeper's: a wake-up with no other process.
    Bounded by time, not count: where timers are coarse a sleep takes
    longer than asked."""
    n = 0
    started = time.process_time_ns()
    deadline = time.perf_counter() + seconds
    while n < 100 or time.perf_counter() < deadline:
        time.sleep(GAP_SECONDS)
        n += 1
    return n, (time.process_time_ns() - started) / n / 1000


def placements(cpus: list[int]) -> list[Placement]:
    a = cpus[0]
    rows = [Placement("one CPU", a, a)]
    if len(cpus) > 1:
        b = cpus[1]
        rows += [
            Placement("two CPUs", a, b),
            Placement(f"two CPUs, {GAP_SECONDS * 1000:g} ms apart", a, b, GAP_SECONDS),
        ]
    rows.append(Placement("unpinned", None, None))
    return rows


def run(seconds: float) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    print(f"bench wakeups: {len(cpus)} CPU(s) this process may use; "
          f"pinned rows use CPU {cpus[0]}" + (f" and CPU {cpus[1]}" if len(cpus) > 1 else ""))
    if len(cpus) < 2:
        print("  one CPU only: the two-CPU rows are left out")
    print("Two processes bounce one byte over a unix socket pair, each blocking on its read "
          f"(each row {seconds:g} s)")
    print(f"  {'placement':<24} {'round trips':>11} {'us wall':>9} {'us CPU':>9} {'us CPU':>9}"
          f" {'us CPU per':>11}")
    print(f"  {'':<24} {'':>11} {'/trip':>9} {'initiator':>9} {'responder':>9}"
          f" {'wake-up':>11}")
    results: dict[str, Result] = {}
    for placement in placements(cpus):
        say(f"  measuring {placement.label}...")
        r = measure(placement, seconds)
        results[placement.label] = r
        # Each side sleeps in its read and is woken once per round trip.
        per_wake = (r.initiator_cpu_us + r.responder_cpu_us) / 2
        print(f"  {placement.label:<24} {r.round_trips:>11,} {r.wall_us:>9.1f}"
              f" {r.initiator_cpu_us:>9.1f} {r.responder_cpu_us:>9.1f} {per_wake:>11.1f}")
    n, timer = timer_wakeup_cpu_us(seconds)
    print(f"  {'a 1 ms sleep (timer)':<24} {n:>11,} {'':>9} {timer:>9.1f} {'':>9} {timer:>11.1f}")
    print("  us wall /trip: a round trip's time, from the send to the answer; "
          "us CPU: each process's CPU time per round trip (in the paused row the "
          "initiator's includes its own timer wake-up)")
    one = results["one CPU"]
    two = results.get("two CPUs")
    if two is not None:
        ratio = ((two.initiator_cpu_us + two.responder_cpu_us)
                 / max(one.initiator_cpu_us + one.responder_cpu_us, 1e-9))
        print(f"A wake-up from another CPU costs {ratio:.1f}x the CPU of one on the same CPU "
              "here; every hop between processes pays it at both ends.")
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench wakeups",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=1.0,
                   help="length of each row's measurement (default 1)")
    args = p.parse_args(argv)
    if not args.seconds > 0:
        print("python -m bench wakeups: --seconds: a positive number", file=sys.stderr)
        return 2
    if not hasattr(os, "sched_setaffinity"):
        print("python -m bench wakeups: needs Linux (os.sched_setaffinity)", file=sys.stderr)
        return 2
    return run(args.seconds)
