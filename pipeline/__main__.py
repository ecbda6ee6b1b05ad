"""``python -m pipeline JOB …`` = ``polyport pipeline JOB …``; also the file
to hand to ``spark-submit`` (``spark-submit [--master URL] --jars DRIVER.jar
pipeline/__main__.py export --out DIR``)."""

from __future__ import annotations

import sys
from pathlib import Path

# spark-submit runs this file as a script, which puts pipeline/ itself first
# on sys.path; its modules must be imported as pipeline.*, never top-level.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

from polyport.gateway.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["pipeline", *sys.argv[1:]]))
