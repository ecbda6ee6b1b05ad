"""``python -m bench workers`` for a moment: both worker counts measured, the
table printed with the ratio and the CPU ceiling.  Checks the shape, not the
figures (speed is never asserted in a test)."""

from __future__ import annotations

import re
import sys

import pytest

from bench.peers import TICK, parse_stat
from bench.processes import system_seconds
from bench.workers import Run, Setup, paired_ratios, plan_setups
from tests.bench.command import bench


def test_workers_bench_prints_every_chain_mode_with_ratio_and_ceiling() -> None:
    done = bench("workers", "--seconds", "0.3", "--repeat", "1", "--protocols", "bson",
                 "--publishers", "4", "--workers", "1,2", "--client-processes", "2",
                 "--chain", "all")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    rows = {
        m.group(1): m.group(2).split()
        for m in re.finditer(r"^  bson +(1|2 own|2 chain|2 hosted) +[\d,]+ +(.*)$",
                             done.stdout, re.M)
    }
    # --workers 2 three times: each worker committing itself, through a
    # chain process, and through the chain hosted by a worker.
    assert set(rows) == {"1", "2 own", "2 chain", "2 hosted"}, done.stdout
    one, own, chain, hosted = rows["1"], rows["2 own"], rows["2 chain"], rows["2 hosted"]
    # gateway, chain, PG, client, total, us/event, events/commit, then ratio
    # and CPU ratio (not on the reference row), the ceiling (only there), the
    # chain's max.
    assert len(one) == 8 and float(one[-1]) > 0  # the ceiling, on the reference row
    assert float(one[1]) == 0  # no chain process at one worker
    for row in (own, hosted):  # no chain process of its own either
        assert len(row) == 9 and float(row[7]) > 0 and float(row[8]) > 0
        assert float(row[1]) == 0
    assert len(chain) == 10 and float(chain[7]) > 0
    assert float(chain[1]) > 0  # the chain's cores were read at all
    assert float(chain[9].replace(",", "")) > 0  # and what it could carry
    # Every run committed: at least one event per commit (a commit holds one
    # append or more), and no more than its four publishers had in flight.
    for row in (one, own, chain, hosted):
        assert 1.0 <= float(row[6]) <= 4.0, done.stdout
    assert float(one[0]) > 0  # gateway cores were read at all

    # Each process of every run: its share of the events (from each
    # worker's own /status), cores and CPU per event of its own.
    procs: dict[tuple[str, str], list[str]] = {
        (m.group(1), m.group(2)): m.group(3).split()
        for m in re.finditer(r"^  bson +(1|2 own|2 chain|2 hosted) (worker \d(?: \+ chain)?|chain)"
                             r" +(.*)$", done.stdout, re.M)
    }
    assert set(procs) == {("1", "worker 0"), ("2 own", "worker 0"), ("2 own", "worker 1"),
                          ("2 chain", "chain"), ("2 chain", "worker 0"),
                          ("2 chain", "worker 1"), ("2 hosted", "worker 0"),
                          ("2 hosted", "worker 1 + chain")}, done.stdout
    assert procs[("2 chain", "chain")][0] == "100%"
    assert procs[("1", "worker 0")][0] == "100%" and float(procs[("1", "worker 0")][1]) > 0
    for label in ("2 own", "2 chain", "2 hosted"):
        workers = [v for (lb, role), v in procs.items() if lb == label and role != "chain"]
        shares = [int(v[0].rstrip("%")) for v in workers]
        assert 99 <= sum(shares) <= 101, (label, done.stdout)  # every event counted once
        # cores, us CPU, the kernel's part, waits, preempted; four publishers
        # may all land on one worker (SO_REUSEPORT hashes them), leaving the
        # other idle.
        assert all(len(v) == 6 and float(v[1]) >= 0 for v in workers), done.stdout
        assert all(0 <= int(v[3].rstrip("%")) <= 100 for v in workers), done.stdout
        assert any(float(v[1]) > 0 for v in workers), done.stdout


def test_a_bad_worker_list_is_one_line() -> None:
    done = bench("workers", "--workers", "1,1", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m bench workers: --workers: distinct positive integers, comma-separated"
    ]


def test_every_worker_count_runs_under_each_policy() -> None:
    """--cpu-scheduling normal,batch: every worker count and chain under
    both policies; the first setup stays the reference."""
    got = [s.label for s in plan_setups([1, 2], "worker", ["normal", "batch"])]
    assert got == ["1", "1 batch", "2 hosted", "2 hosted batch"]
    assert plan_setups([2], "both", ["batch"]) == [Setup(2, "off", "batch"),
                                                    Setup(2, "auto", "batch")]


def test_a_baseline_install_runs_every_worker_count_beside_this_tree() -> None:
    """--baseline: the same worker counts served by another install's
    polyport command (here this tree's own, as a stand-in for an earlier
    checkout), on a database its own migrate made, and a table of this tree
    against it."""
    command = f"{sys.executable} -m polyport.gateway.cli.main"
    done = bench("workers", "--seconds", "0.3", "--repeat", "1", "--protocols", "bson",
                 "--publishers", "4", "--workers", "1", "--baseline", command)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"baseline: {command}, on its own database" in done.stderr
    main = {m.group(1): m.group(2).split()
            for m in re.finditer(r"^  bson +(1|base 1) +[\d,]+ +(.*)$", done.stdout, re.M)}
    assert set(main) == {"1", "base 1"}, done.stdout
    # Each is its own tree's reference row: no ratio, a ceiling.
    assert len(main["base 1"]) == 8 and float(main["base 1"][-1]) > 0, done.stdout
    versus = re.search(r"^Against the baseline.*\n.*\n  bson +1 +([\d,]+) +([\d,]+) +([\d.]+) "
                       r"+(\d+) +(\d+) +([\d.]+)$", done.stdout, re.M)
    assert versus is not None, done.stdout
    events, base_events, ratio = (float(versus.group(i).replace(",", "")) for i in (1, 2, 3))
    assert events > 0 and base_events > 0
    assert abs(ratio - events / base_events) < 0.01 + 0.01 * ratio


def test_a_baseline_that_is_not_polyport_is_one_line() -> None:
    done = bench("workers", "--workers", "1", "--baseline", "false", timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m bench workers: --baseline: its migrate upgrade failed (no message); "
        "check that false is a polyport command")
    missing = bench("workers", "--baseline", "/nonexistent/polyport", timeout=60)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "python -m bench workers: --baseline: /nonexistent/polyport is not an executable command"
    ]


def test_the_baseline_runs_every_worker_count_after_this_tree() -> None:
    got = [s.label for s in plan_setups([1, 2], "worker", ["normal"], baseline=True)]
    assert got == ["1", "2 hosted", "base 1", "base 2"]


def test_the_baseline_commits_through_its_default_chain() -> None:
    """Each "base N" runs with commit_chain auto, as this tree's default
    does: not every worker committing on its own."""
    base = [s for s in plan_setups([1, 2], "worker", ["normal"], baseline=True) if s.baseline]
    assert [s.chain for s in base] == ["auto", "auto"]
    assert base[1].mode == Setup(2).mode


def test_setups_are_compared_round_by_round() -> None:
    """Each round's run against the first setup's run of the same round:
    a machine that slows down between rounds moves both."""
    one, two = Setup(1), Setup(2)
    cores = {"gateway": 0.5, "pg": 0.25, "client": 0.25}  # 1.0 in all

    def run(setup: Setup, events: float, total: float = 1.0) -> Run:
        return Run("bson", setup, events, {k: v * total for k, v in cores.items()})

    firsts = [run(one, 1000), run(one, 500)]
    others = [run(two, 1100, 1.1), run(two, 450, 1.2)]
    events, cpu = paired_ratios(firsts, others)
    assert events == pytest.approx([1.1, 0.9])
    assert cpu == pytest.approx([1.0, 1.2 / 0.9])
    # A round in which either measured nothing is left out.
    assert paired_ratios([run(one, 0)], [run(two, 100)]) == ([], [])


def test_the_kernel_part_of_a_process_cpu_is_its_stime() -> None:
    # /proc/PID/stat with a command name holding a space and parentheses:
    # utime 700, stime 300, cutime 20, cstime 10 ticks (fields 14-17).
    fields = ["S", "1", "2", "2", "0", "-1", "4194560", "100", "0", "0", "0",
              "700", "300", "20", "10", "20", "0", "1", "0", "123"]
    raw = b"4242 (poly (port) x) " + " ".join(fields).encode()
    ppid, cpu = parse_stat(raw)
    assert ppid == 1
    assert cpu == pytest.approx((700 + 300 + 20 + 10) / TICK)
    assert system_seconds(raw) == pytest.approx((300 + 10) / TICK)
