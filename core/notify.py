"""Telling other processes that the log moved: ``NOTIFY polyport_events,
'<position>'`` on a connection of its own, after commit and never inside the
append transaction (NOTIFY takes a global lock at commit).

One notification in flight at a time, carrying the latest position, and at
most one per ``interval``: under load one NOTIFY covers many commits.  A lost
notification costs nothing but latency: every tailer also polls.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from polyport.core import sql

log = logging.getLogger("polyport.notify")


class Notifier:
    def __init__(self, dsn: str, interval: float) -> None:
        self._dsn = dsn
        self._interval = interval
        self._latest = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

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
            self._wake.set()

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
                    conn = await asyncpg.connect(self._dsn)
                await conn.execute(sql.NOTIFY, str(target))
                sent = target
                await asyncio.sleep(self._interval)
            except asyncio.CancelledError:
                if conn is not None:
                    conn.terminate()
                raise
            except Exception as exc:  # noqa: BLE001 - polling covers a lost notification
                log.debug("NOTIFY failed: %s", exc)
                if conn is not None:
                    conn.terminate()
                conn = None
