"""NOTIFY only for listeners of another notify group (core/notify.py)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from polyport.core import notify, sql
from polyport.core.commands import BEGINNING, Selector, Subscribe
from polyport.core.migrate import asyncpg_dsn
from polyport.core.notify import Notifier
from polyport.core.store import EventStore, StoreConfig
from tests.core.helpers import append, ev
from tests.waiting import eventually


class _Heard:
    """A plain LISTEN on the events channel, optionally holding the listener
    lock of ``group`` as a tailer does."""

    def __init__(self) -> None:
        self.payloads: list[int] = []
        self.conn: asyncpg.Connection | None = None

    async def open(self, dsn: str, group: int | None) -> None:
        self.conn = await asyncpg.connect(dsn)
        await self.conn.add_listener(
            sql.NOTIFY_CHANNEL, lambda *a: self.payloads.append(int(a[-1])))
        if group is not None:
            await self.conn.execute(sql.HOLD_LISTENER_LOCK, sql.LISTENER_LOCK_KEY, group)
            await self.conn.execute(sql.LISTENER_HELLO, str(group))

    async def close(self) -> None:
        assert self.conn is not None
        await self.conn.close()


async def _heard_after(notifier: Notifier, heard: _Heard, position: int) -> bool:
    notifier.committed(position)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        if position in heard.payloads:
            return True
        await asyncio.sleep(0.02)
    return False


async def _delivered(reader: EventStore, writer: EventStore, stream: str) -> None:
    """An append through ``writer`` reaches a live subscriber on ``reader``."""
    sub = await reader.subscribe(Subscribe(Selector(context="default"), start=BEGINNING))
    try:
        await writer.append(append(stream, ev(1)))
        got = await sub.next(5.0)
        assert got is not None and got.stream == stream
    finally:
        sub.close()


@pytest.fixture(autouse=True)
def _fresh_presence(monkeypatch: pytest.MonkeyPatch) -> None:
    # Look again at every notification rather than once a second.
    monkeypatch.setattr(notify, "PRESENCE_INTERVAL", 0.0)


async def test_a_notifier_speaks_only_while_another_group_listens(db_url: str) -> None:
    dsn = asyncpg_dsn(db_url)
    notifier = Notifier(dsn, 0.001, group=11)
    notifier.start()
    bare, same, other = _Heard(), _Heard(), _Heard()
    try:
        # A LISTEN without the lock, and one of the notifier's own group:
        # nobody another group's notifier needs to tell.
        await bare.open(dsn, None)
        await same.open(dsn, 11)
        assert not await _heard_after(notifier, same, 1)
        assert notifier.sent == 0
        assert bare.payloads == []

        await other.open(dsn, 12)
        assert await _heard_after(notifier, other, 2)
        assert 2 in same.payloads and 2 in bare.payloads  # NOTIFY reaches every listener

        # The other group's listener leaves (its connection, and so its
        # lock, goes): silence again.
        await other.close()
        sent = notifier.sent
        assert not await _heard_after(notifier, same, 3)
        assert notifier.sent == sent
    finally:
        notifier.stop()
        await bare.close()
        await same.close()


async def test_always_notifies_its_own_group(db_url: str) -> None:
    # A worker committing while its chain is away: its siblings share its
    # group and hear of those commits only this way.
    dsn = asyncpg_dsn(db_url)
    notifier = Notifier(dsn, 0.001, group=21, always=True)
    notifier.start()
    sibling = _Heard()
    try:
        await sibling.open(dsn, 21)
        assert await _heard_after(notifier, sibling, 5)
    finally:
        notifier.stop()
        await sibling.close()


async def test_a_store_wakes_another_store_without_polling(db_url: str) -> None:
    # Two gateways on one database: polling every 30 s, the subscriber on
    # the second sees the first's append at once only if it was notified.
    writer = EventStore(StoreConfig(db_url, poll_interval=30, run_binders=False))
    reader = EventStore(StoreConfig(db_url, poll_interval=30, run_binders=False))
    await writer.start()
    await reader.start()
    try:
        assert writer.tailer.notify_group != reader.tailer.notify_group
        await _delivered(reader, writer, "n")
    finally:
        await reader.close()
        await writer.close()


async def test_a_store_that_starts_later_is_heard_from_at_once(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first store found nobody else listening and would not look again
    # for an hour: the newcomer's hello makes it look at the next commit.
    monkeypatch.setattr(notify, "PRESENCE_INTERVAL", 3600.0)
    writer = EventStore(StoreConfig(db_url, poll_interval=30, run_binders=False))
    await writer.start()
    notifier = writer._notifier
    reader: EventStore | None = None
    try:
        await writer.append(append("early", ev(0)))
        # The notifier looked (its answer is stamped with when) and found nobody.
        await eventually(lambda: notifier._others[1] > float("-inf"), what="the first look")
        assert notifier.sent == 0
        reader = EventStore(StoreConfig(db_url, poll_interval=30, run_binders=False))
        await reader.start()
        sub = await reader.subscribe(Subscribe(Selector(context="default", stream="late")))
        # The newcomer's hello reached the writer's notifier: its answer is due again.
        await eventually(lambda: notifier._others[1] == float("-inf"), what="the hello")
        await writer.append(append("late", ev(1)))
        got = await sub.next(5.0)
        assert got is not None and got.stream == "late"
        # Counted once the NOTIFY returned, which may be after it was heard.
        await eventually(lambda: notifier.sent >= 1, what="a notification")
        sub.close()
    finally:
        if reader is not None:
            await reader.close()
        await writer.close()


async def test_a_store_alone_sends_no_notifications(db_url: str) -> None:
    store = EventStore(StoreConfig(db_url, poll_interval=0.2, run_binders=False))
    await store.start()
    try:
        for i in range(20):
            await store.append(append("alone", ev(i)))
        await asyncio.sleep(0.1)
        assert store._notifier.sent == 0
    finally:
        await store.close()


async def test_a_taken_listener_lock_does_not_hang_the_listen(db_url: str) -> None:
    # An exclusive lock on the same keys (a consumer group whose names hash
    # to them) must not make the tailer wait: it starts, and polls.
    group = 4242
    holder = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        await holder.execute("SELECT pg_advisory_lock($1::int4, $2::int4)",
                             sql.LISTENER_LOCK_KEY, group)
        store = EventStore(StoreConfig(db_url, poll_interval=0.2, run_binders=False,
                                       notify_group=group))
        await asyncio.wait_for(store.start(), 10)
        try:
            await _delivered(store, store, "taken")
        finally:
            await store.close()
    finally:
        await holder.close()
