"""``polyport status``: the database's state plus a running gateway's /status."""

from __future__ import annotations

import asyncio
import json

import pytest

from polyport.core.commands import Append, FromBeginning, Selector
from polyport.core.events import EventData
from polyport.gateway.cli import main


async def test_status_command_reads_database_and_running_gateway(
    gateway_factory, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = await gateway_factory()
    await gw.store.append(Append("default", "s", tuple(EventData("t", b"x") for _ in range(3))))
    await gw.store.binders.create("docs", context="default")
    await gw.store.register_fetch_subscription("reader", Selector(context="default"),
                                               FromBeginning())
    loop = asyncio.get_running_loop()
    host, port = gw.http_address
    args = ["status", "--database-url", db_url, "--host", host, "--http-port", str(port)]
    assert await loop.run_in_executor(None, main, [*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["database"]["head_position"] == 3 and data["database"]["schema_current"]
    assert [s["name"] for s in data["subscriptions"]] == ["reader"]
    assert data["subscriptions"][0]["lag_events"] == 3
    assert [b["name"] for b in data["binders"]] == ["docs"]
    assert data["gateway"]["reachable"] is True, data["gateway"]
    listeners = {li["name"] for li in data["gateway"]["status"]["listeners"]
                 if li["kind"] == "protocol"}
    assert listeners == set(gw.listeners)

    assert await loop.run_in_executor(None, main, args) == 0
    text = capsys.readouterr().out
    assert "log head    position 3" in text and "reader" in text and "docs" in text
    assert f"gateway     http://{host}:{port}/status" in text

    # No gateway on that port: the database part still answers.
    await gw.stop()
    assert await loop.run_in_executor(None, main, args) == 0
    assert "gateway     not reachable" in capsys.readouterr().out
