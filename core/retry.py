"""Riding out database trouble: which failures mean the connection (or the
server) went away, bounded backoff for the loops that wait for it to come
back, and one place that tells the log and readiness about an outage.

Every long-running task that talks to PostgreSQL (the tailer, the writer's
outcome checks, the binder projector, consumer groups, the LISTEN connection)
retries through :func:`reconnecting`, so they all back off the same way and
all come back within ``MAX_WAIT`` seconds of the database returning.
"""

from __future__ import annotations

import logging
import time

import asyncpg
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    wait_exponential,
    wait_random,
)

from polyport.core.errors import StatementRefused, StorageUnavailable
from polyport.core.health import Health
from polyport.core.logs import RateLimitedLog

# Readiness promises 200 within 2 s of the database being back: no waiter
# sleeps longer than this between attempts.
FIRST_WAIT = 0.05
MAX_WAIT = 1.0

# What a lost connection or a stopping server looks like through asyncpg.
# InternalClientError ("cannot switch to state N; another operation (2) is in
# progress") is what a pooled connection raises when the server's FATAL
# "terminating connection due to administrator command" arrived while it was
# idle and the socket's close has not been read yet: it is no PostgresError,
# InterfaceError or OSError, and catching only those let it end the tailer.
CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, and TimeoutError
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection or the server is gone (rather than
    that the server refused a statement on a healthy connection); request
    paths raise it already translated (core.db) as StorageUnavailable, and a
    refused statement as its StatementRefused subclass, which is no outage."""
    return (isinstance(exc, (*CONNECTION_LOST, StorageUnavailable))
            and not isinstance(exc, StatementRefused))


class Outage:
    """One component's view of database trouble: the first failure is logged
    at once (then at most once a minute), each one is reported to
    :class:`Health` so that readiness says 503, and the recovery is logged
    with how long it took."""

    def __init__(self, who: str, logger: logging.Logger, health: Health | None) -> None:
        self.who = who
        self._log = RateLimitedLog(logger)
        self._logger = logger
        self._health = health
        self.since: float | None = None

    def failed(self, exc: BaseException) -> None:
        if self._health is not None:
            self._health.failed(self.who, exc)
        if self.since is None:
            self.since = time.monotonic()
        self._log.warning(
            self.who, "%s cannot reach the database (%s: %s); retrying",
            self.who, type(exc).__name__, exc,
        )

    def recovered(self) -> None:
        if self._health is not None:
            self._health.ok()
        if self.since is not None:
            self._logger.warning(
                "%s reached the database again after %.1fs", self.who,
                time.monotonic() - self.since,
            )
            self.since = None


def reconnecting(
    outage: Outage, *, within: float | None = None, any_error: bool = False
) -> AsyncRetrying:
    """Attempts with bounded exponential backoff (50 ms doubling to 1 s, with
    jitter so that many waiters do not reconnect in step)::

        async for attempt in reconnecting(outage):
            with attempt:
                await work()

    Retries lost connections (every exception with ``any_error``: a task that
    must never end, such as the tailer), forever or for ``within`` seconds;
    then the last exception propagates.  Cancellation is never retried.
    """

    def before_sleep(state: RetryCallState) -> None:
        assert state.outcome is not None
        exc = state.outcome.exception()
        if exc is not None:
            outage.failed(exc)

    return AsyncRetrying(
        retry=retry_if_exception_type(Exception) if any_error
        else retry_if_exception(connection_lost),
        wait=wait_exponential(multiplier=FIRST_WAIT, max=MAX_WAIT) + wait_random(0, FIRST_WAIT),
        stop=stop_never if within is None else stop_after_delay(within),
        before_sleep=before_sleep,
        reraise=True,
    )
