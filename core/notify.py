"""Telling other processes that the log moved: ``NOTIFY polyport_events,
'<position>'`` on a connection of its own, after commit and never inside the
append transaction (NOTIFY takes a global lock at commit).

One notification in flight at a time, carrying the latest position, and at
most one per ``interval``: under load one NOTIFY covers many commits.  A lost
notification costs nothing but latency: every tailer also polls.

Only when someone needs it.  Each process belongs to a *notify group*: the
processes that hear of each other's commits without PostgreSQL (the
workers of a gateway whose commit chain tells them every commit; a single
process alone).  Every tailer's LISTEN connection holds a shared advisory
lock naming its group (sql.HOLD_LISTENER_LOCK), and a notifier sends only
while a listener of another group holds one, looked up at most once per
``PRESENCE_INTERVAL`` while commits come.  A gateway alone on its database
thus sends none: at 200 a second they cost two workers 12 % of their W1
events/s on the 2-core machine, mostly in PostgreSQL and in the listeners'
wake-ups (docs/performance.md, session 12).  A listener that starts says
so on sql.LISTENER_HELLO_CHANNEL, which the notifier's connection hears:
the next commit looks again.  A notification lost in that race costs the
newcomer one poll, like any lost notification.

The connection commits asynchronously (``synchronous_commit = off``).  A
NOTIFY is a transaction of its own with a transaction id and a commit
record, so with the server's default every notification waited for a WAL
flush of its own.  Listeners are signalled at commit, flushed or not, and a
notification points at events whose own commits were flushed before it was
sent: losing it in a crash loses nothing but the hint.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

import asyncpg

from polyport.core import sql

log = logging.getLogger("polyport.notify")

# See the module docstring: a notification needs no flush of its own.
NOTIFY_SETTINGS = {"synchronous_commit": "off"}
# How stale the answer to "does another group listen?" may be.
PRESENCE_INTERVAL = 1.0


def new_notify_group() -> int:
    """A group id of its own (positive, so pg_locks shows it as given)."""
    return 1 + secrets.randbelow(2**31 - 1)


class Notifier:
    def __init__(self, dsn: str, interval: float, group: int, *, always: bool = False) -> None:
        """``always``: notify whoever listens, own group included (a worker
        committing on its own while its commit chain is away: its siblings
        then hear of those commits only this way)."""
        self._dsn = dsn
        self._interval = interval
        self.group = group
        self._always = always
        self._latest = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # (whether another group listens, when that was looked up)
        self._others: tuple[bool, float] = (False, float("-inf"))
        self.sent = 0  # notifications sent, for the tests

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="polyport-notify")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def committed(self, last_position: int) -> None:
        """The log's head is now at least ``last_position``; never blocks."""
        if last_position > self._latest:
            self._latest = last_position
            others, at = self._others
            # Alone: the task stays asleep until the answer is due again.
            if others or self._always or time.monotonic() - at >= PRESENCE_INTERVAL:
                self._wake.set()

    def _on_hello(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload != str(self.group):
            self._others = (False, float("-inf"))  # look again at the next commit

    async def _others_listen(self, conn: asyncpg.Connection) -> bool:
        if self._always:
            return True
        others, at = self._others
        now = time.monotonic()
        if now - at >= PRESENCE_INTERVAL:
            others = bool(await conn.fetchval(
                sql.OTHER_LISTENERS, sql.LISTENER_LOCK_KEY, self.group))
            self._others = (others, now)
        return others

    async def _run(self) -> None:
        sent = 0
        conn: asyncpg.Connection | None = None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._latest <= sent:
                continue
            target = self._latest
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self._dsn, server_settings=NOTIFY_SETTINGS)
                    self._others = (False, float("-inf"))
                    await conn.add_listener(sql.LISTENER_HELLO_CHANNEL, self._on_hello)
                if await self._others_listen(conn):
                    await conn.execute(sql.NOTIFY, str(target))
                    self.sent += 1
                    sent = target
                    await asyncio.sleep(self._interval)
                else:
                    sent = target
            except asyncio.CancelledError:
                if conn is not None:
                    conn.terminate()
                raise
            except Exception as exc:  # noqa: BLE001 - polling covers a lost notification
                log.debug("NOTIFY failed: %s", exc)
                if conn is not None:
                    conn.terminate()
                conn = None
