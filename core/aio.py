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


class Wakeup:
    """:class:`asyncio.Event` for the one task that waits on it, bound to the
    running loop at its first wait.  ``Event.wait`` asks asyncio for the
    running loop on every wait, and on Python 3.11 that is a ``getpid()``
    system call each time (the writer's loop waits once per commit)."""

    __slots__ = ("_loop", "_set", "_waiter")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        assert self._waiter is None, "Wakeup has one waiter"
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None


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
