"""``/status`` (JSON for tools and the status page) and the status page at ``/``.

The page is static HTML + JavaScript in ``gateway/http/static/``: no build step, no
external resources; it polls ``/status`` and draws its chart as inline SVG.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from polyport.core.errors import new_error_id
from polyport.core.monitor import HourlyVolume
from polyport.gateway.http.admin_token import is_admin
from polyport.gateway.http.telemetry import (
    CHART_BUCKET,
    DB_TIMEOUT,
    LagSnapshot,
    SubscriptionLag,
    Telemetry,
    polyport_version,
)
from polyport.gateway.transports.websocket import WEBSOCKET_ENDPOINTS, WebSocketEndpoint

log = logging.getLogger("polyport.status")

if TYPE_CHECKING:
    from polyport.core.store import EventStore
    from polyport.gateway.app import Gateway

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = {
    "status.js": "application/javascript",
    "status.css": "text/css",
}

async def event_chart(gw: Gateway) -> dict[str, Any]:
    """Event volume: hourly from the pipeline's ``event_stats`` (its own
    migration creates the table) when it exists and holds rows, else per 10
    seconds from this gateway's live counters."""
    monitor = gw.store.monitor
    try:
        async with asyncio.timeout(DB_TIMEOUT):
            exists = await monitor.has_event_stats()
        if exists:
            async with asyncio.timeout(DB_TIMEOUT):
                rows = await monitor.event_stats_hourly()
            if rows:
                return {
                    "source": "event_stats",
                    "bucket_seconds": 3600,
                    "points": _hourly(rows),
                }
    except Exception:  # noqa: BLE001 - no database right now: the live chart still works
        pass
    assert gw.telemetry is not None
    return {"source": "live", "bucket_seconds": CHART_BUCKET, "points": gw.telemetry.live_chart()}


def _hourly(rows: list[HourlyVolume]) -> list[dict[str, Any]]:
    by_hour = {r.hour: (r.events, r.bytes) for r in rows}
    hour: datetime = rows[0].hour
    last: datetime = rows[-1].hour
    points = []
    while hour <= last:
        events, size = by_hour.get(hour, (0, 0))
        points.append({"t": hour.astimezone(UTC).isoformat(), "events": events, "bytes": size})
        hour += timedelta(hours=1)
    return points


def _batch_summary(sizes: list[int]) -> dict[str, Any]:
    if not sizes:
        return {"count": 0, "mean": 0.0, "p50": 0, "p95": 0, "max": 0}
    ordered = sorted(sizes)
    return {
        "count": len(ordered),
        "mean": round(statistics.fmean(ordered), 2),
        "p50": ordered[len(ordered) // 2],
        "p95": ordered[min(len(ordered) - 1, (len(ordered) * 95) // 100)],
        "max": ordered[-1],
    }


async def _database(gw: Gateway) -> dict[str, Any]:
    monitor = gw.store.monitor
    pool = monitor.pool_stats()
    out: dict[str, Any] = {
        "pool": {"size": pool.size, "idle": pool.idle, "min": pool.min, "max": pool.max},
    }
    started = time.monotonic()
    try:
        async with asyncio.timeout(DB_TIMEOUT):
            await monitor.ping()
        out["reachable"] = True
        out["round_trip_ms"] = round((time.monotonic() - started) * 1000, 2)
    except Exception as exc:  # noqa: BLE001 - any failure: reported as unreachable
        # /status is public: the canonical words and an id, the exception's
        # text (hosts, paths, server messages) only in the log.
        eid = new_error_id()
        log.warning("status: database ping failed (error id %s): %s: %s", eid,
                    exc.__class__.__name__, exc)
        out["reachable"] = False
        out["error"] = f"the database did not answer (error id {eid}; the gateway's log has " \
                       "the details)"
    return out


def _schema(gw: Gateway) -> dict[str, Any]:
    """As the store's schema check last saw it (every 30 s and at start):
    no connection of its own per request."""
    store = gw.store
    # The revision as the store's first check (before start() returned) saw it.
    head, revision = store.schema_head, store.schema_revision
    return {"revision": revision, "head": head, "current": revision == head}


# How long the database's part of /status is shared between requests.
SECTIONS_TTL = 1.0

Sections = tuple[Any, dict[str, Any], dict[str, Any] | None, dict[tuple[Any, str], int]]


class DatabaseSections:
    """The parts of /status that cost database round trips (subscription
    lag, a ping, the chart, parked counts), computed at most once per
    :data:`SECTIONS_TTL` and shared by every request meanwhile: /status is
    public, and a loop of anonymous GETs must not become a loop of queries
    on the gateway's pool."""

    def __init__(self) -> None:
        self._at = float("-inf")
        self._task: asyncio.Future[Sections] | None = None

    async def get(self, gw: Gateway) -> Sections:
        now = time.monotonic()
        task = self._task
        if task is None or (task.done() and now - self._at > SECTIONS_TTL):
            self._at = now
            task = self._task = asyncio.ensure_future(_gather_sections(gw))
        # Shielded: a client that disconnects does not cancel the others' answer.
        return await asyncio.shield(task)


async def _gather_sections(gw: Gateway) -> Sections:
    telemetry = gw.telemetry
    assert telemetry is not None
    lag, database, chart = await asyncio.gather(
        telemetry.subscription_lag(), _database(gw), event_chart(gw))
    return lag, database, chart, lag.parked


def _transport_rows(
    gw: Gateway, websockets: Sequence[tuple[str, WebSocketEndpoint]]
) -> list[dict[str, Any]]:
    """The HTTP port and its WebSocket endpoints as listener rows.  What they
    do not count themselves is null: a WebSocket endpoint's frames, bytes and
    errors are in its protocol's row (one ListenerStats for both)."""
    if gw.http_address is None:
        return []
    base = f"{gw.http_address[0]}:{gw.http_address[1]}"
    unknown = dict.fromkeys(
        ("connections_open", "connections_total", "connections_refused", "frames_in",
         "frames_out", "bytes_in", "bytes_out", "events_appended", "events_delivered"))
    telemetry = gw.telemetry
    requests = 0
    if telemetry is not None:
        requests = int(sum(
            s.value for m in telemetry.http_requests.collect() for s in m.samples
            if s.name.endswith("_total")
        ))
    rows: list[dict[str, Any]] = [
        {"name": "http", "kind": "http", "address": base, **unknown,
         "errors": {}, "errors_total": 0, "requests_total": requests},
    ]
    for path, endpoint in sorted(websockets, key=lambda x: x[0]):
        rows.append(
            {"name": f"{endpoint.name} (WebSocket)", "kind": "websocket",
             "address": f"{base}{path}", **unknown,
             "connections_open": endpoint.open_connections,
             "counted_with": endpoint.name, "errors": {}, "errors_total": 0}
        )
    return rows


def _subscription_json(lag: SubscriptionLag, names_shown: bool) -> dict[str, Any]:
    """A subscription's row; its name and selector (stream names, matchers:
    what tenants are interested in) only for an admin-token holder."""
    out = lag.as_json()
    if not names_shown:
        out["name"] = None
        out["selector"] = None
    return out


def _protocol_rows(gw: Gateway, telemetry: Telemetry) -> list[dict[str, Any]]:
    """Each protocol listener's row: its own counters and the events appended
    and delivered through it."""
    listeners = []
    for name, listener in sorted(gw.listeners.items()):
        s = listener.stats
        host, port = listener.address
        listeners.append(
            {
                "name": name,
                "kind": "protocol",
                "address": f"{host}:{port}",
                "connections_open": s.connections_open,
                "connections_total": s.connections_total,
                "connections_refused": s.connections_refused,
                "frames_in": s.frames_in,
                "frames_out": s.frames_out,
                "bytes_in": s.bytes_in,
                "bytes_out": s.bytes_out,
                "errors": dict(sorted(s.errors.items())),
                "errors_total": sum(s.errors.values()),
                "events_appended": telemetry.appended.get(name, 0),
                "events_delivered": telemetry.delivered.get(name, 0),
            }
        )
    return listeners


def _writer_json(store: EventStore) -> dict[str, Any]:
    ws = store.writer.stats
    return {
        "queue_depth": store.writer.queue_depth,
        "commits": ws.commits,
        "events": ws.events,
        "last_batch_size": ws.last_batch_size,
        "batch_sizes": _batch_summary(list(ws.batch_sizes)),
        "planned_commits": ws.planned_commits,
        "planned_refused": ws.planned_refused,
    }


def _subscriptions_json(
    store: EventStore, lag: LagSnapshot, parked: dict[tuple[Any, str], int], names_shown: bool
) -> dict[str, Any]:
    return {
        "live": store.tailer.live_count,
        "open": len(lag.transient),
        "names_shown": names_shown,
        "durable": [{**_subscription_json(x, names_shown),
                     "parked": parked.get((x.selector.get("context"), x.name), 0)}
                    for x in lag.durable],
        "in_process": [_subscription_json(x, names_shown) for x in lag.transient[:100]],
        "error": lag.error,
    }


async def build_status(
    gw: Gateway,
    websockets: Sequence[tuple[str, WebSocketEndpoint]] = (),
    *,
    names_shown: bool = False,
    local_only: bool = False,
    sections: DatabaseSections | None = None,
) -> dict[str, Any]:
    """The /status document.  Counters are for everyone; subscription names
    and selectors only with ``names_shown`` (the request had the admin token).
    ``local_only``: without the sections that are the database's rather than
    this process's (database, schema, chart, parked counts): what another
    worker adds to the first worker's document (gateway/process/workers.py).
    ``sections``: where those come from, shared between requests (else
    computed for this call alone)."""
    telemetry = gw.telemetry
    assert telemetry is not None
    store = gw.store
    now = time.time()
    listeners = _protocol_rows(gw, telemetry)
    listeners.extend(_transport_rows(gw, websockets))
    if gw.http_address is not None:
        http = {"name": "http", "address": f"{gw.http_address[0]}:{gw.http_address[1]}"}
    else:
        http = None
    if local_only:
        lag = await telemetry.subscription_lag()
        database: dict[str, Any] | None = None
        chart: dict[str, Any] | None = None
        schema: dict[str, Any] | None = None
        parked: dict[tuple[Any, str], int] = {}
    else:
        lag, database, chart, parked = await (
            sections.get(gw) if sections is not None else _gather_sections(gw))
        schema = _schema(gw)
    return {
        "version": polyport_version(),
        "now": datetime.fromtimestamp(now, UTC).isoformat(),
        "started_at": datetime.fromtimestamp(gw.started_at, UTC).isoformat(),
        "uptime_seconds": round(now - gw.started_at, 3),
        "ready": gw.listeners_bound,
        "listeners": listeners,
        "http": http,
        "writer": _writer_json(store),
        "reads_waiting": store.reads_waiting,
        "log": {
            "head_position": store.tailer.head,
            "last_recorded_at": (
                store.tailer.last_time.isoformat() if store.tailer.last_time else None
            ),
        },
        "rates": telemetry.rates(),
        # Over the same window as the rates, from the histograms' buckets.
        "latency": telemetry.latency(),
        "subscriptions": _subscriptions_json(store, lag, parked, names_shown),
        # Counts only: who is connected (addresses, users) is for the admin
        # API (GET /admin/connections), which the page calls given the token.
        "connections": {"open": len(gw.connections)},
        "connections_chart": telemetry.connections_chart(),
        "database": database,
        "schema": schema,
        "chart": chart,
    }


def setup(app: web.Application, gw: Gateway) -> None:
    sections = DatabaseSections()

    async def status(request: web.Request) -> web.Response:
        if gw.telemetry is None or gw.store is None:
            raise web.HTTPServiceUnavailable(text="the gateway is starting\n")
        endpoints = request.app.get(WEBSOCKET_ENDPOINTS, [])
        names_shown = is_admin(request, gw.config.admin_token)
        doc = await build_status(gw, endpoints, names_shown=names_shown, sections=sections)
        if gw.aggregator is not None:  # every worker's (gateway/process/workers.py)
            doc = await gw.aggregator.status(doc, names_shown)
        return web.json_response(doc)

    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers=_NO_CACHE)

    async def static(request: web.Request) -> web.FileResponse:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        return web.FileResponse(
            STATIC_DIR / name, headers={**_NO_CACHE, "Content-Type": STATIC_FILES[name]}
        )

    app.router.add_get("/status", status)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)


_NO_CACHE = {"Cache-Control": "no-cache"}
