"""``polyport connections list|close``: a running gateway's open connections,
through its admin API (the address from ``<data-dir>/gateway.json`` as for
``polyport status``, the token from ``admin_token`` / POLYPORT_ADMIN_TOKEN)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from polyport.gateway.config import GatewayConfig
from polyport.gateway.status_cli import gateway_address
from polyport.gateway.tables import table

HTTP_TIMEOUT = 5.0


class AdminError(Exception):
    """The admin API could not be reached or refused the request."""


def add_connections_parser(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "connections", help="a running gateway's open connections (admin API)",
        description="a running gateway's open connections, through its admin API "
                    "(needs admin_token / POLYPORT_ADMIN_TOKEN)",
    )
    common(p)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = actions.add_parser("list", help="list open connections")
    ls.add_argument("--protocol", help="only this protocol's")
    ls.add_argument("--user", help="only this user's")
    ls.add_argument("--address", help="only peers whose address contains this")
    ls.add_argument("--json", action="store_true", help="print JSON")
    close = actions.add_parser("close", help="close a connection (Res01: disconnect the peer)")
    close.add_argument("id", type=int, help="connection id, from 'connections list'")
    for leaf in (ls, close):
        common(leaf)
        leaf.add_argument("--host", help="where the gateway's HTTP port listens")
        leaf.add_argument("--http-port", help="the gateway's HTTP port")
    return p


async def admin_request(
    config: GatewayConfig, method: str, path: str, *, explicit: bool = False,
    params: dict[str, str] | None = None,
) -> Any:
    """One admin API call to the running gateway; its JSON (None for 204)."""
    if not config.admin_token:
        raise AdminError("no admin token: set admin_token in the configuration or "
                         "POLYPORT_ADMIN_TOKEN")
    address = gateway_address(config, explicit)
    if address is None:
        raise AdminError("http_port is off in this configuration")
    host = "127.0.0.1" if address[0] in ("0.0.0.0", "::", "") else address[0]
    if ":" in host:
        host = f"[{host}]"
    url = f"http://{host}:{address[1]}/admin{path}"
    headers = {"Authorization": f"Bearer {config.admin_token}"}
    try:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.request(
            method, url, headers=headers, params=params
        ) as r:
            if r.status == 204:
                return None
            try:
                body = await r.json()
            except (aiohttp.ContentTypeError, ValueError):
                body = {"error": (await r.text()).strip()}
            if r.status >= 400:
                raise AdminError(f"{method} {url}: HTTP {r.status}: "
                                 f"{body.get('error', body) if isinstance(body, dict) else body}")
            return body
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise AdminError(f"cannot reach the gateway at {url} "
                         f"({exc.__class__.__name__}: {exc}); is it running?") from exc


def render(connections: list[dict[str, Any]]) -> str:
    return table(connections, (
        ("ID", lambda c: c["id"]), ("PROTOCOL", lambda c: c["protocol"]),
        ("PEER", lambda c: c["peer"]), ("USER", lambda c: c["user"]),
        ("SINCE", lambda c: c["since"][:19]),
        ("BYTES IN/OUT", lambda c: f"{c['bytes_in']}/{c['bytes_out']}"),
        ("EVENTS IN/OUT", lambda c: f"{c['events_in']}/{c['events_out']}"),
        ("SUBS", lambda c: c["subscriptions"]),
    ), empty="no open connections")


async def run_connections(args: argparse.Namespace, config: GatewayConfig) -> int:
    explicit = bool(args.host or args.http_port)
    if args.action == "list":
        query = {k: v for k in ("protocol", "user", "address")
                 if (v := getattr(args, k)) is not None}
        found = await admin_request(config, "GET", "/connections", explicit=explicit,
                                    params=query)
        print(json.dumps(found, indent=2) if args.json else render(found))
    else:
        await admin_request(config, "DELETE", f"/connections/{quote(str(args.id))}",
                            explicit=explicit)
        print(f"connection {args.id} closed")
    return 0
