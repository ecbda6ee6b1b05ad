"""Small asyncio helpers shared by the core."""

from __future__ import annotations

import asyncio


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
