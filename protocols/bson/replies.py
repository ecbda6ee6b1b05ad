"""What the BSON session and its parts share about replies.

RESPONSE carries no request id, so the session sends replies strictly in
request order.  Every request becomes a :class:`Reply` whose outcome is a
future (already done for an instant answer, a task for work in the core); the
session's writer sends them in order and :class:`Budget` bounds how many (and
how many event bytes) are in flight.  Exceptions become reply frames by
``errors.py``'s mapping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polyport.protocols.bson.errors import ProtocolError, error_response
from polyport.protocols.bson.frames import Frame, Response

OK = Response(ok=True)


def reply_frame(fut: asyncio.Future[Any], success: Frame | None = None) -> Frame:
    """The reply a finished outcome future stands for: its frame, or
    ``success`` when given (the future is then the store's, e.g. an
    append's results)."""
    if fut.cancelled():
        return Response(ok=False, err_code="internal", err_msg="request cancelled")
    exc = fut.exception()
    if exc is not None:
        return error_response(exc)
    return success if success is not None else fut.result()


def done(frame: Frame) -> asyncio.Future[Frame]:
    """An outcome decided already."""
    fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
    fut.set_result(frame)
    return fut


@dataclass(slots=True)
class Reply:
    # The reply frame, or (with ``success``) the store's outcome: success
    # answers ``success``, a failure its error RESPONSE.
    outcome: asyncio.Future[Any]
    # Event bytes this request holds against the in-flight budget.
    cost: int = 0
    # Runs right after the reply was sent (e.g. start RECEV delivery).
    after: Callable[[Frame], None] | None = None
    # Set on the sentinel that ends the connection after the replies before it.
    fatal: ProtocolError | None = None
    success: Frame | None = None


class Budget:
    """In-flight requests (count and bytes).  Only ``data_received`` acquires,
    so one event is enough to wake it."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max(1, max_count)
        self.max_bytes = max(1, max_bytes)
        self.count = 0
        self.bytes = 0
        self._freed = asyncio.Event()

    async def acquire(self, size: int) -> None:
        # A single request larger than the byte budget still goes through alone.
        while self.count >= self.max_count or (self.count and self.bytes + size > self.max_bytes):
            self._freed.clear()
            await self._freed.wait()
        self.count += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size
        self._freed.set()
