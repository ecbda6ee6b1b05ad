from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from polyport.core.access import Tenant
from polyport.core.commands import (
    BEGINNING,
    Append,
    FromPosition,
    FromTime,
    FromVersion,
    Principal,
    Selector,
    Subscribe,
)
from polyport.core.errors import Forbidden, Malformed, NotFound
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore, StoreConfig
from tests.core.helpers import append, ev


async def collect(sub, n: int, timeout: float = 5.0) -> list:
    out = []
    while len(out) < n:
        e = await sub.next(timeout)
        assert e is not None, f"got {len(out)} of {n}"
        out.append(e)
    return out


def _count_reads(store: EventStore) -> list[int]:
    reads = [0]
    real = store.tailer.read_selected

    async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        reads[0] += 1
        return await real(*args, **kwargs)

    store.tailer.read_selected = counted  # type: ignore[method-assign]
    return reads


async def test_catch_up_then_live_in_order(store: EventStore) -> None:
    for i in range(30):
        await store.append(append(f"o-{i % 3}", ev(i)))
    sub = await store.subscribe(Subscribe(Selector(context="default"), start=BEGINNING))
    first = await collect(sub, 30)
    writers = [store.append(append(f"o-{i % 3}", ev(i))) for i in range(30, 60)]
    await asyncio.gather(*writers)
    rest = await collect(sub, 30)
    assert [e.position for e in first + rest] == list(range(1, 61))
    sub.close()


async def test_selectors_and_starts(store: EventStore) -> None:
    await store.append(append("cart-1", ev(1, type="added"), ev(2, type="removed")))
    await store.append(append("cart-2", ev(3, type="added")))
    await store.append(append("order-1", ev(4, type="added")))
    await store.append(append("cart-1", ev(5, type="added"), context="other"))
    prefix = await store.subscribe(
        Subscribe(Selector(context="default", prefix="cart-", types=frozenset({"added"})),
                  start=BEGINNING))
    got = await collect(prefix, 2)
    assert [(e.stream, e.version) for e in got] == [("cart-1", 1), ("cart-2", 1)]
    assert await prefix.next(0.3) is None
    exact = await store.subscribe(
        Subscribe(Selector(context="default", stream="cart-1"), start=FromVersion(2)))
    assert [e.version for e in await collect(exact, 1)] == [2]
    everything = await store.subscribe(Subscribe(Selector(context=None), start=FromPosition(3)))
    assert [e.position for e in await collect(everything, 2)] == [4, 5]
    t = (await store.read_all(0, 10))[2].recorded_at
    by_time = await store.subscribe(Subscribe(Selector(context=None), start=FromTime(t)))
    assert [e.position for e in await collect(by_time, 3)] == [3, 4, 5]
    matcher = await store.subscribe(Subscribe(
        Selector(context=None, matcher=lambda e: e.body == b'{"n": 4}'), start=BEGINNING))
    assert [e.position for e in await collect(matcher, 1)] == [4]
    for s in (prefix, exact, everything, by_time, matcher):
        s.close()


async def test_end_start_sees_only_new_events(store: EventStore) -> None:
    await store.append(append("e", ev(1)))
    sub = await store.subscribe(Subscribe(Selector(context="default")))
    assert await sub.next(0.3) is None
    await store.append(append("e", ev(2)))
    assert (await collect(sub, 1))[0].version == 2
    sub.close()


async def test_credit_limited_subscriber_never_gets_more_than_granted(store: EventStore) -> None:
    for i in range(20):
        await store.append(append("c", ev(i)))
    sub = await store.subscribe(Subscribe(Selector(context="default"), start=BEGINNING),
                                credit=True)
    assert await sub.next(0.3) is None
    sub.grant(1)
    assert len(await collect(sub, 1)) == 1
    assert await sub.next(0.2) is None
    sub.grant(2)
    assert len(await collect(sub, 2)) == 2
    assert await sub.next(0.2) is None
    sub.grant(1000)
    assert [e.version for e in await collect(sub, 17)] == list(range(4, 21))
    assert sub.credits == 1000 - 17
    sub.close()


async def test_a_batch_stays_within_credits_and_is_observed_once(store: EventStore) -> None:
    for i in range(20):
        await store.append(append("b", ev(i)))
    seen: list[list[int]] = []
    store.on_deliver = lambda events: seen.append([e.version for e in events])
    sub = await store.subscribe(Subscribe(Selector(context="default"), start=BEGINNING),
                                credit=True)
    for _ in range(500):  # the catch-up fills the buffer without credits
        if sub.buffered == 20:
            break
        await asyncio.sleep(0.01)
    sub.grant(7)
    assert [e.version for e in await sub.next_batch(100, timeout=2)] == list(range(1, 8))
    assert await sub.next_batch(100, timeout=0.1) == []  # out of credits
    sub.grant(100)
    assert [e.version for e in await sub.next_batch(5, timeout=2)] == list(range(8, 13))
    assert [e.version for e in await sub.next_batch(100, timeout=2)] == list(range(13, 21))
    assert seen == [list(range(1, 8)), list(range(8, 13)), list(range(13, 21))]
    assert (sub.delivered, sub.credits) == (20, 100 - 13)
    sub.close()


async def test_full_subscriber_does_not_delay_others(store: EventStore) -> None:
    slow = await store.subscribe(Subscribe(Selector(context="default"), buffer_size=5))
    fast = await store.subscribe(Subscribe(Selector(context="default"), buffer_size=5))
    got = []
    for i in range(50):
        await store.append(append("f", ev(i)))
        got.append(await fast.next(5))
    assert [e.version for e in got] == list(range(1, 51))
    # The slow one never read, yet still gets everything, in order, afterwards.
    late = await collect(slow, 50)
    assert [e.version for e in late] == list(range(1, 51))
    slow.close()
    fast.close()


async def test_durable_subscription_resumes_after_restart(db_url: str) -> None:
    s1 = EventStore(StoreConfig(db_url, poll_interval=0.2))
    await s1.start()
    for i in range(10):
        await s1.append(append("d", ev(i)))
    m = await s1.subscribe(Subscribe(Selector(context="default"), start=BEGINNING,
                                     durable="dur-1"))
    got = await collect(m, 6)
    m.ack_through(got[3].position)  # acked 4 of the 6 received
    m.close()
    await s1.close()
    s2 = EventStore(StoreConfig(db_url, poll_interval=0.2))
    await s2.start()
    m2 = await s2.subscribe(Subscribe(Selector(context="default"), start=BEGINNING,
                                      durable="dur-1"))
    rest = await collect(m2, 6)
    assert [e.version for e in rest] == list(range(5, 11))
    m2.close()
    await s2.close()


async def test_consumer_group_splits_between_members(store: EventStore) -> None:
    sel = Selector(context="default", stream="q")
    a = await store.subscribe(Subscribe(sel, start=BEGINNING, durable="grp", buffer_size=10))
    b = await store.subscribe(Subscribe(sel, start=BEGINNING, durable="grp", buffer_size=10))
    for i in range(40):
        await store.append(append("q", ev(i)))
    seen_a: list[int] = []
    seen_b: list[int] = []

    async def drain(member, into):
        while True:
            e = await member.next(0.5)
            if e is None:
                return
            into.append(e.version)
            member.ack(e.position)

    await asyncio.gather(drain(a, seen_a), drain(b, seen_b))
    assert seen_a and seen_b
    assert not set(seen_a) & set(seen_b)
    assert sorted(seen_a + seen_b) == list(range(1, 41))
    a.close()
    b.close()


async def test_fetch_and_progress(store: EventStore) -> None:
    for i in range(5):
        await store.append(append("pull", ev(i)))
    sub = await store.register_fetch_subscription(
        "res01:x", Selector(context="default", prefix=""), BEGINNING)
    again = await store.register_fetch_subscription(
        "res01:x", Selector(context="default", prefix=""), BEGINNING)
    assert again.id == sub.id
    b1 = await store.fetch(sub.id, 2)
    assert [e.version for e in b1] == [1, 2]
    assert [e.version for e in await store.fetch(sub.id, 2)] == [1, 2]
    assert not await store.progress(sub.id, b1[0].recorded_at)
    assert await store.progress(sub.id, b1[-1].recorded_at)
    assert not await store.progress(sub.id, b1[-1].recorded_at)
    assert [e.version for e in await store.fetch(sub.id, 10)] == [3, 4, 5]
    await store.seek(sub.id, FromTime(b1[-1].recorded_at))
    assert [e.version for e in await store.fetch(sub.id, 1)] == [2]


async def test_durable_names_are_scoped_by_context(store: EventStore) -> None:
    """The same group name in two contexts is two groups with two checkpoints:
    neither sees the other's events, and acks in one do not move the other."""
    for i in range(3):
        await store.append(append("q", ev(i), context="ctx-a"))
        await store.append(append("q", ev(10 + i), context="ctx-b"))
    a = await store.subscribe(Subscribe(Selector(context="ctx-a"), start=BEGINNING,
                                        durable="same"))
    b = await store.subscribe(Subscribe(Selector(context="ctx-b"), start=BEGINNING,
                                        durable="same"))
    got_a, got_b = await collect(a, 3), await collect(b, 3)
    assert {e.context for e in got_a} == {"ctx-a"} and {e.context for e in got_b} == {"ctx-b"}
    assert await a.next(0.2) is None and await b.next(0.2) is None
    a.ack_through(got_a[-1].position)
    a.close()
    b.close()
    await asyncio.sleep(0.1)  # the group saves its checkpoint as it shuts down
    assert await store.durable_checkpoint("ctx-a", "same") == got_a[-1].position
    assert await store.durable_checkpoint("ctx-b", "same") == 0
    subs = {(s["context"], s["name"]) for s in await store.list_subscriptions()}
    assert subs == {("ctx-a", "same"), ("ctx-b", "same")}
    assert await store.delete_subscription("ctx-b", "same")
    assert await store.subscription_id("ctx-b", "same") is None
    assert await store.subscription_id("ctx-a", "same") is not None


async def test_durable_subscription_must_name_one_context(store: EventStore) -> None:
    with pytest.raises(Malformed):
        await store.subscribe(Subscribe(Selector(context=None), start=BEGINNING, durable="g"))
    with pytest.raises(Malformed):
        await store.register_fetch_subscription("f", Selector(context=None), BEGINNING)
    assert await store.list_subscriptions() == []


async def test_tenant_keeps_durable_subscriptions_in_its_contexts(store: EventStore) -> None:
    """Through a Tenant, a durable name, a fetch id or a context outside the
    principal's contexts is forbidden, whoever guesses it."""
    alice = Tenant(store, Principal("alice", "ctx-a", frozenset({"ctx-a"})))
    bob = Tenant(store, Principal("bob", "ctx-b", frozenset({"ctx-b"})))
    mine = await alice.register_fetch_subscription("f", Selector(context="ctx-a"), BEGINNING)
    theirs = await bob.register_fetch_subscription("f", Selector(context="ctx-b"), BEGINNING)
    assert mine.id != theirs.id and (mine.context, theirs.context) == ("ctx-a", "ctx-b")
    assert await alice.fetch_subscription_id("ctx-a", "f") == mine.id
    for attempt in (
        alice.fetch(theirs.id, 1),
        alice.seek(theirs.id, BEGINNING),
        alice.fetch_subscription(theirs.id),
        alice.fetch_subscription_id("ctx-b", "f"),
        alice.subscribe(Subscribe(Selector(context="ctx-b"), start=BEGINNING, durable="f")),
        alice.subscribe(Subscribe(Selector(context=None), start=BEGINNING)),
    ):
        with pytest.raises(Forbidden):
            await attempt
    assert (await alice.fetch_subscription(mine.id)).name == "f"
    # A refused fetch is refused before it reads or records a batch: what
    # Bob fetches first is still his first batch, and his PS takes it.
    await store.append(Append("ctx-b", "s", (ev(1),)))
    with pytest.raises(Forbidden):
        await alice.fetch(theirs.id, 1, wait=0.2)
    row = await store.db.fetchrow(
        "SELECT fetched_position FROM subscriptions WHERE id = $1", theirs.id)
    assert row["fetched_position"] is None
    [first] = await bob.fetch(theirs.id, 1)
    # Alice naming Bob's batch is refused, and moves nothing: the batch is
    # still Bob's to progress.
    with pytest.raises(Forbidden):
        await alice.progress(theirs.id, first.recorded_at)
    assert await bob.progress(theirs.id, first.recorded_at)
    assert not await bob.progress(theirs.id, first.recorded_at)  # done: a no-op
    with pytest.raises(NotFound):
        await bob.progress(10**9, first.recorded_at)


async def test_a_subscriber_behind_catches_up_in_batches(store: EventStore) -> None:
    """Fallen behind, a subscription reads from the database once real room
    is free, not once per event taken (which was slower than events arrive,
    so it never got back to the live feed)."""
    await store.append(append("trickle", *(ev(i) for i in range(600))))
    reads = _count_reads(store)
    sub = await store.subscribe(
        Subscribe(Selector(context="default", stream="trickle"), start=BEGINNING, buffer_size=50)
    )
    got = []
    for _ in range(600):
        e = await sub.next(5)
        assert e is not None
        got.append(e.version)
        await asyncio.sleep(0)  # the catch-up task runs between takes
    assert got == list(range(1, 601))
    # One read per emptied buffer of 50 (plus the last, empty one), not ~550.
    assert reads[0] <= 600 // 50 + 2, reads[0]
    sub.close()


async def test_a_subscriber_just_behind_joins_live_from_memory(store: EventStore) -> None:
    """Events the tailer fanned out recently are served from memory: the new
    subscription joins the live feed without a database read."""
    live = await store.subscribe(Subscribe(Selector(context="default", stream="recent")))
    await store.append(append("recent", *(ev(i) for i in range(100))))
    await collect(live, 100)
    reads = _count_reads(store)
    late = await store.subscribe(
        Subscribe(Selector(context="default", stream="recent"), start=FromVersion(41))
    )
    got = await collect(late, 60)
    assert [e.version for e in got] == list(range(41, 101))
    assert reads[0] == 0
    assert late.live  # type: ignore[attr-defined]
    await store.append(append("recent", ev(100)))
    nxt = await late.next(5)
    assert nxt is not None and nxt.version == 101
    live.close()
    late.close()


async def test_catching_up_under_steady_appends_reaches_the_live_feed(store: EventStore) -> None:
    """Appends keep arriving while a subscription catches up: it still joins
    the live feed (by database reads slower than the appends it stayed a
    round trip behind for ever) and sees
    every event once, in order."""
    live = await store.subscribe(Subscribe(Selector(context="default", stream="steady")))
    stop = asyncio.Event()
    warmed = asyncio.Event()
    appended = 0

    async def keep_appending() -> None:
        nonlocal appended
        while not stop.is_set():
            await store.append(append("steady", ev(appended)))
            appended += 1
            if appended == 20:
                warmed.set()

    real = store.tailer.read_selected

    async def slow_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        # A database read slower than events arrive, as under load.
        await asyncio.sleep(0.05)
        return await real(*args, **kwargs)

    store.tailer.read_selected = slow_read  # type: ignore[method-assign]
    writer = asyncio.create_task(keep_appending())
    try:
        await asyncio.wait_for(warmed.wait(), 10)
        sub = await store.subscribe(
            Subscribe(Selector(context="default", stream="steady"), start=BEGINNING)
        )
        versions = []
        async with asyncio.timeout(10):
            while not sub.live:  # type: ignore[attr-defined]
                e = await sub.next(5)
                assert e is not None
                versions.append(e.version)
    finally:
        stop.set()
        await writer
    versions += [e.version for e in await collect(sub, appended - len(versions))]
    assert versions == list(range(1, appended + 1))
    live.close()
    sub.close()


async def test_remembered_events_stay_bounded(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import polyport.core.subscriptions as subs

    monkeypatch.setattr(subs, "RECENT_EVENTS", 50)
    monkeypatch.setattr(subs, "RECENT_BYTES", 30 * (subs._RECENT_OVERHEAD + 1000))
    live = await store.subscribe(Subscribe(Selector(context="default", stream="ring")))
    await store.append(append("ring", *(ev(i) for i in range(80))))
    await collect(live, 80)
    recent = store.tailer._recent
    assert len(recent) == 50
    await store.append(append("ring", *(ev(i, body=b"x" * 1000) for i in range(80, 120))))
    await collect(live, 40)
    assert len(recent) <= 30
    positions = [e.position for e in recent]
    assert positions == list(range(positions[0], store.tailer.head + 1))
    # Older than memory reaches: read from the database, then memory, no gap.
    reads = _count_reads(store)
    old = await store.subscribe(
        Subscribe(Selector(context="default", stream="ring"), start=BEGINNING)
    )
    assert [e.version for e in await collect(old, 120)] == list(range(1, 121))
    assert reads[0] >= 1
    live.close()
    old.close()


async def test_live_events_from_memory_equal_the_stored_ones(store: EventStore) -> None:
    """Live subscribers get this process's commits without a read back: each
    must equal what the database returns for it, field by field (headers in
    jsonb's key order, client time in UTC, recorded_at to the microsecond)."""
    from datetime import datetime, timedelta, timezone

    from polyport.core.commands import ReadStream
    from polyport.core.events import EventData

    reads = _count_reads(store)
    live = await store.subscribe(Subscribe(Selector(context="default", stream="same")))
    plus2 = timezone(timedelta(hours=2))
    events = [
        EventData("a", b"\x00\xff", headers={"zz": "1", "a": "2", "bb": "3", "\u00e9": "4"},
                  client_time=datetime(2020, 5, 1, 12, 0, 0, 123456, tzinfo=plus2)),
        EventData("b", b"{}", content_type="application/json"),
        EventData("c", b"x", headers={"k": "v"}, client_time=datetime(2021, 1, 1)),
    ]
    await store.append(append("same", *events))
    await store.append(append("same", ev(3)))
    got = await collect(live, 4)
    assert reads[0] == 0  # straight from the commit, no catch-up read
    stored = await store.read_stream(ReadStream(context="default", stream="same"))
    assert got == list(stored)
    assert [list(e.headers) for e in got] == [list(e.headers) for e in stored]
    assert got[0].client_time is not None and got[0].client_time.utcoffset() == timedelta(0)
    live.close()


async def test_a_failing_fan_out_never_fails_the_commit(store: EventStore) -> None:
    """Fan-out from memory runs in the writer's commit path: whatever breaks
    there, the append is acknowledged and subscribers still get every event
    (read back from the database)."""
    calls = 0

    def broken(_ev: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("listener bug")

    live = await store.subscribe(Subscribe(Selector(context="default", stream="broken")))
    store.tailer.listeners.append(broken)
    try:
        result = await store.append(append("broken", *(ev(i) for i in range(3))))
        assert result.last_version == 3
        got = await collect(live, 3)
        assert [e.version for e in got] == [1, 2, 3]
    finally:
        store.tailer.listeners.remove(broken)
    live.close()


async def test_a_fetch_takes_what_committed_since_the_last_from_memory(
    store: EventStore,
) -> None:
    """A pull reader keeps the tailer feeding its memory: its next fetch
    takes the events committed since from there, with no read query, and
    they are what the read would have returned, for every kind of selector."""
    selectors = {
        "stream": Selector(context="default", stream="mem-a"),
        "prefix": Selector(context="default", prefix="mem-"),
        "types": Selector(context="default", prefix="", types=frozenset({"t1"})),
        "context": Selector(context="default", prefix=""),
    }
    await store.append(append("mem-a", ev(0, type="t1")))
    subs = {k: await store.register_fetch_subscription(f"mem:{k}", sel, BEGINNING)
            for k, sel in selectors.items()}
    for sub in subs.values():
        [first] = (await store.fetch(sub.id, 10))[-1:]
        assert await store.progress(sub.id, first.recorded_at)
    for i in range(1, 13):
        await store.append(append(("mem-a", "mem-b", "other")[i % 3],
                                  ev(i, type=("t1", "t2")[i % 2])))
    await store.append(append("mem-a", ev(99), context="elsewhere"))
    real_read = store.tailer.read_selected
    reads = _count_reads(store)
    # A fetch of two stops there (the batch PS will name), then the whole.
    two = await store.fetch(subs["context"].id, 2)
    fetched = {k: await store.fetch(sub.id, 100) for k, sub in subs.items()}
    assert reads[0] == 0
    assert two == fetched["context"][:2]
    head = store.tailer.head
    for k, sub in subs.items():
        checkpoint = (await store.get_fetch_subscription(sub.id)).checkpoint
        expected, _last, _done = await real_read(selectors[k], checkpoint, head, 500)
        assert fetched[k] == expected and expected, k
    assert {e.stream for e in fetched["stream"]} == {"mem-a"}
    assert {e.type for e in fetched["types"]} == {"t1"}


async def test_fetches_keep_the_tailer_feeding_only_for_a_while(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no fetch for RECENT_WANTED_SECONDS the tailer stops keeping
    events for pull readers; a fetch then reads them from the database."""
    from polyport.core import subscriptions

    monkeypatch.setattr(subscriptions, "RECENT_WANTED_SECONDS", 0.2)
    sub = await store.register_fetch_subscription(
        "mem:quiet", Selector(context="default", stream="quiet"), BEGINNING)
    assert await store.fetch(sub.id, 10) == []
    assert store.tailer.feeding
    await asyncio.sleep(0.3)
    assert not store.tailer.feeding
    await store.append(append("quiet", ev(1), ev(2)))
    reads = _count_reads(store)
    assert [e.version for e in await store.fetch(sub.id, 10)] == [1, 2]
    assert reads[0] >= 1


def _statements(store: EventStore) -> list[str]:
    """The statements the store's request paths send from now on in the
    calling task, by their name in core.sql (the tailer's reads, the writer
    and background tasks such as the binders' are not among them)."""
    from polyport.core import sql

    names = {text: name for name, text in vars(sql).items()
             if name.isupper() and isinstance(text, str)}
    sent: list[str] = []
    db = store.db
    caller = asyncio.current_task()
    for method in ("fetch", "fetchrow", "fetchval", "execute"):
        real = getattr(db, method)

        async def counted(query, *args, _real=real):  # type: ignore[no-untyped-def]
            if asyncio.current_task() is caller:
                sent.append(names.get(query, query))
            return await _real(query, *args)

        setattr(db, method, counted)
    return sent


async def _fetch_progress(store: EventStore, sub_id: int, count: int = 100) -> list:
    batch = await store.fetch(sub_id, count)
    assert batch and await store.progress(sub_id, batch[-1].recorded_at)
    return batch


async def test_a_fetch_loop_takes_each_batch_in_one_round_trip(store: EventStore) -> None:
    """In an FE/PS loop the store knows the checkpoint its own PS left: the
    next FE takes its batch from memory and records it in the statement
    that checks what it knew, one round trip, and the PS that names the
    batch moves the checkpoint as before."""
    sub = await store.register_fetch_subscription(
        "one-trip", Selector(context="default", stream="trip"), BEGINNING)
    await store.append(append("trip", ev(0)))
    await _fetch_progress(store, sub.id)
    sent = _statements(store)
    reads = _count_reads(store)
    for i in range(1, 10, 3):
        await store.append(append("trip", ev(i), ev(i + 1), ev(i + 2)))
        del sent[:]
        batch = await store.fetch(sub.id, 100)
        assert [e.version for e in batch] == [i + 1, i + 2, i + 3]
        assert sent == ["FETCH_STATE_RECORDING"]
        # Fetched again without a PS: the same batch, recorded again.
        assert await store.fetch(sub.id, 100) == batch
        assert await store.progress(sub.id, batch[-1].recorded_at)
        assert sent == ["FETCH_STATE_RECORDING"] * 2 + ["PROGRESS_FETCHED"]
        assert (await store.get_fetch_subscription(sub.id)).checkpoint == batch[-1].position
    assert reads[0] == 0


async def test_a_progress_commits_without_waiting_for_its_wal_flush(db_url: str) -> None:
    """A PS is on every FE/PS cycle: its commit does not wait for the WAL
    flush (a progress lost in a crash hands its batch out again, never skips
    one).  Seen from PostgreSQL: a synchronous commit returns with the WAL
    flushed past everything inserted before it; after this PS the flush can
    still be short of where the WAL stood when the PS was sent.  The WAL
    writer may flush first now and then, so a few cycles are tried.  (The
    test clusters commit asynchronously; this database as production does.)"""
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        name = await conn.fetchval("SELECT quote_ident(current_database())")
        await conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = on")
    finally:
        await conn.close()
    store = EventStore(StoreConfig(db_url, poll_interval=0.2))
    await store.start()
    try:
        await _progress_leaves_flush_behind(store)
    finally:
        await store.close()


async def _progress_leaves_flush_behind(store: EventStore) -> None:
    sub = await store.register_fetch_subscription(
        "no-flush", Selector(context="default", stream="flush"), BEGINNING)
    db = store.db
    for i in range(1, 21):
        await store.append(append("flush", ev(i)))
        [fetched] = await store.fetch(sub.id, 100)
        sent_at = await db.fetchval("SELECT pg_current_wal_insert_lsn()")
        assert await store.progress(sub.id, fetched.recorded_at)
        if await db.fetchval("SELECT pg_current_wal_flush_lsn()") < sent_at:
            break
    else:
        raise AssertionError("each of 20 PS returned with the WAL flushed: it waited for it")
    assert (await store.get_fetch_subscription(sub.id)).checkpoint == fetched.position


async def test_a_fetch_on_what_another_process_changed_fetches_from_the_row(
    store: EventStore,
) -> None:
    """What a store knew of a subscription goes stale when another process
    moves its checkpoint or changes its selector: the statement then records
    nothing, and the fetch goes on from the row it read, in the same round
    trip, with what the database says."""
    from polyport.core import sql
    from polyport.core.store import selector_to_json

    sub = await store.register_fetch_subscription(
        "stale", Selector(context="default", stream="stale-a"), BEGINNING)
    assert await store.fetch(sub.id, 100) == []  # memory keeps what follows
    await store.append(append("stale-a", ev(1), ev(2)))
    await store.append(append("stale-b", ev(1)))
    first = await _fetch_progress(store, sub.id)
    # Another process seeks back to the beginning.
    await store.db.execute(sql.SET_CHECKPOINT, sub.id, 0)
    await store.append(append("stale-a", ev(3)))
    sent = _statements(store)
    again = await store.fetch(sub.id, 100)
    assert [e.version for e in again] == [1, 2, 3] and again[:2] == first
    assert sent[0] == "FETCH_STATE_RECORDING" and "RECORD_FETCH" in sent
    assert await store.progress(sub.id, again[-1].recorded_at)
    assert (await store.get_fetch_subscription(sub.id)).checkpoint == again[-1].position
    # Another process points it at another stream, the checkpoint left.
    await store.db.execute(sql.UPDATE_SUBSCRIPTION_SELECTOR, sub.id, json.dumps(
        selector_to_json(Selector(context="default", stream="stale-b"))))
    await store.append(append("stale-a", ev(4)))
    await store.append(append("stale-b", ev(2)))
    other = await store.fetch(sub.id, 100)
    assert [(e.stream, e.version) for e in other] == [("stale-b", 2)]


async def test_retries_set_after_a_fetch_still_count_every_fetch(store: EventStore) -> None:
    """max_retries set by an operator while a store knows the subscription
    without it: the next FEs still count their attempts, and the batch
    fetched past max_retries + 1 times is parked."""
    sub = await store.register_fetch_subscription(
        "late-retries", Selector(context="default", stream="late"), BEGINNING)
    await store.append(append("late", ev(0)))
    await _fetch_progress(store, sub.id)
    await store.update_subscription("default", "late-retries", {"max_retries": 1})
    await store.append(append("late", ev(1), ev(2)))
    await store.append(append("late", ev(3)))
    assert [e.version for e in await store.fetch(sub.id, 2)] == [2, 3]
    assert [e.version for e in await store.fetch(sub.id, 2)] == [2, 3]
    assert [e.version for e in await store.fetch(sub.id, 2)] == [4]
    parked = await store.parked_events("default", "late-retries")
    assert [p.position for p in parked] == [2, 3]


async def test_a_known_subscription_is_still_refused_to_another_tenant(
    store: EventStore,
) -> None:
    """What the store remembers of Bob's subscription does not let Alice
    fetch it: refused before anything is recorded, Bob's batch still his."""
    alice = Tenant(store, Principal("alice", "ctx-a", frozenset({"ctx-a"})))
    bob = Tenant(store, Principal("bob", "ctx-b", frozenset({"ctx-b"})))
    theirs = await bob.register_fetch_subscription("known", Selector(context="ctx-b"), BEGINNING)
    assert await bob.fetch(theirs.id, 10) == []
    await store.append(Append("ctx-b", "s", (ev(1),)))
    [first] = await bob.fetch(theirs.id, 10)
    await store.append(Append("ctx-b", "s", (ev(2),)))
    sent = _statements(store)
    with pytest.raises(Forbidden):
        await alice.fetch(theirs.id, 10)
    assert "FETCH_STATE_RECORDING" not in sent and "RECORD_FETCH" not in sent
    assert await bob.progress(theirs.id, first.recorded_at)
