"""Public /status is served from kept state (issue 27, item 4): a loop of
anonymous GETs opens no database connection per request and shares one
round of the database's sections a second, instead of running them on the
gateway's pool for every request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from polyport.core import migrate

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]


async def test_a_flood_of_anonymous_status_requests_costs_one_round_a_second(
    gateway_factory: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await gateway_factory()

    async def no_new_connection(_url: str) -> str | None:
        raise AssertionError("/status opened a database connection of its own")

    # What /status used for the schema section: a connection per request.
    monkeypatch.setattr(migrate, "current_revision", no_new_connection)
    monitor = gw.store.monitor
    pings = 0
    real_ping = monitor.ping

    async def counted_ping() -> None:
        nonlocal pings
        pings += 1
        await real_ping()

    monkeypatch.setattr(monitor, "ping", counted_ping)
    url = f"http://{gw.http_address[0]}:{gw.http_address[1]}/status"
    async with aiohttp.ClientSession() as http:

        async def get() -> dict[str, Any]:
            async with http.get(url) as r:
                assert r.status == 200
                doc: dict[str, Any] = await r.json()
                return doc

        loop = asyncio.get_running_loop()
        started = loop.time()
        docs = await asyncio.gather(*(get() for _ in range(60)))
        docs += [await get() for _ in range(20)]
        elapsed = loop.time() - started
        # Within about a second of each other: one round of the database's
        # sections, or one more per second the requests took.
        assert pings <= 1 + int(elapsed), (pings, elapsed)
        await asyncio.sleep(1.1)
        await get()
        assert pings <= 2 + int(elapsed), (pings, elapsed)  # and it refreshes
    for doc in docs:
        assert doc["database"]["reachable"] is True
        assert doc["schema"]["current"] is True
        assert doc["schema"]["revision"] == doc["schema"]["head"]
