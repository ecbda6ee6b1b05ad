"""``/metrics``: Prometheus exposition of the gateway's telemetry.

Metric names and meanings are listed in docs/operations.md; everything comes
from the gateway's own registry (:class:`gateway.telemetry.Telemetry`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from polyport.gateway.admin import is_admin
from polyport.gateway.telemetry import PER_SUBSCRIPTION_METRICS
from polyport.gateway.workers import MetricsOf

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway


def setup(app: web.Application, gw: Gateway) -> None:
    async def metrics(request: web.Request) -> web.Response:
        telemetry = gw.telemetry
        if telemetry is None:
            raise web.HTTPServiceUnavailable(text="the gateway is starting\n")
        # Subscription lag needs the database: refresh it (rate-limited) before
        # the synchronous collectors run.
        await telemetry.subscription_lag()
        telemetry.prime()
        # Per-subscription series (metrics_per_subscription) are labelled
        # with subscription names: like /status, only for the admin token.
        hidden = () if is_admin(request, gw.config.admin_token) else PER_SUBSCRIPTION_METRICS
        if gw.aggregator is not None:  # every worker's (gateway/workers.py)
            merged = [m for m in await gw.aggregator.metrics() if m.name not in hidden]
            body = generate_latest(MetricsOf(merged))
        else:
            body = generate_latest(WithoutCreated(telemetry.registry, hidden=hidden))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)


class WithoutCreated(Collector):
    """A registry's metrics without the ``_created`` samples prometheus_client
    adds to counters and histograms: Prometheus ignores them in the text
    format, and each one is a series to store.  (Filtered here rather than
    with ``disable_created_metrics()``, which is process-wide.)"""

    def __init__(self, registry: CollectorRegistry, *, hidden: Iterable[str] = ()) -> None:
        self._registry = registry
        self._hidden = frozenset(hidden)

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            if metric.name in self._hidden:
                continue
            kept = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(kept) != len(metric.samples):
                metric = _copy(metric, kept)
            yield metric


def _copy(metric: Metric, samples: list[Sample]) -> Metric:
    out = Metric(metric.name, metric.documentation, metric.type, metric.unit)
    out.samples = samples
    return out
