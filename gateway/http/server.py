"""The HTTP port: health and readiness here; status and the status page
(:mod:`gateway.http.status`), metrics (:mod:`gateway.http.metrics`), the admin API
(:mod:`gateway.http.admin`), and WebSocket endpoints registered by listeners."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from polyport.gateway.http import admin, metrics, status
from polyport.gateway.http.telemetry import UNMATCHED_ROUTE
from polyport.gateway.transports import websocket

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    problems = request.app[GATEWAY_KEY].readiness_problems()
    if problems:
        return web.json_response({"status": "unavailable", "problems": problems}, status=503)
    return web.json_response({"status": "ready"})


def route_template(request: web.Request) -> str:
    """The matched route's path template (``/admin/users/{name}``), never the
    raw path: the label's values are bounded by the routes the app has."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED_ROUTE


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_metrics(gw: Gateway) -> Middleware:
    """Count and time every request, by route template, method and status.
    Outermost, so that answers of the other middlewares (the admin API's 401)
    are counted too."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500  # an exception that is not an HTTP answer: aiohttp sends 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            telemetry = gw.telemetry
            if telemetry is not None:
                route = route_template(request)
                telemetry.http_requests.labels(route, request.method, str(status)).inc()
                telemetry.http_duration.labels(route, request.method).observe(
                    time.perf_counter() - started
                )

    return middleware


async def _prime_routes(app: web.Application) -> None:
    # on_startup: every route is registered by now (listeners add theirs
    # after build_app), and the router is frozen.
    telemetry = app[GATEWAY_KEY].telemetry
    if telemetry is None:
        return
    telemetry.prime_routes(
        sorted({
            (route.resource.canonical, route.method)
            for route in app.router.routes()
            if route.resource is not None and route.method not in ("HEAD", "*")
        })
    )


def build_app(gw: Gateway) -> web.Application:
    app = web.Application(
        client_max_size=8 << 20, middlewares=[request_metrics(gw), admin.middleware(gw)]
    )
    app.on_startup.append(_prime_routes)
    app[GATEWAY_KEY] = gw
    app[websocket.ALLOWED_ORIGINS] = gw.config.websocket_allowed_origins
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    status.setup(app, gw)
    metrics.setup(app, gw)
    admin.setup(app, gw)
    return app
