"""Issue 29 item 10: drain on stop (lame duck).  On SIGTERM the gateway is
unready at once and accepts no new connection; appends already in flight are
answered (committed) within the grace period; then it closes.  A real
``serve`` process is checked end to end, SIGTERM included."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.protocols.bson.client import BsonClient
from tests.gateway.test_readyz import wait_status
from tests.listeners import port_flags
from tests.pg import HEAD_LOCK, lock_waiters, row_locked

pytestmark = pytest.mark.timeout(120)


async def test_drain_answers_what_is_in_flight_and_refuses_new_connections(
    gateway_factory: Any, db_url: str
) -> None:
    gw = await gateway_factory()
    host, port = gw.http_address
    readyz = f"http://{host}:{port}/readyz"
    bson = gw.listeners["bson"].address
    client = await BsonClient.connect(*bson)
    async with aiohttp.ClientSession() as http:
        async with row_locked(db_url, HEAD_LOCK):
            pending = asyncio.create_task(client.emit("drained", "InFlight", {"n": 1}))
            await lock_waiters(db_url, 1)
            draining = asyncio.create_task(gw.drain(30.0))
            await wait_status(http, readyz, 503, 2.0)
            async with http.get(readyz) as r:
                assert any("shutting down" in p for p in (await r.json())["problems"])
            with pytest.raises(OSError):
                await asyncio.wait_for(asyncio.open_connection(*bson), 2)
            await asyncio.sleep(0.3)
            assert not draining.done()  # waits for the append it holds
        await asyncio.wait_for(pending, 10)  # acknowledged: committed
        await asyncio.wait_for(draining, 10)  # and the drain ended with it, not at 30 s
    stored = await gw.store.read_stream(ReadStream("default", "drained"))
    assert [e.type for e in stored] == ["InFlight"]
    await client.close()


async def test_sigterm_drains_a_real_serve(db_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    env["POLYPORT_DATABASE_URL"] = db_url
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve", *port_flags("0"),
        "--data-dir", str(tmp_path / "data"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**env, "POLYPORT_SHUTDOWN_GRACE": "20"})
    assert proc.stdout is not None
    bson: tuple[str, int] | None = None
    try:
        while not (line := (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
                   ).startswith("polyport: ready"):
            assert line, "serve exited before it was ready"
            if line.startswith("polyport: bson listening on "):
                h, p = line.rsplit(" ", 1)[1].rsplit(":", 1)
                bson = (h, int(p))
        assert bson is not None
        client = await BsonClient.connect(*bson)
        async with row_locked(db_url, HEAD_LOCK):
            pending = asyncio.create_task(client.emit("drained", "BeforeStop", {}))
            await lock_waiters(db_url, 1)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            assert proc.returncode is None and not pending.done()
        await asyncio.wait_for(pending, 10)
        await client.close()
        await asyncio.wait_for(proc.wait(), 30)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    said = (await proc.stderr.read()).decode()
    assert "in-flight requests get up to 20 s (shutdown_grace)" in said
    assert "drain ended with" not in said


async def test_a_second_signal_cuts_the_grace_short(gateway_factory: Any, db_url: str) -> None:
    gw = await gateway_factory()
    hurry = asyncio.Event()
    async with row_locked(db_url, HEAD_LOCK):
        pending = asyncio.create_task(
            gw.store.append(Append("default", "s", (EventData("t", b"{}"),))))
        await lock_waiters(db_url, 1)
        draining = asyncio.create_task(gw.drain(60.0, hurry))
        await asyncio.sleep(0.2)
        hurry.set()
        await asyncio.wait_for(draining, 2)
    await pending  # the writer still commits what it accepted (stop drains it)
