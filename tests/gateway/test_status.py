"""/status JSON, the live and event_stats charts, subscription lag, logs (issue 8)."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from polyport.core.commands import Append, FromBeginning, Selector, Subscribe
from polyport.core.events import EventData
from polyport.core.matcher import event_matcher
from polyport.gateway.http import status
from polyport.gateway.process.logging_setup import JsonFormatter
from polyport.protocols.bson.client import BsonClient, BsonError


@pytest.fixture(autouse=True)
def _fresh_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    # These tests change state and read /status again at once; sharing the
    # database's sections between requests is tests/security's to check.
    monkeypatch.setattr(status, "SECTIONS_TTL", 0.0)


def base(gw: Any) -> str:
    host, port = gw.http_address
    return f"http://{host}:{port}"


ADMIN_TOKEN = "status-admin"


async def get_status(gw: Any, token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(
        base(gw) + "/status", headers=headers
    ) as r:
        assert r.status == 200
        data: dict[str, Any] = await r.json()
        return data


def events(n: int, prefix: str = "e") -> tuple[EventData, ...]:
    return tuple(EventData("t", f'{{"{prefix}": {i}}}'.encode(), content_type="application/json")
                 for i in range(n))


async def test_status_reports_listeners_writer_rates_and_database(gateway_factory) -> None:
    gw = await gateway_factory()
    client = await BsonClient.connect(*gw.listeners["bson"].address)
    try:
        for i in range(5):
            await client.emit("orders", "placed", {"n": i})
        st = await get_status(gw)
    finally:
        await client.close()
    names = {x["name"] for x in st["listeners"] if x["kind"] == "protocol"}
    assert names == {"bson", "micromsg2", "reactivesocket", "res01", "rsocket", "segment"}
    # The HTTP port and the ReactiveSocket WebSocket endpoint are listed too.
    http = next(x for x in st["listeners"] if x["kind"] == "http")
    assert http["address"] == "{}:{}".format(*gw.http_address)
    assert http["requests_total"] >= 0 and http["frames_in"] is None
    ws = next(x for x in st["listeners"]
              if x["kind"] == "websocket" and x["counted_with"] == "reactivesocket")
    assert ws["address"] == "{}:{}/reactivesocket".format(*gw.http_address)
    assert ws["counted_with"] == "reactivesocket" and ws["connections_open"] == 0
    assert st["schema"]["current"] is True and st["schema"]["revision"] == st["schema"]["head"]
    bson = next(x for x in st["listeners"] if x["name"] == "bson")
    assert bson["address"] == "{}:{}".format(*gw.listeners["bson"].address)
    assert bson["connections_open"] == 1 and bson["connections_total"] == 1
    assert bson["frames_in"] == 6 and bson["frames_out"] == 6  # CONNECT + 5 EMIT, 6 RESPONSE
    assert bson["events_appended"] == 5
    assert st["http"]["address"] == "{}:{}".format(*gw.http_address)
    assert st["version"] and st["uptime_seconds"] >= 0 and st["ready"] is True
    assert st["writer"]["events"] == 5 and st["writer"]["commits"] >= 1
    assert st["writer"]["batch_sizes"]["count"] == st["writer"]["commits"]
    assert st["writer"]["queue_depth"] == 0
    assert st["rates"]["append"] > 0 and st["rates"]["by_protocol"]["bson"]["append"] > 0
    assert st["database"]["reachable"] is True
    assert st["database"]["pool"]["max"] >= st["database"]["pool"]["size"] >= 1
    assert st["log"]["head_position"] == 5
    assert st["chart"]["source"] == "live"
    assert sum(p["events"] for p in st["chart"]["points"]) == 5


async def test_status_subscription_lag(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=ADMIN_TOKEN)
    store = gw.store
    await store.append(Append("default", "lagged", events(7)))
    # A durable subscription that has consumed nothing yet: 7 events behind.
    store_sub = await store.register_fetch_subscription(
        "reports", Selector(context="default", stream="lagged"), FromBeginning()
    )
    # An in-process subscription with everything buffered and nothing taken.
    live = await store.subscribe(
        Subscribe(Selector(context="default", prefix="lag"), FromBeginning())
    )
    try:
        for _ in range(50):
            if live.buffered == 7:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        gw.telemetry.lag.taken = 0  # no cached lag
        st = await get_status(gw, ADMIN_TOKEN)
        durable = {d["name"]: d for d in st["subscriptions"]["durable"]}
        assert durable["reports"]["lag_events"] == 7
        assert durable["reports"]["checkpoint"] == store_sub.checkpoint == 0
        assert durable["reports"]["lag_seconds"] >= 0.2
        [transient] = st["subscriptions"]["in_process"]
        assert transient["lag_events"] == 7 and transient["buffered"] == 7
        assert transient["lag_seconds"] >= 0.2
        # Consume it all: no lag left.
        got = await live.next_batch(10, timeout=2)
        assert len(got) == 7
        await store.progress(store_sub.id, (await store.fetch(store_sub.id, 10))[-1].recorded_at)
        gw.telemetry.lag.taken = 0
        st = await get_status(gw)
        assert st["subscriptions"]["durable"][0]["lag_events"] == 0
        assert st["subscriptions"]["in_process"][0]["lag_events"] == 0
        assert st["subscriptions"]["in_process"][0]["lag_seconds"] == 0
    finally:
        live.close()


async def test_chart_reads_event_stats_when_present(gateway_factory) -> None:
    gw = await gateway_factory()
    st = await get_status(gw)
    assert st["chart"]["source"] == "live"
    # The pipeline's table (its migration creates it; created here for the test).
    hour = datetime(2024, 5, 1, 10, tzinfo=UTC)
    async with gw.store.pool.acquire() as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS event_stats (context text, category text, type text, "
            "hour timestamptz, events bigint, bytes bigint, "
            "PRIMARY KEY (context, category, type, hour))"
        )
        await conn.executemany(
            "INSERT INTO event_stats VALUES ($1, $2, $3, $4, $5, $6)",
            [
                ("a", "orders", "placed", hour, 10, 1000),
                ("b", "orders", "placed", hour, 5, 500),
                ("a", "orders", "placed", hour + timedelta(hours=2), 7, 70),
            ],
        )
    st = await get_status(gw)
    chart = st["chart"]
    assert chart["source"] == "event_stats" and chart["bucket_seconds"] == 3600
    assert [(p["t"], p["events"]) for p in chart["points"]] == [
        (hour.isoformat(), 15),
        ((hour + timedelta(hours=1)).isoformat(), 0),
        ((hour + timedelta(hours=2)).isoformat(), 7),
    ]


async def test_log_lines_for_listener_auth_failure_and_protocol_error(
    gateway_factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polyport")
    gw = await gateway_factory(allow_anonymous=False)
    host, port = gw.listeners["bson"].address
    # Each listener is announced once, by serve (tests/gateway/test_systemd.py),
    # not logged a second time by the gateway.
    assert not any(f"listener bson on {host}:{port}" in r.getMessage() for r in caplog.records)
    with pytest.raises(BsonError):
        await BsonClient.connect(host, port, username="mallory", password="nope")
    # A frame that is not BSON: protocol error, then the server closes.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"\x05\x00\x00\x00\x07")
    await writer.drain()
    await asyncio.wait_for(reader.read(), 5)
    writer.close()
    lines = [r for r in caplog.records if r.name == "polyport.errors"]
    auth = [r for r in lines if "auth failure" in r.getMessage()]
    assert auth and auth[0].levelno == logging.WARNING
    assert "bson: auth failure from 127.0.0.1:" in auth[0].getMessage()
    assert "unauthenticated" in auth[0].getMessage()
    proto = [r for r in lines if "protocol error" in r.getMessage()]
    assert proto and "malformed" in proto[0].getMessage()
    # JSON logs carry the peer and code as fields.
    out = json.loads(JsonFormatter().format(proto[0]))
    assert out["level"] == "info" and out["protocol"] == "bson" and out["code"] == "malformed"
    assert out["peer"].startswith("127.0.0.1:")


async def test_connection_refused_above_max_connections(
    gateway_factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polyport")
    gw = await gateway_factory(max_connections=1)
    host, port = gw.listeners["bson"].address
    first = await BsonClient.connect(host, port)
    try:
        with pytest.raises((BsonError, ConnectionError, asyncio.IncompleteReadError)):
            await BsonClient.connect(host, port, timeout=5)
        st = await get_status(gw)
        bson = next(x for x in st["listeners"] if x["name"] == "bson")
        assert bson["connections_refused"] == 1 and bson["connections_open"] == 1
        assert any("connection refused from 127.0.0.1:" in r.getMessage()
                   for r in caplog.records if r.levelno == logging.WARNING)
        await first.ping()  # the open one is unaffected
    finally:
        await first.close()


async def test_slow_commit_is_logged(gateway_factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="polyport")
    gw = await gateway_factory(slow_commit_seconds=0.0)
    await gw.store.append(Append("default", "s", events(1)))
    assert any(r.getMessage().startswith("slow commit:") for r in caplog.records)


async def test_status_page_assets_are_served(gateway_factory) -> None:
    gw = await gateway_factory()
    async with aiohttp.ClientSession() as http:
        async with http.get(base(gw) + "/") as r:
            assert r.status == 200 and r.content_type == "text/html"
            page = await r.text()
        assert '<script src="/static/status.js">' in page and "http" not in page.split(
            "<body>")[1].replace("http://www.w3.org", "")
        async with http.get(base(gw) + "/static/status.js") as r:
            assert r.status == 200 and "fetch(\"/status\"" in await r.text()
        async with http.get(base(gw) + "/static/../status.py") as r:
            assert r.status == 404


async def test_durable_lag_counts_only_what_the_matcher_selects(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=ADMIN_TOKEN)
    store = gw.store
    await store.append(Append("default", "matched", events(7, prefix="n")))
    spec = {"n": {"$gte": 5}}
    await store.register_fetch_subscription(
        "big-ones",
        Selector(context="default", stream="matched", matcher=event_matcher(spec),
                 matcher_spec=spec),
        FromBeginning(),
    )
    gw.telemetry.lag.taken = 0
    st = await get_status(gw, ADMIN_TOKEN)
    [sub] = [d for d in st["subscriptions"]["durable"] if d["name"] == "big-ones"]
    assert sub["lag_events"] == 2 and sub["lag_exact"] is True
    assert sub["lag_seconds"] >= 0


async def test_subscription_names_and_selectors_need_the_admin_token(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=ADMIN_TOKEN)
    store = gw.store
    await store.append(Append("default", "payroll-2024", tuple(
        EventData("t", b'{"salary": %d}' % n, content_type="application/json")
        for n in (90000, 120000, 150000, 200000))))
    spec = {"salary": {"$gte": 100000}}
    await store.register_fetch_subscription(
        "hr-audit",
        Selector(context="default", prefix="payroll-", matcher=event_matcher(spec),
                 matcher_spec=spec),
        FromBeginning(),
    )
    live = await store.subscribe(Subscribe(Selector(context="default", stream="payroll-2024"),
                                           FromBeginning()))
    try:
        for token in (None, "wrong-token"):
            gw.telemetry.lag.taken = 0
            st = await get_status(gw, token)
            subs = st["subscriptions"]
            assert subs["names_shown"] is False
            text = json.dumps(subs)
            assert "hr-audit" not in text and "payroll" not in text and "salary" not in text
            [durable] = subs["durable"]
            assert durable["name"] is None and durable["selector"] is None
            # The numbers stay public.
            assert durable["lag_events"] == 3 and durable["checkpoint"] == 0
            assert all(x["selector"] is None for x in subs["in_process"])
        st = await get_status(gw, ADMIN_TOKEN)
        assert st["subscriptions"]["names_shown"] is True
        [durable] = st["subscriptions"]["durable"]
        assert durable["name"] == "hr-audit"
        assert durable["selector"] == {"context": "default", "prefix": "payroll-",
                                       "matcher": spec}
    finally:
        live.close()
