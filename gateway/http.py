"""The HTTP port: health and readiness here; status and the status page
(:mod:`gateway.status`), metrics (:mod:`gateway.metrics`), the admin API
(:mod:`gateway.admin`), and WebSocket endpoints registered by listeners."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from polyport.gateway import admin, metrics, status

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    # From what the store keeps current (core.health): a probe polled by a
    # load balancer costs no database round trip.
    problems = gw.store.health().problems
    if not gw.listeners_bound:
        problems.append("listeners not bound yet")
    if problems:
        return web.json_response({"status": "unavailable", "problems": problems}, status=503)
    return web.json_response({"status": "ready"})


def build_app(gw: Gateway) -> web.Application:
    app = web.Application(client_max_size=8 << 20, middlewares=[admin.middleware(gw)])
    app[GATEWAY_KEY] = gw
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    status.setup(app, gw)
    metrics.setup(app, gw)
    admin.setup(app, gw)
    return app
