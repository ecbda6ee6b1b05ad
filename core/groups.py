"""Durable subscriptions and consumer groups.

A durable name is scoped by its context: (context, name) owns a checkpoint
row in ``subscriptions``.  Every live subscriber with that name is a member
of one group: a single feeding subscription reads from the checkpoint and
hands each event to one member with room.  The checkpoint advances to the
highest position below which every handed-out event has been acknowledged; a
member that leaves gives its unacknowledged events back to the others.
Across gateway processes one process at a time owns a group (an advisory
lock); members elsewhere wait.
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
            if self._task is not None:
                self._task.cancel()
            asyncio.ensure_future(self._shutdown())

    async def _shutdown(self) -> None:
        if self._feeder is not None:
            self._feeder.close()
        await self.flush()
        if self._owner:
            await self._locks.release(self.context, self.name)
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
                await self.store.advance_checkpoint(self.context, self.name, target)
            except Exception as exc:
                log.warning(
                    "checkpoint save for %s in %s failed: %s", self.name, self.context, exc
                )
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

    async def _run(self) -> None:
        try:
            # The lock lives in another process: nothing to wait on but time.
            while not await self._locks.try_acquire(self.context, self.name):  # noqa: ASYNC110
                await asyncio.sleep(self.store.config.poll_interval)
            self._owner = True
            checkpoint = await self.store.durable_checkpoint(self.context, self.name)
            self.checkpoint = self._saved_checkpoint = self.dispatched_upto = checkpoint
            self._feeder = self.store.start_subscription(
                self.selector, checkpoint, buffer_size=1000
            )
            while True:
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
                        continue  # interrupted: events came back to redeliver
                    ev = got
                    self.dispatched_upto = max(self.dispatched_upto, ev.position)
                member = self._pick() or member
                if member.closed:
                    self._redeliver.appendleft(ev)
                    continue
                self._inflight[ev.position] = (member, ev)
                member._push(ev)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("consumer group %s in %s stopped", self.name, self.context)
        finally:
            with contextlib.suppress(Exception):
                if self._feeder is not None:
                    self._feeder.close()
