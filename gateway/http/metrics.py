"""``/metrics``: Prometheus exposition of the gateway's telemetry.

Metric names and meanings are listed in docs/operations.md; everything comes
from the gateway's own registry (:class:`gateway.http.telemetry.Telemetry`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from polyport.gateway.http.admin_token import is_admin
from polyport.gateway.http.collectors import MetricsOf, WithoutCreated
from polyport.gateway.http.telemetry import PER_SUBSCRIPTION_METRICS

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
        if gw.aggregator is not None:  # every worker's (gateway/process/workers.py)
            merged = [m for m in await gw.aggregator.metrics() if m.name not in hidden]
            body = generate_latest(MetricsOf(merged))
        else:
            body = generate_latest(WithoutCreated(telemetry.registry, hidden=hidden))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)
