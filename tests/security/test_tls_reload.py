"""A TLS reload rebuilds the context from the files (issue 27, item 8): a
client CA taken out of the bundle stops being trusted for new connections,
on the byte-stream listeners and on HTTPS alike, while the CA that stays
goes on working.  Reload used to load the bundle into the running context,
which only ever added CAs."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from polyport.gateway.config import TlsOptions
from polyport.protocols.bson.client import BsonClient
from tests.gateway.test_tls import CERTIFICATE_REFUSED
from tests.tlspki import Pki

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]
USER = "tls-user"


async def _bson_ok(gw: Any, client_ssl: ssl.SSLContext) -> bool:
    """A certificate login and a ping over TLS; False when it is refused."""
    host, port = gw.listeners["bson"].address
    try:
        client = await BsonClient.connect(host, port, ssl=client_ssl, timeout=10)
        try:
            await client.ping()
        finally:
            await client.close()
    except (CERTIFICATE_REFUSED["bson"], ssl.SSLError):
        return False
    return True


async def _https_ok(gw: Any, client_ssl: ssl.SSLContext) -> bool:
    host, port = gw.http_address
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"https://{host}:{port}/healthz", ssl=client_ssl) as r:
            return r.status == 200
    except (aiohttp.ClientError, ssl.SSLError, ConnectionError):
        return False


async def test_a_ca_removed_from_the_bundle_is_no_longer_trusted_after_reload(
    gateway_factory: GatewayFactory, pki: Pki, tmp_path: Path
) -> None:
    other = trustme.CA()
    bundle = tmp_path / "clients.pem"
    bundle.write_bytes(pki.ca.cert_pem.bytes() + other.cert_pem.bytes())
    options = TlsOptions(str(pki.cert), str(pki.key), str(bundle))
    gw = await gateway_factory(tls=options, allow_anonymous=False)
    await gw.store.users.add(USER, "secret-pw", default_context="c", contexts=["c"])
    stays, goes = pki.client(USER), pki.client(USER, ca=other)
    assert await _bson_ok(gw, stays) and await _bson_ok(gw, goes)
    # HTTPS asks for no login: a certificate from either CA is verified.
    assert await _https_ok(gw, stays) and await _https_ok(gw, goes)

    bundle.write_bytes(pki.ca.cert_pem.bytes())  # the operator drops the other CA
    reloaded = gw.reload_tls(replace(gw.config))
    assert {"bson", "http"} <= set(reloaded)
    assert await _bson_ok(gw, stays)
    assert not await _bson_ok(gw, goes)
    assert await _https_ok(gw, stays)
    assert not await asyncio.wait_for(_https_ok(gw, goes), 20)
