"""Persistent subscriptions end to end: settings through the admin API, events a
consumer keeps failing get parked, replay-parked delivers them again (BSON
durable subscriptions, ReactiveSocket groups and Res01 fetch subscriptions)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp

from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.res01.adapter import subscription_name
from polyport.protocols.res01.client import Res01Client

TOKEN = "persistent-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def admin_url(gw: Any) -> str:
    host, port = gw.http_address
    return f"http://{host}:{port}/admin"


async def put_events(gw: Any, stream: str, n: int) -> None:
    for i in range(n):
        await gw.store.append(Append("default", stream, (
            EventData("Work", b'{"n": %d}' % i, content_type="application/json"),)))


async def subscription(http: aiohttp.ClientSession, gw: Any, name: str) -> dict[str, Any]:
    async with http.get(admin_url(gw) + "/subscriptions/" + name.replace("/", "%2F")) as r:
        assert r.status == 200, await r.text()
        result: dict[str, Any] = await r.json()
        return result


async def eventually_parked(http: aiohttp.ClientSession, gw: Any, name: str, n: int) -> None:
    for _ in range(100):
        if (await subscription(http, gw, name))["parked"] == n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name}: never {n} parked")


async def test_bson_consumer_that_keeps_dying_on_an_event_gets_it_parked(
    gateway_factory,
) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    host, port = gw.listeners["bson"].address
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(admin_url(gw) + "/subscriptions", json={
            "name": "billing", "context": "default", "stream": "invoices",
            "start": "beginning", "max_retries": 1,
        }) as r:
            assert r.status == 201, await r.text()
            created = await r.json()
        assert created["settings"]["max_retries"] == 1 and created["parked"] == 0
        await put_events(gw, "invoices", 1)
        # Two consumers in a row take the event and die without ACKEV: the
        # first try and one retry.
        for _ in range(2):
            c = await BsonClient.connect(host, port)
            sub = await c.subscribe("invoices", durable_id="billing", auto_ack=False)
            ev = await sub.next(5)
            assert ev is not None and ev.seq_no == 0
            await c.close()
        await eventually_parked(http, gw, "billing", 1)
        async with http.get(admin_url(gw) + "/subscriptions/billing/parked") as r:
            [parked] = await r.json()
        host_http, port_http = gw.http_address
        async with http.get(f"http://{host_http}:{port_http}/status") as r:
            status = await r.json()
        [durable] = [d for d in status["subscriptions"]["durable"] if d["name"] == "billing"]
        assert durable["parked"] == 1
        assert (parked["stream"], parked["version"], parked["retries"]) == ("invoices", 1, 1)
        assert parked["reason"] == "consumer left"

        # Parked: a healthy consumer gets the next event, not the parked one.
        await put_events(gw, "invoices", 1)
        c = await BsonClient.connect(host, port)
        sub = await c.subscribe("invoices", durable_id="billing")
        ev = await sub.next(5)
        assert ev is not None and ev.seq_no == 1
        assert await sub.next(0.3) is None

        async with http.post(admin_url(gw) + "/subscriptions/billing/replay-parked") as r:
            assert r.status == 202 and (await r.json()) == {"replaying": 1}
        again = await sub.next(5)
        assert again is not None and again.seq_no == 0
        assert await sub.next(0.3) is None  # (auto-ack acknowledged it)
        await eventually_parked(http, gw, "billing", 0)
        await c.close()


async def test_reactivesocket_group_nacks_past_max_retries_then_replays(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    host, port = gw.listeners["reactivesocket"].address
    # A ReactiveSocket group's durable name is the group, in the context.
    name = "workers"
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(admin_url(gw) + "/subscriptions", json={
            "name": name, "context": "default", "stream": "jobs", "start": "beginning",
        }) as r:
            assert r.status == 201, await r.text()
        async with http.put(admin_url(gw) + "/subscriptions/workers/settings?context=default",
                            json={"max_retries": 2, "max_in_flight": 10}) as r:
            assert r.status == 200
            assert (await r.json())["settings"]["max_retries"] == 2
        await put_events(gw, "jobs", 2)
        c = await ReactiveSocketClient.connect(host, port)
        stream = await c.subscribe(stream="jobs", group="workers", manual_ack=True, initial_n=100)
        poison_deliveries = 0
        while poison_deliveries < 3:  # the first try and two retries
            ev = await stream.next(5)
            assert ev is not None
            if ev.version == 1:
                poison_deliveries += 1
                await c.nack(stream, ev.position)
            else:
                await c.ack(stream, ev.position)
        await eventually_parked(http, gw, name, 1)
        async with http.get(admin_url(gw) + "/subscriptions/workers/parked?context=default") as r:
            [parked] = await r.json()
        assert (parked["version"], parked["retries"], parked["reason"]) == (1, 2, "nack")
        # Both events are settled: the checkpoint passed the parked one.
        for _ in range(100):
            if (await subscription(http, gw, name))["checkpoint"] == 2:
                break
            await asyncio.sleep(0.05)
        assert (await subscription(http, gw, name))["checkpoint"] == 2

        replay = admin_url(gw) + "/subscriptions/workers/replay-parked?context=default"
        async with http.post(replay) as r:
            assert r.status == 202
        again = await stream.next(5)
        assert again is not None and again.version == 1
        await c.ack(stream, again.position)
        await eventually_parked(http, gw, name, 0)
        await c.close()


async def test_res01_batch_fetched_too_often_is_parked_then_replayed(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    # The main Res01 port is anonymous: context "default" only.
    client = await Res01Client.connect(gw.listeners["res01"].address, timeout=10)
    name = subscription_name("puller", "default", "jobs")
    url = admin_url(gw) + "/subscriptions/" + quote(name, safe="")
    try:
        await put_events(gw, "jobs", 3)
        since = datetime(2000, 1, 1, tzinfo=UTC)
        [sub_id] = await client.subscribe("puller", [("default", "jobs", since)])
        async with aiohttp.ClientSession(headers=AUTH) as http:
            async with http.put(url + "/settings", json={"max_retries": 1}) as r:
                assert r.status == 200, await r.text()
            # FE twice without PS (the first try and one retry), then the
            # third FE parks the batch and returns the next one.
            for _ in range(2):
                [batch] = await client.fetch([(sub_id, 2)])
                assert [e.sequence for e in batch.events] == [1, 2]
            [after] = await client.fetch([(sub_id, 2)])
            assert [e.sequence for e in after.events] == [3]
            assert await client.progress([(sub_id, after.events[-1].timestamp)]) == [sub_id]
            async with http.post(url + "/replay-parked") as r:
                assert r.status == 202 and (await r.json())["replaying"] == 2
            # The replayed batch comes out again, the same on FE without PS.
            [replayed] = await client.fetch([(sub_id, 10)])
            assert [e.sequence for e in replayed.events] == [1, 2]
            [again] = await client.fetch([(sub_id, 10)])
            assert again.events == replayed.events
            # PS naming it unparks the rows; FE then has nothing old to give.
            assert await client.progress([(sub_id, replayed.events[-1].timestamp)]) == [sub_id]
            async with http.get(url + "/parked") as r:
                assert await r.json() == []
            [empty] = await client.fetch([(sub_id, 10)])
            assert empty.events == ()
            await put_events(gw, "jobs", 1)
            [new] = await client.fetch([(sub_id, 10)])
            assert [e.sequence for e in new.events] == [4]
    finally:
        await client.close()
