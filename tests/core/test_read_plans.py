"""Read plans that do not depend on luck (issue 30, goal 2).

Every read statement runs, under ``plan_cache_mode = force_generic_plan``
(what a pooled connection's prepared statement switches to after five
executions) and under custom plans, on 100,000 events that were never
analyzed; each may read at most a bound of buffers, counted by EXPLAIN
(ANALYZE, BUFFERS).  Buffers, not time: a plan that scans from the cursor
to the head reads thousands, one that uses the right index a few hundred.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from polyport.core import sql
from polyport.core.events import SEGMENT_EVENT_HEADER_SIZE
from polyport.core.migrate import asyncpg_dsn

ROWS = 100_000
BODY = 200
START = datetime(2026, 1, 1, tzinfo=UTC)
# A cursor early in the log: a plan that scans from it to the head reads
# 90,000 rows (about 4,000 buffers).
AFTER = 10_000
# A batch of 500 rows of one stream on 500 pages, its index pages and the
# bisection's probes; or a lag count's 10,000 positions (about 450 pages).
BOUND = 1_000

# Positions 1..ROWS: every 1000th in context "rare" (stream "r"), the rest in
# 100 streams "cat<k % 10>-<k % 100>" of context "default"; type "Rare" every
# 5000th.  Versions count per stream from 1; segment offsets follow them.
# Stored in position order, as appends store them.
FILL = f"""
INSERT INTO events (position, event_id, context, stream, version, type, headers, body,
                    content_type, client_time, recorded_at, origin, segment_offset)
SELECT i, md5(i::text)::uuid, c, s, v, t, '{{}}'::jsonb, decode(repeat('78', {BODY}), 'hex'),
       'application/json', NULL, timestamptz '{START.isoformat()}' + i * interval '1 ms',
       'core', (v - 1) * {SEGMENT_EVENT_HEADER_SIZE + BODY}
FROM (
    SELECT i, c, s, t, row_number() OVER (PARTITION BY c, s ORDER BY i) AS v
    FROM (
        SELECT i,
               CASE WHEN i % 1000 = 0 THEN 'rare' ELSE 'default' END AS c,
               CASE WHEN i % 1000 = 0 THEN 'r' ELSE 'cat' || i % 10 || '-' || i % 100 END AS s,
               CASE WHEN i % 5000 = 0 THEN 'Rare' ELSE 'T' || i % 7 END AS t
        FROM generate_series(1, {ROWS}) AS i
    ) k
) n
ORDER BY i
"""


# A persistent subscription (id 1) with three events parked, two to replay.
PARKED = """
INSERT INTO subscriptions (id, context, name, selector, checkpoint, created_at, updated_at)
VALUES (1, 'default', 'p', '{}'::jsonb, 95000, now(), now());
INSERT INTO parked_events (subscription_id, position, retries, reason, parked_at, replay)
VALUES (1, 20000, 3, 'x', now(), true), (1, 60000, 3, 'x', now(), true),
       (1, 94000, 3, 'x', now(), false);
"""


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'::timestamptz"
    if isinstance(value, list) and value and isinstance(value[0], uuid.UUID):
        return "ARRAY[" + ", ".join(f"'{v}'" for v in value) + "]::uuid[]"
    if isinstance(value, list) and value and isinstance(value[0], int):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]::bigint[]"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]::text[]"
    raise TypeError(value)


def _cases() -> dict[str, tuple[str, tuple[Any, ...]]]:
    def selected(context: str | None, stream: str | None = None, prefix: str | None = None,
                 types: frozenset[str] = frozenset()) -> tuple[str, tuple[Any, ...]]:
        read = sql.selected_read(AFTER, ROWS, 500, context, stream, prefix, types)
        return read.statement, read.args

    stream_offset = 500 * (SEGMENT_EVENT_HEADER_SIZE + BODY) + 17
    return {
        "catch-up: whole log": selected(None),
        "catch-up: a context": selected("default"),
        "catch-up: a rare context": selected("rare"),
        "catch-up: one stream": selected("default", "cat3-23"),
        "catch-up: a rare stream": selected("rare", "r"),
        "catch-up: a category": selected("default", prefix="cat3-"),
        "catch-up: a rare type": selected("default", types=frozenset({"Rare"})),
        "catch-up: a stream in any context": selected(None, "cat3-23"),
        "lag count: a rare context": (
            sql.COUNT_SELECTED,
            (AFTER, AFTER + 10_000, *sql.selected_params("rare", None, None, ()), 10_000),
        ),
        "tail": (sql.READ_ALL_AFTER, (AFTER, 500)),
        "stream read by version": (sql.READ_STREAM, ("default", "cat3-23", 400, 500)),
        "segment read from an offset": (
            sql.READ_SEGMENT_FROM, ("default", "cat3-23", stream_offset, 100)),
        "stream state": (sql.STREAM_STATE, ("default", "cat3-23")),
        "stream states": (sql.STREAM_STATES, (["default", "rare"], ["cat3-23", "r"])),
        "start at a time": (sql.POSITION_BEFORE_TIME, (START + timedelta(seconds=30),)),
        "start at a version": (sql.POSITION_BEFORE_VERSION, ("default", "cat3-23", 700)),
        "re-sent event ids": (
            sql.EXISTING_EVENT_IDS,
            (["default", "rare"], [uuid.UUID(_md5(5)), uuid.UUID(_md5(7000))]),
        ),
        "times of positions": (sql.RECORDED_AT_MANY, ([5, 50_000, 99_999],)),
        "parked events": (sql.LIST_PARKED, (1, 100)),
        "parked events to replay": (sql.REPLAY_DUE, (1, 100)),
        "parked events to replay, fetch-style": (sql.FETCH_REPLAY_DUE, (1, 90_000, 100)),
        "a fetch's subscription, head and replay flag": (sql.FETCH_STATE, (1,)),
    }


def _md5(i: int) -> str:
    import hashlib

    return hashlib.md5(str(i).encode()).hexdigest()


async def _buffers(conn: asyncpg.Connection, statement: str, args: tuple[Any, ...]) -> int:
    await conn.execute(f"PREPARE q AS {statement}")
    try:
        call = f"EXECUTE q({', '.join(_literal(a) for a in args)})" if args else "EXECUTE q"
        plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {call}"))
    finally:
        await conn.execute("DEALLOCATE q")
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


@pytest.mark.timeout(120)
async def test_every_read_plan_is_bounded_without_statistics(db_url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        await conn.execute("ALTER TABLE events SET (autovacuum_enabled = false)")
        await conn.execute(FILL)
        await conn.execute(
            "UPDATE log_head SET last_position = $1, last_recorded_at = $2 WHERE id = 1",
            ROWS, START + timedelta(milliseconds=ROWS))
        await conn.execute(PARKED)
        analyzed = await conn.fetchval(
            "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL "
            "FROM pg_stat_user_tables WHERE relname = 'events'")
        assert not analyzed
        read: dict[str, int] = {}
        for mode in ("force_generic_plan", "force_custom_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            for name, (statement, args) in _cases().items():
                read[f"{name} ({mode})"] = await _buffers(conn, statement, args)
    finally:
        await conn.close()
    over = {name: n for name, n in read.items() if n > BOUND}
    assert not over, f"buffers read over {BOUND}: {over} (all: {read})"


async def test_bisected_starts_match_the_scans_they_replace(db_url: str) -> None:
    """The bisections answer what the range scans did: the first event of a
    stream past a position, the event holding a segment offset, the last
    position before a time; at both ends and past them too."""
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        await conn.execute(FILL.replace(str(ROWS), "3000"))
        await conn.execute(
            "UPDATE log_head SET last_position = 3000, last_recorded_at = $1 WHERE id = 1",
            START + timedelta(milliseconds=3000))
        frame = SEGMENT_EVENT_HEADER_SIZE + BODY
        for after in (0, 1, 22, 23, 1523, 2923, 2999, 3000):
            got = await conn.fetch(sql.READ_STREAM_SELECTED, after, 3000, "default", "cat3-23",
                                   5)
            want = await conn.fetch(
                "SELECT position FROM events WHERE context = 'default' AND stream = 'cat3-23' "
                "AND position > $1 ORDER BY position LIMIT 5", after)
            assert [r["position"] for r in got] == [r["position"] for r in want], after
        for offset in (0, 1, frame - 1, frame, 7 * frame + 3, 29 * frame, 29 * frame + 5):
            got = await conn.fetch(sql.READ_SEGMENT_FROM, "default", "cat3-23", offset, 3)
            want = await conn.fetch(
                "SELECT position FROM events WHERE context = 'default' AND stream = 'cat3-23' "
                "AND segment_offset >= (SELECT coalesce(max(segment_offset), 0) FROM events "
                "WHERE context = 'default' AND stream = 'cat3-23' AND segment_offset <= $1) "
                "ORDER BY segment_offset LIMIT 3", offset)
            assert [r["position"] for r in got] == [r["position"] for r in want], offset
        assert await conn.fetch(sql.READ_SEGMENT_FROM, "default", "none", 0, 3) == []
        for ms in (-5, 0, 1, 2, 1500, 2999, 3000, 3001, 9000):
            at = START + timedelta(milliseconds=ms)
            got = await conn.fetchval(sql.POSITION_BEFORE_TIME, at)
            want = await conn.fetchval(
                "SELECT coalesce(max(position), 0) FROM events WHERE recorded_at < $1", at)
            assert got == want, ms
    finally:
        await conn.close()



async def test_a_read_from_the_top_of_the_key_space_is_empty(store: Any) -> None:
    """A stream read names its versions as a closed range: a client's
    from_version near the top of bigint reads nothing, not an overflow."""
    from polyport.core.commands import Append, ReadStream
    from polyport.core.events import EventData

    await store.append(Append("default", "a", (EventData("t", b"x"),)))
    top = (1 << 63) - 1
    for version, count in ((top, 1000), (top - 5, 1000), (2, top)):
        assert await store.read_stream(ReadStream("default", "a", version, count)) == []
    assert len(await store.read_stream(ReadStream("default", "a", 1, top))) == 1


async def test_sparse_selectors_cross_many_scan_windows(store: Any) -> None:
    """A selector that picks few events reads the log a batch of positions
    per statement: subscriptions, durable fetches and binders still see
    every event they pick, past windows that hold none."""
    from polyport.core.commands import BEGINNING, Selector, Subscribe
    from tests.core.helpers import append, ev

    await store.binders.create("carts", context="default", stream_prefix="cart-")
    await store.append(append("cart-1", ev(1)))
    for k in range(5):
        await store.append(append(f"other-{k}", *(ev(n) for n in range(500))))
    await store.append(append("cart-2", ev(2)))
    last = await store.append(append("cart-1", ev(3), context="elsewhere"))
    assert last.last_position == 2_503

    sub = await store.subscribe(Subscribe(
        Selector(context="default", prefix="cart-"), start=BEGINNING, buffer_size=1))
    try:
        got = [await sub.next(10), await sub.next(10)]
        assert [(e.stream, e.position) for e in got if e is not None] == [
            ("cart-1", 1), ("cart-2", 2_502)]
        assert await sub.next(0.3) is None
    finally:
        sub.close()
    await store.binders.wait_caught_up("carts", last.last_position)
    assert (await store.query("carts", {})).count == 2
