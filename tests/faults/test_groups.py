"""Consumer groups across database trouble: the group task restarts and keeps
its members; a process whose lock connection is killed stops delivering and
the group goes on elsewhere; no event is skipped (at least once)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import asyncpg

from bench.faults import Gateway as FaultGateway
from polyport.core.commands import FromBeginning, Selector, Subscribe
from polyport.core.groups import GroupMember
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore, StoreConfig
from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from tests.faults.support import SUMMARY, Appender, Row, all_positions


async def _consume(member: GroupMember, got: list[int]) -> None:
    while True:
        ev = await member.next()
        if ev is None:
            return
        got.append(ev.position)
        member.ack(ev.position)


async def _wait_all(db_url: str, received: list[list[int]], timeout: float) -> tuple[int, int]:
    """(missing, duplicated) once every stored position was received."""
    positions = await all_positions(db_url)
    started = time.monotonic()
    while True:
        seen = Counter(p for r in received for p in r)
        missing = sum(1 for p in positions if seen[p] == 0)
        if not missing or time.monotonic() - started > timeout:
            return missing, sum(c - 1 for c in seen.values() if c > 1)
        await asyncio.sleep(0.05)


async def _stop_and_record(
    fault: str, protocol: str, db_url: str, appender: Appender, received: list[list[int]],
    since: float,
) -> tuple[int, int]:
    """Stop the load, wait until every stored event was received, add the
    summary row; returns (missing, duplicated) over every member."""
    appender.stop()
    await asyncio.sleep(0.2)
    missing, dup = await _wait_all(db_url, received, 15)
    SUMMARY.append(Row(fault, protocol, len(appender.acked), len(await all_positions(db_url)),
                       missing, dup, missing, time.monotonic() - since))
    return missing, dup


async def test_group_over_two_processes_when_owner_loses_its_lock(fault_db: str) -> None:
    stores = [EventStore(StoreConfig(fault_db, poll_interval=0.2)) for _ in range(2)]
    for s in stores:
        await s.start()
    admin = await asyncpg.connect(asyncpg_dsn(fault_db))
    cmd = Subscribe(Selector("default"), FromBeginning(), durable="g-two")
    members = [await s.subscribe(cmd) for s in stores for _ in range(2)]
    received: list[list[int]] = [[] for _ in members]
    tasks = [asyncio.create_task(_consume(m, r))  # type: ignore[arg-type]
             for m, r in zip(members, received, strict=True)]
    appender = Appender(stores[0], "grp")
    tasks.append(asyncio.create_task(appender.run()))
    try:
        await asyncio.sleep(1.0)
        owner = next(i for i, s in enumerate(stores) if s._group_locks._conn is not None
                     and s._groups[("default", "g-two")]._owner)
        conn = stores[owner]._group_locks._conn
        assert conn is not None
        killed_at = time.monotonic()
        await admin.fetchval("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        await asyncio.sleep(0.3)
        # The old owner stopped handing out; one process owns the group.
        owners = [s._groups[("default", "g-two")]._owner for s in stores]
        assert owners.count(True) <= 1
        await asyncio.sleep(1.5)
        missing, dup = await _stop_and_record("group lock lost (2 procs)", "core", fault_db,
                                              appender, received, killed_at)
        assert missing == 0
        assert dup <= 2000  # at least once: re-delivery only of what was unacknowledged
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await admin.close()
        for s in stores:
            await s.close()


async def test_group_survives_restart(fault_pg: EmbeddedPostgres, fault_db: str) -> None:
    store = EventStore(StoreConfig(fault_db, poll_interval=0.2))
    await store.start()
    cmd = Subscribe(Selector("default"), FromBeginning(), durable="g-restart")
    members = [await store.subscribe(cmd) for _ in range(3)]
    received: list[list[int]] = [[] for _ in members]
    tasks = [asyncio.create_task(_consume(m, r))  # type: ignore[arg-type]
             for m, r in zip(members, received, strict=True)]
    appender = Appender(store, "grp-restart")
    tasks.append(asyncio.create_task(appender.run()))
    try:
        await asyncio.sleep(0.8)
        started = time.monotonic()
        await asyncio.to_thread(fault_pg.restart)
        await asyncio.sleep(1.5)
        missing, _ = await _stop_and_record("group across pg restart", "core", fault_db,
                                            appender, received, started)
        assert missing == 0
        assert store._groups[("default", "g-restart")].members == members  # kept its members
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()


async def _rs_member(address: tuple[str, int], group: str, got: list[int]) -> None:
    """A ReactiveSocket group member; delivery to the transport is its ack."""
    client = await ReactiveSocketClient.connect(*address)
    try:
        async for ev in await client.subscribe(group=group, start="beginning"):
            got.append(ev.position)
    finally:
        await client.close()


async def test_group_over_two_gateway_processes_one_killed(
    fault_db: str, tmp_path: Path
) -> None:
    """Two ``polyport serve`` processes on one database, the group's members
    on both; SIGKILL one: the other delivers everything from the group's
    checkpoint on, so no event is skipped (repeats are counted, not failed:
    at least once)."""
    gateways = [FaultGateway(tmp_path / f"gw{i}", fault_db, ("reactivesocket",))
                for i in range(2)]
    await asyncio.gather(*(g.start() for g in gateways))
    store = EventStore(StoreConfig(fault_db, poll_interval=0.2))
    await store.start()
    received: list[list[int]] = [[] for _ in range(4)]
    try:
        addresses = [g.ports() for g in gateways]
        assert None not in addresses
        tasks = [asyncio.create_task(_rs_member(addresses[i // 2]["reactivesocket"],  # type: ignore[index]
                                                "g-procs", received[i]))
                 for i in range(4)]
        appender = Appender(store, "grp-procs")
        tasks.append(asyncio.create_task(appender.run()))
        await asyncio.sleep(1.5)
        # Kill the process that owns the group (its members got the events):
        # killing the idle one would test no takeover.
        owner = 0 if received[0] or received[1] else 1
        survivor = received[2 * (1 - owner)] + received[2 * (1 - owner) + 1]
        before = len(survivor)
        killed_at = time.monotonic()
        await gateways[owner].kill()
        await asyncio.sleep(1.5)
        missing, _ = await _stop_and_record("group, 2 procs, 1 SIGKILLed", "reactivesocket",
                                            fault_db, appender, received, killed_at)
        assert missing == 0
        # The survivor took over: its members got the newest events.
        survivor = received[2 * (1 - owner)] + received[2 * (1 - owner) + 1]
        assert len(survivor) > before
        assert max(survivor) == max(await all_positions(fault_db))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()
        for g in gateways:
            await g.stop()
