"""Entry points for the multi-process tests (run in child processes)."""

from __future__ import annotations

import asyncio
import json
import random
import sys

from polyport.core.commands import BEGINNING, Append, Selector, Subscribe
from polyport.core.events import EventData
from polyport.core.store import EventStore, StoreConfig


def planned(writer: int, appends: int) -> list[tuple[int, int]]:
    """(events, stream number) of each append a writer makes: known in advance
    so a subscriber started first knows how many events to expect."""
    rng = random.Random(writer)
    return [(rng.randint(1, 3), rng.randint(0, 9)) for _ in range(appends)]


async def _write(url: str, writer: int, appends: int) -> int:
    store = EventStore(StoreConfig(url, poll_interval=0.2, run_binders=False))
    await store.start()
    plan = planned(writer, appends)
    written = 0
    try:
        async def one(i: int) -> int:
            n, stream = plan[i]
            events = tuple(EventData("t", f"{writer}:{i}:{k}".encode()) for k in range(n))
            await store.append(Append("mp", f"shared-{stream}", events))
            return n

        for start in range(0, appends, 20):
            chunk = range(start, min(start + 20, appends))
            written += sum(await asyncio.gather(*(one(i) for i in chunk)))
    finally:
        await store.close()
    return written


def write_main(url: str, writer: int, appends: int) -> None:
    print(asyncio.run(_write(url, writer, appends)), flush=True)


async def _subscribe(url: str, expected: int, out_path: str) -> None:
    store = EventStore(StoreConfig(url, poll_interval=0.2, run_binders=False))
    await store.start()
    try:
        sub = await store.subscribe(Subscribe(Selector(context=None), start=BEGINNING,
                                              buffer_size=50))
        with open(out_path, "w") as out:
            for _ in range(expected):
                ev = await sub.next(30)
                if ev is None:
                    break
                out.write(json.dumps([ev.position, ev.recorded_at.isoformat(),
                                      str(ev.event_id)]) + "\n")
                out.flush()
            # Anything beyond the expected count would be a duplicate.
            extra = await sub.next(1.0)
            if extra is not None:
                out.write(json.dumps([extra.position, extra.recorded_at.isoformat(),
                                      str(extra.event_id)]) + "\n")
        sub.close()
    finally:
        await store.close()


def subscribe_main(url: str, expected: int, out_path: str) -> None:
    asyncio.run(_subscribe(url, expected, out_path))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        subscribe_main(sys.argv[2], int(sys.argv[3]), sys.argv[4])
