"""Subscriptions: catch-up from the database, then live fan-out from one tailer.

The :class:`Tailer` reads each new event once and offers it to every live
subscription without awaiting.  A subscription whose buffer is full is not
waited for: it leaves the live set and catches up from the database later, so
a slow reader never delays the tailer or its neighbours.

Delivery is in position order with no gaps: a subscription's ``cursor`` is the
last position it has considered; the tailer offers only positions above it,
and a catching-up subscription joins the live set only when its cursor equals
the tailer's head (checked and joined without an ``await`` in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

import asyncpg

from polyport.core import sql
from polyport.core.aio import wait_event
from polyport.core.commands import Selector
from polyport.core.db import driver_errors
from polyport.core.errors import StorageUnavailable
from polyport.core.events import SEGMENT_EVENT_HEADER_SIZE, RecordedEvent, build_recorded_event
from polyport.core.health import Health
from polyport.core.logs import RateLimitedLog
from polyport.core.notify import new_notify_group
from polyport.core.reader import BufferedReader
from polyport.core.records import record_from_row
from polyport.core.retry import Outage, reconnecting

log = logging.getLogger("polyport.subscriptions")
# A matcher that fails on one event tends to fail on every event.
_matcher_failures = RateLimitedLog(log)

CATCH_UP_BATCH = 500
# A catching-up subscription reads once this much of its buffer is free.
CATCH_UP_MIN_ROOM = 250
TAIL_BATCH = 500
# The tailer keeps the newest events it fanned out, so a subscription a little
# behind the head joins the live feed from memory, without an await between
# its last event and the join.  Catching up by database reads alone never
# joined under steady load: each read took longer than the next event took to
# arrive, so the subscriber stayed a round trip behind (W3 in bench peers).
RECENT_EVENTS = 4096
RECENT_BYTES = 8 << 20
# How far back from the head a segment read looks in that memory for its
# offset before it reads the database instead: a reader at the tail of a
# stream finds it within its last few commits, and a stream quiet for
# longer costs one bounded scan, not one of the whole memory per read.
SEGMENT_SCAN_EVENTS = 512
# A pull reader (a Res01 FE) keeps the tailer reading every commit's events
# into that memory for this long after its last read, so that its next
# read of what committed since is served from there, not by a query
# (docs/performance.md, session 23).
RECENT_WANTED_SECONDS = 10.0
# What an event costs in the ring beyond its body (object, headers, strings).
_RECENT_OVERHEAD = 256
_ONE_MICROSECOND = timedelta(microseconds=1)


class Subscription(BufferedReader):
    """One reader's view of the log.

    Pull-style protocols call :meth:`next` or :meth:`next_batch`.  Push
    protocols with request-N flow control create it with ``credit=True`` and
    call :meth:`grant`: :meth:`next` then never hands out more events than
    granted.
    """

    def __init__(
        self,
        tailer: Tailer,
        selector: Selector,
        cursor: int,
        buffer_size: int = 1000,
        credit: bool = False,
    ) -> None:
        super().__init__(buffer_size, credit)
        self._tailer = tailer
        self.selector = selector
        self.cursor = cursor
        self._space = asyncio.Event()
        self._catch_up_task: asyncio.Task[None] | None = None
        self.live = False

    def _on_room(self) -> None:
        self._space.set()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._tailer.leave(self)
        if self._catch_up_task is not None:
            self._catch_up_task.cancel()
        self._readable.set()
        self._space.set()

    # --- producer side ----------------------------------------------------

    def start(self) -> None:
        self._start_catch_up()

    def _start_catch_up(self) -> None:
        self.live = False
        self._catch_up_task = asyncio.create_task(self._catch_up(), name="polyport-catch-up")

    async def _catch_up(self) -> None:
        while not self.closed:
            space = self._limit - len(self._buffer)
            if space < min(self._limit, CATCH_UP_MIN_ROOM) and self._buffer:
                # Wait for real room: reading as soon as one slot was free
                # made a subscriber that fell behind catch up one event per
                # database round trip, slower than events arrived, so it
                # never got back to the live feed.
                self._space.clear()
                await self._space.wait()
                continue
            upper = self._tailer.head
            if self.cursor >= upper:
                self._tailer.join(self)
                return
            before = self.cursor
            if self._tailer.join_from_recent(self):
                return
            if self.cursor != before:
                continue  # filled from memory up to a full buffer
            # Retried until the database answers: a catch-up that ended on a
            # failure would leave its subscriber waiting forever.
            async for attempt in reconnecting(self._tailer.catch_up_outage, any_error=True):
                with attempt:
                    events, last_row, exhausted = await self._tailer.read_selected(
                        self.selector, self.cursor, upper, min(space, CATCH_UP_BATCH)
                    )
            self._buffer.extend(events)
            self.cursor = upper if exhausted else last_row
            if events:
                self._readable.set()

    def offer(self, ev: RecordedEvent) -> None:
        """Called by the tailer, in position order, without awaiting."""
        if ev.position <= self.cursor:
            return
        if not self._accept(ev):
            # Too slow for the live feed: read the rest from the database later.
            self._tailer.leave(self)
            self._start_catch_up()

    def fill(self, events: deque[RecordedEvent], start: int) -> bool:
        """Take ``events[start:]`` (contiguous positions, the first one right
        after ``cursor``) as :meth:`offer` would; False when the buffer filled
        first.  Never awaits."""
        return all(self._accept(ev) for ev in islice(events, start, None))

    def _accept(self, ev: RecordedEvent) -> bool:
        """Consider the event after ``cursor``; False (nothing changed) when
        the buffer is full."""
        if len(self._buffer) >= self._limit:
            return False
        self.cursor = ev.position
        if _safe_match(self.selector, ev):
            self._buffer.append(ev)
            self._readable.set()
        return True


def _selects_all(selector: Selector) -> bool:
    return (selector.context is None and selector.stream is None and selector.prefix is None
            and not selector.types and selector.matcher is None)


def _safe_match(selector: Selector, ev: RecordedEvent) -> bool:
    try:
        return selector.matches(ev)
    except Exception as exc:  # noqa: BLE001 - a user-supplied matcher must not break the fan-out
        _matcher_failures.error(
            ("matcher", id(selector)),
            "subscription matcher failed on position %d (%s: %s); event skipped",
            ev.position, type(exc).__name__, exc,
        )
        return False


class Tailer:
    """Reads committed events once per process and fans them out."""

    def __init__(
        self, pool: asyncpg.Pool, dsn: str, poll_interval: float = 1.0,
        health: Health | None = None, *, notify_group: int | None = None,
    ) -> None:
        self._pool = pool
        # Held on the LISTEN connection so that other groups' notifiers
        # know someone listens (core/notify.py).
        self.notify_group = new_notify_group() if notify_group is None else notify_group
        self._dsn = dsn
        self.poll_interval = poll_interval
        # Told of every round trip's outcome: readiness answers from it.
        self.health = health or Health()
        self._outage = Outage("tailer", log, self.health)
        self.catch_up_outage = Outage("subscription catch-up", log, self.health)
        self.head = 0
        self.last_time: datetime | None = None
        self._known_head = 0
        self._live: set[Subscription] = set()
        # Contiguous positions ending at ``head`` (or empty): see RECENT_EVENTS.
        self._recent: deque[RecordedEvent] = deque()
        self._recent_bytes = 0
        # Until then (loop-independent monotonic time) the tailer feeds that
        # memory even with no live subscriber: see RECENT_WANTED_SECONDS.
        self._recent_wanted_until = float("-inf")
        # Set (and dropped) when the head moves, for held reads: see wait_beyond.
        self._moved: asyncio.Event | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listen_conn: asyncpg.Connection | None = None
        self.listeners: list[Callable[[RecordedEvent], None]] = []
        self.on_advance: list[Callable[[int], None]] = []
        # Called when a migration ran on this database (sql.SCHEMA_CHANNEL).
        self.on_schema_change: Callable[[], None] | None = None

    @property
    def live_count(self) -> int:
        return len(self._live)

    async def start(self) -> None:
        self.head = self._known_head = await self._pool.fetchval(sql.HEAD_POSITION)
        self.health.ok()
        await self._listen()
        self._task = asyncio.create_task(self._run(), name="polyport-tailer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._listen_conn is not None and not self._listen_conn.is_closed():
            await self._listen_conn.close()

    async def _listen(self) -> None:
        """(Re)open the LISTEN connection.  Best effort: polling covers a
        missing one, and the next round tries again."""
        old, self._listen_conn = self._listen_conn, None
        if old is not None:
            old.terminate()
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(self._dsn, timeout=self.poll_interval + 2)
            await conn.add_listener(sql.NOTIFY_CHANNEL, self._on_notify)
            await conn.add_listener(sql.SCHEMA_CHANNEL, self._on_schema_notify)
            if await conn.fetchval(sql.HOLD_LISTENER_LOCK, sql.LISTENER_LOCK_KEY,
                                   self.notify_group):
                await conn.execute(sql.LISTENER_HELLO, str(self.notify_group))
            else:
                log.warning("another session holds this process's listener lock; other "
                            "gateways' commits reach it by polling (poll_interval)")
        except Exception as exc:  # noqa: BLE001 - any failure here means "poll instead"
            log.debug("LISTEN failed (%s); relying on polling", exc)
            if conn is not None:
                conn.terminate()
            return
        self._listen_conn = conn

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError):
            self.notify(int(payload))

    def _on_schema_notify(self, _conn: object, _pid: int, _channel: str, _payload: str) -> None:
        if self.on_schema_change is not None:
            self.on_schema_change()

    def notify(self, position: int) -> None:
        self._known_head = max(self._known_head, position)
        if position > self.head:
            if not self.feeding:
                # Nobody to feed: move the head here rather than wake the
                # tailer task once per commit (a task switch and a retry
                # context each, 3% of a W1 profile).
                self._move_head(position)
                self._advanced()
                return
            self._wake.set()

    @property
    def feeding(self) -> bool:
        """Whether anyone in this process takes events as they commit (or
        will read them soon: :meth:`want_recent`)."""
        return bool(self._live or self.listeners) or (
            time.monotonic() < self._recent_wanted_until)

    def want_recent(self) -> None:
        """A pull reader read just now: keep every commit's events in memory
        for RECENT_WANTED_SECONDS more (see :meth:`recent_selected`)."""
        self._recent_wanted_until = time.monotonic() + RECENT_WANTED_SECONDS

    def recent_selected(
        self, selector: Selector, after: int, upper: int
    ) -> Iterator[RecordedEvent] | None:
        """The events at positions ``after`` + 1 … ``upper`` that ``selector``
        takes, in order, from memory: what :meth:`read_selected` returns
        for that range, without a query.  None when memory does not hold
        every one of those positions.  Lazy, so a reader that wants a few
        stops early: take what is needed before the next await (the next
        commit changes the memory under it)."""
        recent = self._recent
        if not recent or upper > self.head:
            return None
        first = recent[0].position
        if after + 1 < first:
            return None
        start, stop = after + 1 - first, upper + 1 - first
        events: Iterator[RecordedEvent]
        n = len(recent)
        if start > n - start:
            # Nearer the newest end, where an FE/PS loop reads: taken from
            # the right, not skipped from the left (6.3 against 0.3 µs for
            # the newest of a full memory).  A list no longer than the skip.
            tail = list(islice(reversed(recent), n - stop, n - start))
            tail.reverse()
            events = iter(tail)
        else:
            events = islice(recent, start, stop)
        if _selects_all(selector):
            return events
        return (e for e in events if _safe_match(selector, e))

    def recent_segment(self, context: str, stream: str, offset: int) -> list[RecordedEvent] | None:
        """The events of ``context``/``stream`` whose segment view starts at
        byte ``offset`` or later, up to the head, in order, from memory:
        what a database read from ``offset`` returns.  None when memory
        cannot tell within the last SEGMENT_SCAN_EVENTS events: it must hold
        the stream's event that starts at ``offset``, or the one that ends
        there (an empty list then: nothing after it up to the head).  An
        offset inside an event, or one older than that, reads the database."""
        found: list[RecordedEvent] = []
        for ev in islice(reversed(self._recent), SEGMENT_SCAN_EVENTS):
            if ev.stream != stream or ev.context != context:
                continue
            start = ev.segment_offset
            if start >= offset:
                found.append(ev)
                if start > offset:
                    continue
            elif start + SEGMENT_EVENT_HEADER_SIZE + len(ev.body) != offset:
                return None
            found.reverse()
            return found
        return None

    def committed(self, base: int, t0: datetime, rows: Sequence[tuple[Any, ...]]) -> None:
        """This process's writer committed ``rows`` (the planner's row
        layout) at positions ``base + 1 …``, the first recorded at ``t0``.

        When they follow the head directly, they are fanned out from memory
        with what the database would have returned: no read back, and no
        task switch between the commit and the subscribers.  Otherwise
        (another process committed in between) the tailer reads the range."""
        last = base + len(rows)
        if base != self.head or not self.feeding:
            self.notify(last)
            return
        try:
            for i, r in enumerate(rows):
                self._fan_out(_recorded(base + i + 1, t0 + i * _ONE_MICROSECOND, r))
        except Exception:  # runs in the writer's commit path
            # The commit stands whatever happens here; the tailer reads the
            # rest of the range from the database instead.
            log.exception("fan-out from memory failed at position %d; reading it back", self.head)
            self.notify(last)
            return
        self._known_head = max(self._known_head, last)
        self._advanced()

    def _fan_out(self, ev: RecordedEvent) -> None:
        for sub in list(self._live):
            sub.offer(ev)
        for listener in self.listeners:
            listener(ev)
        self._remember(ev)
        self.head = ev.position
        self.last_time = ev.recorded_at

    def join(self, sub: Subscription) -> None:
        if sub.closed:
            return
        sub.live = True
        self._live.add(sub)

    def leave(self, sub: Subscription) -> None:
        sub.live = False
        self._live.discard(sub)

    def join_from_recent(self, sub: Subscription) -> bool:
        """Hand ``sub`` the remembered events after its cursor and join it to
        the live set, all without awaiting; False when memory does not reach
        back to its cursor or its buffer filled first."""
        recent = self._recent
        if sub.closed or not recent or sub.cursor >= self.head:
            return False
        start = sub.cursor + 1 - recent[0].position
        if start < 0:
            return False
        if not sub.fill(recent, start):
            return False
        self.join(sub)
        return True

    def _remember(self, ev: RecordedEvent) -> None:
        if self._recent and self._recent[-1].position != ev.position - 1:
            self._forget_recent()  # keep the positions contiguous
        self._recent.append(ev)
        self._recent_bytes += len(ev.body) + _RECENT_OVERHEAD
        while len(self._recent) > RECENT_EVENTS or self._recent_bytes > RECENT_BYTES:
            old = self._recent.popleft()
            self._recent_bytes -= len(old.body) + _RECENT_OVERHEAD

    def _move_head(self, position: int) -> None:
        """The head moves without the events being read: what is remembered
        no longer ends at the head."""
        self.head = position
        self._forget_recent()

    def _forget_recent(self) -> None:
        self._recent.clear()
        self._recent_bytes = 0

    async def read_selected(
        self, selector: Selector, after: int, upper: int, limit: int
    ) -> tuple[list[RecordedEvent], int, bool]:
        """Events in (after, upper] matching ``selector``: (events, position of
        the last row read, whether the range was exhausted)."""
        read = sql.selected_read(
            after, upper, limit, selector.context, selector.stream, selector.prefix,
            selector.types,
        )
        with driver_errors():  # a subscriber's read: core's errors only
            try:
                rows = await self._pool.fetch(read.statement, *read.args)
            except asyncpg.TooManyConnectionsError as exc:
                raise StorageUnavailable(str(exc)) from exc
        events = list(map(record_from_row, rows))
        if not _selects_all(selector):
            events = [e for e in events if _safe_match(selector, e)]
        if len(rows) >= limit:
            return events, rows[-1]["position"], False
        return events, read.upper, read.upper >= upper

    async def _run(self) -> None:
        """Never ends but by cancellation: a failed round is retried with
        bounded backoff until the database answers again, and resumes from
        ``head``, so live subscriptions see every event with no gap.  (A round
        that raised something unexpected used to end this task silently, and
        with it live delivery for the whole process.)"""
        while True:
            woken = await wait_event(self._wake, self.poll_interval)
            self._wake.clear()
            async for attempt in reconnecting(self._outage, any_error=True):
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        woken = False  # announcements made while away are lost
                    if self._listen_conn is None or self._listen_conn.is_closed():
                        await self._listen()
                    await self._advance(announced=woken)
            self._outage.recovered()

    async def _advance(self, announced: bool = False) -> None:
        if not self.feeding:
            # Nobody to feed: move the head without reading events.  Someone
            # may have joined during the await; then they need the events.
            # Commits announce their position (in process, or by NOTIFY);
            # only the polling safety net asks the database.
            known = self._known_head
            if not announced:
                known = max(known, await self._pool.fetchval(sql.HEAD_POSITION))
                self.health.ok()
            if not self.feeding:
                if known > self.head:
                    self._move_head(known)
                    self._advanced()
                return
        while True:
            rows = await self._pool.fetch(sql.READ_ALL_AFTER, self.head, TAIL_BATCH)
            self.health.ok()
            if not rows:
                return
            for row in rows:
                if row["position"] <= self.head:
                    continue  # fanned out from memory while this read ran
                self._fan_out(record_from_row(row))
            self._advanced()
            if len(rows) < TAIL_BATCH:
                return

    def _advanced(self) -> None:
        self._head_moved()
        for cb in self.on_advance:
            try:
                cb(self.head)
            except Exception:  # may run in the writer's commit path
                log.exception("tailer advance callback failed")

    def _head_moved(self) -> None:
        moved, self._moved = self._moved, None
        if moved is not None:
            moved.set()

    async def wait_beyond(self, position: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the head to pass ``position``
        (a commit this process knows of); whether it did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.head <= position:
            left = deadline - loop.time()
            if left <= 0:
                return False
            if self._moved is None:
                self._moved = asyncio.Event()
            await wait_event(self._moved, left)
        return True


def _jsonb_order(headers: dict[str, str]) -> dict[str, str]:
    """Headers in the key order a jsonb object comes back in (shorter keys
    first, then bytewise), so events fanned out from memory look exactly like
    the same events read from the database."""
    if len(headers) < 2:
        return dict(headers)
    return dict(sorted(headers.items(), key=_jsonb_key_order))


def _jsonb_key_order(item: tuple[str, str]) -> tuple[int, bytes]:
    key = item[0].encode()
    return len(key), key


def _recorded(position: int, recorded_at: datetime, r: tuple[Any, ...]) -> RecordedEvent:
    (event_id, context, stream, version, type_, headers, body, content_type, client_time,
     origin, segment_offset) = r
    # Field order: RecordedEvent's (built without __init__, core/builders.py).
    return build_recorded_event(
        position, event_id, context, stream, version, type_, _jsonb_order(headers), body,
        content_type,
        # Stored as timestamptz: read back in UTC.
        None if client_time is None else client_time.astimezone(UTC),
        recorded_at, origin, segment_offset,
    )
