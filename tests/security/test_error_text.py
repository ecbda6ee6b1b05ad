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
from polyport.protocols.res01.client import Res01Client, Res01ServerError, new_event

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]
SECRET = "host=db.internal password=hunter2 /var/lib/secret"


async def test_res01_er_replies_name_an_error_id_not_the_exception(
    gateway_factory: GatewayFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = await gateway_factory()

    async def broken(self: Tenant, command: Any) -> Any:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(Tenant, "append", broken)
    client = await Res01Client.connect(gw.listeners["res01"].address, timeout=10)
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(Res01ServerError) as err:
            await client.commit("default", "s", -1, [new_event("t", "{}")])
    finally:
        await client.close()
    assert SECRET not in err.value.message and "hunter2" not in err.value.message
    found = re.search(r"error id ([0-9a-f]{8})", err.value.message)
    assert found, err.value.message
    # The log line with the details carries the same id.
    assert any(found.group(1) in r.getMessage() and r.exc_info for r in caplog.records)


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
