"""The connection table: every transport's connections listed with their user
and totals, filtered, closed by the admin API, and one log line per close."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest

from polyport.protocols.bson.client import BsonClient
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.res01.client import Res01Client, new_event
from tests.waiting import until

TOKEN = "connections-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def admin_url(gw: Any) -> str:
    host, port = gw.http_address
    return f"http://{host}:{port}/admin"


async def listed(http: aiohttp.ClientSession, gw: Any, **query: str) -> list[dict[str, Any]]:
    async with http.get(admin_url(gw) + "/connections", params=query) as r:
        assert r.status == 200, await r.text()
        result: list[dict[str, Any]] = await r.json()
        return result


async def test_list_filter_and_close(gateway_factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="polyport.connections")
    gw = await gateway_factory(admin_token=TOKEN)
    await gw.store.users.add("tim", "1234")
    bson_host, bson_port = gw.listeners["bson"].address
    http_host, http_port = gw.http_address
    async with aiohttp.ClientSession(headers=AUTH) as http:
        tim = await BsonClient.connect(bson_host, bson_port, username="tim", password="1234")
        await tim.emit("s1", "Made", {"n": 1})
        await tim.emit("s1", "Made", {"n": 2})
        sub = await tim.subscribe("s1", start_seq=0)
        assert await sub.next(5) is not None
        ws = await ReactiveSocketClient.connect_websocket(
            f"ws://{http_host}:{http_port}/reactivesocket")
        await ws.read("s1")

        async def both() -> bool:
            return len(await listed(http, gw)) == 2

        await until(both)
        [b] = await listed(http, gw, protocol="bson")
        assert b["user"] == "tim" and b["events_in"] == 2 and b["events_out"] >= 1
        assert b["subscriptions"] == 1 and b["bytes_in"] > 0 and b["bytes_out"] > 0
        [r] = await listed(http, gw, protocol="reactivesocket")
        assert r["user"] is None and r["peer"].startswith("127.0.0.1:")
        assert [c["id"] for c in await listed(http, gw, user="tim")] == [b["id"]]
        port = b["peer"].rsplit(":", 1)[1]
        assert [c["id"] for c in await listed(http, gw, address=":" + port)] == [b["id"]]
        assert await listed(http, gw, protocol="segment") == []

        async with http.delete(admin_url(gw) + f"/connections/{b['id']}") as resp:
            assert resp.status == 204
        # The client sees its connection end (after what was already sent).
        for _ in range(3):
            if await sub.next(5) is None:
                break
        else:
            raise AssertionError("the subscription did not end")

        async def one() -> bool:
            return [c["id"] for c in await listed(http, gw)] == [r["id"]]

        await until(one)
        async with http.delete(admin_url(gw) + f"/connections/{b['id']}") as resp:
            assert resp.status == 404
        async with http.delete(admin_url(gw) + "/connections/x1") as resp:
            assert resp.status == 400
        await ws.close()
        await until(lambda: _empty(http, gw))
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "polyport.connections"]
    assert any(
        "bson: connection" in m and "(admin close)" in m and "user tim" in m
        and "events in/out 2/" in m for m in lines
    ), lines
    assert any("reactivesocket: connection" in m and "(peer closed)" in m for m in lines), lines
    await tim.close()


async def _empty(http: aiohttp.ClientSession, gw: Any) -> bool:
    return await listed(http, gw) == []


async def test_idle_and_shutdown_reasons(gateway_factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="polyport.connections")
    gw = await gateway_factory(admin_token=TOKEN, idle_timeout=0.3)
    host, port = gw.listeners["bson"].address
    idle = await BsonClient.connect(host, port)
    await asyncio.sleep(0.8)
    await idle.close()
    busy = await BsonClient.connect(host, port)
    await gw.stop()
    await busy.close()
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "polyport.connections"]
    assert any("(idle)" in m for m in lines), lines
    assert any("(shutdown)" in m for m in lines), lines


async def test_res01_peers_are_listed_and_disconnected(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    async with aiohttp.ClientSession(headers=AUTH) as http:
        client = await Res01Client.connect(gw.listeners["res01"].address, timeout=10)
        await client.commit("default", "r1", -1, [new_event("Made", '{"n": 1}')])
        [peer] = await listed(http, gw, protocol="res01")
        assert peer["peer"].startswith("zmq:") and peer["events_in"] == 1
        assert peer["bytes_in"] > 0 and peer["bytes_out"] > 0
        async with http.delete(admin_url(gw) + f"/connections/{peer['id']}") as resp:
            assert resp.status == 204
        assert await listed(http, gw, protocol="res01") == []
        # It was disconnected; the DEALER connects again on its own, and
        # its next request registers it afresh (the ROUTER gave the new
        # connection a routing id of its own).
        await client.commit("default", "r1", -1, [new_event("Made", '{"n": 2}')])
        [again] = await listed(http, gw, protocol="res01")
        assert again["id"] != peer["id"] and again["peer"] != peer["peer"]
        await client.close()
