"""``/metrics``: Prometheus exposition of the gateway's telemetry.

Metric names and meanings are listed in docs/operations.md; everything comes
from the gateway's own registry (:class:`gateway.telemetry.Telemetry`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

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
        body = generate_latest(telemetry.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)
