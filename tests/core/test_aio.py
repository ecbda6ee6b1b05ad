"""core/aio.py's small helpers."""

from __future__ import annotations

import asyncio

import pytest

from polyport.core.aio import settled


async def test_settled_waits_without_raising_the_outcome() -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.call_later(0.02, fut.set_exception, ValueError("the outcome"))
    await settled(fut)
    assert fut.done()
    with pytest.raises(ValueError):
        fut.result()


async def test_cancelling_the_wait_leaves_the_future_alone() -> None:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(settled(fut))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not fut.done()
    fut.set_result(None)  # and no callback of the cancelled wait is left on it
    await asyncio.sleep(0)
