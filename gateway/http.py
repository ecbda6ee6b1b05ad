"""The HTTP port: health and readiness here; status and the status page
(:mod:`gateway.status`), metrics (:mod:`gateway.metrics`), the admin API
(:mod:`gateway.admin`), and WebSocket endpoints registered by listeners."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from polyport.core.migrate import SchemaBehind, check_current
from polyport.gateway import admin, metrics, status

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")
READY_CHECK_TIMEOUT = 1.5


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    problems: list[str] = []
    try:
        await asyncio.wait_for(gw.store.monitor.ping(), READY_CHECK_TIMEOUT)
    except Exception as exc:
        problems.append(f"database unreachable: {exc.__class__.__name__}: {exc}")
    else:
        try:
            await asyncio.wait_for(check_current(gw.database_url), READY_CHECK_TIMEOUT)
        except SchemaBehind as exc:
            problems.append(str(exc))
        except Exception as exc:
            problems.append(f"schema check failed: {exc}")
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
