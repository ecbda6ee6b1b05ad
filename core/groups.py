"""Durable subscriptions and consumer groups.

A durable name is scoped by its context: (context, name) owns a checkpoint
row in ``subscriptions``.  Every live subscriber with that name is a member
of one group: a single feeding subscription reads from the checkpoint and
hands each event to one member with room.  The checkpoint advances to the
highest position below which every handed-out event has been acknowledged; a
member that leaves gives its unacknowledged events back to the others.
Across gateway processes one process at a time owns a group (an advisory
lock); members elsewhere wait.

Database trouble does not end a group: its task restarts with bounded
backoff and keeps its members.  While it still owns the lock it resumes
where it was (nothing handed out twice); once the lock connection is gone it
stops handing out at once, drops what its members had not read yet, and
when it owns the group again starts over from the saved checkpoint, so every
unacknowledged event is delivered again (at least once, never skipped).

Persistent-subscription settings (:mod:`core.parking`) bound the events in
flight, time out events a consumer holds too long, and park an event that
failed more than ``max_retries`` times.  A failure is an event the consumer
took and then gave back: negatively acknowledged, timed out, or still
unacknowledged when its member left.  (Events a member buffered but its
consumer never took go back without counting.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING

from polyport.core.aio import wait_event
from polyport.core.commands import Selector
from polyport.core.events import RecordedEvent
from polyport.core.locks import GroupLocks
from polyport.core.parking import SubscriptionSettings
from polyport.core.reader import BufferedReader
from polyport.core.retry import Outage, reconnecting
from polyport.core.subscriptions import Subscription

if TYPE_CHECKING:
    from polyport.core.store import EventStore

log = logging.getLogger("polyport.groups")

# How often an owning group re-reads its settings and looks for parked events
# to replay (an admin change in this process pokes it at once).
REFRESH_INTERVAL = 5.0


class GroupMember(BufferedReader):
    """The consumer's handle: same reading interface as a Subscription, plus acks."""

    def __init__(self, group: ConsumerGroup, buffer_size: int, credit: bool) -> None:
        super().__init__(buffer_size, credit)
        self._group = group
        self.selector = group.selector

    def _on_room(self) -> None:
        self._group.member_has_room()

    @property
    def name(self) -> str:
        return self._group.name

    @property
    def context(self) -> str:
        return self._group.context

    @property
    def capacity(self) -> int:
        room = self._limit - len(self._buffer)
        if self._credits is not None:
            room = min(room, self._credits - len(self._buffer))
        return room

    def _push(self, ev: RecordedEvent) -> None:
        self._buffer.append(ev)
        self._readable.set()

    def _handed_out(self, events: Sequence[RecordedEvent]) -> None:
        for ev in events:
            self._group.taken(ev)
        super()._handed_out(events)

    def nack(self, position: int) -> None:
        """The consumer could not handle this delivered event: retry it (on
        any member), or park it once it failed more than ``max_retries``."""
        self._group.nack(self, position)

    def ack(self, position: int) -> None:
        """Acknowledge one delivered event."""
        self._group.ack(self, position, through=False)

    def ack_through(self, position: int) -> None:
        """Acknowledge every event this member was given up to ``position``."""
        self._group.ack(self, position, through=True)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._readable.set()
        self._group.remove(self)


class ConsumerGroup:
    def __init__(
        self, store: EventStore, locks: GroupLocks, context: str, name: str, selector: Selector
    ) -> None:
        self.store = store
        self._locks = locks
        self.context = context
        self.name = name
        self.selector = selector
        self.members: list[GroupMember] = []
        self._inflight: dict[int, tuple[GroupMember, RecordedEvent]] = {}
        self._redeliver: deque[RecordedEvent] = deque()
        self._room = asyncio.Event()
        self._feeder: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._rr = 0
        self.dispatched_upto = 0
        self.checkpoint = 0
        self._saved_checkpoint = 0
        self._saving: asyncio.Task[None] | None = None
        self._owner = False
        # The lock generation the group was taken in (GroupLocks.holds).
        self._generation = -1
        self._outage = Outage(f"consumer group {name}", log, None)
        locks.on_lost.append(self._ownership_lost)
        # Persistent-subscription state (see the module docstring).
        self.settings = SubscriptionSettings()
        self.sub_id: int | None = None
        self.retries: dict[int, int] = {}  # position -> failures so far (store keeps them)
        self._taken: dict[int, float] = {}  # in flight and taken: since (monotonic)
        self._parking: dict[int, RecordedEvent] = {}  # being written to parked_events
        self._replaying: set[int] = set()  # parked events handed out again
        self._poke = asyncio.Event()
        self._housekeeper: asyncio.Task[None] | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()
        # The last member gone: the shutdown, held here so that it runs to its end.
        self._closing: asyncio.Task[None] | None = None

    def add(self, member: GroupMember) -> None:
        self.members.append(member)
        self.member_has_room()
        if self._task is None:
            self._task = asyncio.create_task(
                self._run(), name=f"polyport-group-{self.context}/{self.name}"
            )

    def member_has_room(self) -> None:
        self._room.set()

    def remove(self, member: GroupMember) -> None:
        if member in self.members:
            self.members.remove(member)
        # Give this member's unacknowledged events to the others, oldest
        # first; those its consumer had taken count as failed once.
        back = []
        for ev in sorted(
            (ev for pos, (m, ev) in self._inflight.items() if m is member),
            key=lambda e: e.position,
        ):
            del self._inflight[ev.position]
            if self._taken.pop(ev.position, None) is None or not self._fail(ev, "consumer left"):
                back.append(ev)
        self._redeliver.extendleft(reversed(back))
        self._room.set()
        if back and self._feeder is not None:
            self._feeder.interrupt()
        if not self.members:
            self.store.forget_group(self)
            with contextlib.suppress(ValueError):
                self._locks.on_lost.remove(self._ownership_lost)
            if self._task is not None:
                self._task.cancel()
            if self._housekeeper is not None:
                self._housekeeper.cancel()
            self._closing = asyncio.ensure_future(self._shutdown())

    async def _shutdown(self) -> None:
        if self._feeder is not None:
            self._feeder.close()
        # Parks in progress first: the checkpoint may then pass them.
        if self._side_tasks:
            await asyncio.gather(*list(self._side_tasks), return_exceptions=True)
        await self.flush()
        if self._owner and self._locks.holds(self._generation):
            with contextlib.suppress(Exception):  # a lost connection released it already
                await self._locks.release(self.context, self.name)
        self._owner = False

    def ack(self, member: GroupMember, position: int, *, through: bool) -> None:
        if through:
            done = [p for p, (m, _) in self._inflight.items() if m is member and p <= position]
        else:
            entry = self._inflight.get(position)
            done = [position] if entry is not None and entry[0] is member else []
        for pos in done:
            del self._inflight[pos]
            self._taken.pop(pos, None)
            self.retries.pop(pos, None)
            if pos in self._replaying:
                self._replaying.discard(pos)
                self._side_task(self._unpark(pos))
        if done:
            self._room.set()  # max_in_flight may have held dispatch back
        self._advance_checkpoint()

    # --- failures, parking, replay ------------------------------------------------

    def taken(self, ev: RecordedEvent) -> None:
        """A member's consumer took ``ev``: its message timeout starts."""
        if ev.position in self._inflight:
            self._taken[ev.position] = time.monotonic()

    def nack(self, member: GroupMember, position: int) -> None:
        entry = self._inflight.get(position)
        if entry is None or entry[0] is not member:
            return
        del self._inflight[position]
        self._taken.pop(position, None)
        if not self._fail(entry[1], "nack"):
            self._give_back([entry[1]])
        self._room.set()

    def _fail(self, ev: RecordedEvent, reason: str) -> bool:
        """Count one failure of ``ev`` (already out of flight); True when it
        went to be parked, False when the caller should hand it out again."""
        failures = self.retries.get(ev.position, 0) + 1
        limit = self.settings.max_retries
        if limit is None or failures <= limit or self.sub_id is None:
            self.retries[ev.position] = failures
            return False
        self.retries.pop(ev.position, None)
        self._parking[ev.position] = ev
        self._side_task(self._park(ev, failures, reason))
        return True

    def _give_back(self, events: list[RecordedEvent]) -> None:
        self._redeliver.extendleft(sorted(events, key=lambda e: e.position, reverse=True))
        self._room.set()
        if self._feeder is not None:
            self._feeder.interrupt()

    def _side_task(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _park(self, ev: RecordedEvent, failures: int, reason: str) -> None:
        assert self.sub_id is not None
        try:
            await self.store.parking.park(self.sub_id, ev.position, failures - 1, reason)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the event is parked again later
            # Not lost: it goes round again and is parked at its next failure.
            log.warning("subscription %s: parking position %d failed (%s); retrying it",
                        self.name, ev.position, exc)
            self._parking.pop(ev.position, None)
            self._give_back([ev])
            return
        log.info("subscription %s: parked the event at position %d (%s/%s) after %d retries "
                 "(last failure: %s)", self.name, ev.position, ev.context, ev.stream,
                 failures - 1, reason)
        self._parking.pop(ev.position, None)
        self._replaying.discard(ev.position)
        self._advance_checkpoint()

    async def _unpark(self, position: int) -> None:
        assert self.sub_id is not None
        try:
            await self.store.parking.unpark(self.sub_id, position)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the row stays marked for replay
            # The row stays marked for replay: the next owner hands it out again.
            log.warning("subscription %s: removing parked position %d failed: %s",
                        self.name, position, exc)

    def poke(self) -> None:
        """Settings changed or a replay was asked for: look now."""
        self._poke.set()

    async def _housekeep(self) -> None:
        """Message timeouts; settings and replay requests every REFRESH_INTERVAL."""
        refreshed = time.monotonic()
        while True:
            timeout = self.settings.message_timeout
            interval = min(REFRESH_INTERVAL, timeout / 4) if timeout else REFRESH_INTERVAL
            poked = await wait_event(self._poke, interval)
            self._poke.clear()
            if poked or time.monotonic() - refreshed >= REFRESH_INTERVAL:
                refreshed = time.monotonic()
                try:
                    await self._refresh()
                except Exception as exc:  # noqa: BLE001 - the owner loop must not die
                    log.warning("subscription %s: refresh failed: %s", self.name, exc)
            self._expire()

    async def _refresh(self) -> None:
        assert self.sub_id is not None
        _, self.settings = await self.store.parking.settings(self.context, self.name)
        due = await self.store.parking.replay_due(self.sub_id)
        fresh = [ev for ev in due if ev.position not in self._replaying]
        if fresh:
            self._replaying.update(ev.position for ev in fresh)
            log.info("subscription %s: replaying %d parked events", self.name, len(fresh))
            self._give_back(fresh)
        self._room.set()  # max_in_flight may have grown

    def _expire(self) -> None:
        timeout = self.settings.message_timeout
        if timeout is None:
            return
        now = time.monotonic()
        again = []
        for pos in [p for p, since in self._taken.items() if now - since >= timeout]:
            del self._taken[pos]
            entry = self._inflight.pop(pos, None)
            if entry is not None and not self._fail(entry[1], "timeout"):
                again.append(entry[1])
        if again:
            self._give_back(again)
        self._advance_checkpoint()

    def _advance_checkpoint(self) -> None:
        # Replayed parked events lie behind the checkpoint: they never hold it.
        pending = [
            p for p in (*self._inflight, *(e.position for e in self._redeliver), *self._parking)
            if p not in self._replaying
        ]
        new = min(pending) - 1 if pending else self.dispatched_upto
        if new > self.checkpoint:
            self.checkpoint = new
            if self._saving is None or self._saving.done():
                self._saving = asyncio.ensure_future(self.flush())

    async def flush(self) -> None:
        """Write the checkpoint; coalesces acks that arrive meanwhile."""
        while self._saved_checkpoint < self.checkpoint:
            target = self.checkpoint
            try:
                await self.store.advance_checkpoint(self.context, self.name, target)
            except Exception as exc:  # noqa: BLE001 - a failed save is retried at the next ack
                log.warning(
                    "checkpoint save for %s in %s failed: %s", self.name, self.context, exc
                )
                return
            self._saved_checkpoint = target

    def _pick(self) -> GroupMember | None:
        limit = self.settings.max_in_flight
        if limit is not None and len(self._inflight) >= limit:
            return None
        n = len(self.members)
        for i in range(n):
            m = self.members[(self._rr + i) % n]
            if m.capacity > 0 and not m.closed:
                self._rr = (self._rr + i + 1) % n
                return m
        return None

    def _ownership_lost(self) -> None:
        """The lock connection ended: another process may own the group now.
        Stop handing out at once and forget what was handed out but not read
        (the next owner delivers everything above the saved checkpoint)."""
        if not self._owner:
            return
        self._owner = False
        log.warning("consumer group %s: lost ownership; stopped delivering", self.name)
        self._inflight.clear()
        self._redeliver.clear()
        for m in self.members:
            m._buffer.clear()
        if self._feeder is not None:
            self._feeder.interrupt()
        self._room.set()

    async def _run(self) -> None:
        try:
            # Restarted after any failure, with bounded backoff; members stay.
            async for attempt in reconnecting(self._outage, any_error=True):
                with attempt:
                    await self._serve()
            self._outage.recovered()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("consumer group %s in %s stopped", self.name, self.context)

    async def _serve(self) -> None:
        try:
            if not (self._owner and self._locks.holds(self._generation)):
                # The lock lives in another process: nothing to wait on but time.
                while not await self._locks.try_acquire(self.context, self.name):  # noqa: ASYNC110
                    await asyncio.sleep(self.store.config.poll_interval)
                self._generation = self._locks.generation
                checkpoint = await self.store.durable_checkpoint(self.context, self.name)
                self._owner = True
                self.checkpoint = self._saved_checkpoint = self.dispatched_upto = checkpoint
                self._inflight.clear()
                self._redeliver.clear()
                # A new ownership hands out again from the checkpoint: nothing
                # is in a consumer's hands, no parked event is being replayed.
                self._taken.clear()
                self._replaying.clear()
            self._outage.recovered()
            # Still the owner after a failure: resume after what was handed out.
            self.sub_id, self.settings = await self.store.parking.settings(self.context, self.name)
            await self._refresh()
            if self._housekeeper is None or self._housekeeper.done():
                self._housekeeper = asyncio.create_task(
                    self._housekeep(), name=f"polyport-group-{self.name}-housekeeping"
                )
            self._feeder = self.store.start_subscription(
                self.selector, self.dispatched_upto, buffer_size=1000
            )
            while True:
                if not self._owner:
                    raise OwnershipLost(self.name)
                member = self._pick()
                if member is None:
                    self._room.clear()
                    await self._room.wait()
                    continue
                if self._redeliver:
                    ev = self._redeliver.popleft()
                else:
                    got = await self._feeder.next()
                    if got is None:
                        if self._feeder.closed:
                            return
                        continue  # interrupted: redelivery, or ownership lost
                    ev = got
                    if not self._owner:
                        raise OwnershipLost(self.name)
                    self.dispatched_upto = max(self.dispatched_upto, ev.position)
                member = self._pick() or member
                if member.closed:
                    self._redeliver.appendleft(ev)
                    continue
                self._inflight[ev.position] = (member, ev)
                member._push(ev)
        finally:
            with contextlib.suppress(Exception):
                if self._feeder is not None:
                    self._feeder.close()
            if self._housekeeper is not None:
                self._housekeeper.cancel()


class OwnershipLost(Exception):
    """The group's lock connection ended; its task starts over."""
