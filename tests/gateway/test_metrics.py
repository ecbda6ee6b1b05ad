"""/metrics after traffic on every protocol, parsed with prometheus_client's
parser: the counters match the traffic sent (issue 8, acceptance 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient, RemoteError
from polyport.protocols.res01.client import Res01Client, Res01ServerError, new_event
from polyport.protocols.segment.client import NoSuchSegmentError, SegmentReader, SegmentWriter

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(gw: Any) -> tuple[Samples, set[str]]:
    host, port = gw.http_address
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{host}:{port}/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    samples: Samples = {}
    types: set[str] = set()
    for family in text_string_to_metric_families(text):
        types.add(f"{family.name}:{family.type}")
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_metrics_match_traffic_on_every_protocol(gateway_factory) -> None:
    gw = await gateway_factory()
    host = "127.0.0.1"

    # Res01: 3 commits of 2 events, 1 commit with a wrong expected version,
    # then a durable subscription fetched once (6 events delivered).
    res01 = await Res01Client.connect(gw.listeners["res01"].address)
    for _ in range(3):
        await res01.commit("ctx", "r-stream", -1, [new_event("T", "{}"), new_event("T", "{}")])
    with pytest.raises(Res01ServerError):
        await res01.commit("ctx", "r-stream", 99, [new_event("T", "{}")])
    [sub_id] = await res01.subscribe("metrics", [("ctx", "r-stream", datetime(2000, 1, 1,
                                                                            tzinfo=UTC))])
    [fetched] = await res01.fetch([(sub_id, 100)])
    assert len(fetched.events) == 6

    # BSON: CONNECT, 4 EMITs, a QUERY on a binder that does not exist.
    bson = await BsonClient.connect(*gw.listeners["bson"].address)
    for i in range(4):
        await bson.emit("b-stream", "T", {"n": i})
    with pytest.raises(BsonError):
        await bson.query("no-such-binder", {})

    # ReactiveSocket: SETUP, 2 appends of 3 events, 1 with a wrong expected
    # version, then a subscription from the beginning taking the 6 events.
    rs = await ReactiveSocketClient.connect(*gw.listeners["reactivesocket"].address)
    for _ in range(2):
        await rs.append("rs-stream", [NewEvent("T", b"x") for _ in range(3)])
    with pytest.raises(RemoteError):
        await rs.append("rs-stream", [NewEvent("T", b"x")], expected_version=42)
    sub = await rs.subscribe(stream="rs-stream", start="beginning")
    for _ in range(6):
        assert await sub.next(5) is not None

    # MicroMsg2: 5 MESSAGEs (acked after commit).
    mm = await MicroMsg2Client.connect(host, gw.listeners["micromsg2"].address[1],
                                       required=["ack"])
    for i in range(5):
        await mm.publish("topic/mm-stream", f"m{i}".encode())
    await mm.flush(timeout=5)

    # Segment: one appender writing 7 events; a reader asking for a missing segment.
    writer = await SegmentWriter.connect(*gw.listeners["segment"].address)
    appender = await writer.open_segment("segctx/seg-stream")
    await appender.append([b"e%d" % i for i in range(7)])
    await appender.flush()
    reader = await SegmentReader.connect(*gw.listeners["segment"].address)
    with pytest.raises(NoSuchSegmentError):
        await reader.read("segctx/missing")

    # Res01 counts connections from the ZeroMQ socket monitor: asynchronous.
    async def res01_counted() -> bool:
        samples, _ = await scrape(gw)
        return value(samples, "polyport_connections_total", protocol="res01") == 1

    await until(res01_counted)
    samples, types = await scrape(gw)
    try:
        expected_connections = {"res01": 1, "bson": 1, "reactivesocket": 1, "micromsg2": 1,
                                "segment": 2}
        for proto, n in expected_connections.items():
            assert value(samples, "polyport_connections_total", protocol=proto) == n, proto
            assert value(samples, "polyport_connections_open", protocol=proto) == n, proto
        appended = {"res01": 6, "bson": 4, "reactivesocket": 6, "micromsg2": 5, "segment": 7}
        for proto, n in appended.items():
            assert value(samples, "polyport_events_appended_total", protocol=proto) == n, proto
        assert value(samples, "polyport_committed_events_total") == sum(appended.values())
        assert value(samples, "polyport_log_head_position") == sum(appended.values())
        # Errors, by protocol and canonical code: exactly the ones provoked.
        errors = {k[1]: v for k, v in samples.items() if k[0] == "polyport_errors_total"}
        assert errors == {
            (("code", "wrong_expected_version"), ("protocol", "res01")): 1,
            (("code", "not_found"), ("protocol", "bson")): 1,
            (("code", "wrong_expected_version"), ("protocol", "reactivesocket")): 1,
            (("code", "not_found"), ("protocol", "segment")): 1,
        }
        assert value(samples, "polyport_append_failures_total", protocol="res01") == 1
        assert value(samples, "polyport_append_failures_total", protocol="reactivesocket") == 1
        # Frames: Res01 4 AC + RS + FE in, 3 CR + ER + SR + EF out.
        assert value(samples, "polyport_frames_received_total", protocol="res01") == 6
        assert value(samples, "polyport_frames_sent_total", protocol="res01") == 6
        # BSON: CONNECT + 4 EMIT + QUERY in, one RESPONSE each out.
        assert value(samples, "polyport_frames_received_total", protocol="bson") == 6
        assert value(samples, "polyport_frames_sent_total", protocol="bson") == 6
        # ReactiveSocket: SETUP + 3 REQUEST_RESPONSE + REQUEST_SUB in;
        # 2 RESPONSE + ERROR + 6 event RESPONSEs out.
        assert value(samples, "polyport_frames_received_total", protocol="reactivesocket") == 5
        assert value(samples, "polyport_frames_sent_total", protocol="reactivesocket") == 9
        # MicroMsg2: hello + final handshake frame + 5 MESSAGE in; the server's
        # handshake reply + one ACK per MESSAGE out.
        assert value(samples, "polyport_frames_received_total", protocol="micromsg2") == 7
        assert value(samples, "polyport_frames_sent_total", protocol="micromsg2") == 6
        # Segment (the codec hands a whole append block over as one input):
        # SETUP_APPEND + the block + READ_SEGMENT in; APPEND_SETUP,
        # DATA_APPENDED, NO_SUCH_SEGMENT out.
        assert value(samples, "polyport_frames_received_total", protocol="segment") == 3
        assert value(samples, "polyport_frames_sent_total", protocol="segment") == 3
        for proto in appended:
            assert value(samples, "polyport_bytes_received_total", protocol=proto) > 0, proto
            assert value(samples, "polyport_bytes_sent_total", protocol=proto) > 0, proto
        # Histograms: one append-latency and batch-size observation per append request.
        requests = {"res01": 4, "bson": 4, "reactivesocket": 3, "micromsg2": None,
                    "segment": None}
        for proto, n in requests.items():
            count = value(samples, "polyport_append_latency_seconds_count", protocol=proto)
            size_sum = value(samples, "polyport_append_batch_events_sum", protocol=proto)
            if n is not None:
                assert count == n, proto
            assert count >= 1 and size_sum >= appended[proto], proto
            assert value(samples, "polyport_append_latency_seconds_bucket", protocol=proto,
                         le="+Inf") == count
        assert value(samples, "polyport_commit_batch_events_sum") == sum(appended.values())
        # Deliveries: 6 fetched over Res01, 6 pushed over ReactiveSocket.
        for proto in ("res01", "reactivesocket"):
            assert value(samples, "polyport_events_delivered_total", protocol=proto) == 6
            assert value(samples, "polyport_delivery_latency_seconds_count", protocol=proto) == 6
        # Gauges: queues, lag of the durable Res01 subscription (6 fetched, none progressed).
        assert value(samples, "polyport_writer_queue_depth") == 0
        lag = {dict(k[1])["subscription"]: v for k, v in samples.items()
               if k[0] == "polyport_subscription_lag_events"}
        assert lag == {'res01:["metrics","ctx","r-stream"]': 6}
        assert value(samples, "polyport_subscription_lag_seconds",
                     subscription='res01:["metrics","ctx","r-stream"]') > 0
        assert value(samples, "polyport_open_subscriptions") >= 1
        assert value(samples, "polyport_db_pool_max") >= 1
        assert "polyport_connections:counter" in types
        assert "polyport_append_latency_seconds:histogram" in types
        assert "polyport_subscription_lag_events:gauge" in types
    finally:
        await sub.cancel()
        for close in (res01.close, bson.close, rs.close, mm.close, writer.close, reader.close):
            await close()


async def test_each_gateway_has_its_own_registry(gateway_factory) -> None:
    one = await gateway_factory()
    two = await gateway_factory()
    client = await BsonClient.connect(*one.listeners["bson"].address)
    try:
        await client.emit("s", "T", {})
    finally:
        await client.close()
    first, _ = await scrape(one)
    second, _ = await scrape(two)
    assert value(first, "polyport_events_appended_total", protocol="bson") == 1
    assert value(second, "polyport_events_appended_total", protocol="bson") == 0
    assert one.telemetry.registry is not two.telemetry.registry
