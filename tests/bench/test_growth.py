"""``python -m bench growth`` end to end on two tiny sizes: every figure
prints for polyport (and NATS when nats-server is installed), the growth
table follows, and bad sizes are one line.  Checks that figures are there
and positive, not what they are."""

from __future__ import annotations

import json

import pytest

from tests.bench.command import bench
from tests.bench.test_peers import HAVE_NATS

FIGURES = ("fill", "w1", "catch_up_all", "catch_up_one_ms", "last_n_ms", "bytes_per_event",
           "index_bytes_per_event", "rss_mib")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("analyze", ["--analyze", "--no-analyze"])
def test_growth_prints_every_figure_at_each_size(analyze: str) -> None:
    done = bench("growth", "--sizes", "1200,1500", "--seconds", "0.3", analyze,
                 env={"POLYPORT_BENCH_JSON": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "growth from 1,200 to 1,500 events" in done.stdout
    state = "ANALYZE before each size's reads" if analyze == "--analyze" else "never analyzed"
    assert state in done.stdout
    rows = json.loads(done.stdout.strip().splitlines()[-1])["rows"]
    assert [r["size"] for r in rows] == [1200, 1500]
    for r in rows:
        assert r["polyport"]["events"] >= r["size"]
        for name in FIGURES:
            assert r["polyport"][name] > 0, (name, r)
            if HAVE_NATS and name != "index_bytes_per_event":
                assert r["nats"][name] > 0, (name, r)


def test_bad_sizes_are_one_line() -> None:
    done = bench("growth", "--sizes", "5000,2000", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m bench growth: --sizes: rising integers from 1,100, comma-separated; "
        "--seconds >= 0"
    ]
