"""``polyport connections`` (through a running gateway's admin API) and the
persistent-subscription actions of ``polyport subscriptions``."""

from __future__ import annotations

import asyncio
import json

import pytest

from polyport.core.commands import Append, Selector, Subscribe
from polyport.core.events import EventData
from polyport.gateway.cli.main import main
from polyport.protocols.bson.client import BsonClient

TOKEN = "cli-token"


async def test_connections_list_and_close(
    gateway_factory, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    loop = asyncio.get_running_loop()
    host, port = gw.http_address
    where = ["--host", host, "--http-port", str(port)]
    monkeypatch.delenv("POLYPORT_ADMIN_TOKEN", raising=False)
    assert await loop.run_in_executor(None, main, ["connections", "list", *where]) == 1
    assert "POLYPORT_ADMIN_TOKEN" in capsys.readouterr().err

    monkeypatch.setenv("POLYPORT_ADMIN_TOKEN", TOKEN)
    client = await BsonClient.connect(*gw.listeners["bson"].address)
    assert await loop.run_in_executor(
        None, main, ["connections", "list", *where, "--protocol", "bson", "--json"]) == 0
    [conn] = json.loads(capsys.readouterr().out)
    assert conn["protocol"] == "bson"
    assert await loop.run_in_executor(None, main, ["connections", "list", *where]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["ID", "PROTOCOL", "PEER"]
    assert conn["peer"] in table

    assert await loop.run_in_executor(
        None, main, ["connections", "close", str(conn["id"]), *where]) == 0
    assert f"connection {conn['id']} closed" in capsys.readouterr().out
    assert await loop.run_in_executor(
        None, main, ["connections", "close", str(conn["id"]), *where]) == 1
    assert "HTTP 404" in capsys.readouterr().err
    await client.close()


async def test_subscriptions_create_update_parked_replay(
    gateway_factory, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = await gateway_factory()
    store = gw.store
    loop = asyncio.get_running_loop()

    async def run(*argv: str) -> int:
        return await loop.run_in_executor(None, main, [*argv, "--database-url", db_url])

    assert await run("subscriptions", "create", "jobs", "--context", "default",
                     "--stream", "todo", "--start", "beginning", "--max-retries", "0",
                     "--message-timeout", "30") == 0
    created = json.loads(capsys.readouterr().out)
    assert created["settings"] == {"start": "beginning", "max_in_flight": None,
                                   "max_retries": 0, "message_timeout": 30.0}
    assert await run("subscriptions", "create", "jobs", "--context", "default") == 1
    capsys.readouterr()
    assert await run("subscriptions", "update", "jobs", "--message-timeout", "none",
                     "--max-in-flight", "5") == 0
    updated = json.loads(capsys.readouterr().out)
    assert updated["settings"]["message_timeout"] is None
    assert updated["settings"]["max_in_flight"] == 5 and updated["parked"] == 0

    # A consumer fails the one event once: with max_retries 0 it is parked.
    await store.append(Append("default", "todo", (EventData("Job", b"{}"),)))
    member = await store.subscribe(Subscribe(Selector(context="default", stream="todo"),
                                             durable="jobs"))
    ev = await member.next(5)
    assert ev is not None
    member.nack(ev.position)
    for _ in range(100):
        if await store.parked_events("default", "jobs"):
            break
        await asyncio.sleep(0.05)
    assert await run("subscriptions", "parked", "jobs", "--json") == 0
    [parked] = json.loads(capsys.readouterr().out)
    assert parked["position"] == ev.position and parked["reason"] == "nack"
    assert await run("subscriptions", "list", "--json") == 0
    assert json.loads(capsys.readouterr().out)[0]["parked"] == 1

    assert await run("subscriptions", "replay-parked", "jobs") == 0
    assert "1 parked events of jobs marked for replay" in capsys.readouterr().out
    # The running gateway (another store here) notices within its refresh interval.
    again = await member.next(10)
    assert again is not None and again.position == ev.position
    member.ack(again.position)
    member.close()
