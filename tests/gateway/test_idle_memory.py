"""What an idle connection costs the gateway, measured while the connections
are open: ``polyport serve`` as its own process, 400 logged-in clients per
protocol that then send nothing, the process's RSS (settled) before and with
them.  Each protocol is held to the figure docs/operations.md ("Memory
model") gives operators to size for."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from bench.peers import Env, Roots, rss_per_connection

CONNECTIONS = 400
# KiB per idle connection (docs/operations.md, "Memory model"): the
# byte-stream protocols, and a Res01 peer (libzmq's own buffers included).
BUDGET_KIB = {"bson": 16, "reactivesocket": 16, "rsocket": 16, "micromsg2": 16,
              "segment": 16, "res01": 48}

pytestmark = [pytest.mark.timeout(240), pytest.mark.exclusive]


@pytest.mark.parametrize("protocol", sorted(BUDGET_KIB))
async def test_an_idle_connection_stays_within_its_documented_memory(
    db_url: str, protocol: str
) -> None:
    root = Path(tempfile.mkdtemp(prefix="pp-rss-", dir="/tmp"))
    ctx = zmq.asyncio.Context()
    ctx.set(zmq.MAX_SOCKETS, CONNECTIONS + 200)
    try:
        env = Env("", None, None, ctx, Roots())
        r = await rss_per_connection(env, root, db_url, protocol, CONNECTIONS, None)
    finally:
        ctx.destroy(linger=0)
        shutil.rmtree(root, ignore_errors=True)
    print(f"{protocol}: RSS {r.before_kib} -> {r.after_kib} KiB with {CONNECTIONS} idle "
          f"connections open: {r.per_connection:.1f} KiB each (budget "
          f"{BUDGET_KIB[protocol]} KiB)")
    assert r.after_kib > r.before_kib, r  # the connections were measured at all
    assert r.per_connection <= BUDGET_KIB[protocol], r
