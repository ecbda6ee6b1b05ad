"""Commits at planned positions (migration 0011, core/writer.py): the events
of consecutive commits are inserted while the commit before is still open,
and a commit becomes visible only after the one before it, never without it."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from itertools import pairwise

import asyncpg
import orjson
import pytest

from polyport.core import sql
from polyport.core.commands import ReadStream
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore, StoreConfig
from polyport.core.writer import WriterLimits, at_args, fast_statement
from tests.core.helpers import append, ev, unique
from tests.pg import HEAD_LOCK, lock_waiters, row_locked

pytestmark = pytest.mark.timeout(60)


def _in_flight_before(store: EventStore) -> asyncio.Future[None]:
    """Make the writer's next batch find a batch still in flight before it
    (a commit at planned positions follows only such a one: with nothing in
    flight, moving the head first is the cheaper statement).  Resolve the
    returned future to let it end."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    store.writer._last_done = fut
    return fut


async def test_commits_in_flight_insert_together_and_commit_in_order(db_url: str) -> None:
    store = EventStore(StoreConfig(db_url, writer=WriterLimits(pipeline_depth=2)))
    await store.start()
    writer = store.writer
    try:
        a, b = unique("at-a"), unique("at-b")
        await store.append(append(a, ev(0)))  # moves the head first: now it is known
        await store.append(append(b, ev(0)))  # nothing in flight before it: the same
        assert writer.stats.planned_commits == 0
        earlier = _in_flight_before(store)
        async with row_locked(db_url, HEAD_LOCK):
            first = asyncio.create_task(store.append(append(a, ev(1))))
            # Inserted, waiting to move the head another transaction holds.
            await lock_waiters(db_url, 1)
            second = asyncio.create_task(store.append(append(a, ev(2), ev(3))))
            # Inserted too, waiting for the first commit's transaction.
            await lock_waiters(db_url, 2)
            assert sum(writer._statement_sent) == 2
            async with _connect(db_url) as conn:
                # Nothing of either is visible yet.
                assert await conn.fetchval(
                    "SELECT count(*) FROM events WHERE stream = $1", a) == 1
            await asyncio.sleep(0.1)
            assert not first.done() and not second.done()
        earlier.set_result(None)
        one, two = await asyncio.gather(first, second)
        assert writer.stats.planned_commits == 2 and writer.stats.planned_refused == 0
        assert (one.first_version, two.first_version, two.last_version) == (2, 3, 4)
        assert two.first_position == one.last_position + 1
        events = await store.read_all(0)
        assert [e.position for e in events] == list(range(1, len(events) + 1))
        times = [e.recorded_at for e in events]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert [e.version for e in await store.read_stream(ReadStream("default", a))] == [
            1, 2, 3, 4]
    finally:
        await store.close()


async def test_many_commits_at_planned_positions_stay_gapless(db_url: str) -> None:
    store = EventStore(StoreConfig(db_url, writer=WriterLimits(pipeline_depth=4)))
    await store.start()
    try:
        streams = [unique("many") for _ in range(8)]

        async def publish(stream: str) -> None:
            for i in range(40):
                await store.append(append(stream, ev(i)))

        await asyncio.gather(*(publish(s) for s in streams))
        assert store.writer.stats.planned_commits > 0
        events = await store.read_all(0, 1000)
        assert [e.position for e in events] == list(range(1, 321))
        times = [e.recorded_at for e in events]
        assert all(x < y for x, y in pairwise(times))
        for s in streams:
            read = await store.read_stream(ReadStream("default", s))
            assert [e.version for e in read] == list(range(1, 41))
            assert [e.body for e in read] == [ev(i).body for i in range(40)]
    finally:
        await store.close()


async def test_another_process_committing_sends_the_writer_back_to_moving_the_head(
    db_url: str,
) -> None:
    ours = EventStore(StoreConfig(db_url))
    theirs = EventStore(StoreConfig(db_url, writer=WriterLimits(planned_positions=False)))
    await ours.start()
    await theirs.start()
    writer = ours.writer
    try:
        s = unique("ours")
        await ours.append(append(s, ev(0)))  # the head is known now
        await theirs.append(append(unique("theirs"), ev(0), ev(1)))
        # Planned after our own commit: the positions are taken.
        earlier = _in_flight_before(ours)
        pending = asyncio.create_task(ours.append(append(s, ev(1))))
        await asyncio.sleep(0.3)
        earlier.set_result(None)  # redone on the checked path after it
        result = await pending
        assert (result.first_version, result.first_position) == (2, 4)
        assert writer.stats.planned_refused == 1 and writer.stats.planned_commits == 0
        assert writer._planned_after > time.monotonic()
        await ours.append(append(s, ev(2)))
        await ours.append(append(s, ev(3)))
        assert writer.stats.planned_commits == 0  # still moving the head first
        events = await ours.read_all(0)
        assert [e.position for e in events] == [1, 2, 3, 4, 5, 6]
    finally:
        await ours.close()
        await theirs.close()


# --- the function itself (migration 0011) ------------------------------------

class _Batch:
    """One event for sql.APPEND_AT, following the commit ``after``."""

    def __init__(self, base: int, after: uuid.UUID, stream: str) -> None:
        self.token = uuid.uuid4()
        body = b"x"
        doc = orjson.dumps([[str(uuid.uuid4()), "t", {}, "text/plain", None, "test",
                             "default", stream, 1, 0, 0, len(body)]]).decode()
        _, _, parts = fast_statement(1, doc, body, [], [], [], [], [])
        self.args = at_args(parts, base, datetime.now(UTC), after, self.token)


async def _head(conn: asyncpg.Connection) -> tuple[int, uuid.UUID | None]:
    row = await conn.fetchrow("SELECT last_position, last_commit FROM log_head WHERE id = 1")
    return row["last_position"], row["last_commit"]


class _connect:
    def __init__(self, db_url: str) -> None:
        self.dsn = asyncpg_dsn(db_url)

    async def __aenter__(self) -> asyncpg.Connection:
        self.conn: asyncpg.Connection = await asyncpg.connect(self.dsn)
        return self.conn

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()


async def _start_at_a_known_head(conn: asyncpg.Connection) -> uuid.UUID:
    token = uuid.uuid4()
    await conn.execute("UPDATE log_head SET last_commit = $1 WHERE id = 1", token)
    return token


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_a_commit_waits_for_the_one_before_and_never_follows_a_failed_one(
    db_url: str, outcome: str,
) -> None:
    async with _connect(db_url) as c1, _connect(db_url) as c2:
        start = await _start_at_a_known_head(c1)
        first = _Batch(0, start, unique("f"))
        second = _Batch(1, first.token, unique("s"))
        tx = c1.transaction()
        await tx.start()
        await c1.execute(sql.APPEND_AT, *first.args)  # inserted, head moved, not committed
        following = asyncio.create_task(c2.execute(sql.APPEND_AT, *second.args))
        await lock_waiters(db_url, 1)  # the second waits for the first's transaction
        assert not following.done()
        if outcome == "commit":
            await tx.commit()
            await following
            assert await _head(c1) == (2, second.token)
            assert await c1.fetchval("SELECT count(*) FROM events") == 2
        else:
            await tx.rollback()
            with pytest.raises(asyncpg.SerializationError, match="not where this commit"):
                await following
            assert await _head(c1) == (0, start)
            assert await c1.fetchval("SELECT count(*) FROM events") == 0


async def test_a_commit_refuses_a_head_another_history_left_at_its_base(db_url: str) -> None:
    """The position alone is not enough: a commit of the same size in place
    of the one planned before leaves the head at this commit's base."""
    async with _connect(db_url) as conn:
        start = await _start_at_a_known_head(conn)
        planned_before = _Batch(0, start, unique("p"))
        other = _Batch(0, start, unique("o"))
        await conn.execute(sql.APPEND_AT, *other.args)  # took the planned one's place
        after = _Batch(1, planned_before.token, unique("a"))
        with pytest.raises(asyncpg.SerializationError):
            await conn.execute(sql.APPEND_AT, *after.args)
        assert await _head(conn) == (1, other.token)
        assert await conn.fetchval("SELECT count(*) FROM events") == 1
