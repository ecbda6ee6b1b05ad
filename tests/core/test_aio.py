"""core/aio.py's small helpers."""

from __future__ import annotations

import asyncio

import pytest

from polyport.core.aio import Wakeup, settled


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


async def test_a_wakeup_wakes_its_waiter_and_stays_set_until_cleared() -> None:
    wake = Wakeup()
    waiting = asyncio.create_task(wake.wait())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    wake.set()
    await asyncio.wait_for(waiting, 1)
    assert wake.is_set()
    await asyncio.wait_for(wake.wait(), 1)  # still set: returns at once
    wake.clear()
    again = asyncio.create_task(wake.wait())
    await asyncio.sleep(0.01)
    assert not again.done()
    again.cancel()  # a cancelled wait leaves it usable
    with pytest.raises(asyncio.CancelledError):
        await again
    asyncio.get_running_loop().call_later(0.01, wake.set)
    await asyncio.wait_for(wake.wait(), 1)


async def test_a_wakeup_asks_for_the_running_loop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # On Python 3.11 each asyncio.get_running_loop() is a getpid() system
    # call; the writer's loop waits once per commit.
    asked = 0
    real = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        nonlocal asked
        asked += 1
        return real()

    wake = Wakeup()
    monkeypatch.setattr(asyncio, "get_running_loop", counting)
    for _ in range(20):
        real().call_soon(wake.set)
        await wake.wait()
        wake.clear()
    assert asked == 1
