"""WebSocket handshakes from browser pages of other origins are refused unless
the origin is configured (``websocket_allowed_origins``); clients that send no
Origin (not browsers) are served as before.  Every WebSocket endpoint
(/reactivesocket, /rsocket) checks it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from polyport.gateway.config import load_config
from polyport.gateway.transports.websocket import origin_allowed
from tests.gateway.test_status_page import browser, find_browser

pytestmark = pytest.mark.timeout(90)

PATHS = ("/reactivesocket", "/rsocket")
EVIL = "http://evil.example:8000"


async def handshake_status(url: str, origin: str | None) -> int:
    headers = {"Origin": origin} if origin is not None else {}
    async with aiohttp.ClientSession() as http:
        try:
            async with http.ws_connect(url, headers=headers) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


async def test_foreign_origins_are_refused_by_default(gateway_factory) -> None:
    gw = await gateway_factory()
    host, port = gw.http_address
    for path in PATHS:
        url = f"ws://{host}:{port}{path}"
        assert await handshake_status(url, EVIL) == 403, path
        # Not even the gateway's own origin: no page of it opens WebSockets.
        assert await handshake_status(url, f"http://{host}:{port}") == 403, path
        assert await handshake_status(url, None) == 101, path  # not a browser
    async with aiohttp.ClientSession() as http, http.get(
        f"http://{host}:{port}/reactivesocket",
        headers={
            "Origin": EVIL, "Connection": "Upgrade", "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    ) as r:
        assert r.status == 403
        text = await r.text()
    assert EVIL in text and "websocket_allowed_origins" in text
    assert gw.listeners["reactivesocket"].stats.errors["forbidden"] == 3


async def test_configured_origins_are_accepted(gateway_factory) -> None:
    gw = await gateway_factory(websocket_allowed_origins=("https://app.example", EVIL + "/"))
    host, port = gw.http_address
    for path in PATHS:
        url = f"ws://{host}:{port}{path}"
        assert await handshake_status(url, "https://app.example") == 101, path
        assert await handshake_status(url, "HTTP://EVIL.example:8000") == 101, path
        assert await handshake_status(url, "https://other.example") == 403, path


def test_origin_rules_and_configuration() -> None:
    assert origin_allowed(None, ())
    assert not origin_allowed("null", ())  # file:// and sandboxed pages
    assert origin_allowed("https://x.example", ("*",))
    assert not origin_allowed("https://x.example:444", ("https://x.example",))
    cfg = load_config(env={"POLYPORT_WEBSOCKET_ALLOWED_ORIGINS": "https://a.example, https://b"})
    assert cfg.websocket_allowed_origins == ("https://a.example", "https://b")
    assert load_config(env={}).websocket_allowed_origins == ()


PAGE = """<!doctype html>
<html><head><title>pending</title></head><body><script>
const ws = new WebSocket("%s");
ws.onopen = () => { document.title = "open"; ws.close(); };
ws.onerror = () => { document.title = "error"; };
</script></body></html>
"""


@contextlib.asynccontextmanager
async def page_server() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A tiny site on another port (so another origin) serving ``pages["/"]``:
    yields its origin first, so a gateway can be told about it."""
    pages: dict[str, str] = {}

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=pages["/"], content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        yield f"http://127.0.0.1:{port}", pages
    finally:
        await runner.cleanup()


async def title_after_load(binary: str, url: str) -> str:
    """The page's title once its WebSocket opened or failed."""
    async with browser(binary) as (_http, devtools):
        await devtools.call("Page.enable")
        await devtools.call("Page.navigate", url=url)
        for _ in range(200):
            title = await devtools.evaluate("document.title")
            if title in ("open", "error"):
                return str(title)
            await asyncio.sleep(0.05)
        return str(await devtools.evaluate("document.title"))


async def test_a_page_of_another_origin_cannot_open_a_websocket(gateway_factory) -> None:
    binary = find_browser()
    if binary is None:
        pytest.skip("no Chromium binary installed (apt-get install chromium)")
    async with page_server() as (origin, pages):
        refused = await gateway_factory()
        host, port = refused.http_address
        pages["/"] = PAGE % f"ws://{host}:{port}/reactivesocket"
        assert await title_after_load(binary, origin + "/") == "error"
        assert refused.listeners["reactivesocket"].stats.errors["forbidden"] == 1
        # The same page against a gateway that allows its origin: it connects.
        allowed = await gateway_factory(websocket_allowed_origins=(origin,))
        host, port = allowed.http_address
        pages["/"] = PAGE % f"ws://{host}:{port}/reactivesocket"
        assert await title_after_load(binary, origin + "/") == "open"
        assert allowed.listeners["reactivesocket"].stats.errors["forbidden"] == 0
