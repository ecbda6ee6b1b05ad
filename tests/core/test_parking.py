"""Persistent-subscription settings and parked events (core.parking, core.groups)."""

from __future__ import annotations

import asyncio

import pytest

from polyport.core.commands import BEGINNING, Selector, Subscribe
from polyport.core.errors import Malformed
from polyport.core.parking import SubscriptionSettings
from polyport.core.store import EventStore
from tests.core.helpers import append, ev

SEL = Selector(context="default", stream="work")


async def _member(store: EventStore, name: str = "workers", buffer_size: int = 10):
    return await store.subscribe(
        Subscribe(SEL, start=BEGINNING, durable=name, buffer_size=buffer_size)
    )


async def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.05)


async def test_settings_validate_and_merge() -> None:
    s = SubscriptionSettings.from_json({"max_retries": 2, "start": "beginning"})
    assert s.merged({"message_timeout": 1.5}).as_json() == {
        "start": "beginning", "max_in_flight": None, "max_retries": 2, "message_timeout": 1.5,
    }
    assert s.merged({"max_retries": None}).max_retries is None
    for bad in ({"max_in_flight": 0}, {"max_retries": -1}, {"message_timeout": 0},
                {"start": "yesterday"}):
        with pytest.raises(Malformed):
            SubscriptionSettings.from_json(bad)


async def test_create_places_the_checkpoint_and_lists_settings(store: EventStore) -> None:
    for i in range(3):
        await store.append(append("work", ev(i)))
    created = await store.create_subscription(
        "workers", SEL, SubscriptionSettings(start="end", max_retries=1))
    assert created
    assert not await store.create_subscription("workers", SEL, SubscriptionSettings())
    [row] = await store.list_subscriptions()
    assert row["checkpoint"] == 3 and row["parked"] == 0
    assert row["settings"]["max_retries"] == 1
    await store.update_subscription("default", "workers", {"max_in_flight": 4})
    [row] = await store.list_subscriptions()
    assert row["settings"]["max_retries"] == 1 and row["settings"]["max_in_flight"] == 4


async def test_nacked_past_max_retries_is_parked_then_replayed(store: EventStore) -> None:
    await store.create_subscription(
        "workers", SEL, SubscriptionSettings(start="beginning", max_retries=2))
    for i in range(3):
        await store.append(append("work", ev(i)))
    m = await _member(store)
    poison = None
    deliveries = 0
    while True:
        e = await m.next(2)
        assert e is not None
        if e.version == 2:
            deliveries += 1
            poison = e.position
            m.nack(e.position)
        else:
            m.ack(e.position)
        if deliveries == 3:  # the first delivery and two retries
            break
    rest = [e.version for e in [await m.next(2)] if e is not None]
    assert 2 not in rest

    async def parked() -> bool:
        return [p.position for p in await store.parked_events("default", "workers")] == [poison]

    await _wait_for(parked)
    [p] = await store.parked_events("default", "workers")
    assert (p.retries, p.reason, p.stream, p.version) == (2, "nack", "work", 2)

    async def checkpoint_passed() -> bool:
        return (await store.list_subscriptions())[0]["checkpoint"] == 3

    await _wait_for(checkpoint_passed)
    assert (await store.list_subscriptions())[0]["parked"] == 1

    assert await store.replay_parked("default", "workers") == 1
    again = await m.next(5)
    assert again is not None and again.position == poison
    m.ack(again.position)

    async def unparked() -> bool:
        return await store.parked_events("default", "workers") == []

    await _wait_for(unparked)
    m.close()


async def test_a_consumer_leaving_counts_as_a_failure(store: EventStore) -> None:
    await store.create_subscription(
        "workers", SEL, SubscriptionSettings(start="beginning", max_retries=1))
    await store.append(append("work", ev(0)))
    for _ in range(2):
        m = await _member(store)
        e = await m.next(5)
        assert e is not None and e.version == 1
        m.close()  # taken, never acknowledged
        await asyncio.sleep(0.1)

    async def parked() -> bool:
        return len(await store.parked_events("default", "workers")) == 1

    await _wait_for(parked)
    [p] = await store.parked_events("default", "workers")
    assert (p.retries, p.reason) == (1, "consumer left")


async def test_buffered_but_never_taken_is_no_failure(store: EventStore) -> None:
    await store.create_subscription(
        "workers", SEL, SubscriptionSettings(start="beginning", max_retries=0))
    await store.append(append("work", ev(0)))
    m = await _member(store)

    async def buffered() -> bool:
        return m.buffered == 1

    await _wait_for(buffered)
    m.close()
    m2 = await _member(store)
    e = await m2.next(5)
    assert e is not None and e.version == 1
    assert await store.parked_events("default", "workers") == []
    m2.close()


async def test_message_timeout_retries_then_parks(store: EventStore) -> None:
    await store.create_subscription(
        "workers", SEL,
        SubscriptionSettings(start="beginning", max_retries=1, message_timeout=0.2))
    await store.append(append("work", ev(0)))
    m = await _member(store)
    first = await m.next(5)
    second = await m.next(5)  # redelivered after the timeout
    assert first is not None and second is not None
    assert first.position == second.position

    async def parked() -> bool:
        return len(await store.parked_events("default", "workers")) == 1

    await _wait_for(parked)
    assert (await store.parked_events("default", "workers"))[0].reason == "timeout"
    m.close()


async def test_max_in_flight_bounds_unacknowledged_events(store: EventStore) -> None:
    await store.create_subscription(
        "workers", SEL, SubscriptionSettings(start="beginning", max_in_flight=2))
    for i in range(5):
        await store.append(append("work", ev(i)))
    m = await _member(store)
    got = [await m.next(2), await m.next(2)]
    assert [e.version for e in got if e is not None] == [1, 2]
    assert await m.next(0.3) is None
    m.ack(got[0].position)
    third = await m.next(2)
    assert third is not None and third.version == 3
    m.close()


async def test_fetch_subscription_batch_fetched_too_often_is_parked(store: EventStore) -> None:
    for i in range(3):
        await store.append(append("work", ev(i)))
    sub = await store.register_fetch_subscription("puller", SEL, BEGINNING)
    await store.update_subscription("default", "puller", {"max_retries": 1})
    first = await store.fetch(sub.id, 2)
    again = await store.fetch(sub.id, 2)  # one retry: still allowed
    assert [e.version for e in first] == [e.version for e in again] == [1, 2]
    # The third fetch without progress parks the batch and moves on.
    assert [e.version for e in await store.fetch(sub.id, 2)] == [3]
    parked = await store.parked_events("default", "puller")
    assert [(p.version, p.retries, p.reason) for p in parked] == [
        (1, 2, "fetched again"), (2, 2, "fetched again")]
    # Progress resets the count.
    batch = await store.fetch(sub.id, 2)
    assert await store.progress(sub.id, batch[-1].recorded_at)
    assert await store.fetch(sub.id, 2) == []


async def _park_first_two(store: EventStore) -> int:
    """Three events on a fetch subscription with max_retries 1; the batch of
    the first two fetched three times without progress, so parked."""
    for i in range(3):
        await store.append(append("work", ev(i)))
    sub = await store.register_fetch_subscription("puller", SEL, BEGINNING)
    await store.update_subscription("default", "puller", {"max_retries": 1})
    for _ in range(2):
        assert [e.version for e in await store.fetch(sub.id, 2)] == [1, 2]
    assert [e.version for e in await store.fetch(sub.id, 2)] == [3]
    return sub.id


async def test_fetch_subscription_replays_parked_batch_then_moves_on(store: EventStore) -> None:
    sub_id = await _park_first_two(store)
    checkpoint = await store.durable_checkpoint("default", "puller")
    assert await store.replay_parked("default", "puller") == 2
    # Replayed events come first, as a batch, and FE again returns the same.
    replayed = await store.fetch(sub_id, 10)
    assert [e.version for e in replayed] == [1, 2]
    assert [e.version for e in await store.fetch(sub_id, 10)] == [1, 2]
    # A PS naming another batch changes nothing.
    assert not await store.progress(sub_id, replayed[0].recorded_at.replace(year=2000))
    assert len(await store.parked_events("default", "puller")) == 2
    # The PS naming the replayed batch unparks it; the checkpoint stays put.
    assert await store.progress(sub_id, replayed[-1].recorded_at)
    assert await store.parked_events("default", "puller") == []
    assert await store.durable_checkpoint("default", "puller") == checkpoint
    # Then FE returns the events past the checkpoint, and new ones after them.
    batch = await store.fetch(sub_id, 10)
    assert [e.version for e in batch] == [3]
    assert await store.progress(sub_id, batch[-1].recorded_at)
    await store.append(append("work", ev(3)))
    assert [e.version for e in await store.fetch(sub_id, 10)] == [4]


async def test_fetch_subscription_replay_in_batches_oldest_first(store: EventStore) -> None:
    sub_id = await _park_first_two(store)
    await store.replay_parked("default", "puller")
    first = await store.fetch(sub_id, 1, extend_same_time=False)
    assert [e.version for e in first] == [1]
    assert await store.progress(sub_id, first[-1].recorded_at)
    assert [p.version for p in await store.parked_events("default", "puller")] == [2]
    second = await store.fetch(sub_id, 1, extend_same_time=False)
    assert [e.version for e in second] == [2]


async def test_fetch_subscription_replayed_batch_refetched_is_parked_again(
    store: EventStore,
) -> None:
    sub_id = await _park_first_two(store)
    checkpoint = await store.durable_checkpoint("default", "puller")
    await store.replay_parked("default", "puller")
    for _ in range(2):
        assert [e.version for e in await store.fetch(sub_id, 2)] == [1, 2]
    # The third fetch without progress parks the replayed batch again (not
    # lost, no longer marked) and FE goes on with the events past it.
    assert [e.version for e in await store.fetch(sub_id, 2)] == [3]
    parked = await store.parked_events("default", "puller")
    assert [(p.version, p.replay, p.reason) for p in parked] == [
        (1, False, "fetched again"), (2, False, "fetched again")]
    assert await store.durable_checkpoint("default", "puller") == checkpoint
    # Replaying again hands them out once more.
    assert await store.replay_parked("default", "puller") == 2
    assert [e.version for e in await store.fetch(sub_id, 2)] == [1, 2]


async def test_fetch_subscription_replay_requested_mid_batch_is_kept(store: EventStore) -> None:
    sub_id = await _park_first_two(store)
    batch = await store.fetch(sub_id, 2)  # the normal batch [3] is out
    await store.replay_parked("default", "puller")
    # Its PS moves the checkpoint and leaves the replay request alone.
    assert await store.progress(sub_id, batch[-1].recorded_at)
    assert [p.replay for p in await store.parked_events("default", "puller")] == [True, True]
    assert [e.version for e in await store.fetch(sub_id, 2)] == [1, 2]
