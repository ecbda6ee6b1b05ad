"""``python -m bench ...`` as the tests run it: from the repository root, output
captured as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def bench(*args: str, timeout: float = 240,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        check=False, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=timeout,
    )
