"""``polyport connections list|close``: a running gateway's open connections,
through its admin API (the address from ``<data-dir>/gateway.json`` as for
``polyport status``, the token from ``admin_token`` / POLYPORT_ADMIN_TOKEN).

The token goes over HTTPS when the configuration turns TLS on for the HTTP
port, checked against the certificate the configuration names, and never
over plain HTTP to anything but a loopback address."""

from __future__ import annotations

import argparse
import ipaddress
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from polyport.gateway.cli.status_cli import gateway_address
from polyport.gateway.cli.tables import table
from polyport.gateway.config import GatewayConfig

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
        leaf.add_argument("--ca-file", metavar="FILE",
                          help="with HTTPS: trust the CAs in FILE and check the gateway's "
                               "name (default: trust exactly the certificate the "
                               "configuration names, tls_cert / http_tls_cert)")
    return p


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def _pinned(cert_file: str) -> ssl.SSLContext:
    """Trust the first certificate of the gateway's configured chain, and
    nothing else: the CLI reads the gateway's configuration, so it knows
    exactly which certificate must answer.  Only the leaf: an intermediate in
    the trust store would admit any certificate that intermediate signed,
    whatever its name (the name is not checked: the pin is the check)."""
    try:
        pem = Path(cert_file).read_text()
    except OSError as exc:
        raise AdminError(f"cannot read the gateway's certificate {cert_file} to check it "
                         f"({exc.strerror}); give --ca-file with the CA that signed it") from None
    end = "-----END CERTIFICATE-----"
    if end not in pem:
        raise AdminError(f"{cert_file} holds no PEM certificate; give --ca-file")
    ctx = ssl.create_default_context(cadata=pem[:pem.index(end) + len(end)] + "\n")
    ctx.check_hostname = False
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


def _transport(
    config: GatewayConfig, host: str, ca_file: str | None
) -> tuple[str, ssl.SSLContext | None]:
    """(scheme, TLS context) for sending the admin token to ``host``."""
    tls = config.tls_for("http")
    if tls is not None:
        if ca_file is None:
            assert tls.cert is not None  # tls_for returns only options with one
            return "https", _pinned(tls.cert)
        try:
            return "https", ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise AdminError(f"--ca-file: cannot load {ca_file}: {exc}") from None
    if not _is_loopback(host):
        # The token would cross the network readable by anyone on the path.
        raise AdminError(f"refusing to send the admin token over plain HTTP to {host}: turn "
                         "on TLS for the HTTP port (tls_cert/tls_key, or http_tls_cert) or run "
                         "this on the gateway's machine against 127.0.0.1")
    return "http", None


async def admin_request(
    config: GatewayConfig, method: str, path: str, *, explicit: bool = False,
    params: dict[str, str] | None = None, ca_file: str | None = None,
) -> Any:
    """One admin API call to the running gateway; its JSON (None for 204)."""
    # Imported here: every other CLI command starts 0.2 s sooner without it.
    import aiohttp

    if not config.admin_token:
        raise AdminError("no admin token: set admin_token in the configuration or "
                         "POLYPORT_ADMIN_TOKEN")
    address = gateway_address(config, explicit)
    if address is None:
        raise AdminError("http_port is off in this configuration")
    host = "127.0.0.1" if address[0] in ("0.0.0.0", "::", "") else address[0]
    scheme, tls = _transport(config, host, ca_file)
    if ":" in host:
        host = f"[{host}]"
    url = f"{scheme}://{host}:{address[1]}/admin{path}"
    headers = {"Authorization": f"Bearer {config.admin_token}"}
    try:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.request(
            method, url, headers=headers, params=params, ssl=tls if tls is not None else True
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
    except aiohttp.ClientSSLError as exc:
        # Before any byte of the request: the token was not sent.
        raise AdminError(f"the gateway at {url} failed the TLS check ({exc}); it must present "
                         "the certificate the configuration names, or one --ca-file "
                         "signed") from exc
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
                                    params=query, ca_file=args.ca_file)
        print(json.dumps(found, indent=2) if args.json else render(found))
    else:
        await admin_request(config, "DELETE", f"/connections/{quote(str(args.id))}",
                            explicit=explicit, ca_file=args.ca_file)
        print(f"connection {args.id} closed")
    return 0
