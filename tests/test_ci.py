"""``.ci/run`` runs exactly the README's test command, after installing the
system packages the README names, so that CI skips none of the tests that
need them (issue 29.11)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CI = REPO / ".ci" / "run"
APT = "apt-get install -y --no-install-recommends"


def sh_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_ci_runs_the_readme_test_command_last() -> None:
    readme = sh_blocks((REPO / "README.md").read_text())
    test_command = next(b for b in readme if "-m pytest" in b)
    lines = [line for line in CI.read_text().splitlines() if line.strip()]
    assert lines[-1] == test_command


def test_ci_installs_what_the_readme_says() -> None:
    readme = sh_blocks((REPO / "README.md").read_text())
    install = next(b for b in readme if b.startswith(APT))
    wanted = install.removeprefix(APT).split()
    assert sorted(wanted) == ["chromium", "nats-server", "prometheus"]
    script = CI.read_text()
    # The same packages, installed non-interactively and without recommends.
    found = re.search(r"apt-get install -y -qq --no-install-recommends \\\n\s*(.*?);", script)
    assert found is not None, script
    assert sorted(found.group(1).split()) == sorted(wanted)
    done = subprocess.run(["bash", "-n", str(CI)], check=False, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr

