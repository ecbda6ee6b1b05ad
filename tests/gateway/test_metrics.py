"""/metrics after traffic on every protocol, parsed with prometheus_client's
parser: the counters match the traffic sent (issue 8, acceptance 1); and the
exposition's hygiene: ``promtool check metrics`` without a warning, no
``_created`` series, every counter present at zero from the start, refused
connections and HTTP requests counted."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient, RemoteError
from polyport.protocols.res01.client import Res01Client, Res01ServerError, new_event
from polyport.protocols.segment.client import NoSuchSegmentError, SegmentReader, SegmentWriter
from tests.waiting import until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


ADMIN_TOKEN = "metrics-admin"


async def scrape_text(gw: Any, token: str | None = None) -> str:
    host, port = gw.http_address
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{host}:{port}/metrics", headers=headers) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


async def scrape(gw: Any, token: str | None = None) -> tuple[Samples, set[str]]:
    text = await scrape_text(gw, token)
    samples: Samples = {}
    types: set[str] = set()
    for family in text_string_to_metric_families(text):
        types.add(f"{family.name}:{family.type}")
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_match_traffic_on_every_protocol(gateway_factory) -> None:
    gw = await gateway_factory(metrics_per_subscription=True, admin_token=ADMIN_TOKEN)
    host = "127.0.0.1"

    # Res01 (anonymous, so in the context "default"): 3 commits of 2 events,
    # 1 commit with a wrong expected version, then a durable subscription
    # fetched once (6 events delivered).
    res01 = await Res01Client.connect(gw.listeners["res01"].address)
    for _ in range(3):
        await res01.commit("default", "r-stream", -1,
                           [new_event("T", "{}"), new_event("T", "{}")])
    with pytest.raises(Res01ServerError):
        await res01.commit("default", "r-stream", 99, [new_event("T", "{}")])
    [sub_id] = await res01.subscribe("metrics", [("default", "r-stream", datetime(2000, 1, 1,
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

    # Segment (anonymous: context "default"): one appender writing 7 events; a
    # reader asking for a missing segment.
    writer = await SegmentWriter.connect(*gw.listeners["segment"].address)
    appender = await writer.open_segment("default/seg-stream")
    await appender.append([b"e%d" % i for i in range(7)])
    await appender.flush()
    reader = await SegmentReader.connect(*gw.listeners["segment"].address)
    with pytest.raises(NoSuchSegmentError):
        await reader.read("default/missing")

    # Res01 counts connections from the ZeroMQ socket monitor: asynchronous.
    async def res01_counted() -> bool:
        samples, _ = await scrape(gw)
        return value(samples, "polyport_connections_total", protocol="res01") == 1

    await until(res01_counted)
    samples, types = await scrape(gw, ADMIN_TOKEN)
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
        errors = {k[1]: v for k, v in samples.items()
                  if k[0] == "polyport_errors_total" and v}
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
            assert value(samples, "polyport_received_bytes_total", protocol=proto) > 0, proto
            assert value(samples, "polyport_sent_bytes_total", protocol=proto) > 0, proto
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
        assert lag == {'res01:["metrics","default","r-stream"]': 6}
        assert value(samples, "polyport_subscription_lag_seconds",
                     subscription='res01:["metrics","default","r-stream"]') > 0
        assert value(samples, "polyport_open_subscriptions") >= 1
        assert value(samples, "polyport_durable_subscriptions") == 1
        assert value(samples, "polyport_durable_subscription_lag_max_events") == 6
        assert value(samples, "polyport_db_pool_max_connections") >= 1
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


PROMTOOL = shutil.which("promtool")


async def http_traffic(gw: Any) -> None:
    """Requests to a few routes, one that does not exist, one refused by the
    admin API (no token configured: 404 from its middleware or route)."""
    host, port = gw.http_address
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/healthz", "/status", "/no/such/path/123", "/admin/users"):
            async with http.get(f"http://{host}:{port}{path}") as r:
                await r.read()


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                    "(apt-get install -y prometheus puts it in /usr/bin)")
async def test_promtool_finds_nothing_to_warn_about(gateway_factory) -> None:
    gw = await gateway_factory(metrics_per_subscription=True, admin_token=ADMIN_TOKEN)
    client = await BsonClient.connect(*gw.listeners["bson"].address)
    try:
        for i in range(3):
            await client.emit("p-stream", "T", {"n": i})
        with pytest.raises(BsonError):
            await client.query("no-such-binder", {})
    finally:
        await client.close()
    await http_traffic(gw)
    # A failed login: the login counters have a value to check too (with
    # http_traffic's /admin/users without the token: wrong admin tokens
    # count as failed logins, gateway/http/admin.py).
    with pytest.raises(BsonError):
        await BsonClient.connect(*gw.listeners["bson"].address, username="x", password="y")
    text = await scrape_text(gw, ADMIN_TOKEN)
    assert "polyport_login_failures_total 2.0" in text
    assert PROMTOOL is not None
    done = await asyncio.to_thread(
        subprocess.run, [PROMTOOL, "check", "metrics"], input=text, capture_output=True,
        text=True, timeout=60,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


async def test_no_created_series_and_process_metrics(gateway_factory) -> None:
    gw = await gateway_factory()
    await http_traffic(gw)
    text = await scrape_text(gw)
    assert "_created" not in text
    samples, types = await scrape(gw)
    assert value(samples, "process_resident_memory_bytes") > 0
    assert value(samples, "process_start_time_seconds") > 0
    assert value(samples, "process_open_fds") > 0
    assert "process_cpu_seconds:counter" in types
    assert any(k[0] == "python_info" for k in samples)


async def test_every_counter_is_present_at_zero_from_start(gateway_factory) -> None:
    from polyport.core.errors import ERROR_BY_CODE

    gw = await gateway_factory()
    samples, types = await scrape(gw)
    protocols = sorted(gw.listeners)
    assert protocols == ["bson", "micromsg2", "reactivesocket", "res01", "rsocket", "segment"]
    for proto in protocols:
        for name in ("polyport_connections_total", "polyport_connections_refused_total",
                     "polyport_frames_received_total", "polyport_frames_sent_total",
                     "polyport_received_bytes_total", "polyport_sent_bytes_total"):
            assert samples[(name, (("protocol", proto),))] == 0, (name, proto)
        for code in ERROR_BY_CODE:
            key = ("polyport_errors_total", (("code", code), ("protocol", proto)))
            assert samples[key] == 0, key
    for proto in [*protocols, "core"]:
        for name in ("polyport_events_appended_total", "polyport_append_requests_total",
                     "polyport_append_failures_total", "polyport_events_delivered_total",
                     "polyport_append_latency_seconds_count",
                     "polyport_delivery_latency_seconds_count"):
            assert samples[(name, (("protocol", proto),))] == 0, (name, proto)
    assert samples[("polyport_commits_total", ())] == 0
    assert samples[("polyport_committed_events_total", ())] == 0
    assert samples[("polyport_planned_commits_total", ())] == 0
    assert samples[("polyport_planned_commit_refusals_total", ())] == 0
    assert samples[("polyport_http_request_duration_seconds_count",
                    (("method", "GET"), ("route", "/status")))] == 0
    assert samples[("polyport_durable_subscriptions", ())] == 0
    # Per-subscription series are off by default (metrics_per_subscription).
    assert "polyport_subscription_lag_events:gauge" not in types


async def test_commits_at_planned_positions_are_counted(gateway_factory) -> None:
    """planned_positions = on: commits sent while the one before was in
    flight are counted in /metrics and the writer's /status."""
    from polyport.core.commands import Append
    from polyport.core.events import EventData

    gw = await gateway_factory(planned_positions="on")

    async def publish(stream: str) -> None:
        for i in range(40):
            await gw.store.append(Append("default", stream, (EventData("t", b"%d" % i),)))

    await asyncio.gather(*(publish(f"planned-{i}") for i in range(8)))
    planned = gw.store.writer.stats.planned_commits
    assert planned > 0
    samples, types = await scrape(gw)
    assert "polyport_planned_commits:counter" in types
    assert value(samples, "polyport_planned_commits_total") == planned
    assert value(samples, "polyport_planned_commit_refusals_total") == 0
    host, port = gw.http_address
    async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}/status") as r:
        writer = (await r.json())["writer"]
    assert writer["planned_commits"] == planned and writer["planned_refused"] == 0


async def test_refused_connections_are_counted(gateway_factory) -> None:
    gw = await gateway_factory(max_connections=1)
    address = gw.listeners["bson"].address
    first = await BsonClient.connect(*address)
    try:
        # The second connection is closed by the server before its CONNECT is answered.
        with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError, BsonError)):
            second = await BsonClient.connect(*address)
            await second.close()
    finally:
        await first.close()
    samples, _ = await scrape(gw)
    assert value(samples, "polyport_connections_refused_total", protocol="bson") == 1
    assert value(samples, "polyport_connections_total", protocol="bson") == 1


async def test_http_requests_by_route_template_and_status(gateway_factory) -> None:
    gw = await gateway_factory()
    await http_traffic(gw)
    samples, types = await scrape(gw)
    requests = {tuple(v for _, v in k[1]): n for k, n in samples.items()
                if k[0] == "polyport_http_requests_total"}
    # Labels sorted by name: method, route, status.
    assert requests[("GET", "/healthz", "200")] == 2
    assert requests[("GET", "/status", "200")] == 1
    assert requests[("GET", "unmatched", "404")] == 1
    # The raw path never becomes a label value.
    assert not any("/no/such" in route for _, route, _ in requests)
    admin = [k for k in requests if k[1].startswith("/admin")]
    assert admin and all(status in ("401", "403", "404") for _, _, status in admin)
    assert value(samples, "polyport_http_request_duration_seconds_count",
                 method="GET", route="/healthz") == 2
    assert "polyport_http_request_duration_seconds:histogram" in types


async def test_subscription_names_in_metrics_need_the_admin_token(gateway_factory) -> None:
    gw = await gateway_factory(metrics_per_subscription=True, admin_token=ADMIN_TOKEN)
    res01 = await Res01Client.connect(gw.listeners["res01"].address)
    try:
        await res01.subscribe("secret-reader", [("default", "payroll-", datetime(2000, 1, 1,
                                                                                  tzinfo=UTC))])
    finally:
        await res01.close()
    for token in (None, "wrong"):
        text = await scrape_text(gw, token)
        assert "secret-reader" not in text and "payroll" not in text
        assert "polyport_subscription_lag_events" not in text
        # The counts stay public.
        assert "polyport_durable_subscriptions 1.0" in text
    assert 'res01:[\\"secret-reader\\",\\"default\\",\\"payroll-\\"]' in await scrape_text(
        gw, ADMIN_TOKEN)


async def test_login_failures_and_throttling_are_counted(gateway_factory) -> None:
    from polyport.core.errors import Unauthenticated

    gw = await gateway_factory(allow_anonymous=False)
    users = gw.store.users
    await users.add("known", "right")
    throttle = users.throttle
    throttle.base_delay = 0.05  # the 11th failure waits, briefly
    # Through the users service with a peer address, as every listener
    # logs in (Res01's ZAP path is tested end to end in test_res01).
    for _ in range(throttle.free_failures + 1):
        with pytest.raises(Unauthenticated):
            await users.authenticate("known", "wrong", peer="192.0.2.7")
    await users.authenticate("known", "right", peer="192.0.2.8")
    samples, types = await scrape(gw)
    assert value(samples, "polyport_login_failures_total") == throttle.free_failures + 1
    assert value(samples, "polyport_login_throttled_total") == 1
    assert {"polyport_login_failures:counter", "polyport_login_throttled:counter"} <= types


@given(st.lists(st.floats(0, 1e6, allow_nan=False) | st.sampled_from([0.0, 0.005, 0.1, 1.0]),
                max_size=40))
def test_observing_a_batch_counts_as_observing_each(values: list[float]) -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from polyport.gateway.http.telemetry import LATENCY_BUCKETS, observe_many

    def samples(fill: Any) -> list[tuple[str, dict[str, str], float]]:
        registry = CollectorRegistry()
        h = Histogram("h", "", ["p"], buckets=LATENCY_BUCKETS, registry=registry)
        fill(h.labels("x"))
        return [(s.name, s.labels, s.value) for m in registry.collect() for s in m.samples
                if not s.name.endswith("_created")]

    def one_by_one(child: Any) -> None:
        for v in values:
            child.observe(v)

    got = samples(lambda child: observe_many(child, values))
    want = samples(one_by_one)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for (_n, _l, g), (_n2, _l2, w) in zip(got, want, strict=True):
        assert g == pytest.approx(w)  # the sum is added in another order


def test_a_commit_of_many_units_counts_as_each_unit_alone() -> None:
    # observe_commit takes a commit's units per protocol at once; the series
    # must read as if each unit had been observed by itself.
    from polyport.core.writer import CommitObservation
    from polyport.gateway.http.telemetry import LATENCY_BUCKETS, Telemetry

    units = [
        ("bson", 1, 0.0004, True), ("bson", 3, 0.002, True), ("micromsg2", 1, 0.2, True),
        ("bson", 2, 0.05, False), ("micromsg2", 5, 1.5, False), ("bson", 1, 0.0004, True),
        ("bson", 1, 45.0, True),  # past the last bound: the +Inf bucket
    ]

    def observation(some: list[tuple[str, int, float, bool]], commit: bool) -> CommitObservation:
        return CommitObservation(8 if commit else 0, 0.01 if commit else 0.0,
                                 [u[0] for u in some], [u[1] for u in some],
                                 [u[2] for u in some], [u[3] for u in some], commit=commit)

    def exposed(observations: list[CommitObservation]) -> list[tuple[str, Any, float]]:
        t = Telemetry(None)  # type: ignore[arg-type]  # observe_commit reads no gateway
        # The status page's counts share the histogram's bisect (observe_commit).
        assert tuple(t.append_latency.labels("x")._upper_bounds) == (*LATENCY_BUCKETS, float("inf"))
        for o in observations:
            t.observe_commit(o)
        series = [(s.name, sorted(s.labels.items()), s.value)
                  for h in (t.append_latency, t.append_size) for m in h.collect()
                  for s in m.samples if not s.name.endswith("_created")]
        series += [(name, sorted(counts.items()), 0.0) for name, counts in (
            ("requests", t.append_requests), ("appended", t.appended),
            ("failures", t.append_failures), ("le", dict(enumerate(t._append_le))))]
        return sorted(series)

    for some in (units, [u for u in units if u[0] == "bson"]):
        together = exposed([observation(some, True)])
        alone = exposed([observation(some[:1], True)]
                        + [observation([u], False) for u in some[1:]])
        assert [g[:2] for g in together] == [a[:2] for a in alone]
        for (_n, _l, g), (_n2, _l2, a) in zip(together, alone, strict=True):
            assert g == pytest.approx(a)
    together = exposed([observation(units, True)])
    assert ("requests", [("bson", 5), ("micromsg2", 2)], 0.0) in together
    assert ("appended", [("bson", 6), ("micromsg2", 1)], 0.0) in together
    assert ("failures", [("bson", 1), ("micromsg2", 1)], 0.0) in together
    le = dict(next(s[1] for s in together if s[0] == "le"))
    assert le[len(LATENCY_BUCKETS)] == 1 and sum(le.values()) == len(units)
