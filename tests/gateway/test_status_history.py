"""Issue 29 item 6: the status page's ten minutes of history survive a
restart (the charts' points are kept in the data directory)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.gateway.http import chart_history
from polyport.protocols.bson.client import BsonClient


async def test_the_charts_come_back_after_a_restart(gateway_factory: Any,
                                                    tmp_path: Path) -> None:
    data = tmp_path / "kept"
    data.mkdir()
    gw = await gateway_factory(data_dir=str(data))
    assert gw.telemetry is not None
    client = await BsonClient.connect(*gw.listeners["bson"].address)
    await gw.store.append(Append("default", "s", tuple(EventData("t", b"{}")
                                                        for _ in range(25))))
    await asyncio.sleep(1.2)  # a sample after the append, the client connected
    gw.telemetry.sample()
    await client.close()
    await gw.stop()
    kept = json.loads((data / chart_history.FILE_NAME).read_text())
    assert kept and kept[-1]["head"] >= 25
    assert max(p["connections"].get("bson", 0) for p in kept) == 1

    again = await gateway_factory(data_dir=str(data))
    assert again.telemetry is not None
    assert sum(p["events"] for p in again.telemetry.live_chart()) >= 25
    seen = [b["open"] for b in again.telemetry.connections_chart() if b["open"]]
    assert any(b.get("bson") == 1 for b in seen), seen
    # Rates start afresh: the restored points feed only the charts.
    assert again.telemetry.rates()["append"] == 0


def test_a_damaged_history_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / chart_history.FILE_NAME
    path.write_text("{not json")
    assert chart_history.load(path) == []
    path.write_text(json.dumps([{"wall": "x"}, {"wall": 1.0, "head": 3, "connections": {}}]))
    assert chart_history.load(path) == []  # too old, and one malformed
