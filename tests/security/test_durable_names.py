"""Durable subscription and group names obey core.limits on every protocol,
and one context holds at most ``max_durable_subscriptions`` of them (issue
27, item 6).  Real gateway, real sockets, the real database."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.micromsg2.client import MicroMsg2Client, MicroMsg2Error
from polyport.protocols.reactive.client import RemoteError
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.rsocket.client import RSocketClient

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]

# One byte past max_durable_name_bytes (1024 by default): a name an old
# gateway stored without complaint.
TOO_LONG = "g" * 1025


async def _bson(gw: Any, name: str) -> str:
    host, port = gw.listeners["bson"].address
    client = await BsonClient.connect(host, port, timeout=20)
    try:
        await client.subscribe("s", durable_id=name)
    except BsonError as exc:
        return exc.err_code
    finally:
        await client.close()
    return "ok"


async def _reactivesocket(gw: Any, name: str) -> str:
    return await _group(gw, "reactivesocket", name)


async def _rsocket(gw: Any, name: str) -> str:
    return await _group(gw, "rsocket", name)


async def _group(gw: Any, protocol: str, name: str, user: str | None = None,
                 context: str | None = None) -> str:
    """A ReactiveSocket or RSocket group subscription (anonymous without
    ``user``): "ok", or the error code that ended it."""
    client_class = {"reactivesocket": ReactiveSocketClient, "rsocket": RSocketClient}[protocol]
    host, port = gw.listeners[protocol].address
    login = {"user": user, "password": "pw"} if user is not None else {}
    client = await client_class.connect(host, port, **login)
    try:
        where = {"context": context} if context is not None else {}
        events = await client.subscribe(stream="s", group=name, **where)
        # A refused subscription ends its stream with ERROR; an accepted one
        # stays open with nothing to deliver.
        await asyncio.wait_for(anext(aiter(events)), 2)
    except RemoteError as exc:
        return exc.code
    except TimeoutError:
        return "ok"
    finally:
        await client.close()
    return "ok"


async def _micromsg2(gw: Any, name: str) -> str:
    """MicroMsg2 names a queue's group after its destination and filter: a
    filter long enough makes the name too long (the stream stays short)."""
    host, port = gw.listeners["micromsg2"].address
    client = await MicroMsg2Client.connect(host, port, required=["pubsub"])
    try:
        await client.subscribe("queue/s", f"p=T{name}")
        # subscribe has no reply on success, an ERROR frame on failure.
        await client.receive(timeout=2)
    except MicroMsg2Error as exc:
        return exc.code or exc.text
    except TimeoutError:
        return "ok"
    finally:
        await client.close()
    return "ok"


SUBSCRIBERS = {
    "bson": _bson,
    "reactivesocket": _reactivesocket,
    "rsocket": _rsocket,
    "micromsg2": _micromsg2,
}


@pytest.mark.parametrize("protocol", sorted(SUBSCRIBERS))
async def test_a_durable_name_past_the_limit_is_refused(
    gateway_factory: GatewayFactory, protocol: str
) -> None:
    gw = await gateway_factory()
    subscribe = SUBSCRIBERS[protocol]
    assert await subscribe(gw, TOO_LONG) == "too_large"
    # Nothing was stored, and a name within the limit still works.
    assert await gw.store.list_subscriptions() == []
    assert await subscribe(gw, "g" * 100) == "ok"
    assert len(await gw.store.list_subscriptions()) == 1


@pytest.mark.parametrize("protocol", ["bson", "reactivesocket"])
async def test_a_nul_in_a_durable_name_is_malformed(
    gateway_factory: GatewayFactory, protocol: str
) -> None:
    gw = await gateway_factory()
    assert await SUBSCRIBERS[protocol](gw, "bad\x00name") == "malformed"
    assert await gw.store.list_subscriptions() == []


async def test_the_quota_stops_the_next_durable_subscription(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(max_durable_subscriptions=3)
    for i in range(3):
        assert await _bson(gw, f"d{i}") == "ok"
    # The fourth name, on any protocol, is refused; the existing ones still
    # subscribe (no new row).
    assert await _bson(gw, "d3") == "too_large"
    assert await _rsocket(gw, "d3") == "too_large"
    assert await _micromsg2(gw, "x") == "too_large"
    assert await _bson(gw, "d1") == "ok"
    assert len(await gw.store.list_subscriptions()) == 3
    # The quota is the context's: another tenant still has its own.
    await gw.store.users.add("tim", "pw", default_context="tims", contexts=["tims"])
    host, port = gw.listeners["bson"].address
    async with await BsonClient.connect(host, port, username="tim", password="pw",
                                        timeout=20) as tim:
        await tim.subscribe("s", durable_id="d3")
    assert len(await gw.store.list_subscriptions()) == 4


async def test_concurrent_creations_cannot_pass_the_quota(
    gateway_factory: GatewayFactory,
) -> None:
    """Ten new names at once, on ten connections, against a quota of three:
    the count and the insert are one locked step, so exactly three win."""
    gw = await gateway_factory(max_durable_subscriptions=3)
    results = await asyncio.gather(*(_bson(gw, f"c{i}") for i in range(10)))
    assert sorted(results) == ["ok"] * 3 + ["too_large"] * 7
    assert len(await gw.store.list_subscriptions()) == 3


async def _rsocket_as(gw: Any, user: str | None, context: str, name: str) -> str:
    return await _group(gw, "rsocket", name, user, context)


async def test_a_principal_is_held_to_its_own_quota_over_every_context(
    gateway_factory: GatewayFactory,
) -> None:
    """The per-principal quota: a user allowed many contexts (or every one)
    cannot create more than its share by spreading them over contexts; the
    anonymous user is one principal; another user keeps its own share."""
    gw = await gateway_factory(max_durable_subscriptions_per_principal=2,
                               anonymous_contexts=("default", "spare"))
    await gw.store.users.add("ann", "pw", contexts=None)  # every context
    await gw.store.users.add("bob", "pw", contexts=["a"])
    assert await _rsocket_as(gw, "ann", "a", "g1") == "ok"
    assert await _rsocket_as(gw, "ann", "b", "g2") == "ok"
    assert await _rsocket_as(gw, "ann", "c", "g3") == "too_large"
    assert await _rsocket_as(gw, "ann", "a", "g1") == "ok"  # an existing one still joins
    assert await _rsocket_as(gw, "bob", "a", "g4") == "ok"   # bob has his own share
    assert await _rsocket_as(gw, None, "default", "g5") == "ok"
    assert await _rsocket_as(gw, None, "spare", "g6") == "ok"
    assert await _rsocket_as(gw, None, "spare", "g7") == "too_large"
    owners = sorted((s["context"], s["name"]) for s in await gw.store.list_subscriptions())
    assert owners == [("a", "g1"), ("a", "g4"), ("b", "g2"), ("default", "g5"),
                      ("spare", "g6")]
    # Each row records its creator ("" the anonymous user).
    rows = await gw.store.pool.fetch("SELECT name, created_by FROM subscriptions ORDER BY name")
    assert {r["name"]: r["created_by"] for r in rows} == {
        "g1": "ann", "g2": "ann", "g4": "bob", "g5": "", "g6": ""}
