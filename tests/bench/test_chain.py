"""``python -m bench chain`` for a moment: the chain process of a real
gateway fed on its socket by two feeder processes.  Checks the shape and
that every append was answered, not the figures (speed is never asserted
in a test)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import msgpack
import pytest

from polyport.core.chain_wire import RESULT
from tests.bench.command import bench


def test_chain_bench_feeds_the_chain_and_prints_its_cost_per_event() -> None:
    done = bench("chain", "--feeders", "1,2", "--seconds", "0.5", "--outstanding", "8")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    # Feeders wait for their answers before leaving: the chain never
    # writes into a closed connection.
    assert "connection failed" not in done.stderr, done.stderr
    rows = {int(m.group(1)): m.group(2).split()
            for m in re.finditer(r"^ +(\d) +([\d,]+ .*)$", done.stdout, re.M)}
    assert set(rows) == {1, 2}, done.stdout
    for row in rows.values():
        # events/s, chain cores, us/event, chain max, workers, PG, feeders, failed
        assert len(row) == 8, row
        rate, chain, us, ceiling = (float(v.replace(",", "")) for v in row[:4])
        assert rate > 0 and chain > 0 and us > 0 and ceiling > 0, row
        assert float(row[5]) > 0 and float(row[6]) > 0, row  # PG and feeders read
        assert row[7] == "0", row  # no append failed


def test_chain_bench_refuses_bad_options_in_one_line() -> None:
    done = bench("chain", "--feeders", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == "python -m bench chain: --feeders: positive integers, " \
                                  "comma-separated"


async def test_a_feeder_holds_a_window_with_no_answer_open_until_one_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain that answers nothing for longer than the whole window (a
    stalled flush) is measured until its first answer, not read as 0
    events/s (which failed CI once in `bench commits`)."""
    import bench.chain as chain_bench

    # The first answers come after the warm-up and the window both.
    monkeypatch.setattr(chain_bench, "WARMUP_SECONDS", 0.1)
    stall = 0.8

    async def chain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        unpacker = msgpack.Unpacker(raw=False)
        began: float | None = None
        while data := await reader.read(1 << 20):
            unpacker.feed(data)
            uids = [unit[1] for batch in unpacker for unit in batch]
            began = began or time.monotonic()
            await asyncio.sleep(max(0.0, began + stall - time.monotonic()))
            writer.write(msgpack.packb([[RESULT, uid, []] for uid in uids]))
        writer.close()

    path = tmp_path / "chain.sock"
    server = await asyncio.start_unix_server(chain, path=str(path))
    go = asyncio.StreamReader()
    go.feed_data(b"go\n")
    async with server:
        feeder = chain_bench._Feeder({"socket": str(path), "outstanding": 4, "events": 1,
                                      "seconds": 0.2, "index": 0})
        done = await feeder.run(go)
    assert done["rate"] > 0, done
    assert done["window"] >= stall - 0.1, done
