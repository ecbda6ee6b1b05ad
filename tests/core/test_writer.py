"""The group-commit writer's pipeline: a batch planned while its predecessor
commits still counts as waiting, and batches commit in the order taken."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest

from polyport.core.commands import ExactVersion, ReadStream
from polyport.core.errors import Busy, Timeout, WrongExpectedVersion
from polyport.core.events import EventData
from polyport.core.limits import _VALID_TEXT, _VALID_TEXT_MAX
from polyport.core.limits import check_text as _check_text
from polyport.core.store import EventStore, StoreConfig
from polyport.core.writer import WriterLimits
from tests.core.helpers import append, ev, unique
from tests.pg import HEAD_LOCK, lock_waiters, row_locked

pytestmark = pytest.mark.timeout(60)


async def test_planned_batches_count_as_waiting_and_commit_in_order(db_url: str) -> None:
    # Moving the head first: the second batch goes to the database at once.
    limits = WriterLimits(max_pending_events=2, pipeline_depth=2, commit_timeout=20,
                          planned_positions=False)
    store = EventStore(StoreConfig(db_url, writer=limits))
    await store.start()
    try:
        streams = [unique("pipe") for _ in range(3)]
        async with row_locked(db_url, HEAD_LOCK):
            first = asyncio.create_task(store.append(append(streams[0], ev(1))))
            await lock_waiters(db_url, 1)  # in the database, waiting for the head lock
            second = asyncio.create_task(store.append(append(streams[1], ev(2))))
            await lock_waiters(db_url, 2)  # another stream: sent too, waits on the lock
            third = asyncio.create_task(store.append(append(streams[2], ev(3))))
            await asyncio.sleep(0.2)  # queued
            assert store.writer.queue_depth == 2
            with pytest.raises(Busy):
                await store.append(append(unique("refused"), ev(4)))
        results = await asyncio.gather(first, second, third)
        positions = [r.first_position for r in results]
        # The first holds the head first.  The second and the third (sent
        # when the first's slot freed) touch other streams and have no
        # defined order (docs/architecture.md, "Order"): PostgreSQL lets the
        # third's UPDATE take the new head row while the second still
        # follows the update chain from the old one (seen under load).
        assert positions[0] == min(positions)
        assert sorted(positions) == list(range(positions[0], positions[0] + 3))
        assert store.writer.queue_depth == 0
    finally:
        await store.close()


async def test_pipelined_appends_to_one_stream_keep_their_order(store: EventStore) -> None:
    stream = unique("order")
    results = await asyncio.gather(*(store.append(append(stream, ev(i))) for i in range(200)))
    assert [r.first_version for r in results] == list(range(1, 201))
    positions = [r.first_position for r in results]
    assert positions == sorted(positions)


async def test_batch_planned_on_a_failed_batch_leaves_no_version_gap(db_url: str) -> None:
    """The second batch is planned on the first one's expected stream state.
    When the first fails in the database, the second must not write the
    versions it planned (they would leave a gap): it re-reads the stream."""
    store = EventStore(StoreConfig(db_url, writer=WriterLimits(pipeline_depth=2)))
    await store.start()
    try:
        stream, other = unique("gap"), unique("other")
        await store.append(append(stream, ev(1)))
        taken = ev(2)
        await store.append(append(other, taken))
        async with row_locked(db_url, HEAD_LOCK):
            # Planned as version 2; fails in the database: the id is already
            # stored, in another stream.
            first = asyncio.create_task(store.append(append(stream, taken)))
            await asyncio.sleep(0.2)
            # Planned as version 3 while the first waits for the lock.
            second = asyncio.create_task(store.append(append(stream, ev(3))))
            await asyncio.sleep(0.2)
        with pytest.raises(WrongExpectedVersion):
            await first
        result = await second
        assert result.first_version == 2
        events = await store.read_stream(ReadStream("default", stream))
        assert [e.version for e in events] == [1, 2]
    finally:
        await store.close()


async def test_fast_path_round_trips_every_column(store: EventStore) -> None:
    stream = unique("cols")
    ct = datetime(1999, 12, 31, 23, 59, 59, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    events = (
        EventData("tÿpe \"quoted\" \\ back", b"\x00\xff binary \x00", headers={
            "ключ": "значение 🎉", "quote\"": "back\\slash", "ctl": "\t\n\x1f"},
            content_type="application/x-odd; charset=utf-8", client_time=ct),
        EventData("naive", b"", client_time=datetime(2020, 1, 2, 3, 4, 5, 6)),
        EventData("none", b"{}"),
    )
    result = await store.append(append(stream, *events))
    assert (result.first_version, result.last_version) == (1, 3)
    read = await store.read_stream(ReadStream("default", stream))
    assert [(e.type, e.body, dict(e.headers), e.content_type, e.client_time) for e in read] == [
        (e.type, e.body, dict(e.headers), e.content_type, e.client_time) for e in events]
    assert read[1].client_time == datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert [e.segment_offset for e in read] == [0, 8 + 11, 8 + 11 + 8]


async def test_a_bad_name_is_refused_after_good_ones_were_remembered(db_url: str) -> None:
    """Valid names are remembered so repeats skip the check; a NUL or an
    unpaired surrogate must still fail its own append, and only that one."""
    store = EventStore(StoreConfig(db_url))
    await store.start()
    try:
        stream = unique("names")
        for _ in range(3):
            await store.append(append(stream, ev(1)))
        bad = [stream + "\x00", stream + "\ud800"]
        outcomes = await asyncio.gather(
            *(store.append(append(name, ev(2))) for name in bad),
            store.append(append(stream, ev(3))),
            return_exceptions=True,
        )
        assert [type(o).__name__ for o in outcomes] == ["Malformed", "Malformed", "AppendResult"]
        assert "NUL" in str(outcomes[0]) and "surrogate" in str(outcomes[1])
    finally:
        await store.close()


def test_the_remembered_names_are_bounded() -> None:
    _VALID_TEXT.clear()
    for i in range(_VALID_TEXT_MAX + 10):
        _check_text(f"name-{i}", "stream name")
    assert len(_VALID_TEXT) <= _VALID_TEXT_MAX
    assert "name-0" not in _VALID_TEXT  # cleared when it filled up


async def test_closing_with_a_commit_in_flight_returns_when_it_commits(db_url: str) -> None:
    """drain_and_stop while a batch is in the database: the writer loop must
    see that batch end (it used to look before the task's done-callback ran,
    then slept until the drain timeout, commit_timeout + 5 s)."""
    store = EventStore(StoreConfig(db_url, writer=WriterLimits(commit_timeout=10)))
    await store.start()
    try:
        stream = unique("drain")
        async with row_locked(db_url, HEAD_LOCK):
            pending = asyncio.create_task(store.append(append(stream, ev(1))))
            await lock_waiters(db_url, 1)  # in the database, waiting for the head lock
            closing = asyncio.create_task(store.writer.drain_and_stop())
            await asyncio.sleep(0.2)
            assert not closing.done()
        loop = asyncio.get_running_loop()
        released = loop.time()
        await asyncio.wait_for(closing, 15)
        assert loop.time() - released < 3
        assert (await pending).first_version == 1
    finally:
        await store.close()


async def test_a_batch_on_other_streams_waits_in_the_database_not_in_the_loop(
    db_url: str,
) -> None:
    """While a commit waits for the head lock, the next batch goes to the
    database at once when it shares no stream with it (and queues on the same
    lock there); one that shares a stream waits for its predecessor here.
    (Commits that move the head first; at planned positions every batch
    follows the one before in PostgreSQL, see the tests below.)"""
    store = EventStore(StoreConfig(db_url, writer=WriterLimits(pipeline_depth=2,
                                                               planned_positions=False)))
    await store.start()
    writer = store.writer
    try:
        a, b = unique("ahead-a"), unique("ahead-b")
        await asyncio.gather(store.append(append(a, ev(0))), store.append(append(b, ev(0))))
        async with row_locked(db_url, HEAD_LOCK):
            first = asyncio.create_task(store.append(append(a, ev(1))))
            await asyncio.sleep(0.2)
            same = asyncio.create_task(store.append(append(a, ev(2))))
            await asyncio.sleep(0.2)
            assert sum(writer._statement_sent) == 1  # the same stream waits here
        await asyncio.gather(first, same)
        async with row_locked(db_url, HEAD_LOCK):
            first = asyncio.create_task(store.append(append(a, ev(3))))
            await asyncio.sleep(0.2)
            other = asyncio.create_task(store.append(append(b, ev(1))))
            await asyncio.sleep(0.2)
            assert sum(writer._statement_sent) == 2  # both wait on the lock in PostgreSQL
            assert not first.done() and not other.done()
        results = await asyncio.gather(first, other)
        assert sorted(r.first_position for r in results) == [
            min(r.first_position for r in results),
            min(r.first_position for r in results) + 1,
        ]
        versions = [e.version for e in await store.read_stream(ReadStream("default", a))]
        assert versions == [1, 2, 3, 4]
    finally:
        await store.close()


async def test_a_batch_after_one_that_went_ahead_still_waits_for_the_earlier_one(
    db_url: str,
) -> None:
    """A batch sent ahead can finish before its predecessor (it reached the
    head lock first).  The batch after it, planned on the predecessor's
    expected state of a shared stream, must wait for the predecessor, not
    only for the batch that went ahead: else its versions commit first and a
    stream's versions come out of position order."""
    store = EventStore(StoreConfig(db_url, writer=WriterLimits(pipeline_depth=2,
                                                               planned_positions=False)))
    await store.start()
    writer = store.writer
    try:
        a, b = unique("late-a"), unique("late-b")
        await store.append(append(a, ev(0)))
        await store.append(append(b, ev(0)))
        slow_slot = writer._free_slots[0]
        real = writer._connection

        async def slow_connection(slot: int):  # type: ignore[no-untyped-def]
            if slot == slow_slot:
                await asyncio.sleep(0.5)  # this batch reaches PostgreSQL late
            return await real(slot)

        writer._connection = slow_connection  # type: ignore[method-assign]
        first = asyncio.create_task(store.append(append(a, ev(1))))  # the slow slot
        await asyncio.sleep(0.05)
        await store.append(append(b, ev(1)))  # ahead, on the other slot: done first
        assert not first.done()
        third = asyncio.create_task(store.append(append(a, ev(2))))  # planned on `first`
        results = await asyncio.gather(first, third)
        assert [r.first_version for r in results] == [2, 3]
        assert results[0].first_position < results[1].first_position
        events = await store.read_stream(ReadStream("default", a))
        assert [e.version for e in events] == [1, 2, 3]
        positions = [e.position for e in events]
        assert positions == sorted(positions)
    finally:
        await store.close()


async def test_on_settle_hears_each_outcome_once_in_the_committing_turn(
    store: EventStore,
) -> None:
    # The commit chain answers another worker from on_settle: in the turn
    # that commits, so the answer joins the commit's own message.
    writer = store.writer
    heard: list[tuple[str, bool]] = []
    committed_in_turn: list[bool] = []

    def told(name: str):
        def on_settle(fut: asyncio.Future) -> None:
            heard.append((name, fut.exception() is None))
            # Called from the commit's own task; a done-callback runs a
            # turn later, outside any task.
            committed_in_turn.append(asyncio.current_task() is not None)
        return on_settle

    stream = unique("told")
    ok = writer.enqueue([append(stream, ev(1))], on_settle=told("ok"))
    bad = writer.enqueue([append(stream, ev(2), expected=ExactVersion(9))],
                         on_settle=told("bad"))
    assert (await ok)[0].first_version == 1
    with pytest.raises(WrongExpectedVersion):
        await bad
    await asyncio.sleep(0.05)  # the futures' done-callbacks ran too: still once each
    assert sorted(heard) == [("bad", False), ("ok", True)]
    assert committed_in_turn == [True, True]


async def test_on_settle_hears_a_refusal_settled_outside_a_commit(db_url: str) -> None:
    # A unit that expires in the queue is settled by the timer, not by a
    # commit: on_settle hears of it through the future.  (Moving the head
    # first, both batches wait on the held lock in PostgreSQL.)
    limits = WriterLimits(commit_timeout=0.3, planned_positions=False)
    store = EventStore(StoreConfig(db_url, writer=limits))
    await store.start()
    heard: list[BaseException | None] = []
    try:
        async with row_locked(db_url, HEAD_LOCK):
            first = asyncio.create_task(store.append(append(unique("held"), ev(1))))
            await lock_waiters(db_url, 1)
            second = asyncio.create_task(store.append(append(unique("held2"), ev(2))))
            await lock_waiters(db_url, 2)
            late = store.writer.enqueue([append(unique("late"), ev(3))],
                                        on_settle=lambda f: heard.append(f.exception()))
            with pytest.raises(Timeout):
                await late
            await asyncio.sleep(0.05)
        await asyncio.gather(first, second, return_exceptions=True)
    finally:
        await store.close()
    assert len(heard) == 1 and isinstance(heard[0], Timeout)
