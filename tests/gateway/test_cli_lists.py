"""Issue 29 item 7: every list command prints a table by default and JSON
with --json; ``subscriptions show`` and ``--context`` filters."""

from __future__ import annotations

import asyncio
import json

import pytest

from polyport.core.commands import FromBeginning, Selector
from polyport.core.store import EventStore
from polyport.gateway.cli.main import main


async def test_lists_are_tables_and_json_on_request(
    store: EventStore, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await store.users.add("carol", "pw-carol-1234", default_context="a", contexts=["a"])
    await store.register_fetch_subscription("orders", Selector(context="a"), FromBeginning())
    await store.register_fetch_subscription("orders", Selector(context="b"), FromBeginning())
    await store.binders.create("docs", context="a")
    loop = asyncio.get_running_loop()

    async def run(*argv: str) -> str:
        assert await loop.run_in_executor(None, main, [*argv, "--database-url", db_url]) == 0
        return capsys.readouterr().out

    users = (await run("users", "list")).splitlines()
    assert users[0].split() == ["NAME", "DEFAULT", "CONTEXT", "CONTEXTS", "CREATED"]
    assert users[1].split()[:3] == ["carol", "a", "a"]
    assert json.loads(await run("users", "list", "--json"))[0]["name"] == "carol"

    subs = (await run("subscriptions", "list")).splitlines()
    assert [line.split()[:2] for line in subs[1:]] == [["orders", "a"], ["orders", "b"]]
    only_b = (await run("subscriptions", "list", "--context", "b", "--json"))
    assert [s["context"] for s in json.loads(only_b)] == ["b"]

    shown = await run("subscriptions", "show", "orders", "--context", "b")
    assert "context         b" in shown and "checkpoint      0" in shown
    assert json.loads(await run("subscriptions", "show", "orders", "--context", "b",
                                "--json"))["context"] == "b"
    missing = await loop.run_in_executor(
        None, main, ["subscriptions", "show", "orders", "--context", "c", "--database-url",
                     db_url])
    assert missing == 1
    assert "no subscription named 'orders' in context 'c'" in capsys.readouterr().err

    binders = (await run("binders", "list", "--context", "a")).splitlines()
    assert binders[0].split()[:2] == ["NAME", "CONTEXT"] and binders[1].split()[:2] == [
        "docs", "a"]
    assert await run("binders", "list", "--context", "b") == "no binders\n"
    assert await run("keys", "list") == "no CURVE keys\n"
    assert await run("subscriptions", "parked", "orders", "--context", "a") == (
        "no parked events for orders\n")
