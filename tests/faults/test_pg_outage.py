"""PostgreSQL restarted or stopped under load: appends resume, live
subscribers get every event with no gap without reconnecting, readiness
follows the database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from polyport.core.store import EventStore, StoreConfig
from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from tests.faults.support import (
    SUMMARY,
    Appender,
    LiveReader,
    Row,
    all_positions,
    audit_appends,
    delivery_gaps,
    stop_appenders,
    stored_sequences,
)

APPENDERS = 8
READERS = 3
# docs/operations.md promises appends again "within about 1 s" of PostgreSQL
# being back (the reconnect backoff is capped at 1 s); 3x that on a loaded
# 2-core CI machine, and no more.
APPEND_RECOVERY_BOUND = 3.0


async def _wait_for(check: Callable[[], bool], timeout: float, step: float = 0.02) -> float:
    """Seconds until ``check()`` held; fails the test after ``timeout``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"not within {timeout}s"
        await asyncio.sleep(step)
    return time.monotonic() - started


async def _under_load(
    db_url: str, fault_name: str, fault: Callable[[EventStore], Awaitable[float]]
) -> None:
    store = EventStore(StoreConfig(db_url, poll_interval=0.2))
    await store.start()
    readers = [LiveReader(store) for _ in range(READERS)]
    appenders = [Appender(store, f"load-{i}") for i in range(APPENDERS)]
    tasks = [asyncio.create_task(r.run()) for r in readers]
    await asyncio.sleep(0.2)  # readers are live before the load starts
    appending = [asyncio.create_task(a.run()) for a in appenders]
    tasks += appending
    try:
        await asyncio.sleep(1.0)
        before = sum(len(a.acked) for a in appenders)
        recovery = await fault(store)
        # Every appender gets a new acknowledgement, after its last failure,
        # within the documented bound of the database being back (an append
        # that hangs instead of failing counts as not recovered), then some
        # more load.
        resumed = time.monotonic()
        counts = [len(a.acked) for a in appenders]
        await _wait_for(lambda: all(len(a.acked) > n and a.recovered_at >= a.last_failure
                                    for a, n in zip(appenders, counts, strict=True)),
                        APPEND_RECOVERY_BOUND)
        recovery = max(recovery, time.monotonic() - resumed)
        await asyncio.sleep(1.0)
        await stop_appenders(appenders, appending)
        positions = await all_positions(db_url)
        await _wait_for(lambda: all(r.positions[-1:] == positions[-1:] for r in readers), 15)
        stored = await stored_sequences(db_url)
        acked, n, lost, dup = audit_appends(appenders, stored)
        gaps = sum(delivery_gaps(r.positions, positions) for r in readers)
        SUMMARY.append(Row(fault_name, "core", acked, n, lost, dup, gaps, recovery))
        assert sum(len(a.acked) for a in appenders) > before
        assert (lost, dup, gaps) == (0, 0, 0)
        assert acked == n
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()


async def test_restart_keeps_live_delivery(fault_pg: EmbeddedPostgres, fault_db: str) -> None:
    async def restart(store: EventStore) -> float:
        await asyncio.to_thread(fault_pg.restart)
        return await _wait_for(lambda: not store.health().problems, 5)

    await _under_load(fault_db, "pg_ctl restart -m fast", restart)


async def test_readiness_follows_a_stopped_database(
    fault_pg: EmbeddedPostgres, fault_db: str
) -> None:
    async def stop_then_start(store: EventStore) -> float:
        await asyncio.to_thread(fault_pg.stop)
        # 503 within 2 s of the database stopping...
        await _wait_for(lambda: bool(store.health().problems), 2)
        await asyncio.sleep(1.0)
        assert store.health().problems
        await asyncio.to_thread(fault_pg.start)
        # ...and 200 within 2 s of it being back, without restarting anything.
        return await _wait_for(lambda: not store.health().problems, 2)

    await _under_load(fault_db, "pg stopped 1 s, started", stop_then_start)
