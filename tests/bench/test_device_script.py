"""bench/device.sh runs on a lent machine as one command of at most 600 s,
after .devbench/run has installed the wheels and this checkout (about 25 s):
its benches' limits and the starting point's install must leave that room,
what it writes under $OUT must all come back (at most 8 files), and the
script must parse."""

from __future__ import annotations

import re
import shutil
import subprocess

from tests.bench.command import REPO

SCRIPT = REPO / "bench" / "device.sh"
DEVICE_LIMIT = 600
DEVBENCH_INSTALLS = 25
# The device tool brings back at most this many files from $OUT.
DEVICE_FILES = 8
# One bench of the script: ``run NAME LIMIT ...``, its output in $OUT/NAME.txt.
RUN_LINE = re.compile(r"^(?:\S+=\S+ )?run (\S+) (\d+) ", re.M)


def test_the_device_script_fits_in_one_device_command() -> None:
    text = SCRIPT.read_text()
    limits = [int(m.group(2)) for m in RUN_LINE.finditer(text)]
    assert len(limits) >= 6, limits
    installs = [int(m.group(1)) for m in re.finditer(r"timeout (\d+) \"\$py\" -m pip", text)]
    assert installs, "the starting point's install has no time limit"
    # Every other step of its own, outside run(): each bounded, each counted.
    steps = [int(m.group(1)) for m in re.finditer(r"^timeout (\d+) \"\$py\"", text, re.M)]
    untimed = [line for line in text.splitlines()
               if re.match(r'^"\$py" ', line.strip())]
    assert not untimed, untimed
    total = sum(limits) + sum(installs) + sum(steps) + DEVBENCH_INSTALLS
    assert total <= DEVICE_LIMIT, (limits, installs, steps)


def test_every_file_the_device_script_writes_comes_back() -> None:
    text = SCRIPT.read_text()
    outputs = {m.group(1) + ".txt" for m in RUN_LINE.finditer(text)}
    outputs |= set(re.findall(r'"\$out/([\w.-]+)"', text))
    assert "machine.txt" in outputs and "base-install.txt" in outputs, outputs
    assert len(outputs) <= DEVICE_FILES, sorted(outputs)


def test_the_device_script_parses() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
