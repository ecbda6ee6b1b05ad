"""A bench stopped with SIGTERM (as `timeout` in bench/device.sh stops one)
stops what it started: its throwaway cluster and its gateway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.bench.command import REPO


def _carrying(marker: str) -> list[int]:
    """The processes whose environment holds ``marker``: a bench's
    children inherit it, the cluster's postmaster included, though
    pg_ctl leaves it no parent of the bench's."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.mark.parametrize("args", [
    # Through asyncio.Runner (peers.run_command), with a gateway beside the cluster.
    ("workers", "--workers", "1", "--protocols", "bson", "--seconds", "60", "--repeat", "1"),
    # Through asyncio.run, the cluster alone.
    ("core", "--seconds", "60", "--rounds", "1", "--clients", "2"),
])
def test_sigterm_stops_what_the_bench_started(args: tuple[str, ...], tmp_path: Path) -> None:
    name, value = "POLYPORT_TEST_BENCH_MARK", uuid.uuid4().hex
    marker = f"{name}={value}"
    err_path = tmp_path / "stderr"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench", *args], cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=err, env={**os.environ, name: value})
    try:
        deadline = time.monotonic() + 90
        # Measuring has begun once the cluster is up and the gateway or the
        # raw clients run: the clean-up then has the most to stop.
        started = "starting polyport serve" if args[0] == "workers" else "raw asyncpg"
        while started not in err_path.read_text():
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)
        time.sleep(1.0)
        assert len(_carrying(marker)) > 1  # the bench and what it started
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err_path.read_text()
    assert f"python -m bench {args[0]}: interrupted" in text
    assert "Traceback" not in text
    deadline = time.monotonic() + 10
    while (left := _carrying(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"still running after the bench: {left}"
