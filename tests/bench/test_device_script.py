"""bench/device.sh runs on a lent machine as one command of at most 600 s,
after .devbench/run has installed the wheels and this checkout (about 25 s):
its benches' limits and the starting point's install must leave that room,
and the script must parse."""

from __future__ import annotations

import re
import shutil
import subprocess

from tests.bench.command import REPO

SCRIPT = REPO / "bench" / "device.sh"
DEVICE_LIMIT = 600
DEVBENCH_INSTALLS = 25


def test_the_device_script_fits_in_one_device_command() -> None:
    text = SCRIPT.read_text()
    limits = [int(m.group(1)) for m in re.finditer(r"^(?:\S+=\S+ )?run \S+ (\d+) ", text, re.M)]
    assert len(limits) >= 6, limits
    installs = [int(m.group(1)) for m in re.finditer(r"timeout (\d+) \"\$py\" -m pip", text)]
    assert installs, "the starting point's install has no time limit"
    assert sum(limits) + sum(installs) + DEVBENCH_INSTALLS <= DEVICE_LIMIT, (limits, installs)


def test_the_device_script_parses() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
