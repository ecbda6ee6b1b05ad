from __future__ import annotations

import asyncio

import pytest

from polyport.core.commands import Principal
from polyport.core.errors import Malformed, NotFound, Unauthenticated
from polyport.core.matcher import compile_matcher
from polyport.core.store import EventStore, StoreConfig
from polyport.core.users import hash_password, verify_password
from tests.core.helpers import append, ev


def test_password_hashes_are_salted_scrypt() -> None:
    a, b = hash_password("s3cret"), hash_password("s3cret")
    assert a != b and a.startswith("scrypt$")
    assert verify_password("s3cret", a) and not verify_password("wrong", a)
    assert not verify_password("s3cret", "garbage")


async def test_users_and_contexts(store: EventStore) -> None:
    await store.users.add("tim", "1234", default_context="shop", contexts=["shop", "audit"])
    p = await store.authenticate("tim", "1234")
    assert p == Principal("tim", "shop", frozenset({"shop", "audit"}))
    assert p.may_use("audit") and not p.may_use("default")
    with pytest.raises(Unauthenticated):
        await store.authenticate("tim", "nope")
    with pytest.raises(Unauthenticated):
        await store.authenticate("nobody", "x")
    anon = await store.authenticate(None, None)
    # Anonymous is limited to the configured contexts (default: "default").
    assert anon.user is None and anon.may_use("default") and not anon.may_use("anything")
    await store.users.set_password("tim", "5678")
    await store.authenticate("tim", "5678")
    await store.users.set_contexts("tim", None)
    assert (await store.authenticate("tim", "5678")).contexts is None
    assert [u.name for u in await store.users.list()] == ["tim"]
    await store.users.remove("tim")
    with pytest.raises(NotFound):
        await store.users.remove("tim")


async def test_anonymous_can_be_disabled(db_url: str) -> None:
    s = EventStore(StoreConfig(db_url, allow_anonymous=False))
    await s.start()
    try:
        with pytest.raises(Unauthenticated):
            await s.authenticate(None, None)
    finally:
        await s.close()


@pytest.mark.parametrize(
    ("spec", "doc", "expected"),
    [
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": 1}, {"a": [0, 1]}, True),
        ({"a.b": "x"}, {"a": {"b": "x"}}, True),
        ({"a": {"$eq": 1}}, {"a": 1}, True),
        ({"a": {"$ne": 1}}, {}, True),
        ({"a": {"$gt": 1}}, {"a": 2}, True),
        ({"a": {"$gt": 1}}, {"a": "2"}, False),
        ({"a": {"$gte": 2, "$lt": 3}}, {"a": 2}, True),
        ({"a": {"$lte": 1}}, {"a": 2}, False),
        ({"a": {"$in": [1, 2]}}, {"a": 2}, True),
        ({"a": {"$nin": [1, 2]}}, {"a": 3}, True),
        ({"a": {"$exists": True}}, {"a": None}, True),
        ({"a": {"$exists": False}}, {"b": 1}, True),
        ({"$or": [{"a": 1}, {"b": 2}]}, {"b": 2}, True),
        ({"$and": [{"a": 1}, {"b": 2}]}, {"a": 1, "b": 3}, False),
        ({"a": True}, {"a": 1}, False),
    ],
)
def test_matcher(spec: dict, doc: dict, expected: bool) -> None:
    assert compile_matcher(spec)(doc) is expected


def test_matcher_rejects_unknown_operators() -> None:
    with pytest.raises(Malformed):
        compile_matcher({"a": {"$regex": "x"}})
    with pytest.raises(Malformed):
        compile_matcher({"$where": "1"})


async def test_binder_fills_from_log_and_answers_queries(store: EventStore) -> None:
    await store.binders.create("baskets", context="default", stream_prefix="basket-")
    await store.binders.create("last", context="default", stream_prefix="basket-",
                               fold="replace")
    await store.append(append("basket-1", ev(body=b'{"items": 1, "owner": "ann"}')))
    await store.append(append("basket-1", ev(body=b'{"items": 3}')))
    await store.append(append("basket-2", ev(body=b'{"items": 7, "owner": "bob"}')))
    last = await store.append(append("other-1", ev(body=b'{"items": 100}')))
    for name in ("baskets", "last"):
        await store.binders.wait_caught_up(name, last.last_position)
    q = await store.query("baskets", {"items": {"$gte": 3}})
    docs = [d async for d in q]
    assert q.count == 2
    assert docs == [{"_id": "basket-1", "items": 3, "owner": "ann"},
                    {"_id": "basket-2", "items": 7, "owner": "bob"}]
    replaced = [d async for d in await store.query("last", {"_id": "basket-1"})]
    assert replaced == [{"_id": "basket-1", "items": 3}]
    await store.binders.rebuild("baskets")
    await store.binders.wait_caught_up("baskets", last.last_position)
    assert (await store.query("baskets", {})).count == 2
    with pytest.raises(NotFound):
        await store.query("nope", {})
    with pytest.raises(Malformed):
        await store.binders.create("baskets", context="default")
    await store.binders.drop("baskets")
    assert [b.name for b in await store.binders.list()] == ["last"]


async def test_the_projector_reads_the_binder_list_once_a_second(
    store: EventStore, db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under load a projector round runs every 50 ms: it reuses the binder
    list for up to LIST_INTERVAL rather than query it every round.  A binder
    another process creates (the CLI's store runs no projector) is still
    taken up within that interval, and one this store creates at once."""
    from polyport.core import binders as binders_module
    from polyport.core import sql

    monkeypatch.setattr(binders_module, "LIST_INTERVAL", 0.5)
    listed = 0
    real_fetch = store.db.fetch

    async def counting(query, *args):  # type: ignore[no-untyped-def]
        nonlocal listed
        listed += query == sql.LIST_BINDERS
        return await real_fetch(query, *args)

    monkeypatch.setattr(store.db, "fetch", counting)
    loop = asyncio.get_running_loop()
    started = loop.time()
    rounds = 0
    while loop.time() - started < 1.2:
        await store.append(append("round", ev(rounds)))
        rounds += 1
        await asyncio.sleep(0.02)
    # Up to 24 rounds (one per MIN_ROUND_INTERVAL) in 1.2 s: the list was
    # read for the first and then once per LIST_INTERVAL.
    assert 1 <= listed <= 4, (rounds, listed)

    cli = EventStore(StoreConfig(db_url, pool_min=1, pool_max=2, run_binders=False))
    await cli.start()
    try:
        await cli.binders.create("from-cli", context="default", stream_prefix="cli-")
    finally:
        await cli.close()
    last = await store.append(append("cli-1", ev(body=b'{"n": 1}')))
    await store.binders.wait_caught_up("from-cli", last.last_position, timeout=5)
    assert (await store.query("from-cli", {"n": 1})).count == 1

    # Its own creation is listed at the next round, however long the interval.
    monkeypatch.setattr(binders_module, "LIST_INTERVAL", 3600.0)
    await store.binders.create("here", context="default", stream_prefix="cli-")
    await store.binders.wait_caught_up("here", last.last_position, timeout=5)
