"""Small asyncio helpers shared by the core."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, Self, TypeVar

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


async def settled(fut: asyncio.Future[Any]) -> None:
    """Until ``fut`` is done, however it ends, without raising its outcome.

    ``asyncio.wait([fut])`` for one future at a fraction of its cost (no
    sets, one callback); as there, cancelling the caller cancels only the
    wait, never ``fut``."""
    if fut.done():
        return
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    fut.add_done_callback(wake)
    try:
        await waiter
    finally:
        fut.remove_done_callback(wake)
