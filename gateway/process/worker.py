"""One gateway worker process, started by the supervisor (gateway/process/supervisor.py):
``python -m polyport.gateway.process.worker --index I --control-fd R --ready-fd W``.

The configuration (database URL included) arrives on the control pipe, never
in argv: a length, then the supervisor's pickled configuration, flags and
:class:`~polyport.gateway.process.workers.WorkerRole`.  The pipe then stays open; EOF
means the supervisor is gone, and the worker drains and exits.  Once every
listener is up, one JSON line on the ready pipe says where they listen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import pickle
import signal
import struct
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("polyport.worker")

_LENGTH = struct.Struct(">Q")


def _read_exactly(fd: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the supervisor closed the control pipe")
        out += chunk
    return bytes(out)


def read_payload(fd: int) -> dict[str, Any]:
    (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    # Written by the supervisor that started this process (an inherited pipe).
    data: dict[str, Any] = pickle.loads(_read_exactly(fd, length))
    return data


def watch_lifeline(control_fd: int, stop: asyncio.Event) -> None:
    """Set ``stop`` when the supervisor's end of the control pipe closes."""
    loop = asyncio.get_running_loop()

    def lifeline() -> None:
        try:
            more = os.read(control_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            more = b""
        if not more:
            loop.remove_reader(control_fd)
            log.warning("the supervisor is gone: stopping")
            stop.set()

    os.set_blocking(control_fd, False)
    loop.add_reader(control_fd, lifeline)


async def _work(payload: dict[str, Any], control_fd: int, ready_fd: int, choice: Any) -> int:
    from polyport.gateway.app import Gateway
    from polyport.gateway.process.eventloop import settle_heap
    from polyport.gateway.process.serve import _reload, _stop_then_hurry

    role = payload["role"]
    args = argparse.Namespace(**payload["args"])
    log.info("worker %d (of %d): event loop %s", role.index, role.count, choice.describe())
    gw = Gateway(role.apply(payload["config"]), role)
    await gw.start()
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _stop_then_hurry, stop, hurry)
    loop.add_signal_handler(signal.SIGHUP, lambda: _reload(gw, args, role.apply))

    watch_lifeline(control_fd, stop)
    curve = getattr(gw.listeners.get("res01"), "curve", None)
    # The port of each setting as bound (the supervisor keeps those it did
    # not choose itself for this worker's restarts).
    ports = {f"{name}_port": li.address[1] for name, li in gw.listeners.items()}
    login = getattr(gw.listeners.get("res01"), "login_address", None)
    if login is not None:
        ports["res01_login_port"] = login[1]
    ready = {
        "ports": ports,
        "pid": os.getpid(),
        "listeners": {name: list(li.address) for name, li in gw.listeners.items()},
        "http": list(gw.http_address) if gw.http_address else None,
        "https": "http" in gw.tls,
        "curve": curve.public_key if curve is not None else None,
    }
    settle_heap()
    os.write(ready_fd, (json.dumps(ready) + "\n").encode())
    os.close(ready_fd)
    await stop.wait()
    log.info("shutting down: unready, no new connections; in-flight requests get up to "
             "%.0f s (shutdown_grace), then the writer drains", gw.config.shutdown_grace)
    await gw.drain(gw.config.shutdown_grace, hurry)
    await gw.stop()
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    # Until the gateway handles SIGHUP (the supervisor forwards it only to
    # ready workers, but a signal sent to the whole group may come earlier).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="polyport-worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    opts = parser.parse_args(argv)
    return run_child(opts.control_fd, opts.index, f"worker {opts.index}",
                     lambda payload, choice: _work(payload, opts.control_fd, opts.ready_fd,
                                                   choice))


def run_child(control_fd: int, tag: int | str, name: str,
              main: Callable[[dict[str, Any], Any], Coroutine[Any, Any, int]]) -> int:
    """A process the supervisor started (a worker, the commit chain): read
    the configuration from the control pipe, log as ``tag``, run ``main`` on
    the configured event loop; a failure is one line naming ``name``."""
    from polyport.gateway.process.eventloop import choose_loop
    from polyport.gateway.process.eventloop import run as run_on_loop
    from polyport.gateway.process.fatal import _say_fatal, describe
    from polyport.gateway.process.logging_setup import setup_logging
    from polyport.gateway.process.scheduling import apply_policy

    payload = read_payload(control_fd)
    config = payload["config"]
    setup_logging(config.log_format, config.log_level, worker=tag)
    role = payload["role"]
    apply_policy(config.cpu_scheduling, commits=role.commits)
    try:
        choice = choose_loop(config.event_loop)
        return run_on_loop(main(payload, choice), choice)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the last resort: said, and exit status 1
        if config.log_level == "debug" or payload["args"].get("debug"):
            traceback.print_exc()
        with contextlib.suppress(Exception):
            _say_fatal(f"{name}: {describe(exc, role.database_url)}",
                       config.log_format)
        return 1


if __name__ == "__main__":
    sys.exit(main())
