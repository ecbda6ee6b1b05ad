"""``polyport status``: the database's state plus a running gateway's /status."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from polyport.core.commands import Append, FromBeginning, Selector
from polyport.core.events import EventData
from polyport.gateway.cli.main import main


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
    # Counted from the live log, not from statistics never gathered (issue 29 item 7).
    assert data["database"]["events"] == 3
    assert (data["database"]["streams"], data["database"]["streams_exact"]) == (1, True)
    assert data["gateway"]["ready"] is True and data["gateway"]["problems"] == []
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
    assert "events      3" in text and "streams     1\n" in text
    assert f"gateway     http://{host}:{port}/status" in text

    # No gateway on that port: the database part still answers, and the exit
    # status says the check failed.
    await gw.stop()
    assert await loop.run_in_executor(None, main, args) == 1
    out, err = capsys.readouterr()
    assert "gateway     not reachable" in out and "log head    position 3" in out
    assert err.splitlines()[-1].startswith("polyport: no gateway answers at")


async def test_status_exits_1_while_the_gateway_is_not_ready(
    gateway_factory, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = await gateway_factory()
    gw.store._health.schema("database schema is at revision 0003, this polyport needs more")
    host, port = gw.http_address
    args = ["status", "--database-url", db_url, "--host", host, "--http-port", str(port)]
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, main, args) == 1
    out, err = capsys.readouterr()
    assert "NOT READY" in out and "not ready: database schema is at revision 0003" in out
    assert err.splitlines()[-1].startswith("polyport: the gateway is not ready: database schema")


def test_status_never_starts_an_embedded_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    (data / "pgdata").mkdir(parents=True)
    (data / "pgdata" / "PG_VERSION").write_text("16\n")  # a cluster, not running
    assert main(["status", "--data-dir", str(data), "--http-port", "1"]) == 1
    out, _err = capsys.readouterr()
    assert "is not running (no gateway serves from it)" in out
    assert not (data / "pgdata" / "postmaster.pid").exists()
