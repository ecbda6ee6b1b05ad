"""Durable subscriptions and consumer groups.

A durable name owns a checkpoint row in ``subscriptions``.  Every live
subscriber with that name is a member of one group: a single feeding
subscription reads from the checkpoint and hands each event to one member
with room.  The checkpoint advances to the highest position below which every
handed-out event has been acknowledged; a member that leaves gives its
unacknowledged events back to the others.  Across gateway processes one
process at a time owns a group (an advisory lock); members elsewhere wait.

Database trouble does not end a group: its task restarts with bounded
backoff and keeps its members.  While it still owns the lock it resumes
where it was (nothing handed out twice); once the lock connection is gone it
stops handing out at once, drops what its members had not read yet, and
when it owns the group again starts over from the saved checkpoint, so every
unacknowledged event is delivered again (at least once, never skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

from polyport.core.commands import Selector
from polyport.core.events import RecordedEvent
from polyport.core.locks import GroupLocks
from polyport.core.reader import BufferedReader
from polyport.core.retry import Outage, reconnecting
from polyport.core.subscriptions import Subscription

if TYPE_CHECKING:
    from polyport.core.store import EventStore

log = logging.getLogger("polyport.groups")


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
    def capacity(self) -> int:
        room = self._limit - len(self._buffer)
        if self._credits is not None:
            room = min(room, self._credits - len(self._buffer))
        return room

    def _push(self, ev: RecordedEvent) -> None:
        self._buffer.append(ev)
        self._readable.set()

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
        self, store: EventStore, locks: GroupLocks, name: str, selector: Selector
    ) -> None:
        self.store = store
        self._locks = locks
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

    def add(self, member: GroupMember) -> None:
        self.members.append(member)
        self.member_has_room()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"polyport-group-{self.name}")

    def member_has_room(self) -> None:
        self._room.set()

    def remove(self, member: GroupMember) -> None:
        if member in self.members:
            self.members.remove(member)
        # Give this member's unacknowledged events to the others, oldest first.
        back = sorted(
            (ev for pos, (m, ev) in self._inflight.items() if m is member),
            key=lambda e: e.position,
        )
        for ev in back:
            del self._inflight[ev.position]
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
            asyncio.ensure_future(self._shutdown())

    async def _shutdown(self) -> None:
        if self._feeder is not None:
            self._feeder.close()
        await self.flush()
        if self._owner and self._locks.holds(self._generation):
            with contextlib.suppress(Exception):  # a lost connection released it already
                await self._locks.release(self.name)
        self._owner = False

    def ack(self, member: GroupMember, position: int, *, through: bool) -> None:
        if through:
            for pos in [p for p, (m, _) in self._inflight.items() if m is member and p <= position]:
                del self._inflight[pos]
        else:
            entry = self._inflight.get(position)
            if entry is not None and entry[0] is member:
                del self._inflight[position]
        self._advance_checkpoint()

    def _advance_checkpoint(self) -> None:
        pending = [*self._inflight.keys(), *(e.position for e in self._redeliver)]
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
                await self.store.advance_checkpoint(self.name, target)
            except Exception as exc:
                log.warning("checkpoint save for %s failed: %s", self.name, exc)
                return
            self._saved_checkpoint = target

    def _pick(self) -> GroupMember | None:
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
            log.exception("consumer group %s stopped", self.name)

    async def _serve(self) -> None:
        try:
            if not (self._owner and self._locks.holds(self._generation)):
                # The lock lives in another process: nothing to wait on but time.
                while not await self._locks.try_acquire(self.name):  # noqa: ASYNC110
                    await asyncio.sleep(self.store.config.poll_interval)
                self._generation = self._locks.generation
                checkpoint = await self.store.durable_checkpoint(self.name)
                self._owner = True
                self.checkpoint = self._saved_checkpoint = self.dispatched_upto = checkpoint
                self._inflight.clear()
                self._redeliver.clear()
            self._outage.recovered()
            # Still the owner after a failure: resume after what was handed out.
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


class OwnershipLost(Exception):
    """The group's lock connection ended; its task starts over."""
