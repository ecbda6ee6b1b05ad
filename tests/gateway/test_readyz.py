"""/readyz follows the database (issue 8, acceptance 5): 503 within 2 s of
PostgreSQL stopping, 200 within 2 s of its return, and the gateway works
again afterwards (the store's pool reconnects)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from polyport.core import migrate
from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.gateway.embedded_pg import EmbeddedPostgres


@pytest.fixture
def own_cluster() -> Iterator[EmbeddedPostgres]:
    """A cluster of its own, for this test to stop and start."""
    # Under /tmp with 0755: the cluster may run as another user than the tests.
    root = Path(tempfile.mkdtemp(prefix="polyport-readyz-pg-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "data", fast=True)
    url = pg.start()
    pg.port = pg.running_port() or 0  # restart on the same port
    migrate.upgrade(url)
    yield pg
    pg.owned = True
    pg.stop()
    shutil.rmtree(root, ignore_errors=True)


async def wait_status(
    http: aiohttp.ClientSession, url: str, want: int, within: float
) -> float:
    """Poll until /readyz answers ``want``; returns the seconds it took."""
    started = time.monotonic()
    last = None
    while time.monotonic() - started < within:
        try:
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=within)) as r:
                last = r.status
                if r.status == want:
                    return time.monotonic() - started
        except aiohttp.ClientError as exc:
            last = repr(exc)
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz did not answer {want} within {within}s (last: {last})")


async def test_readyz_follows_the_database(own_cluster: EmbeddedPostgres) -> None:
    from polyport.gateway.app import Gateway
    from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig

    pg = own_cluster
    port = pg.running_port()
    assert port is not None
    cfg = GatewayConfig(
        database_url=pg.url(port), http_port=0, poll_interval=0.2,
        **{f"{n}_port": None for n in DEFAULT_PORTS},
    )
    gw = Gateway(cfg)
    await gw.start()
    loop = asyncio.get_running_loop()
    try:
        host, http_port = gw.http_address
        url = f"http://{host}:{http_port}/readyz"
        async with aiohttp.ClientSession() as http:
            await wait_status(http, url, 200, 2.0)
            await gw.store.append(Append("default", "r", (EventData("t", b"before"),)))

            await loop.run_in_executor(None, pg.stop)
            took = await wait_status(http, url, 503, 2.0)
            async with http.get(url) as r:
                body = await r.json()
            assert "database unreachable" in " ".join(body["problems"])

            await loop.run_in_executor(None, pg.start)
            took = await wait_status(http, url, 200, 2.0)
            assert took < 2.0
            # Not only the probe: appends and reads work again.
            for _ in range(20):
                try:
                    await gw.store.append(Append("default", "r", (EventData("t", b"after"),)))
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            got = await gw.store.read_stream(ReadStream("default", "r"))
            assert [e.body for e in got] == [b"before", b"after"]
            async with http.get(f"http://{host}:{http_port}/status") as r:
                assert r.status == 200 and (await r.json())["database"]["reachable"]
    finally:
        await gw.stop()
