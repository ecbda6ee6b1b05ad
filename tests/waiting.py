"""Waiting for a condition that another task or process brings about, with
a deadline instead of a fixed sleep: a sleep long enough on an idle machine
is too short under a loaded CI run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(check: Callable[[], bool], timeout: float = 5.0,
                     what: str = "condition") -> None:
    """Return once ``check()`` holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:g} s")
        await asyncio.sleep(0.01)
