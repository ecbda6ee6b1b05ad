"""``python -m bench workers`` for a moment: both worker counts measured, the
table printed with the ratio and the CPU ceiling.  Checks the shape, not the
figures (speed is never asserted in a test)."""

from __future__ import annotations

import re

from tests.bench.command import bench


def test_workers_bench_prints_both_counts_with_ratio_and_ceiling() -> None:
    done = bench("workers", "--seconds", "0.3", "--repeat", "1", "--protocols", "bson",
                 "--publishers", "4", "--workers", "1,2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    rows = {
        int(m.group(1)): m.group(0)
        for m in re.finditer(r"^  bson +(\d) +[\d,]+ .*$", done.stdout, re.M)
    }
    assert set(rows) == {1, 2}, done.stdout
    one, two = rows[1].split(), rows[2].split()
    assert float(one[-1]) > 0  # the ceiling, on the reference row
    assert float(two[-1]) > 0  # the ratio against --workers 1
    assert float(two[3].replace(",", "")) > 0  # gateway cores were read at all


def test_a_bad_worker_list_is_one_line() -> None:
    done = bench("workers", "--workers", "1,1", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m bench workers: --workers: distinct positive integers, comma-separated"
    ]
