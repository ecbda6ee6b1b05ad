"""Rate-limited logging for failures that can repeat once per event.

A poison event, a matcher that fails on every event, a client that keeps
sending the same bad request: logging each occurrence would flood the log
(and cost more than the work itself).  :class:`RateLimitedLog` writes the
first occurrence of each key at once, then at most one line per ``interval``
per key, carrying how many were held back in between.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


@dataclass
class _KeyState:
    next_at: float
    suppressed: int = 0
    since: float = 0.0


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        *,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._max_keys = max_keys
        self._clock = clock
        self._keys: dict[Hashable, _KeyState] = {}

    def log(self, level: int, key: Hashable, msg: str, *args: Any, exc_info: Any = None) -> bool:
        """Log ``msg % args`` unless ``key`` was logged less than ``interval``
        ago (then only count it).  Returns whether a line was written."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self._clock()
        state = self._keys.get(key)
        if state is not None and now < state.next_at:
            state.suppressed += 1
            return False
        if state is not None and state.suppressed:
            msg += " (and %d more like this in the last %.0fs)"
            args = (*args, state.suppressed, now - state.since)
        if state is None:
            if len(self._keys) >= self._max_keys:
                # Bounded: forget the oldest key (dicts keep insertion order).
                del self._keys[next(iter(self._keys))]
            state = self._keys[key] = _KeyState(now)
        state.next_at = now + self.interval
        state.suppressed = 0
        state.since = now
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, key: Hashable, msg: str, *args: Any, exc_info: Any = None) -> bool:
        return self.log(logging.WARNING, key, msg, *args, exc_info=exc_info)

    def error(self, key: Hashable, msg: str, *args: Any, exc_info: Any = None) -> bool:
        return self.log(logging.ERROR, key, msg, *args, exc_info=exc_info)
