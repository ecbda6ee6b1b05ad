"""``polyport serve --workers N`` against ``--workers 1``, in one run: issue
19's acceptance 3 (W1 at least 1.3x with two workers) as a command.

For each repeat, every worker count in turn (rotating the order) gets a fresh
``polyport serve`` on the same throwaway cluster (fsync on), and W1 runs
through each protocol: N closed-loop publishers, each on its own connection,
each awaiting its acknowledgement (``bench.peers``'s W1, same clients).  The
medians are printed with the CPU cores each party used: the gateway's
process tree, PostgreSQL's, and this client process.

The last column answers whether more workers *could* help on this machine.
At ``--workers 1`` the gateway, PostgreSQL and the client together used T of
the machine's C cores for E events/s; if more workers cost nothing extra per
event, the machine runs out of CPU at ``C / T`` times the one-worker rate.
A target above that ceiling cannot be met on this machine by any worker
design; only less CPU per event (or more cores) moves it.

Events per commit is the batches' mean size, counted from the rows
themselves (``bench.processes.commits_between``).  PostgreSQL's CPU per
event follows it: several writers taking turns on the head row, or a chain
whose queue is shared out between two batches in flight, make more, smaller
commits for the same events.

``--baseline COMMAND`` runs every worker count a second time under another
install's ``polyport`` (an earlier commit checked out with its own
virtualenv), on a database that install's own ``migrate`` made, in the same
rotation: before and after, side by side, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import zmq
import zmq.asyncio

from bench.common import (
    BASELINE_HELP,
    baseline_command,
    baseline_database,
    bench_cluster,
    fresh_database,
)
from bench.peers import (
    PROTOCOLS,
    BenchError,
    Env,
    Meter,
    Roots,
    ServeProcess,
    _choices,
    add_client_processes,
    client_loop,
    one_line,
    run_command,
    say,
    w1,
)
from bench.processes import (
    ProcessMeter,
    ProcessShare,
    appended,
    commits_between,
    head_position,
    roles,
)
from polyport.core import migrate
from polyport.gateway.config import CPU_SCHEDULINGS, GatewayConfig
from polyport.gateway.process.supervisor import chain_mode

DEFAULT_PROTOCOLS = ("bson", "micromsg2")


# How workers commit (the gateway's commit_chain setting) -> the table's label.
CHAIN_LABELS = {"process": "chain", "worker": "hosted", "off": "own"}
# A setup's cpu_scheduling in its label (the column is 16 wide).
POLICY_LABELS = {"normal": "", "batch": " batch", "forwarders": " fwd"}
CHAIN_SETS = {"on": ("auto",), "off": ("off",), "process": ("process",),
              "worker": ("worker",), "both": ("off", "auto"),
              "all": ("off", "process", "worker")}


@dataclass(frozen=True)
class Setup:
    """A worker count, where its commit chain runs (``commit_chain``: auto,
    process, worker or off) and the processes' ``cpu_scheduling``."""

    workers: int
    chain: str = "auto"
    scheduling: str = "normal"
    # Served by the --baseline install (its own defaults) instead of this tree.
    baseline: bool = False

    @property
    def mode(self) -> str:
        """The chain as the gateway will run it on this machine."""
        return chain_mode(GatewayConfig(workers=self.workers, commit_chain=self.chain))

    @property
    def label(self) -> str:
        if self.baseline:
            return f"base {self.workers}"
        chain = "" if self.workers == 1 else f" {CHAIN_LABELS[self.mode]}"
        policy = POLICY_LABELS.get(self.scheduling, f" {self.scheduling}")
        return f"{self.workers}{chain}{policy}"


@dataclass
class Run:
    protocol: str
    setup: Setup
    events: float
    cores: dict[str, float]
    # Each gateway process's share of the run (bench/processes.py).
    processes: list[ProcessShare] = field(default_factory=list)
    # The gateway's commits per second (bench/processes.py, commits_between).
    commits: float = 0.0

    @property
    def per_commit(self) -> float:
        """Acknowledged events per commit: the batches' mean size."""
        return self.events / self.commits if self.commits else 0.0

    @property
    def total(self) -> float:
        return sum(self.cores.get(k, 0.0) for k in ("gateway", "pg", "client"))


def plan_setups(workers: list[int], chain: str, schedulings: list[str],
                baseline: bool = False) -> list[Setup]:
    """Every worker count with every chain of ``--chain`` (one worker has
    none) and every policy of ``--cpu-scheduling``, in that order; then,
    with a baseline, every worker count under it."""
    return [Setup(w, c, s) for w in workers for s in schedulings
            for c in (("off",) if w == 1 else CHAIN_SETS[chain])] + (
        # The baseline's own default chain (auto), as the table says: "off"
        # here once made every "base N" commit from each worker on its own.
        [Setup(w, "auto", baseline=True) for w in workers] if baseline else [])


def _median(runs: list[Run]) -> Run:
    first = runs[0]
    by_role: dict[str, list[ProcessShare]] = {}
    for r in runs:
        for ps in r.processes:
            by_role.setdefault(ps.role, []).append(ps)
    return Run(
        first.protocol, first.setup,
        statistics.median(r.events for r in runs),
        {k: statistics.median(r.cores.get(k, 0.0) for r in runs)
         for k in ("gateway", "pg", "client", "chain")},
        [_median_share(role, got) for role, got in sorted(by_role.items())],
        statistics.median(r.commits for r in runs),
    )


def _median_share(role: str, got: list[ProcessShare]) -> ProcessShare:
    """One process role's runs, field by field."""
    med = statistics.median
    return ProcessShare(role, med(p.events for p in got), med(p.cores for p in got),
                        med(p.system for p in got), med(p.voluntary for p in got),
                        med(p.involuntary for p in got))


async def _one_gateway(pg_url: str, root: Path, setup: Setup, protocols: list[str],
                       args: argparse.Namespace, roots: Roots,
                       zmq_ctx: zmq.asyncio.Context, label: str) -> list[Run]:
    workers = setup.workers
    gateway = ServeProcess(root / f"gateway-{label}", pg_url, protocols, workers, setup.mode,
                           setup.scheduling, args.baseline if setup.baseline else ())
    if setup.baseline:
        say(f"[{label}] starting the baseline's polyport serve --workers {workers}...")
    else:
        say(f"[{label}] starting polyport serve --workers {workers}"
            f"{'' if workers == 1 else ' (commit chain: ' + setup.mode + ')'}, "
            f"CPU scheduling {setup.scheduling}...")
    # The baseline's workers are not split: an older gateway may lack the
    # per-worker /status sockets the split reads.
    split = workers > 1 and not setup.baseline
    await gateway.start()
    roots.gateway = gateway.pid
    env = Env("", gateway, None, zmq_ctx, roots, args.client_processes)
    runs: list[Run] = []
    # Each worker's /status socket (gateway/process/workers.py).
    run_dir = gateway.run_dir
    stats: asyncpg.Connection | None = None
    try:
        # Counts the commits (commits_between); idle otherwise.
        stats = await asyncpg.connect(migrate.asyncpg_dsn(pg_url))
        for p in protocols:
            meter = ProcessMeter(roots, roles(gateway.pid, setup.mode == "worker", workers)
                                 if split or workers == 1 else {})
            async with asyncio.timeout(2 * args.seconds + 300):
                # A short warm-up: connections, prepared statements, caches.
                await w1(env, Meter(roots), p, args.publishers, min(1.0, args.seconds))
                before = await appended(run_dir, p) if split else {}
                first = await head_position(stats)
                got = await w1(env, meter, p, args.publishers, args.seconds)
                # w1 returns once every publisher's last append is answered.
                last = await head_position(stats)
                commits = await commits_between(stats, first, last) / max(meter.wall, 1e-9)
                after = await appended(run_dir, p) if split else {}
                shares = meter.shares(before, after, got)
            runs.append(Run(p, setup, got, meter.cores, shares, commits))
            say(f"  [{label}] {p}, --workers {setup.label}: {got:,.0f} events/s (cores: gateway "
                f"{meter.cores['gateway']:.2f}, PostgreSQL {meter.cores['pg']:.2f}, client "
                f"{meter.cores['client']:.2f})")
    finally:
        if stats is not None:
            await stats.close()
        await gateway.stop()
        roots.gateway = None
    return runs


def _first_setups(setups: list[Setup]) -> dict[bool, Setup]:
    """Each tree's reference setup, keyed by ``Setup.baseline``: its first."""
    return {s.baseline: s for s in reversed(setups)}


def _table(rows: list[Run], args: argparse.Namespace) -> None:
    cpus = os.cpu_count() or 1
    first = args.setups[0]
    # Each tree's rows against its own first setup (the baseline's: its
    # first worker count).
    firsts = _first_setups(args.setups)
    base = {(r.protocol, r.setup.baseline): r for r in rows if r.setup in firsts.values()}
    print(f"\nW1 closed loop, {args.publishers} publishers in {args.client_processes} client "
          f"process(es), by worker count (median of {args.repeat} run(s) of "
          f"{args.seconds:g} s, the worker counts alternating); {cpus} CPUs")
    print(f"  {'protocol':<15} {'workers':>16} {'events/s':>10} {'gateway':>8} {'chain':>6} "
          f"{'PG':>6} {'client':>7} {'total':>6} {'us CPU':>7} {'events':>7} {'ratio':>6} "
          f"{'CPU/ev':>7} {'ceiling':>8} {'chain':>8}")
    print(f"  {'':<15} {'':>16} {'':>10} {'cores':>8} {'cores':>6} {'cores':>6} {'cores':>7} "
          f"{'cores':>6} {'/event':>7} {'/commit':>7} {'':>6} {'ratio':>7} {'':>8} "
          f"{'max ev/s':>8}")
    for r in rows:
        b = base[(r.protocol, r.setup.baseline)]
        per_event = r.total / r.events * 1e6 if r.events else float("nan")
        b_per_event = b.total / b.events * 1e6 if b.events else float("nan")
        ratio = r.events / b.events if b.events else float("nan")
        is_first = r.setup == firsts[r.setup.baseline]
        ceiling = f"{cpus / b.total:.2f}" if is_first and b.total else ""
        chain = r.cores.get("chain", 0.0)
        chain_max = f"{r.events / chain:,.0f}" if chain > 0.01 else ""
        print(f"  {r.protocol:<15} {r.setup.label:>16} {r.events:>10,.0f} "
              f"{r.cores['gateway']:>8.2f} {chain:>6.2f} {r.cores['pg']:>6.2f} "
              f"{r.cores['client']:>7.2f} "
              f"{r.total:>6.2f} {per_event:>7.0f} {r.per_commit:>7.1f} "
              f"{'' if is_first else f'{ratio:.2f}':>6} "
              f"{'' if is_first else f'{per_event / b_per_event:.2f}':>7} {ceiling:>8} "
              f"{chain_max:>8}")
    print("  workers: 'N chain' = N workers feeding one commit chain process "
          "(POLYPORT_COMMIT_CHAIN=process); 'N hosted' = the chain inside the last worker "
          "(=worker); 'N own' = each worker commits itself (=off, the design before issue 26); "
          "the default (auto) is a process when the machine has more cores than workers")
    print("  batch: the gateway's processes under SCHED_BATCH (POLYPORT_CPU_SCHEDULING=batch); "
          "fwd: only the workers that forward to a commit chain (=forwarders); without "
          "either, the default policy")
    print(f"  ratio: events/s against --workers {first.label}; CPU/ev ratio: CPU per event "
          f"(gateway + PG + client) against --workers {first.label}")
    print("  events/commit: acknowledged events per commit that stored any (the distinct "
          "transaction ids of the run's rows): the batches' mean size")
    print("  chain cores: the commit chain process's share of the gateway's; chain max "
          "ev/s: events/s it could carry at one full core with that CPU per event")
    print(f"  ceiling: {cpus} cores / total cores at --workers {first.label}: the most "
          "any number of workers could reach here if they cost no extra CPU per event")
    if args.baseline:
        print(f"  base N: the baseline ({' '.join(args.baseline)}) with N workers, its "
              "defaults; its ratios against its own first worker count")
        _baseline_table(rows)
    _process_table(rows, args)


def _baseline_table(rows: list[Run]) -> None:
    """This tree's setups against the baseline's with as many workers."""
    bases = {(r.protocol, r.setup.workers): r for r in rows if r.setup.baseline}
    print("\nAgainst the baseline, same protocol and worker count (this run)")
    print(f"  {'protocol':<15} {'workers':>16} {'events/s':>10} {'base':>10} {'ratio':>6} "
          f"{'us CPU/ev':>10} {'base':>6} {'ratio':>6}")
    for r in rows:
        b = bases.get((r.protocol, r.setup.workers))
        if r.setup.baseline or b is None or not (r.events and b.events):
            continue
        now, then = r.total / r.events * 1e6, b.total / b.events * 1e6
        print(f"  {r.protocol:<15} {r.setup.label:>16} {r.events:>10,.0f} {b.events:>10,.0f} "
              f"{r.events / b.events:>6.2f} {now:>10.0f} {then:>6.0f} {now / then:>6.2f}")
    print("  us CPU/ev: gateway + PostgreSQL + client CPU per event, as above")


def paired_ratios(firsts: list[Run], others: list[Run]) -> tuple[list[float], list[float]]:
    """Per round, a setup's events/s and CPU per event against its tree's
    first setup in the same round: (events ratios, CPU per event ratios).
    The two ran minutes apart at most, on the machine as it then was; the
    ratio of the medians pairs runs from different rounds."""
    events: list[float] = []
    cpu: list[float] = []
    for first, other in zip(firsts, others, strict=False):
        if first.events and other.events and first.total:
            events.append(other.events / first.events)
            cpu.append((other.total / other.events) / (first.total / first.events))
    return events, cpu


def _paired_table(runs: dict[tuple[str, Setup], list[Run]], args: argparse.Namespace) -> None:
    """Each setup against its tree's first, round by round (see paired_ratios)."""
    if args.repeat < 2:
        return
    firsts = _first_setups(args.setups)
    print(f"\nRound by round: each setup against its tree's first setup in the same "
          f"round (median, lowest-highest of {args.repeat})")
    print(f"  {'protocol':<15} {'workers':>16} {'events/s ratio':>20} {'CPU/ev ratio':>20}")
    for p in args.protocols:
        for setup in args.setups:
            first = firsts[setup.baseline]
            if setup == first:
                continue
            events, cpu = paired_ratios(runs[(p, first)], runs[(p, setup)])
            if not events:
                continue
            print(f"  {p:<15} {setup.label:>16} {_spread(events):>20} {_spread(cpu):>20}")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _process_table(rows: list[Run], args: argparse.Namespace) -> None:
    """Each gateway process of every run."""
    split = [r for r in rows if r.processes]
    if not split:
        return
    print(f"\nEach process of the gateway (median of {args.repeat} run(s))")
    print(f"  {'protocol':<15} {'workers':>16} {'process':<17} {'events':>7} {'cores':>6} "
          f"{'us CPU':>7} {'kernel':>6} {'waits':>6} {'preempted':>9}")
    print(f"  {'':<15} {'':>16} {'':<17} {'':>7} {'':>6} {'/event':>7} {'':>6} {'/event':>6} "
          f"{'/event':>9}")
    for r in split:
        for ps in r.processes:
            print(f"  {r.protocol:<15} {r.setup.label:>16} {ps.role:<17} {ps.events:>7.0%} "
                  f"{ps.cores:>6.2f} {ps.us_per_event(r.events):>7.0f} {ps.system:>6.0%} "
                  f"{ps.voluntary:>6.2f} "
                  f"{ps.involuntary:>9.2f}")
    print("  events: the process's share of the events (each worker's own /status; the chain "
          "process commits every event); us CPU, waits (voluntary context switches) and "
          "preempted (involuntary ones): per event of its own; kernel: the part of its CPU "
          "spent in the kernel (system time)")


async def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="polyport-workers-", dir="/tmp"))
    root.chmod(0o755)
    zmq_ctx = zmq.asyncio.Context()
    zmq_ctx.set(zmq.MAX_SOCKETS, 8192)
    runs: dict[tuple[str, Setup], list[Run]] = {}
    try:
        async with bench_cluster() as pg:
            url = await fresh_database(pg)
            # The baseline's own database, under its own migrations.
            base_url = await baseline_database(pg, args.baseline) if args.baseline else url
            roots = Roots(pg=int((pg.pgdata / "postmaster.pid").read_text().split()[0]))
            say(f"bench workers: {os.cpu_count()} CPUs, load average "
                f"{os.getloadavg()[0]:.2f} at start")
            setups: list[Setup] = args.setups
            for rep in range(args.repeat):
                k = rep % len(setups)
                for setup in setups[k:] + setups[:k]:
                    label = f"{rep + 1}/{args.repeat}"
                    for r in await _one_gateway(base_url if setup.baseline else url, root,
                                                setup, args.protocols, args, roots, zmq_ctx,
                                                label):
                        runs.setdefault((r.protocol, setup), []).append(r)
    finally:
        zmq_ctx.destroy(linger=0)
        shutil.rmtree(root, ignore_errors=True)
    _table([_median(runs[(p, s)]) for p in args.protocols for s in args.setups], args)
    _paired_table(runs, args)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench workers",
        description="W1 through polyport serve --workers N against --workers 1, in one run")
    p.add_argument("--workers", default="1,2",
                   help="worker counts, comma-separated; the first is the reference "
                        "(default 1,2)")
    p.add_argument("--protocols", default=",".join(DEFAULT_PROTOCOLS),
                   help=f"comma-separated, from {','.join(PROTOCOLS)} "
                        f"(default {','.join(DEFAULT_PROTOCOLS)})")
    p.add_argument("--publishers", type=int, default=32, help="W1 publishers (default 32)")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--chain", choices=tuple(CHAIN_SETS), default="both",
                   help="for counts above 1: workers feed the commit chain where the "
                        "gateway's default puts it (on), a chain process (process), the "
                        "chain in a worker (worker), or commit each on their own (off); "
                        "both = off and on, all = off, process and worker (default both)")
    p.add_argument("--repeat", type=int, default=3,
                   help="alternating runs per worker count; medians reported (default 3)")
    p.add_argument("--cpu-scheduling", default="normal",
                   help="the gateway's cpu_scheduling, comma-separated to compare: normal "
                        "(the default), batch, forwarders; every worker count runs under each")
    p.add_argument("--baseline", metavar="COMMAND", default="",
                   help=BASELINE_HELP + "; every worker count runs under it too, and a "
                        "table compares the two")
    add_client_processes(p)
    args = p.parse_args(argv)
    try:
        args.protocols = _choices(args.protocols, PROTOCOLS, "--protocols")
        args.workers = [int(x) for x in args.workers.split(",") if x.strip()]
        if not args.protocols:
            raise BenchError("--protocols: name at least one protocol")
        if not args.workers or min(args.workers) < 1 or len(set(args.workers)) != len(
                args.workers):
            raise BenchError("--workers: distinct positive integers, comma-separated")
        if min(args.repeat, args.publishers, args.client_processes) < 1 or args.seconds <= 0:
            raise BenchError("--seconds, --repeat, --publishers and --client-processes must "
                             "be positive")
        schedulings = _choices(args.cpu_scheduling, CPU_SCHEDULINGS, "--cpu-scheduling")
        if not schedulings:
            raise BenchError("--cpu-scheduling: name at least one of "
                             f"{', '.join(CPU_SCHEDULINGS)}")
        args.baseline = baseline_command(args.baseline)
        args.setups = plan_setups(args.workers, args.chain, schedulings, bool(args.baseline))
    except (BenchError, ValueError) as exc:
        print(f"python -m bench workers: {one_line(exc)}", file=sys.stderr)
        return 2
    factory, _name = client_loop()
    return run_command("python -m bench workers", factory, lambda: run(args))
