"""Issue 29 item 2: a serving gateway keeps its embedded PostgreSQL running.
Killed under it, the cluster is restarted on the same port, the gateway
works again, and the log says so in one line per change (no tracebacks)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from polyport.protocols.bson.client import BsonClient
from tests.gateway.test_workers import Served, serve_embedded
from tests.waiting import until

pytestmark = pytest.mark.timeout(180)


async def kill_and_see_it_back(served: Served) -> None:
    """SIGKILL the postmaster under ``served``; wait for the restart and an append."""
    pg = EmbeddedPostgres(served.data_dir)
    port = pg.running_port()
    pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    await served.said(r"embedded PostgreSQL in .* stopped; restarting it", 30)
    await served.said(r"embedded PostgreSQL in .* is back on port", 90)
    assert pg.running_port() == port  # the same URL: every pool reconnects

    async def appended() -> bool:
        try:
            async with await BsonClient.connect(*served.port("bson")) as c:
                await c.emit("embedded", "AfterRestart", {"ok": True})
        except Exception:  # noqa: BLE001 - not yet: the pools are reconnecting
            return False
        return True

    await until(appended, 60, "an append after the restart")


async def test_a_killed_embedded_database_is_restarted() -> None:
    async with serve_embedded() as served:
        await kill_and_see_it_back(served)
        assert not any("Traceback" in line for line in served.stderr), "".join(served.stderr)
        assert sum("stopped; restarting it" in line for line in served.stderr) == 1
        served.proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(served.proc.wait(), 60)
        assert served.proc.returncode == 0, "".join(served.stderr[-20:])
        # The gateway stopped the cluster it restarted, and did not restart it again.
        assert EmbeddedPostgres(served.data_dir).running_port() is None
