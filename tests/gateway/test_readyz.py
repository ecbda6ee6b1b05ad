"""/readyz follows the database (issue 8, acceptance 5): 503 within 2 s of
PostgreSQL stopping, 200 within 2 s of its return, and the gateway works
again afterwards (the store's pool reconnects).  It answers from state the
store keeps current, so probing it costs the database nothing."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from polyport.core import migrate
from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.core.health import Health
from polyport.core.migrate import asyncpg_dsn, schema_behind
from polyport.gateway.process.embedded_pg import EmbeddedPostgres


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


async def gauges(http: aiohttp.ClientSession, host: str, port: int) -> dict[str, float]:
    """polyport_ready and polyport_database_up from /metrics."""
    async with http.get(f"http://{host}:{port}/metrics") as r:
        text = await r.text()
    wanted = ("polyport_ready", "polyport_database_up")
    return {s.name: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name in wanted}


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
            # The same verdict for Prometheus (docs/monitoring/alerts.yml).
            assert await gauges(http, host, http_port) == {
                "polyport_ready": 0.0, "polyport_database_up": 0.0}

            await loop.run_in_executor(None, pg.start)
            took = await wait_status(http, url, 200, 2.0)
            assert took < 2.0
            # Not only the probe: appends and reads work again.
            for _ in range(20):
                try:
                    await gw.store.append(Append("default", "r", (EventData("t", b"after"),)))
                    break
                except Exception:  # noqa: BLE001 - the outage may still show as any error: retry
                    await asyncio.sleep(0.1)
            got = await gw.store.read_stream(ReadStream("default", "r"))
            assert [e.body for e in got] == [b"before", b"after"]
            async with http.get(f"http://{host}:{http_port}/status") as r:
                assert r.status == 200 and (await r.json())["database"]["reachable"]
            assert await gauges(http, host, http_port) == {
                "polyport_ready": 1.0, "polyport_database_up": 1.0}
    finally:
        await gw.stop()


async def _sessions(conn: asyncpg.Connection) -> int:
    """Sessions ever established to this database (PostgreSQL 14+)."""
    return int(await conn.fetchval(
        "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"))


async def test_readyz_answers_from_kept_state(gateway_factory: Any, db_url: str) -> None:
    """1,000 probes open no database connection and run no query: /readyz
    answers from what the writer, the tailer and the schema timer keep."""
    gw = await gateway_factory()
    host, port = gw.http_address
    url = f"http://{host}:{port}/readyz"
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        async with aiohttp.ClientSession() as http:
            await wait_status(http, url, 200, 5.0)
            before = await _sessions(conn)
            started = time.monotonic()
            for _ in range(1000):
                async with http.get(url) as r:
                    assert r.status == 200
            took = time.monotonic() - started
            after = await _sessions(conn)
    finally:
        await conn.close()
    # Only the counting connection itself (the old probe opened one per call).
    assert after - before <= 1, (before, after)
    assert took < 20.0, took


def test_readyz_reports_a_stale_round_trip_and_a_behind_schema() -> None:
    clock = [100.0]
    health = Health(stale_after=5.0, clock=lambda: clock[0])
    assert health.snapshot().problems == [
        "database unreachable: no successful round trip yet", "schema not checked yet"]
    health.ok()
    health.schema(None)
    assert health.snapshot().problems == []
    clock[0] += 6.0
    assert health.snapshot().problems == [
        "database unreachable: no successful round trip for 6.0s"]
    health.ok()
    health.failed("tailer", OSError("connection refused"))
    assert health.snapshot().problems == [
        "database unreachable: tailer: OSError: connection refused"]
    clock[0] += 0.1
    health.ok()
    health.schema(schema_behind("0003", "0004"))
    [problem] = health.snapshot().problems
    assert "revision 0003" in problem and "polyport migrate" in problem


async def test_a_schema_behind_shows_in_readyz(gateway_factory: Any, db_url: str) -> None:
    gw = await gateway_factory()
    host, port = gw.http_address
    url = f"http://{host}:{port}/readyz"
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        await conn.execute("UPDATE alembic_version SET version_num = '0003'")
        # The slow timer's next look; here called at once instead of in 30 s.
        gw.store._schema_task.cancel()
        gw.store._schema_task = asyncio.create_task(gw.store._watch_schema())
        async with aiohttp.ClientSession() as http:
            await wait_status(http, url, 503, 5.0)
            async with http.get(url) as r:
                problems = (await r.json())["problems"]
        assert any("revision 0003" in p for p in problems), problems
    finally:
        await conn.execute("UPDATE alembic_version SET version_num = $1",
                           migrate.head_revision())
        await conn.close()
