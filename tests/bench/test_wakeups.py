"""``python -m bench wakeups`` for a moment: two real processes on a real
socket pair.  Checks the table's shape and that every figure was measured,
not the figures themselves (speed is never asserted in a test)."""

from __future__ import annotations

import os
import re

from bench.wakeups import Placement, measure, placements
from tests.bench.command import bench


def test_wakeups_prints_every_placement_with_measured_figures() -> None:
    done = bench("wakeups", "--seconds", "0.05", timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    row_line = re.compile(
        r"^  (one CPU|two CPUs, 1 ms apart|two CPUs|unpinned) +([\d,.]+ .*)$", re.M)
    rows = {m.group(1): m.group(2).split() for m in row_line.finditer(done.stdout)}
    expected = {"one CPU", "unpinned"}
    if len(os.sched_getaffinity(0)) > 1:
        expected |= {"two CPUs", "two CPUs, 1 ms apart"}
        assert "costs" in done.stdout.splitlines()[-1], done.stdout
    assert set(rows) == expected, done.stdout
    for label, row in rows.items():
        # round trips, us wall, us CPU initiator, responder, per wake-up
        assert len(row) == 5, (label, row)
        trips = int(row[0].replace(",", ""))
        assert trips >= 100, (label, row)
        assert all(float(v) > 0 for v in row[1:]), (label, row)
    timer = re.search(r"^  a 1 ms sleep \(timer\) +([\d,]+) +([\d.]+) +([\d.]+)$",
                      done.stdout, re.M)
    assert timer is not None and float(timer.group(2)) > 0, done.stdout


def test_the_responder_counts_its_own_cpu_and_the_affinity_is_restored() -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    r = measure(Placement("one CPU", cpu, cpu), 0.02)
    assert r.round_trips >= 100
    # Both sides did the same work per round trip: neither clock is zero or
    # the other's.
    assert r.initiator_cpu_us > 0 and r.responder_cpu_us > 0
    assert os.sched_getaffinity(0) == before


def test_one_cpu_leaves_out_the_two_cpu_rows() -> None:
    assert [p.label for p in placements([3])] == ["one CPU", "unpinned"]
    assert [p.responder_cpu for p in placements([0, 5])][:3] == [0, 5, 5]


def test_wakeups_refuses_bad_options_in_one_line() -> None:
    done = bench("wakeups", "--seconds", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == "python -m bench wakeups: --seconds: a positive number"
