"""Acceptance: migrate creates the schema on an empty database, downgrade to
base and upgrade to head round-trip, and serve refuses a stale schema."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import asyncpg
import pytest

from polyport.core import migrate
from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore, StoreConfig
from tests.listeners import port_flags


def polyport(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "polyport.gateway.cli.main", *args],
                          check=False, capture_output=True, text=True, timeout=120)


async def tables(url: str) -> set[str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


async def test_migrate_round_trip_and_stale_serve(empty_db_url: str) -> None:
    serve = await asyncio.to_thread(
        polyport, "serve", "--database-url", empty_db_url, "--http-port", "0",
        *port_flags("off", but=("http",)))
    assert serve.returncode != 0
    assert "polyport migrate" in serve.stderr

    up = await asyncio.to_thread(polyport, "migrate", "--database-url", empty_db_url)
    assert up.returncode == 0, up.stderr
    assert {"events", "streams", "log_head", "subscriptions", "users", "binders"} <= await tables(
        empty_db_url)
    assert await migrate.current_revision(empty_db_url) == migrate.head_revision()

    current = await asyncio.to_thread(polyport, "migrate", "current", "--database-url",
                                      empty_db_url)
    assert "up to date" in current.stdout

    down = await asyncio.to_thread(polyport, "migrate", "downgrade", "base", "--yes",
                                   "--database-url", empty_db_url)
    assert down.returncode == 0, down.stderr
    assert await tables(empty_db_url) == {"alembic_version"}
    assert await migrate.current_revision(empty_db_url) is None

    again = await asyncio.to_thread(polyport, "migrate", "upgrade", "--database-url",
                                    empty_db_url)
    assert again.returncode == 0, again.stderr
    assert await migrate.current_revision(empty_db_url) == migrate.head_revision()

    history = await asyncio.to_thread(polyport, "migrate", "history", "--database-url",
                                      empty_db_url)
    assert "Initial schema" in history.stdout


def test_the_head_revision_is_the_newest_revision_file() -> None:
    # The gateway checks the database against migrations.HEAD_REVISION without
    # loading Alembic: a new revision file must move it.
    assert migrate.head_revision() == migrate.script_head(), (
        "migrations/versions has a newer revision than migrations.HEAD_REVISION: "
        "set HEAD_REVISION to it")


async def test_schema_matches_metadata(db_url: str) -> None:
    """The migrations and core.schema describe the same tables and columns."""
    from polyport.core.schema import metadata

    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name <> 'alembic_version'")
    finally:
        await conn.close()
    in_db: dict[str, set[str]] = {}
    for r in rows:
        in_db.setdefault(r["table_name"], set()).add(r["column_name"])
    in_meta = {t.name: {c.name for c in t.columns} for t in metadata.sorted_tables}
    assert in_db == in_meta


async def test_stream_state_survives_downgrade_past_0003(empty_db_url: str) -> None:
    """0003 drops the per-stream state columns; going back recomputes them from
    the events, and the store reads the same state before and after."""
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")
    store = EventStore(StoreConfig(empty_db_url, run_binders=False))
    await store.start()
    try:
        await store.append(Append("default", "a", (EventData("t", b"12345"),) * 1))
        await store.append(Append("default", "a", (EventData("t", b"xy"), EventData("t", b""))))
        await store.append(Append("default", "b", (EventData("t", b"z"),)))
        before = {s: await store.stream_state("default", s) for s in ("a", "b", "none")}
    finally:
        await store.close()
    assert before == {"a": (3, 8 * 3 + 7), "b": (1, 9), "none": None}

    await asyncio.to_thread(migrate.downgrade, empty_db_url, "0002")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        rows = await conn.fetch(
            "SELECT stream, last_version, segment_length FROM streams ORDER BY stream")
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [("a", 3, 31), ("b", 1, 9)]

    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")
    store = EventStore(StoreConfig(empty_db_url, run_binders=False))
    await store.start()
    try:
        assert {s: await store.stream_state("default", s) for s in ("a", "b", "none")} == before
        result = await store.append(Append("default", "a", (EventData("t", b"!"),)))
        assert (result.first_version, result.first_position) == (4, 5)
    finally:
        await store.close()


async def test_binder_errors_come_and_go_with_0004(empty_db_url: str) -> None:
    """0004 adds the table of events binders skipped; downgrading to 0003
    drops it and leaves the binders and their documents as they were."""
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        await conn.execute(
            "INSERT INTO binders (name, context, stream_prefix, fold, position, created_at) "
            "VALUES ('b', 'default', '', 'merge', 7, now())")
        await conn.execute(
            "INSERT INTO binder_errors (binder, position, error, recorded_at) "
            "VALUES ('b', 3, 'RecursionError: too deep', now())")
    finally:
        await conn.close()

    await asyncio.to_thread(migrate.downgrade, empty_db_url, "0003")
    assert "binder_errors" not in await tables(empty_db_url)
    assert await migrate.current_revision(empty_db_url) == "0003"

    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")
    store = EventStore(StoreConfig(empty_db_url, run_binders=False))
    await store.start()
    try:
        [spec] = await store.binders.list()
        assert (spec.name, spec.position, spec.failures, spec.recent_failures) == ("b", 7, 0, ())
    finally:
        await store.close()


async def test_subscription_context_comes_and_goes_with_0007(empty_db_url: str) -> None:
    """0007 scopes durable names by context, backfilled from the selector
    ('default' when it names none); the downgrade refuses while two contexts
    share a name and puts the global unique name back once they do not."""
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "0006")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        for name, selector in (("g", '{"context": "shop"}'), ("all", '{"context": null}'),
                               ("bare", "{}")):
            await conn.execute(
                "INSERT INTO subscriptions (name, selector, checkpoint, created_at, updated_at) "
                "VALUES ($1, $2::jsonb, 3, now(), now())", name, selector)
    finally:
        await conn.close()

    await asyncio.to_thread(migrate.upgrade, empty_db_url, "0007")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        rows = await conn.fetch("SELECT name, context FROM subscriptions ORDER BY name")
        assert [tuple(r) for r in rows] == [("all", "default"), ("bare", "default"),
                                            ("g", "shop")]
        # Same name, another context: allowed now; same pair twice: not.
        insert = ("INSERT INTO subscriptions (context, name, selector, checkpoint, created_at, "
                  "updated_at) VALUES ($1, 'g', '{}'::jsonb, 0, now(), now())")
        await conn.execute(insert, "other")
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(insert, "shop")
    finally:
        await conn.close()

    with pytest.raises(Exception, match="'g' in other, shop"):
        await asyncio.to_thread(migrate.downgrade, empty_db_url, "0006")
    assert await migrate.current_revision(empty_db_url) == "0007"

    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        await conn.execute("DELETE FROM subscriptions WHERE context = 'other'")
    finally:
        await conn.close()
    await asyncio.to_thread(migrate.downgrade, empty_db_url, "0006")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        columns = {r["column_name"] for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'subscriptions'")}
        assert "context" not in columns
        assert await conn.fetchval("SELECT checkpoint FROM subscriptions WHERE name = 'g'") == 3
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO subscriptions (name, selector, checkpoint, created_at, updated_at) "
                "VALUES ('g', '{}'::jsonb, 0, now(), now())")
    finally:
        await conn.close()
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")


async def test_event_ids_per_context_come_and_go_with_0008(empty_db_url: str) -> None:
    """0008 makes an event id unique per context; the downgrade refuses while
    two contexts hold the same id and puts the global key back otherwise."""
    shared = uuid.uuid4()
    insert = (
        "INSERT INTO events (position, event_id, context, stream, version, type, headers, "
        "body, content_type, recorded_at, origin, segment_offset) "
        "VALUES ($1, $2, $3, 's', $4, 't', '{}'::jsonb, ''::bytea, 'x', now(), 'core', 0)")
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "0007")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        await conn.execute(insert, 1, shared, "a", 1)
        with pytest.raises(asyncpg.UniqueViolationError):  # global before 0008
            await conn.execute(insert, 2, shared, "b", 1)
    finally:
        await conn.close()

    await asyncio.to_thread(migrate.upgrade, empty_db_url, "0008")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        await conn.execute(insert, 2, shared, "b", 1)  # another context: its own id
        with pytest.raises(asyncpg.UniqueViolationError):  # twice in one context: never
            await conn.execute(insert, 3, shared, "b", 2)
    finally:
        await conn.close()

    with pytest.raises(Exception, match=f"{shared} in a, b"):
        await asyncio.to_thread(migrate.downgrade, empty_db_url, "0007")
    assert await migrate.current_revision(empty_db_url) == "0008"

    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        await conn.execute("DELETE FROM events WHERE context = 'b'")
    finally:
        await conn.close()
    await asyncio.to_thread(migrate.downgrade, empty_db_url, "0007")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(insert, 4, shared, "c", 1)
    finally:
        await conn.close()


async def _event_indexes(url: str) -> set[str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'events'")
        return {r["indexname"] for r in rows}
    finally:
        await conn.close()


async def test_leaner_event_indexes_come_and_go_with_0009(empty_db_url: str) -> None:
    """0009 drops the segment-offset and recorded-at indexes and analyzes the
    table; downgrading to 0008 builds both again over the events there are,
    and the store reads the same segment and time starts on either side."""
    kept = {"events_pkey", "events_stream_version_key", "events_context_event_id_key"}
    dropped = {"events_stream_offset_idx", "events_recorded_at_idx"}
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "0008")
    assert await _event_indexes(empty_db_url) == kept | dropped

    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")
    assert await _event_indexes(empty_db_url) == kept
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        assert await conn.fetchval(
            "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'events'")
    finally:
        await conn.close()
    store = EventStore(StoreConfig(empty_db_url, run_binders=False))
    await store.start()
    try:
        for body in (b"12345", b"xy", b"", b"z" * 40):
            await store.append(Append("default", "a", (EventData("t", body),)))
        events = await store.read_all(0, 10)
    finally:
        await store.close()

    await asyncio.to_thread(migrate.downgrade, empty_db_url, "0008")
    assert await _event_indexes(empty_db_url) == kept | dropped
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        # The rebuilt indexes answer what the bisections did.
        assert await conn.fetchval(
            "SELECT max(position) FROM events WHERE recorded_at < $1",
            events[2].recorded_at) == events[1].position
        assert await conn.fetchval(
            "SELECT version FROM events WHERE context = 'default' AND stream = 'a' "
            "AND segment_offset <= $1 ORDER BY segment_offset DESC LIMIT 1",
            events[2].segment_offset + 3) == 3
    finally:
        await conn.close()
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")
    assert await _event_indexes(empty_db_url) == kept


async def test_subscription_creators_come_and_go_with_0010(empty_db_url: str) -> None:
    """0010 adds subscriptions.created_by (rows from before count against
    nobody) and its partial index; downgrading to 0009 drops both and keeps
    the rows."""

    async def columns() -> set[str]:
        conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
        try:
            rows = await conn.fetch("SELECT column_name FROM information_schema.columns "
                                    "WHERE table_name = 'subscriptions'")
            indexes = await conn.fetch("SELECT indexname FROM pg_indexes "
                                       "WHERE tablename = 'subscriptions'")
        finally:
            await conn.close()
        return {r["column_name"] for r in rows} | {r["indexname"] for r in indexes}

    await asyncio.to_thread(migrate.upgrade, empty_db_url, "0009")
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        await conn.execute("INSERT INTO subscriptions (context, name, selector, checkpoint, "
                           "created_at, updated_at) VALUES ('a', 'old', '{}', 0, now(), now())")
    finally:
        await conn.close()
    assert not {"created_by", "subscriptions_created_by_idx"} & await columns()
    await asyncio.to_thread(migrate.upgrade, empty_db_url, "head")
    assert {"created_by", "subscriptions_created_by_idx"} <= await columns()
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        assert await conn.fetchval("SELECT created_by FROM subscriptions") is None
    finally:
        await conn.close()
    await asyncio.to_thread(migrate.downgrade, empty_db_url, "0009")
    assert not {"created_by", "subscriptions_created_by_idx"} & await columns()
    conn = await asyncpg.connect(asyncpg_dsn(empty_db_url))
    try:
        assert await conn.fetchval("SELECT name FROM subscriptions") == "old"
    finally:
        await conn.close()
