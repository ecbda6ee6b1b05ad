"""Acceptance: several writer processes and two EventStores in this process
append concurrently; a subscriber in yet another process sees every committed
event exactly once, in position order, without gaps, with recorded_at never
decreasing."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
from datetime import datetime
from pathlib import Path

from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.core.store import EventStore, StoreConfig

WRITER_PROCESSES = 4
APPENDS_PER_WRITER = 200


async def _run(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.core.procs", *args,
        stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[2]),
    )


async def test_many_processes_one_gapless_ordered_log(db_url: str, tmp_path: Path) -> None:
    local = [EventStore(StoreConfig(db_url, poll_interval=0.2, run_binders=False))
             for _ in range(2)]
    for s in local:
        await s.start()
    rng = random.Random(7)

    async def local_writer(store: EventStore, tag: int) -> int:
        n = 0
        for i in range(150):
            k = rng.randint(1, 3)
            await store.append(Append("mp", f"shared-{rng.randint(0, 9)}", tuple(
                EventData("t", f"local{tag}:{i}:{j}".encode()) for j in range(k))))
            n += k
        return n

    # Count first, then subscribe: the subscriber must see exactly this many.
    writers = [await _run("write", db_url, str(w), str(APPENDS_PER_WRITER))
               for w in range(WRITER_PROCESSES)]
    local_counts = await asyncio.gather(*(local_writer(s, i) for i, s in enumerate(local)))
    remote_counts = []
    for w in writers:
        out, _ = await w.communicate()
        assert w.returncode == 0
        remote_counts.append(int(out.decode().strip()))
    total = sum(local_counts) + sum(remote_counts)
    for s in local:
        await s.close()

    out_path = tmp_path / "delivered.jsonl"
    sub = await _run("subscribe", db_url, str(total), str(out_path))
    await asyncio.wait_for(sub.communicate(), 120)
    assert sub.returncode == 0
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    positions = [r[0] for r in rows]
    assert positions == list(range(1, total + 1))  # exactly once, in order, no gaps
    times = [datetime.fromisoformat(r[1]) for r in rows]
    assert all(a <= b for a, b in itertools.pairwise(times))
    assert len({r[2] for r in rows}) == total


async def test_live_subscriber_in_another_process_during_writes(db_url: str,
                                                                tmp_path: Path) -> None:
    from tests.core.procs import planned

    appends = 150
    total = sum(n for w in range(WRITER_PROCESSES) for n, _ in planned(w, appends))
    out_path = tmp_path / "live.jsonl"
    sub = await _run("subscribe", db_url, str(total), str(out_path))
    await asyncio.sleep(1.0)  # let it reach the live feed before the writes start
    writers = [await _run("write", db_url, str(w), str(appends))
               for w in range(WRITER_PROCESSES)]
    for w in writers:
        await w.communicate()
        assert w.returncode == 0
    await asyncio.wait_for(sub.communicate(), 120)
    assert sub.returncode == 0
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r[0] for r in rows] == list(range(1, total + 1))
    times = [datetime.fromisoformat(r[1]) for r in rows]
    assert all(a <= b for a, b in itertools.pairwise(times))
