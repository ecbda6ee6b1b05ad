"""``python -m bench commits`` for a moment: both statements on one and two
connections, each run's log checked gapless by the bench itself.  Checks
the shape, not the figures (speed is never asserted in a test)."""

from __future__ import annotations

import re

from tests.bench.command import bench


def test_commits_bench_prints_both_statements_per_connection_count() -> None:
    done = bench("commits", "--connections", "1,2", "--events", "8", "--seconds", "0.3")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    rows = {int(m.group(1)): m.group(2).split()
            for m in re.finditer(r"^ +(\d) +([\d,]+ .*)$", done.stdout, re.M)}
    assert set(rows) == {1, 2}, done.stdout
    for row in rows.values():
        # head first: events/s, PG, client; planned: events/s, PG, client; refused; ratio
        assert len(row) == 8, row
        head_first, planned = float(row[0].replace(",", "")), float(row[3].replace(",", ""))
        assert head_first > 0 and planned > 0, row
        assert float(row[1]) > 0 and float(row[4]) > 0, row  # PostgreSQL's CPU read
        assert int(row[6]) >= 0 and float(row[7]) > 0, row


def test_commits_bench_refuses_bad_options_in_one_line() -> None:
    done = bench("commits", "--connections", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == ("python -m bench commits: --connections: positive "
                                   "integers, comma-separated")
