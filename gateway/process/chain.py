"""The commit chain process of ``serve --workers N`` (core/chain.py says why
one writer commits for every worker), started and restarted by the
supervisor: ``python -m polyport.gateway.process.chain --control-fd R --ready-fd W``.

Like a worker, it gets its configuration on the control pipe (never argv),
stops when that pipe closes, and writes one JSON line on the ready pipe once
it listens on ``chain-v<WIRE_VERSION>.sock`` in the supervisor's run
directory (mode 0700; core/chain_wire.py says why the name has a version).
On SIGTERM it keeps serving the workers' connections until they close (they
drain their appends through it as they stop) or ``commit_timeout`` passes,
then commits what it holds and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

log = logging.getLogger("polyport.chain")


async def _serve(payload: dict[str, Any], control_fd: int, ready_fd: int) -> int:
    from polyport.core.chain import CommitChain
    from polyport.core.migrate import GATEWAY_APPLICATION_NAME, asyncpg_dsn, with_application_name
    from polyport.gateway.app import writer_limits
    from polyport.gateway.process.eventloop import settle_heap
    from polyport.gateway.process.worker import watch_lifeline
    from polyport.gateway.process.workers import chain_socket_path, listen_for_workers

    role = payload["role"]
    config = role.apply(payload["config"])
    dsn = with_application_name(asyncpg_dsn(config.database_url), GATEWAY_APPLICATION_NAME)
    chain = CommitChain(dsn, writer_limits(config, dedicated=True),
                        notify_group=role.notify_group)
    chain.start()
    server = await listen_for_workers(chain.protocol, role.run_dir)
    path = chain_socket_path(role.run_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watch_lifeline(control_fd, stop)
    settle_heap()
    os.write(ready_fd, (json.dumps({"pid": os.getpid(), "chain": str(path)}) + "\n").encode())
    os.close(ready_fd)
    log.info("commit chain ready on %s", path)
    await stop.wait()
    server.close()
    if chain.peers:
        log.info("stopping: waiting for %d workers to drain through the chain", chain.peers)
        await chain.peers_gone(config.commit_timeout)
    await chain.drain_and_stop()
    path.unlink(missing_ok=True)
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nothing of its own to reload
    parser = argparse.ArgumentParser(prog="polyport-chain")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    opts = parser.parse_args(argv)
    from polyport.gateway.process.worker import run_child

    return run_child(opts.control_fd, "chain", "commit chain",
                     lambda payload, _choice: _serve(payload, opts.control_fd, opts.ready_fd))


if __name__ == "__main__":
    sys.exit(main())
