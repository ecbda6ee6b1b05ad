from __future__ import annotations

import asyncio

from polyport.core.commands import (
    BEGINNING,
    FromPosition,
    FromTime,
    FromVersion,
    Selector,
    Subscribe,
)
from polyport.core.store import EventStore, StoreConfig
from tests.core.helpers import append, ev


async def collect(sub, n: int, timeout: float = 5.0) -> list:
    out = []
    while len(out) < n:
        e = await sub.next(timeout)
        assert e is not None, f"got {len(out)} of {n}"
        out.append(e)
    return out


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
