"""``python -m bench NAME``: run one benchmark (core, res01, bson, logins,
reactivesocket, micromsg2, segment, pipeline) and print ratios against raw
PostgreSQL measured in the same run; ``peers`` compares raw PostgreSQL, NATS
JetStream and every protocol in one run (docs/performance.md); ``workers``
compares ``polyport serve --workers N`` with one worker and prints the CPU
ceiling of this machine (with ``--baseline``, beside another install, such
as a checkout of an earlier commit); ``chain`` feeds the commit chain process alone
and prints what it commits and its CPU per event; ``commits`` sends the
fast path's statements alone, the head row taken first against planned
positions, on 1..K connections; ``growth`` fills one log
through ``--sizes`` beside NATS JetStream and prints how each figure moves
as it grows; ``wakeups`` prices one process waking another on this
machine (one CPU, two, an idle one), without polyport; ``faults`` (not a
benchmark, not in CI) SIGKILLs ``polyport serve`` under load through every
protocol and audits."""

from __future__ import annotations

import importlib
import pkgutil
import signal
import sys

import bench


def available() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__)
        if m.name not in ("common", "__main__")
    )


def main(argv: list[str]) -> int:
    names = available()
    if len(argv) < 1 or argv[0] not in names:
        print(f"usage: python -m bench {{{','.join(names)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{argv[0]}")
    try:
        result: int = module.main(argv[1:])
    except KeyboardInterrupt:
        # Every bench's Ctrl-C or SIGTERM ends here, once its clean-up has run.
        print(f"python -m bench {argv[0]}: interrupted", file=sys.stderr)
        return 130
    return result


if __name__ == "__main__":
    # `timeout` (bench/device.sh) and service managers stop a bench with
    # SIGTERM, whose default ends the process at once: the throwaway cluster
    # and the gateways it started would outlive it, and load the benches that
    # follow.  Passed on as SIGINT, it is Ctrl-C: asyncio's runner cancels
    # the bench's main task, whose clean-up runs before the process ends.
    # The runner does so only where SIGINT has Python's own handler, which a
    # shell without job control takes away from a command run with `&`.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: signal.raise_signal(signal.SIGINT))
    sys.exit(main(sys.argv[1:]))
