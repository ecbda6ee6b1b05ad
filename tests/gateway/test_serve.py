from __future__ import annotations

import logging

import aiohttp
import pytest

from polyport.core import migrate
from polyport.gateway.app import is_loopback
from polyport.gateway.config import DEFAULT_PORTS


async def test_health_and_ready(gateway_factory) -> None:
    gw = await gateway_factory()
    host, port = gw.http_address
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{host}:{port}/healthz") as r:
            assert r.status == 200
        async with http.get(f"http://{host}:{port}/readyz") as r:
            assert r.status == 200
            assert (await r.json())["status"] == "ready"


async def test_serve_refuses_stale_schema(empty_db_url: str) -> None:
    import pytest

    from polyport.gateway.app import Gateway
    from polyport.gateway.config import GatewayConfig

    gw = Gateway(GatewayConfig(database_url=empty_db_url, http_port=0))
    with pytest.raises(migrate.SchemaBehind, match="polyport migrate"):
        await gw.start()


ALL_OFF = {**{f"{n}_port": None for n in DEFAULT_PORTS}, "http_port": None}


def _anonymous_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "allow_anonymous" in r.getMessage()]


async def test_anonymous_access_on_a_public_address_is_warned_about(
    gateway_factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polyport")
    await gateway_factory(**ALL_OFF)  # 127.0.0.1: no warning
    assert _anonymous_warnings(caplog) == []
    await gateway_factory(**ALL_OFF, host="0.0.0.0", allow_anonymous=False)
    assert _anonymous_warnings(caplog) == []
    await gateway_factory(**ALL_OFF, host="0.0.0.0")
    [line] = _anonymous_warnings(caplog)
    assert "0.0.0.0" in line and "anonymous access on" in line


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "gateway.example"))
