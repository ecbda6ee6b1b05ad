"""``python -m bench chain`` for a moment: the chain process of a real
gateway fed on its socket by two feeder processes.  Checks the shape and
that every append was answered, not the figures (speed is never asserted
in a test)."""

from __future__ import annotations

import re

from tests.bench.command import bench


def test_chain_bench_feeds_the_chain_and_prints_its_cost_per_event() -> None:
    done = bench("chain", "--feeders", "1,2", "--seconds", "0.5", "--outstanding", "8")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    # Feeders wait for their answers before leaving: the chain never
    # writes into a closed connection.
    assert "connection failed" not in done.stderr, done.stderr
    rows = {int(m.group(1)): m.group(2).split()
            for m in re.finditer(r"^ +(\d) +([\d,]+ .*)$", done.stdout, re.M)}
    assert set(rows) == {1, 2}, done.stdout
    for row in rows.values():
        # events/s, chain cores, us/event, chain max, workers, PG, feeders, failed
        assert len(row) == 8, row
        rate, chain, us, ceiling = (float(v.replace(",", "")) for v in row[:4])
        assert rate > 0 and chain > 0 and us > 0 and ceiling > 0, row
        assert float(row[5]) > 0 and float(row[6]) > 0, row  # PG and feeders read
        assert row[7] == "0", row  # no append failed


def test_chain_bench_refuses_bad_options_in_one_line() -> None:
    done = bench("chain", "--feeders", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == "python -m bench chain: --feeders: positive integers, " \
                                  "comma-separated"
