"""The consumer side shared by subscriptions and group members: a bounded
buffer read with ``next``/``next_batch``, optionally limited by request-N
credits."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence

from polyport.core.aio import IterateUntilNone, wait_event
from polyport.core.events import RecordedEvent

MAX_CREDITS = 1 << 62


class BufferedReader(IterateUntilNone[RecordedEvent]):
    def __init__(self, buffer_size: int, credit: bool) -> None:
        self._limit = max(1, buffer_size)
        self._buffer: deque[RecordedEvent] = deque()
        self._credits: int | None = 0 if credit else None
        self._readable = asyncio.Event()
        self._interrupted = False
        self.closed = False
        self.delivered = 0
        # Optional: called with the events of each hand-out (metrics), once
        # per batch: per event it was 6-8 % of a catch-up's gateway profile.
        self.on_deliver: Callable[[Sequence[RecordedEvent]], None] | None = None

    def _on_room(self) -> None:
        """Room appeared in the buffer or in the credits: the producer may go on."""

    @property
    def credits(self) -> int | None:
        return self._credits

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def oldest_buffered(self) -> RecordedEvent | None:
        return self._buffer[0] if self._buffer else None

    def grant(self, n: int) -> None:
        if self._credits is None:
            return
        self._credits = min(self._credits + max(0, n), MAX_CREDITS)
        self._readable.set()
        self._on_room()

    def _take(self) -> RecordedEvent | None:
        if not self._buffer or (self._credits is not None and self._credits <= 0):
            return None
        ev = self._buffer.popleft()
        if self._credits is not None:
            self._credits -= 1
        self._handed_out((ev,))
        return ev

    def _take_many(self, max_count: int) -> list[RecordedEvent]:
        """Up to ``max_count`` buffered events, within the credits."""
        n = min(len(self._buffer), max_count)
        if self._credits is not None:
            n = min(n, self._credits)
        if n <= 0:
            return []
        if self._credits is not None:
            self._credits -= n
        popleft = self._buffer.popleft
        out = [popleft() for _ in range(n)]
        self._handed_out(out)
        return out

    def _handed_out(self, events: Sequence[RecordedEvent]) -> None:
        self.delivered += len(events)
        self._on_room()
        if self.on_deliver is not None:
            self.on_deliver(events)

    async def next(self, timeout: float | None = None) -> RecordedEvent | None:
        """The next event, waiting up to ``timeout`` seconds (None = forever).
        Returns None on timeout, after :meth:`interrupt`, or once closed."""
        while True:
            if self.closed:
                return None
            if self._interrupted:
                self._interrupted = False
                return None
            ev = self._take()
            if ev is not None:
                return ev
            self._readable.clear()
            if not await wait_event(self._readable, timeout):
                return None

    async def next_batch(self, max_count: int, timeout: float | None = None) -> list[RecordedEvent]:
        """Up to ``max_count`` events, waiting for the first as :meth:`next`
        does: an empty list on timeout, after :meth:`interrupt`, or once
        closed."""
        first = await self.next(timeout)
        if first is None:
            return []
        return [first, *self._take_many(max_count - 1)] if max_count > 1 else [first]

    def interrupt(self) -> None:
        """Make a pending (or the next) :meth:`next` return None once."""
        self._interrupted = True
        self._readable.set()
