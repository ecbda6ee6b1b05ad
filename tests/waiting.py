"""Waiting for a condition that another task or process brings about, with
a deadline instead of a fixed sleep: a sleep long enough on an idle machine
is too short under a loaded CI run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(check: Callable[[], bool], timeout: float = 5.0,
                     what: str = "a condition") -> None:
    """Return once ``check()`` holds; fail after ``timeout`` seconds."""

    async def holds() -> bool:
        return check()

    await until(holds, timeout, what, interval=0.01)


async def until(check: Callable[[], Awaitable[T]], timeout: float = 5.0,
                what: str = "a condition", interval: float = 0.05) -> T:
    """Wait for a check that has to wait itself (an HTTP request, a
    query): its first true result, polled every ``interval``; fail after
    ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
