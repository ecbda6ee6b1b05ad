"""Failed logins are throttled per source address, not per connection: a
client that opens a new connection for every guess is still one address
(issue 27, item 1).  Logins in progress are capped per address, and wrong
admin tokens count in the same throttle.  Real gateway, real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.reactive.client import RemoteError
from polyport.protocols.reactivesocket.client import ReactiveSocketClient

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]
TOKEN = "admin-token-for-the-throttle-test"


async def _bson_guess(gw: Any, password: str) -> str:
    """One login on a connection of its own; the error code it got."""
    host, port = gw.listeners["bson"].address
    try:
        client = await BsonClient.connect(host, port, username="alice", password=password,
                                          timeout=20)
    except BsonError as exc:
        return exc.err_code
    await client.close()
    return "ok"


async def test_a_new_connection_per_guess_is_still_one_address(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory()
    await gw.store.users.add("alice", "right")
    throttle = gw.store.users.throttle
    throttle.base_delay = 0.05
    for i in range(throttle.free_failures + 1):
        assert await _bson_guess(gw, f"guess-{i}") == "unauthenticated"
    # One address, whatever the ports: the guess past the free ones waited.
    assert throttle.delay_for("127.0.0.1") > 0
    assert throttle.delayed_total == 1
    # Another protocol from the same address waits too.
    host, port = gw.listeners["reactivesocket"].address
    client = await ReactiveSocketClient.connect(host, port, user="alice", password="nope")
    try:
        # SETUP has no answer; the refusal is the ERROR on stream 0.
        with pytest.raises(RemoteError) as refused:
            await asyncio.wait_for(client.read("s"), 20)
        assert refused.value.code == "unauthenticated"
    finally:
        await client.close()
    assert throttle.delayed_total == 2
    # The right password still works (after its wait) and clears the address.
    assert await _bson_guess(gw, "right") == "ok"
    assert throttle.delay_for("127.0.0.1") == 0


async def _throttled_gateway(gateway_factory: GatewayFactory, wait: float) -> tuple[Any, Any]:
    """A gateway whose throttle already holds 127.0.0.1 past its free
    failures: each login from it waits ``wait`` before its check (the same
    wait each, rather than doubling with every failure)."""
    gw = await gateway_factory()
    await gw.store.users.add("alice", "right")
    throttle = gw.store.users.throttle
    for _ in range(throttle.free_failures + 1):
        throttle.failed("127.0.0.1")
    throttle.base_delay = throttle.max_delay = wait
    return gw, throttle


async def test_logins_from_one_address_are_checked_a_few_at_a_time(
    gateway_factory: GatewayFactory,
) -> None:
    """A pool of connections opened at once from one address is queued, never
    refused: at most max_in_progress_per_address are checked at a time."""
    gw, throttle = await _throttled_gateway(gateway_factory, 0.2)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, throttle.in_progress("127.0.0.1"))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        codes = await asyncio.gather(*(_bson_guess(gw, "wrong") for _ in range(10)))
    finally:
        watcher.cancel()
    assert codes == ["unauthenticated"] * 10
    assert peak == throttle.max_in_progress_per_address


async def test_too_many_waiting_logins_from_one_address_are_refused(
    gateway_factory: GatewayFactory,
) -> None:
    gw, throttle = await _throttled_gateway(gateway_factory, 0.5)
    throttle.max_waiting_per_address = 2
    codes = await asyncio.gather(*(_bson_guess(gw, "wrong") for _ in range(10)))
    # 4 checked, 2 waiting; the rest refused at once, without a check.
    assert codes.count("busy") == 10 - throttle.max_in_progress_per_address - 2, codes
    assert set(codes) == {"busy", "unauthenticated"}, codes
    assert throttle.refused_total == codes.count("busy")


async def test_wrong_admin_tokens_count_in_the_same_throttle(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    throttle = gw.store.users.throttle
    throttle.base_delay = 0.05
    url = f"http://{gw.http_address[0]}:{gw.http_address[1]}/admin/users"
    async with aiohttp.ClientSession() as http:
        for i in range(throttle.free_failures + 1):
            async with http.get(url, headers={"Authorization": f"Bearer wrong-{i}"}) as r:
                assert r.status == 401
        # The one past the free failures waited.
        assert throttle.delayed_total == 1
        assert throttle.delay_for("127.0.0.1") > 0
        # The right token is still served, after the address's wait.
        async with http.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200
    assert throttle.delayed_total == 2
