"""Which asyncio event loop ``polyport serve`` runs on (``event_loop``).

- ``uvloop``: libuv's loop (uvloop); much less overhead per socket call and
  callback than the pure-Python selector loop, which is what a gateway with
  thousands of small reads and writes spends its time in.
- ``asyncio``: the standard library's loop.
- ``auto`` (default): uvloop when it can be imported, else asyncio.

Everything the gateway uses works on both: TLS (``start_server`` with an SSL
context, ``connect_accepted_socket``), ``add_reader`` (the TLS sniffing in
gateway/transports/tls.py and pyzmq's asyncio sockets), subprocesses and signal handlers.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

from polyport.gateway.config import ConfigError

log = logging.getLogger("polyport.gateway")

T = TypeVar("T")


@dataclass(frozen=True)
class LoopChoice:
    name: str  # "uvloop" or "asyncio": what actually runs
    version: str  # uvloop's version; "" for asyncio (the Python's)
    factory: Callable[[], asyncio.AbstractEventLoop] | None  # None: the policy's
    why: str  # how it was chosen, for the start-up line

    def describe(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"{self.name}{version} ({self.why})"


def _uvloop() -> Any | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def choose_loop(setting: str) -> LoopChoice:
    """The loop for ``event_loop = setting``; ConfigError when uvloop is asked
    for by name and cannot be imported (``auto`` falls back instead)."""
    uv = _uvloop() if setting in ("auto", "uvloop") else None
    if uv is not None:
        why = "event_loop uvloop" if setting == "uvloop" else "event_loop auto: uvloop is installed"
        return LoopChoice("uvloop", _version("uvloop"), uv.new_event_loop, why)
    if setting == "uvloop":
        raise ConfigError(
            "event_loop uvloop: uvloop cannot be imported (pip install uvloop), or choose "
            "event_loop auto or asyncio"
        )
    why = "event_loop asyncio" if setting == "asyncio" else (
        "event_loop auto: uvloop is not installed")
    # The selector loop by name, not the policy's loop: an installed uvloop
    # policy (or any other) must not turn "asyncio" into something else.
    factory = None if sys.platform == "win32" else asyncio.SelectorEventLoop
    return LoopChoice("asyncio", "", factory, why)


def run(main: Coroutine[Any, Any, T], choice: LoopChoice) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    with asyncio.Runner(loop_factory=choice.factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this code runs on."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


# Allocations (net of deallocations) of tracked objects between two young-
# generation collections: Python's default is 700.  A gateway under load
# allocates and frees a few dozen short-lived containers per event, almost
# all freed by reference counting; at 700 the collector ran every few
# appends and took 4-6% of a worker's and the commit chain's samples
# (docs/performance.md).
GC_GEN0_THRESHOLD = 20_000


def settle_heap() -> None:
    """After start-up: move everything allocated so far (modules, the
    configuration, pools) out of the collector's sight for good, and collect
    the young generation less often."""
    import gc

    gc.collect()
    gc.freeze()
    _g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, g1, g2)
