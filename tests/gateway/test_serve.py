from __future__ import annotations

import aiohttp

from polyport.core import migrate


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
