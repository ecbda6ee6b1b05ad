"""``python -m bench workers`` for a moment: both worker counts measured, the
table printed with the ratio and the CPU ceiling.  Checks the shape, not the
figures (speed is never asserted in a test)."""

from __future__ import annotations

import re

from tests.bench.command import bench


def test_workers_bench_prints_both_counts_with_ratio_and_ceiling() -> None:
    done = bench("workers", "--seconds", "0.3", "--repeat", "1", "--protocols", "bson",
                 "--publishers", "4", "--workers", "1,2", "--client-processes", "1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    rows = {
        m.group(1): m.group(2).split()
        for m in re.finditer(r"^  bson +(1|2 own|2 chain) +[\d,]+ +(.*)$", done.stdout, re.M)
    }
    # --workers 2 twice: each worker committing itself, and through the chain.
    assert set(rows) == {"1", "2 own", "2 chain"}, done.stdout
    one, own, chain = rows["1"], rows["2 own"], rows["2 chain"]
    # gateway, chain, PG, client, total, us/event, then ratio and CPU ratio
    # (not on the reference row), the ceiling (only there), the chain's max.
    assert len(one) == 7 and float(one[-1]) > 0  # the ceiling, on the reference row
    assert float(one[1]) == 0  # no chain process at one worker
    assert len(own) == 8 and float(own[6]) > 0 and float(own[7]) > 0
    assert float(own[1]) == 0
    assert len(chain) == 9 and float(chain[6]) > 0
    assert float(chain[1]) > 0  # the chain's cores were read at all
    assert float(chain[8].replace(",", "")) > 0  # and what it could carry
    assert float(one[0]) > 0  # gateway cores were read at all


def test_a_bad_worker_list_is_one_line() -> None:
    done = bench("workers", "--workers", "1,1", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m bench workers: --workers: distinct positive integers, comma-separated"
    ]
