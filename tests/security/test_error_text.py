"""Clients get the canonical message and an error id, never an exception's
own text (issue 27, item 14): Res01 ER replies for unexpected failures and
the public /status's database error.  The details, with the same id, are in
the gateway's log."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from polyport.core.access import Tenant
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient, RemoteError
from polyport.protocols.res01.client import Res01Client, Res01ServerError, new_event

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]
SECRET = "host=db.internal password=hunter2 /var/lib/secret"


async def test_res01_er_replies_name_an_error_id_not_the_exception(
    gateway_factory: GatewayFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = await gateway_factory()

    def broken(self: Tenant, command: Any) -> Any:
        raise RuntimeError(SECRET)

    # Res01 queues an AC with start_append: from a task for a peer's first
    # request (its tenant looked up), from the receive loop after that.
    monkeypatch.setattr(Tenant, "start_append", broken)
    client = await Res01Client.connect(gw.listeners["res01"].address, timeout=10)
    try:
        for _ in range(2):
            caplog.clear()
            with caplog.at_level(logging.ERROR), pytest.raises(Res01ServerError) as err:
                await client.commit("default", "s", -1, [new_event("t", "{}")])
            assert SECRET not in err.value.message and "hunter2" not in err.value.message
            found = re.search(r"error id ([0-9a-f]{8})", err.value.message)
            assert found, err.value.message
            # The log line with the details carries the same id.
            assert any(found.group(1) in r.getMessage() and r.exc_info for r in caplog.records)
    finally:
        await client.close()


@pytest.mark.parametrize("transport", ["tcp", "websocket"])
async def test_reactivesocket_append_failures_are_internal_not_the_exception(
    gateway_factory: GatewayFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, transport: str,
) -> None:
    # An append is queued from the read's turn and answered from its
    # commit's callback: a failure there is still an ERROR on its stream.
    gw = await gateway_factory()

    def broken(self: Tenant, command: Any) -> Any:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(Tenant, "start_append", broken)
    if transport == "tcp":
        client = await ReactiveSocketClient.connect(*gw.listeners["reactivesocket"].address)
    else:
        host, port = gw.http_address
        client = await ReactiveSocketClient.connect_websocket(
            f"ws://{host}:{port}/reactivesocket")
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(RemoteError) as err:
            await client.append("s", [NewEvent("t", b"1")])
        assert err.value.code == "internal" and SECRET not in str(err.value)
        assert any(r.exc_info and SECRET in str(r.exc_info[1]) for r in caplog.records)
        assert (await client.read("s")) == []  # the connection serves on
    finally:
        await client.close()


async def test_public_status_names_an_error_id_not_the_exception(
    gateway_factory: GatewayFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = await gateway_factory()

    async def unreachable() -> None:
        raise OSError(SECRET)

    monkeypatch.setattr(gw.store.monitor, "ping", unreachable)
    url = f"http://{gw.http_address[0]}:{gw.http_address[1]}/status"
    with caplog.at_level(logging.WARNING):
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            assert r.status == 200
            database = (await r.json())["database"]
    assert database["reachable"] is False
    assert "hunter2" not in database["error"] and "db.internal" not in database["error"]
    found = re.search(r"error id ([0-9a-f]{8})", database["error"])
    assert found, database
    assert any(found.group(1) in r.getMessage() and "hunter2" in r.getMessage()
               for r in caplog.records)
