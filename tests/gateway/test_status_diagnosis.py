"""What /status adds for a diagnosis (issue 29.6): append and commit
quantiles over the rate window, computed from histogram buckets as
Prometheus' ``histogram_quantile`` does, and open connections per protocol
over the last ten minutes; with workers, both merged."""

from __future__ import annotations

from typing import Any

import aiohttp

from polyport.gateway.http.telemetry import CHART_BUCKETS, LATENCY_BUCKETS, bucket_quantile
from polyport.gateway.process.workers import merge_status
from polyport.protocols.bson.client import BsonClient


def test_bucket_quantile_interpolates_within_the_bucket() -> None:
    counts = [0] * (len(LATENCY_BUCKETS) + 1)
    assert bucket_quantile(0.99, counts) is None
    counts[0] = 10  # all at or below 0.5 ms
    assert bucket_quantile(0.5, counts) == LATENCY_BUCKETS[0] / 2
    counts[3] = 90  # 2.5 ms < x <= 5 ms
    # Rank 99 of 100: 89 of the 90 in the (2.5 ms, 5 ms] bucket.
    assert bucket_quantile(0.99, counts) == round(0.0025 + 0.0025 * 89 / 90, 6)
    counts[-1] = 1000  # beyond every bound: the largest bound
    assert bucket_quantile(0.99, counts) == LATENCY_BUCKETS[-1]


async def status_doc(gw: Any) -> dict[str, Any]:
    host, port = gw.http_address
    async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}/status") as r:
        assert r.status == 200
        doc: dict[str, Any] = await r.json()
        return doc


async def test_status_has_latency_and_connections_by_protocol(gateway_factory) -> None:
    gw = await gateway_factory()
    client = await BsonClient.connect(*gw.listeners["bson"].address)
    try:
        for n in range(5):
            await client.emit("diag", "T", {"n": n})
        doc = await status_doc(gw)
    finally:
        await client.close()
    latency = doc["latency"]
    # Within the window (all of it unless this machine stalled for 10 s).
    assert 1 <= latency["append"]["count"] <= 5
    assert 1 <= latency["commit"]["count"] <= 5
    for key in ("append", "commit"):
        assert 0 < latency[key]["p50"] <= latency[key]["p99"] <= LATENCY_BUCKETS[-1]
    chart = doc["connections_chart"]
    assert len(chart) == CHART_BUCKETS
    seen = [p["open"] for p in chart if p["open"] is not None]
    assert seen and seen[-1]["bson"] == 1 and seen[-1]["res01"] == 0
    # Before the gateway started: no value, not zero.
    assert chart[0]["open"] is None


def _part(p99: float | None, count: int, bson: int) -> dict[str, Any]:
    """The parts of a worker's /status that merge_status reads."""
    return {
        "listeners": [], "reads_waiting": 0, "ready": True, "pid": 1, "started_at": "",
        "writer": {"queue_depth": 0, "commits": 0, "events": 0, "last_batch_size": 0,
                   "batch_sizes": {"count": 0}},
        "log": {"head_position": 1, "last_recorded_at": None},
        "rates": {"append": 0.0, "delivery": 0.0, "log": 0.0, "by_protocol": {}},
        "subscriptions": {"live": 0, "open": 0, "in_process": []},
        "connections": {"open": bson},
        "latency": {"window_seconds": 10.0,
                    "append": {"count": count, "p50": p99, "p99": p99},
                    "commit": {"count": 0, "p50": None, "p99": None}},
        "connections_chart": [{"t": "a", "open": None}, {"t": "b", "open": {"bson": bson}}],
    }


def test_workers_merge_the_largest_quantile_and_sum_connections() -> None:
    doc = merge_status(0, {0: _part(0.01, 3, 1), 1: _part(0.2, 4, 2), 2: _part(None, 0, 0)},
                       {}, 3)
    assert doc["latency"]["append"] == {"count": 7, "p50": 0.2, "p99": 0.2}
    assert doc["latency"]["commit"] == {"count": 0, "p50": None, "p99": None}
    assert doc["connections_chart"] == [{"t": "a", "open": None},
                                        {"t": "b", "open": {"bson": 3}}]


def test_workers_sum_the_commits_at_planned_positions() -> None:
    """A chain process's totals reach the first worker; a chain hosted by
    a worker is that worker's own writer: summed, either is the gateway's
    (a part without them counts 0)."""
    parts = {0: _part(None, 0, 0), 1: _part(None, 0, 0), 2: _part(None, 0, 0)}
    parts[0]["writer"].update(planned_commits=40, planned_refused=2)
    parts[2]["writer"].update(planned_commits=1, planned_refused=0)
    doc = merge_status(0, parts, {}, 3)
    assert (doc["writer"]["planned_commits"], doc["writer"]["planned_refused"]) == (41, 2)
