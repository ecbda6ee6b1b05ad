"""The TCP transport's lazily moved read deadline (gateway/transports/tcp.py)."""

from __future__ import annotations

import asyncio

import pytest

from polyport.gateway.transports.tcp import ReadTimer


def _timer(kind: type[ReadTimer] = ReadTimer) -> ReadTimer:
    """A read timer for the running task."""
    current = asyncio.current_task()
    assert current is not None
    return kind(current)


async def _read_until_cut(timer: ReadTimer, reads: int, gap: float, timeout: float) -> float:
    """``reads`` reads that each return after ``gap`` seconds, then one that
    waits for ever; how long after the last read began it was cut."""
    loop = asyncio.get_running_loop()
    for _ in range(reads):
        timer.start(timeout)
        try:
            await asyncio.sleep(gap)
        finally:
            timer.stop()
    began = loop.time()
    timer.start(timeout)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        assert timer.expired()
        return loop.time() - began
    finally:
        timer.stop()
        timer.close()
    raise AssertionError("never cut")


async def test_a_busy_connection_is_cut_a_timeout_after_its_last_read() -> None:
    # Twelve reads over 0.6 s, each well inside the 0.3 s deadline: the timer
    # armed by the first read fires meanwhile and must sleep again, not cut.
    async def run() -> float:
        return await _read_until_cut(_timer(), reads=12, gap=0.05, timeout=0.3)

    waited = await asyncio.wait_for(run(), 5)
    assert 0.29 <= waited < 0.6


async def test_an_earlier_deadline_moves_the_timer_sooner() -> None:
    async def run() -> float:
        timer = _timer()
        timer.start(30.0)  # armed far out...
        timer.stop()
        return await _read_until_cut(timer, reads=0, gap=0, timeout=0.1)  # ...then due soon

    waited = await asyncio.wait_for(run(), 5)
    assert 0.09 <= waited < 1.0


class _CancelledBesides(ReadTimer):
    """A timer whose expiry coincides with an outside cancel of its task
    (a shutdown arriving in the same event-loop turn)."""

    def _fire(self) -> None:
        super()._fire()
        self._task.cancel()


async def test_a_real_cancellation_is_not_taken_for_the_deadline() -> None:
    async def run() -> None:
        timer = _timer(_CancelledBesides)
        timer.start(0.05)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not timer.expired():
                raise
            raise AssertionError("an outside cancel was taken for the read deadline") from None
        finally:
            timer.stop()
            timer.close()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run(), 5)


async def test_no_read_waiting_means_no_cut() -> None:
    # The deadline passing while the connection is busy elsewhere (not
    # reading) cancels nothing; the next read arms the timer again.
    async def run() -> bool:
        timer = _timer()
        timer.start(0.05)
        timer.stop()
        await asyncio.sleep(0.15)  # the timer fires here and finds no read
        timer.close()
        return True

    assert await asyncio.wait_for(run(), 5)


async def test_a_deadline_already_due_cuts_at_once_and_the_timer_moves_on() -> None:
    # A frame's deadline can be overdue when its read starts (frame_timeout
    # counts from the frame's first byte): the timeout is then 0 or less.
    # uvloop schedules such a call_at with call_soon, whose handle has no
    # when(); the next read's start() asked it for one and the connection
    # died with AttributeError instead of its protocol's timeout error.
    async def run() -> float:
        timer = _timer()
        timer.start(-0.5)
        timer.stop()
        timer.start(0.0)
        timer.stop()
        return await _read_until_cut(timer, reads=0, gap=0, timeout=0.0)

    waited = await asyncio.wait_for(run(), 5)
    assert waited < 0.5
