"""PostgreSQL restarted (``pg_ctl restart -m fast``) under load through the
wire protocols: appenders on all six protocols' clients (resending with the
ids each protocol carries) and a live reader on every protocol that reads
(BSON SUBSCRIBE, ReactiveSocket REQUEST_SUB, RSocket events.subscribe,
MicroMsg2 topic, a Res01 FE/PS loop, segment tail reads) against an
in-process gateway on the fault cluster.  Every acknowledged event is stored
once; every reader gets every event of its selection in order with no gap, on
the connection it opened before the fault (the polling readers retry a
request the outage failed, as such clients do)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg

from bench.faults import PROTOCOLS, Appender, audit
from polyport.core.migrate import asyncpg_dsn
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig
from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.res01.client import Res01Client
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import SegmentReader, iter_events
from tests.faults.support import SUMMARY, PgProxy, Row, delivery_gaps

PER_PROTOCOL = 2
T0 = datetime(2000, 1, 1, tzinfo=UTC)


async def _rows(db_url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        return list(await conn.fetch(
            "SELECT event_id, stream, version, position, body FROM events ORDER BY position"))
    finally:
        await conn.close()


async def _wait(check: Callable[[], bool], timeout: float) -> None:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"not within {timeout}s"
        await asyncio.sleep(0.05)


async def _wire_fault(  # noqa: C901 - one scenario; its six readers are closures over its lists
    db_url: str, fault_name: str, fault: Callable[[], Awaitable[None]],
    gateway_db_url: str | None = None,
) -> None:
    """Load and readers on every protocol; ``fault()`` while they run.
    ``gateway_db_url``: where the gateway reaches the database (a proxy),
    when not ``db_url`` (where the audit reads)."""
    base = GatewayConfig(database_url=gateway_db_url or db_url, http_port=None,
                         poll_interval=0.2,
                         **{f"{n}_port": 0 for n in DEFAULT_PORTS})  # type: ignore[arg-type]
    gw = Gateway(base)
    await gw.start()
    ports = {n: li.address for n, li in gw.listeners.items()}
    appenders = [Appender(p, f"w-{p}-{i}", lambda: ports)
                 for p in PROTOCOLS for i in range(PER_PROTOCOL)]
    bson_stream = appenders[PROTOCOLS.index("bson") * PER_PROTOCOL].stream
    mm2_stream = appenders[PROTOCOLS.index("micromsg2") * PER_PROTOCOL].stream
    rs_stream = appenders[PROTOCOLS.index("reactivesocket") * PER_PROTOCOL].stream
    res01_stream = appenders[PROTOCOLS.index("res01") * PER_PROTOCOL].stream
    seg_stream = appenders[PROTOCOLS.index("segment") * PER_PROTOCOL].stream

    # Live subscribers, in place before the load starts.
    rs = await ReactiveSocketClient.connect(*ports["reactivesocket"])
    rs_sub = await rs.subscribe(start="beginning")
    bson = await BsonClient.connect(*ports["bson"])
    bson_sub = await bson.subscribe(bson_stream, start_seq=0)
    mm2 = await MicroMsg2Client.connect(*ports["micromsg2"], required=["pubsub"])
    await mm2.subscribe(f"topic/{mm2_stream}")
    sessions = gw.listeners["micromsg2"].sessions  # type: ignore[attr-defined]
    await _wait(lambda: sum(s.subscription_count for s in sessions) == 1, 5)
    rsocket = await RSocketClient.connect(*ports["rsocket"])
    rsocket_sub = await rsocket.subscribe(stream=rs_stream, start="beginning")
    res01 = await Res01Client.connect(ports["res01"], timeout=5)
    # The filter is a stream-name prefix: only the first res01 appender's.
    [res01_sub] = await res01.subscribe("faults", [("default", res01_stream, T0)])
    seg_reader = await SegmentReader.connect(*ports["segment"])
    rs_got: list[int] = []
    rsocket_got: list[int] = []
    res01_got: list[int] = []
    seg_bytes = bytearray()
    misplaced: list[tuple[int, int]] = []
    bson_got: list[int] = []
    mm2_got: list[bytes] = []

    async def read_rs() -> None:
        async for ev in rs_sub:
            rs_got.append(ev.position)

    async def read_bson() -> None:
        async for rec in bson_sub:
            bson_got.append(rec.seq_no)

    async def read_mm2() -> None:
        while True:
            mm2_got.append((await mm2.receive()).payload)

    async def read_rsocket() -> None:
        async for ev in rsocket_sub:
            rsocket_got.append(ev.version)

    async def read_res01() -> None:
        while True:
            try:
                [batch] = await res01.fetch([(res01_sub, 100)])
                if batch.events:
                    # Counted on receipt, at least once: a PS whose reply the
                    # outage lost may still have moved the checkpoint (its
                    # outcome is unknown), so the batch may never come again;
                    # one that did not move it gets the same batch refetched.
                    last = res01_got[-1] if res01_got else 0
                    res01_got.extend(e.sequence for e in batch.events if e.sequence > last)
                    await res01.progress([(res01_sub, batch.events[-1].timestamp)])
                else:
                    await asyncio.sleep(0.05)
            except Exception:  # noqa: BLE001 - the outage failed this request: retry
                await asyncio.sleep(0.1)

    async def read_segment() -> None:
        while True:
            try:
                asked = len(seg_bytes)
                reply = await seg_reader.read(f"default/{seg_stream}", asked)
                if reply.offset != asked:  # would splice the byte stream
                    misplaced.append((asked, reply.offset))
                seg_bytes.extend(reply.data)
                if not reply.data:
                    await asyncio.sleep(0.02)
            except Exception:  # noqa: BLE001 - not yet appended, or the outage: retry
                await asyncio.sleep(0.1)

    readers = (read_rs, read_bson, read_mm2, read_rsocket, read_res01, read_segment)
    tasks = [asyncio.create_task(c()) for c in readers]
    tasks += [asyncio.create_task(a.run()) for a in appenders]
    try:
        await _wait(lambda: all(a.acked for a in appenders), 10)
        await asyncio.sleep(1.0)
        restarted_at = time.monotonic()
        await fault()
        await _wait(lambda: all(a.acked_at[-1] > restarted_at for a in appenders), 20)
        await asyncio.sleep(1.0)
        for a in appenders:
            a.stopping = True
        await asyncio.wait_for(asyncio.gather(*tasks[len(readers):]), 15)
        rows = await _rows(db_url)
        positions = [r["position"] for r in rows]
        # BSON's seqNo counts from 0 (the stream's version - 1).
        bson_versions = [r["version"] - 1 for r in rows if r["stream"] == bson_stream]
        mm2_bodies = [bytes(r["body"]) for r in rows if r["stream"] == mm2_stream]
        rs_versions = [r["version"] for r in rows if r["stream"] == rs_stream]
        res01_versions = [r["version"] for r in rows if r["stream"] == res01_stream]
        seg_bodies = [bytes(r["body"]) for r in rows if r["stream"] == seg_stream]
        seg_len = sum(8 + len(b) for b in seg_bodies)
        # Bounded: a reader that never catches up is scored by the gap audit below.
        with contextlib.suppress(AssertionError):
            await _wait(lambda: rs_got[-1:] == positions[-1:]
                        and len(bson_got) >= len(bson_versions)
                        and len(mm2_got) >= len(mm2_bodies)
                        and len(rsocket_got) >= len(rs_versions)
                        and len(res01_got) >= len(res01_versions)
                        and len(seg_bytes) >= seg_len, 15)
        streams: dict[str, list[tuple[uuid.UUID, bytes]]] = {}
        for r in rows:
            streams.setdefault(r["stream"], []).append((r["event_id"], bytes(r["body"])))
        results = audit(appenders, restarted_at, streams)
        gaps = {
            "reactivesocket": delivery_gaps(rs_got, positions),
            "rsocket": delivery_gaps(rsocket_got, rs_versions),
            "res01": delivery_gaps(res01_got, res01_versions),
            "segment": delivery_gaps([int(b) for b in iter_events(bytes(seg_bytes))],
                                     [int(b) for b in seg_bodies]),
            "bson": delivery_gaps(bson_got, bson_versions),
            # Bodies are the appender's zero-padded sequence numbers.
            "micromsg2": delivery_gaps([int(b) for b in mm2_got], [int(b) for b in mm2_bodies]),
        }
        for r in results:
            SUMMARY.append(Row(fault_name, r.protocol, r.acknowledged, r.stored,
                               r.lost, r.duplicated, gaps[r.protocol], r.recovery))
        assert all((r.lost, r.duplicated) == (0, 0) for r in results), results
        # Each appender waits for every acknowledgement before it stops, so
        # nothing may be stored that was not acknowledged.
        assert all(r.stored == r.acknowledged and r.unacknowledged == 0 for r in results), results
        assert all(r.acknowledged > 0 and r.recovery < 20 for r in results), results
        assert gaps == dict.fromkeys(gaps, 0), gaps
        assert not misplaced, misplaced
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for a in appenders:
            if a.client is not None:
                await a.client.close()
        for c in (rs, bson, mm2, rsocket, res01, seg_reader):
            await c.close()
        await gw.stop()


async def test_pg_restart_through_the_wire(fault_pg: EmbeddedPostgres, fault_db: str) -> None:
    async def restart() -> None:
        await asyncio.to_thread(fault_pg.restart)

    await _wire_fault(fault_db, "pg restart (wire)", restart)


async def test_stalled_then_dropped_pg_connections(fault_db: str) -> None:
    """A network fault between gateway and PostgreSQL: every byte stops
    (nothing fails, statements just hang), then every connection is cut.
    Appends resume on new connections, readers catch up with no gap."""
    async with PgProxy(fault_db) as proxy:
        async def stall_then_drop() -> None:
            proxy.stall()
            await asyncio.sleep(1.5)
            proxy.drop()

        await _wire_fault(fault_db, "pg stall, then drop (wire)", stall_then_drop,
                          gateway_db_url=proxy.url)
        assert proxy.dropped > 0  # the gateway's connections did go through it
