"""Poison events and hostile matchers: a binder records an event it cannot
fold and moves on (no other binder waits); matchers too deep or too big are
refused when compiled; repeated failures are logged at a bounded rate."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

import aiohttp
import pytest

from polyport.core.commands import Append
from polyport.core.errors import Malformed
from polyport.core.events import EventData
from polyport.core.limits import EventLimits
from polyport.core.logs import RateLimitedLog
from polyport.core.matcher import compile_matcher
from polyport.core.store import EventStore, StoreConfig
from polyport.core.writer import WriterLimits
from tests.core.test_limits import _nested_bson, _nested_json

pytestmark = pytest.mark.timeout(90)

TOKEN = "poison-admin-token"


def _deep_and(levels: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"a": 1}
    for _ in range(levels):
        spec = {"$and": [spec]}
    return spec


def test_matchers_too_deep_or_too_big_are_refused_at_compile_time() -> None:
    # 200 levels of $and used to compile, then raise RecursionError per event.
    with pytest.raises(Malformed, match=r"deeper than 32 levels \(max_matcher_depth\)"):
        compile_matcher(_deep_and(200))
    with pytest.raises(Malformed, match="max_matcher_depth"):
        compile_matcher(_deep_and(16))  # 33 levels of documents and arrays
    assert compile_matcher(_deep_and(15))({"a": 1})
    assert not compile_matcher(_deep_and(15))({"a": 2})
    with pytest.raises(Malformed, match=r"more than 1000 parts \(max_matcher_nodes\)"):
        compile_matcher({"$or": [{"a": i} for i in range(600)]})
    assert compile_matcher({"$or": [{"a": i} for i in range(400)]})({"a": 399})
    with pytest.raises(Malformed, match=r"exceeds the limit of 65536 bytes \(max_matcher_bytes\)"):
        compile_matcher({"a": {"$in": ["x" * 1000] * 70}})
    # A deep value inside an operator counts too.
    deep: Any = 1
    for _ in range(500):
        deep = [deep]
    with pytest.raises(Malformed, match="max_matcher_depth"):
        compile_matcher({"a": {"$eq": deep}})


async def test_a_binder_query_with_a_deep_matcher_is_malformed(store: EventStore) -> None:
    await store.binders.create("q", context="default")
    with pytest.raises(Malformed, match="max_matcher_depth"):
        await store.query("q", _deep_and(200))


def test_rate_limited_log_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("polyport.test"), 60.0, max_keys=2,
                             clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="polyport.test")
    assert limited.warning("k", "failed at %d", 1)
    for i in range(2, 12):
        now[0] += 1
        assert not limited.warning("k", "failed at %d", i)
    assert limited.warning("other", "other key")  # keys are independent
    now[0] = 61.0
    assert limited.warning("k", "failed at %d", 12)
    assert [r.getMessage() for r in caplog.records] == [
        "failed at 1", "other key", "failed at 12 (and 10 more like this in the last 61s)"]
    limited.warning("third", "x")  # at most max_keys remembered: "k" is forgotten
    assert limited.warning("k", "again")


async def test_poison_events_are_recorded_and_skipped_and_hold_up_no_binder(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Events nested too deep for the encoder (written before the depth
    limit, or under a raised one) and a NUL in a JSON string (jsonb refuses
    it) used to stop their binder and every binder listed after it."""
    caplog.set_level(logging.WARNING, logger="polyport.binders")
    lenient = WriterLimits(events=EventLimits(max_body_depth=100_000))
    store = EventStore(StoreConfig(db_url, poll_interval=0.2, writer=lenient))
    await store.start()
    try:
        for name in ("a", "b", "c"):
            await store.binders.create(name, context="default", stream_prefix="cart-")
        bodies = [
            (b'{"n": 1}', "application/json"),
            (_nested_json(500), "application/json"),
            (_nested_bson(500), "application/bson"),
            (b'{"n": "\\u0000"}', "application/json"),
            (b'{"n": 2}', "application/json"),
        ]
        last = None
        for body, content_type in bodies:
            last = await store.append(Append("default", "cart-1", (
                EventData("t", body, content_type=content_type),)))
        assert last is not None
        for name in ("a", "b", "c"):
            await store.binders.wait_caught_up(name, last.last_position, timeout=20)
        specs = await store.binders.list()
        assert [s.failures for s in specs] == [3, 3, 3]
        docs = [d async for d in await store.query("c", {})]
        assert docs == [{"_id": "cart-1", "n": 2}]
        a = specs[0].as_json()
        assert a["failures"]["count"] == 3
        recent = a["failures"]["recent"]
        assert [f["position"] for f in recent] == [last.last_position - i for i in (1, 2, 3)]
        assert "NUL" in recent[0]["error"]
        assert "RecursionError" in recent[2]["error"]
        # One line per binder, not one per poison event.
        skipped = [r for r in caplog.records if "skipped the event" in r.getMessage()]
        assert len(skipped) == 3

        # Rebuild starts over: the same events fail again, recorded once each.
        await store.binders.rebuild("a")
        await asyncio.sleep(0.1)
        await store.binders.wait_caught_up("a", last.last_position, timeout=20)
        assert (await store.binders.list())[0].failures == 3
        await store.binders.drop("a")
        count = await store.pool.fetchval("SELECT count(*) FROM binder_errors WHERE binder = 'a'")
        assert count == 0
    finally:
        await store.close()


async def test_admin_and_cli_show_binder_failures(db_url: str, gateway_factory: Any) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    store = gw.store
    await store.binders.create("carts", context="default")
    await store.append(Append("default", "cart-9", (
        EventData("t", b'{"x": "\\u0000"}', content_type="application/json"),)))
    head = await store.pool.fetchval("SELECT last_position FROM log_head")
    await store.binders.wait_caught_up("carts", head, timeout=20)
    host, port = gw.http_address
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http,
        http.get(f"http://{host}:{port}/admin/binders/carts") as r,
    ):
        assert r.status == 200
        failures = (await r.json())["failures"]
    assert failures["count"] == 1 and failures["recent"][0]["position"] == head

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "binders", "--database-url", db_url,
        "list", "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    listed = json.loads(out)
    assert listed[0]["failures"]["count"] == 1
    assert "NUL" in listed[0]["failures"]["recent"][0]["error"]
