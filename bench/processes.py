"""Each process of a ``polyport serve --workers N`` during one measurement:
its share of the events, its CPU (and how much of it the kernel's), and how
often it slept and was preempted.

``bench workers`` prints the gateway's cores as one figure; this splits them,
so that a run shows which process is the limit (the worker hosting the
commit chain, or the chain process) and what a worker costs per event of its
own.  On two cores it showed that a feeding worker's protocol path costs far
more per event than one worker's (docs/performance.md, session 17).

A worker's events are the ``events_appended`` of its own ``/status``, asked
over its unix socket in the supervisor's run directory (what the first
worker asks to aggregate); the CPU and context switches are read from
``/proc`` over the measured window.  Linux only, as the rest of the bench.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg

from bench.peers import (
    CHAIN_MODULE,
    TICK,
    Meter,
    Roots,
    _proc_table,
    _tree,
    parse_stat,
    stat_fields,
)
from polyport.core.sql import HEAD_POSITION

WORKER_MODULE = b"polyport.gateway.process.worker"
CHAIN = "chain"


@dataclass(frozen=True)
class Usage:
    """One process's counters at one moment."""

    cpu: float  # seconds
    # Of those, in the kernel (system calls, page faults): whether two
    # workers' extra CPU is the system calls of their extra wake-ups or the
    # interpreter running the same code slower (docs/performance.md, session 29).
    system: float
    voluntary: int  # context switches: it waited (a read, epoll)
    involuntary: int  # it was preempted


@dataclass(frozen=True)
class ProcessShare:
    """One process over a measurement."""

    role: str  # "worker 0", "worker 1 + chain", "chain"
    events: float  # its share of the events (the chain process: 1.0)
    cores: float
    system: float  # the kernel's share of its CPU, 0-1
    voluntary: float  # per event of its own
    involuntary: float

    def us_per_event(self, events_per_second: float) -> float:
        own = events_per_second * self.events
        return self.cores / own * 1e6 if own > 0 else float("nan")


def roles(root: int, hosted_chain: bool, workers: int) -> dict[int, str]:
    """pid -> role, for every worker and chain process under ``root`` (with
    one worker, ``root`` is that worker: ``serve`` without a supervisor)."""
    if workers == 1:
        return {root: "worker 0"}
    out: dict[int, str] = {}
    for pid in _tree(root, _proc_table()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if CHAIN_MODULE in argv:
            out[pid] = CHAIN
        elif WORKER_MODULE in argv and b"--index" in argv:
            index = int(argv[argv.index(b"--index") + 1])
            hosts = hosted_chain and index == workers - 1
            out[pid] = f"worker {index}{' + chain' if hosts else ''}"
    return out


def usage(pid: int) -> Usage | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
        _ppid, cpu = parse_stat(raw)
        voluntary = involuntary = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            status = Path(f"/proc/{pid}/task/{task}/status").read_text()
            voluntary += int(_field(status, "voluntary_ctxt_switches"))
            involuntary += int(_field(status, "nonvoluntary_ctxt_switches"))
    except (OSError, ValueError):
        return None  # gone meanwhile
    return Usage(cpu, system_seconds(raw), voluntary, involuntary)


def system_seconds(raw: bytes) -> float:
    """The kernel's part of :func:`~bench.peers.parse_stat`'s CPU seconds
    (stime and its reaped children's cstime)."""
    rest = stat_fields(raw)
    return (int(rest[12]) + int(rest[14])) / TICK


def _field(status: str, name: str) -> str:
    m = re.search(rf"^{name}:\s*(\d+)", status, re.M)
    if m is None:
        raise ValueError(name)
    return m.group(1)


# The commits that stored a run's events: each row carries the id of the
# transaction that inserted it (xmin), so the distinct ids over the run's
# positions count those commits exactly and at once, where pg_stat_database
# counts NOTIFYs and reads too and reaches the view up to a second late.
COMMITS_BETWEEN = ("SELECT count(DISTINCT xmin::text) FROM events "
                   "WHERE position > $1 AND position <= $2")


async def head_position(conn: asyncpg.Connection) -> int:
    """The log's last position."""
    return int(await conn.fetchval(HEAD_POSITION))


async def commits_between(conn: asyncpg.Connection, after: int, upto: int) -> int:
    """The commits that stored positions ``after`` + 1 to ``upto``."""
    return int(await conn.fetchval(COMMITS_BETWEEN, after, upto))


async def appended(run_dir: Path, protocol: str) -> dict[int, int]:
    """pid -> events appended through ``protocol``, from each worker's own
    ``/status``; empty when the run directory is not where it is expected."""
    out: dict[int, int] = {}
    for sock in sorted(run_dir.glob("worker-*.sock")):
        connector = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=connector) as session, session.get(
                "http://worker/status", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            doc = await resp.json()
        out[int(doc["pid"])] = sum(int(row.get("events_appended", 0))
                                   for row in doc["listeners"] if row["name"] == protocol)
    return out


class ProcessMeter(Meter):
    """A :class:`Meter` that also reads every gateway process over the same
    window."""

    def __init__(self, roots: Roots, processes: dict[int, str]) -> None:
        super().__init__(roots)
        self.processes = processes
        self._u0: dict[int, Usage] = {}
        self.usage: dict[int, Usage] = {}

    def _read(self) -> dict[int, Usage]:
        return {pid: u for pid in self.processes if (u := usage(pid)) is not None}

    def start(self) -> None:
        self._u0 = self._read()
        super().start()

    def stop(self) -> None:
        super().stop()
        u1 = self._read()
        self.usage = {pid: Usage(u.cpu - self._u0[pid].cpu, u.system - self._u0[pid].system,
                                 u.voluntary - self._u0[pid].voluntary,
                                 u.involuntary - self._u0[pid].involuntary)
                      for pid, u in u1.items() if pid in self._u0}

    def shares(self, before: dict[int, int], after: dict[int, int],
               events: float) -> list[ProcessShare]:
        """Each process's share, given its appended counts before and after
        the measurement and the events acknowledged in it (``events``/s)."""
        delta = {pid: after.get(pid, 0) - before.get(pid, 0) for pid in after}
        total = sum(delta.values())
        alone = sum(1 for role in self.processes.values() if role != CHAIN) == 1
        out = []
        for pid, role in sorted(self.processes.items(), key=lambda kv: kv[1]):
            u = self.usage.get(pid)
            if u is None:
                continue
            # The chain process, and a worker alone, see every event.
            whole = role == CHAIN or alone
            share = 1.0 if whole else (delta.get(pid, 0) / total if total else 0.0)
            own = events * self.wall * share
            out.append(ProcessShare(
                role, share, u.cpu / self.wall if self.wall else 0.0,
                u.system / u.cpu if u.cpu > 0 else 0.0,
                u.voluntary / own if own else float("nan"),
                u.involuntary / own if own else float("nan")))
        return out
