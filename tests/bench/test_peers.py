"""``python -m bench peers`` end to end for a moment: raw PostgreSQL, NATS
(when nats-server is installed) and polyport over BSON, every workload, tiny
durations.  Checks the tables print with positive figures, not the figures."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tests.bench.command import bench

HAVE_NATS = Path("/usr/sbin/nats-server").exists() or shutil.which("nats-server") is not None


def test_peers_prints_every_table_with_positive_figures() -> None:
    done = bench("peers", "--seconds", "0.3", "--protocols", "bson", "--publishers", "4",
                 "--rate", "200", "--connections", "100", env={"POLYPORT_BENCH_JSON": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for title in ("W1 closed loop", "W2 pipelined", "W3 delivery", "RSS per idle connection"):
        assert title in done.stdout
    if not HAVE_NATS:
        assert "nats-server not found: apt-get install nats-server" in done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    want = {"raw", "bson", *(["nats"] if HAVE_NATS else [])}
    systems = {
        "w1": want,
        "w2": {"raw-tx", "raw-copy", *(want - {"raw"})},
        "w3": want,
    }
    total_server = 0.0
    for workload, rows in result["workloads"].items():
        assert {r["system"] for r in rows} == systems[workload]
        for r in rows:
            assert r["error"] is None, r
            assert r["value"] > 0, r
            if workload == "w3":
                assert r["p99"] >= r["value"] > 0, r
                # Every system here acknowledges each publish on its own.
                assert r["ack_p99"] >= r["ack_p50"] > 0, r
            assert all(c >= 0 for c in r["cores"].values()), r
            total_server += r["cores"]["pg"] + r["cores"]["gateway"] + r["cores"]["nats"]
    assert total_server > 0  # the /proc readings see the servers at all
    [rss] = result["rss"]
    assert rss["protocol"] == "bson" and rss["connections"] == 100
    assert rss["kib_per_connection"] > 0


def test_a_bad_option_is_one_line() -> None:
    done = bench("peers", "--protocols", "bson,telnet", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m bench peers: --protocols: unknown telnet (choose from res01, bson, "
        "reactivesocket, rsocket, micromsg2, segment)"
    ]


def test_a_baseline_install_is_measured_beside_this_tree() -> None:
    """--baseline: its rows ('base bson') beside this tree's, through its own
    gateway process, whose CPU is read as theirs.  This tree's own command
    stands in for an earlier install."""
    command = f"{sys.executable} -m polyport.gateway.cli.main"
    done = bench("peers", "--seconds", "0.3", "--protocols", "bson", "--publishers", "4",
                 "--workloads", "w1", "--baseline", command,
                 env={"POLYPORT_BENCH_JSON": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"baseline: {command}, on its own database" in done.stderr
    assert "  base bson " in done.stdout
    rows = json.loads(done.stdout.strip().splitlines()[-1])["workloads"]["w1"]
    by_system = {r["system"]: r for r in rows}
    assert {"bson", "base:bson"} <= set(by_system)
    for system in ("bson", "base:bson"):
        assert by_system[system]["value"] > 0 and by_system[system]["cores"]["gateway"] > 0


def test_baseline_rows_go_through_the_baseline_gateway() -> None:
    """A baseline that refuses the bench's 200-byte events (max_event_bytes
    100) fails its rows, and only its rows."""
    command = f"env POLYPORT_MAX_EVENT_BYTES=100 {sys.executable} -m polyport.gateway.cli.main"
    done = bench("peers", "--seconds", "0.3", "--protocols", "bson", "--publishers", "2",
                 "--workloads", "w1", "--baseline", command,
                 env={"POLYPORT_BENCH_JSON": "1"})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])["workloads"]["w1"]
    by_system = {r["system"]: r for r in rows}
    assert by_system["bson"]["error"] is None and by_system["bson"]["value"] > 0
    assert by_system["base:bson"]["error"] is not None
    assert "too_large" in by_system["base:bson"]["error"], by_system["base:bson"]
