"""Small asyncio helpers shared by the core."""

from __future__ import annotations

import asyncio
from typing import Generic, Self, TypeVar

T = TypeVar("T")


class IterateUntilNone(Generic[T]):
    """``async for`` over a reader whose ``next()`` returns None at the end."""

    async def next(self) -> T | None:
        raise NotImplementedError

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        item = await self.next()
        if item is None:
            raise StopAsyncIteration
        return item


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event`` up to ``timeout`` seconds (None = forever); True if set.

    ``asyncio.timeout`` rather than ``wait_for``: no extra task per wait, and a
    cancellation of the caller is never lost in the inner task's teardown.
    """
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
