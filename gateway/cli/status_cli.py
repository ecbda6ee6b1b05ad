"""``polyport status``: the live ``/status`` of the gateway running with the
usual configuration (its HTTP port), plus the state of the event store read
from its database.  It never starts or stops a database, and exits 1 unless
the gateway answers and is ready, so scripts and probes can use it as a
check (like ``nats server check``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from polyport.core import migrate
from polyport.core.store import EventStore
from polyport.gateway.config import GatewayConfig
from polyport.gateway.process.ports_file import read_ports_file

HTTP_TIMEOUT = 2.0


def add_status_parser(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "status", help="event store state (database) and a running gateway's /status"
    )
    common(p)
    p.add_argument("--host", help="where a running gateway's HTTP port listens")
    p.add_argument("--http-port", help="a running gateway's HTTP port")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


async def gather(config: GatewayConfig, store: EventStore) -> dict[str, Any]:
    monitor = store.monitor
    head = await monitor.log_head()
    streams, exact = await monitor.streams_count()
    revision = await migrate.current_revision(store.config.database_url)
    subs = await store.list_subscriptions()
    binders = [b.as_json() for b in await store.binders.list()]
    for b in binders:
        b["lag_events"] = max(0, head.position - int(b["position"]))
    out: dict[str, Any] = {
        "database": {
            "schema_revision": revision,
            "schema_current": revision == migrate.head_revision(),
            "head_position": head.position,
            "last_recorded_at": head.recorded_at.isoformat() if head.position else None,
            "events": head.position,  # positions are gapless: the head counts them
            "streams": streams,
            "streams_exact": exact,
            "users": len(await store.users.list()),
        },
        "binders": binders,
        "subscriptions": subs,
    }
    if await monitor.has_event_stats():
        recent = await monitor.event_stats_24h()
        out["event_stats_24h"] = {
            "events": recent.events,
            "bytes": recent.bytes,
            "last_hour": recent.last_hour.isoformat() if recent.last_hour else None,
        }
    return out


def gateway_address(config: GatewayConfig, explicit: bool) -> tuple[str, int] | None:
    """The running gateway's HTTP address: ``<data-dir>/gateway.json`` (written
    by ``serve`` with the ports it really bound, so ``--http-port 0`` works),
    unless --host/--http-port were given; else the configured port."""
    if not explicit:
        running = read_ports_file(config.data_dir)
        if running is not None and running.get("http"):
            return str(running["http"]["host"]), int(running["http"]["port"])
    if config.http_port is None:
        return None
    return config.host, config.http_port


async def _gateway_status(config: GatewayConfig, explicit: bool = False) -> dict[str, Any]:
    # Imported here: every other CLI command starts 0.2 s sooner without it.
    import aiohttp

    address = gateway_address(config, explicit)
    if address is None:
        return {"reachable": False, "error": "http_port is off in this configuration"}
    host = "127.0.0.1" if address[0] in ("0.0.0.0", "::", "") else address[0]
    if ":" in host:
        host = f"[{host}]"
    url = f"http://{host}:{address[1]}/status"
    try:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as r:
            if r.status != 200:
                return {"reachable": False, "url": url, "error": f"HTTP {r.status}"}
            status: dict[str, Any] = await r.json()
            # Readiness as a probe sees it: listeners bound, database and schema.
            async with http.get(url.removesuffix("/status") + "/readyz") as rz:
                ready = rz.status == 200
                problems = list((await rz.json(content_type=None) or {}).get("problems") or [])
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return {"reachable": False, "url": url, "error": f"{exc.__class__.__name__}: {exc}"}
    return {"reachable": True, "url": url, "status": status, "ready": ready,
            "problems": problems}


def render(data: dict[str, Any]) -> str:
    lines = _render_database(data) if "error" not in data["database"] else [
        f"database    {data['database']['error']}"]
    lines.append("")
    gw = data["gateway"]
    if not gw["reachable"]:
        lines.append(f"gateway     not reachable ({gw.get('url', '')}: {gw['error']})")
        return "\n".join(lines)
    st = gw["status"]
    lines.append(f"gateway     {gw['url']}: version {st['version']}, up "
                 f"{st['uptime_seconds']:.0f} s, {'ready' if gw['ready'] else 'NOT READY'}")
    for problem in gw["problems"]:
        lines.append(f"  not ready: {problem}")
    lines.append(f"rates       append {st['rates']['append']}/s, "
                 f"delivery {st['rates']['delivery']}/s, log {st['rates']['log']}/s")
    lines.append(f"writer      queue {st['writer']['queue_depth']}, "
                 f"{st['writer']['commits']} commits, {st['writer']['events']} events")
    for li in st["listeners"]:
        errors = sum(li["errors"].values())
        # The HTTP and WebSocket rows leave what they do not count null.
        n = {k: "–" if li.get(k) is None else li[k]
             for k in ("connections_open", "frames_in", "frames_out")}
        lines.append(f"  {li['name']:<15} {li['address']:<22} open {n['connections_open']:<5} "
                     f"frames {n['frames_in']}/{n['frames_out']}  errors {errors}")
    return "\n".join(lines)


def _render_database(data: dict[str, Any]) -> list[str]:
    db = data["database"]
    lines = [
        f"schema      {db['schema_revision'] or 'none'}"
        f" ({'current' if db['schema_current'] else 'behind: run polyport migrate'})",
        f"log head    position {db['head_position']}"
        + (f", last event at {db['last_recorded_at']}" if db["last_recorded_at"] else ""),
        f"events      {db['events']}",
        f"streams     {'' if db['streams_exact'] else 'about '}{db['streams']}",
        f"users       {db['users']}",
    ]
    if "event_stats_24h" in data:
        st = data["event_stats_24h"]
        lines.append(f"last 24 h   {st['events']} events, {st['bytes']} bytes (event_stats)")
    lines.append("")
    lines.append(f"binders ({len(data['binders'])})")
    for b in data["binders"]:
        lines.append(f"  {b['name']:<24} position {b['position']:<10} "
                     f"lag {b['lag_events']:<8} documents {b['documents']}")
    lines.append(f"durable subscriptions ({len(data['subscriptions'])})")
    for s in data["subscriptions"]:
        where = f"{s['name']} ({s['context']})"
        lines.append(f"  {where:<40} checkpoint {s['checkpoint']:<10} "
                     f"lag {s['lag_events']} events")
    return lines


async def run_status(
    args: argparse.Namespace, config: GatewayConfig,
    with_store: Callable[[Callable[[EventStore], Awaitable[int]]], Awaitable[int]],
) -> int:
    """``with_store`` runs a function with a store on the configured database,
    never starting an embedded one."""
    from polyport.gateway.process.fatal import describe

    data: dict[str, Any] = {}

    async def read(store: EventStore) -> int:
        data.update(await gather(config, store))
        return 0

    try:
        await with_store(read)
    except Exception as exc:  # noqa: BLE001 - reported, and the gateway still asked
        data = {"database": {"error": describe(exc, config.database_url)},
                "binders": [], "subscriptions": []}
    explicit = args.http_port is not None or args.host is not None
    gw = data["gateway"] = await _gateway_status(config, explicit)
    data["checked_at"] = datetime.now(UTC).isoformat()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(render(data))
    if not gw["reachable"]:
        print(f"polyport: no gateway answers at {gw.get('url') or 'the configured address'} "
              f"({gw['error']}): is it running, and with this --data-dir/--http-port?",
              file=sys.stderr)
        return 1
    if not gw["ready"]:
        problems = "; ".join(gw["problems"]) or "see /readyz"
        print(f"polyport: the gateway is not ready: {problems}", file=sys.stderr)
        return 1
    return 0

