"""The connections API speaks for every worker, and closing a Res01 peer
disconnects it (issue 27, item 11); a user's removal reaches every worker
too (item 9).  Real ``polyport serve --workers 2`` processes and the CLI as
an operator runs it, or a real in-process gateway for the Res01 socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.res01.client import Res01Client, new_event
from tests.gateway.test_cli_errors import polyport
from tests.gateway.test_workers import Served, bson_totals, serve
from tests.waiting import until

pytestmark = pytest.mark.timeout(180)

TOKEN = "token-for-the-connections-test"
GatewayFactory = Callable[..., Awaitable[Any]]


def _config(tmp_path: Path) -> str:
    path = tmp_path / "polyport.toml"
    path.write_text(f'admin_token = "{TOKEN}"\n')
    path.chmod(0o600)
    return str(path)


async def _cli(gw: Served, *args: str) -> Any:
    """``polyport connections …`` against the running gateway (found through
    its data directory), in a process of its own."""
    done = await asyncio.get_running_loop().run_in_executor(None, lambda: polyport(
        "connections", *args, "--data-dir", str(gw.data_dir),
        env={"POLYPORT_ADMIN_TOKEN": TOKEN}))
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _bson_on_both_workers(gw: Served, **login: Any) -> list[BsonClient]:
    """BSON connections until each worker holds one (the kernel picks)."""
    host, port = gw.port("bson")
    clients = []
    for _ in range(40):
        clients.append(await BsonClient.connect(host, port, timeout=20, **login))
        if all(n > 0 for n in bson_totals(await gw.status(), "connections_open")):
            return clients
    raise AssertionError("40 connections all went to one worker")


async def _alive(client: BsonClient) -> bool:
    try:
        await asyncio.wait_for(client.ping(), 10)
    except (BsonError, TimeoutError):
        return False
    return True


async def test_list_and_close_reach_every_worker(db_url: str, tmp_path: Path) -> None:
    async with serve(db_url, "--config", _config(tmp_path)) as gw:
        clients = await _bson_on_both_workers(gw)
        res01 = await Res01Client.connect(gw.port("res01"), timeout=20)
        try:
            await res01.commit("default", "r", -1, [new_event("Made", "{}")])
            listed = json.loads(await _cli(gw, "list", "--json"))
            bson = [c for c in listed if c["protocol"] == "bson"]
            # Every worker's connections, each id naming its worker.
            assert len(bson) == len(clients)
            assert {c["id"] % 2 for c in bson} == {0, 1}
            assert len({c["id"] for c in listed}) == len(listed)
            assert [c["protocol"] for c in listed].count("res01") == 1

            # Close one connection held by each worker.
            victims = [next(c for c in bson if c["id"] % 2 == w) for w in (0, 1)]
            for victim in victims:
                assert f"connection {victim['id']} closed" in await _cli(
                    gw, "close", str(victim["id"]))
            alive = [await _alive(c) for c in clients]
            assert alive.count(False) == 2, alive
            left = json.loads(await _cli(gw, "list", "--json", "--protocol", "bson"))
            assert {c["id"] for c in left} == {c["id"] for c in bson} - {
                v["id"] for v in victims}
        finally:
            await res01.close()
            for c in clients:
                await c.close()


async def test_a_removed_user_loses_its_connections_on_every_worker(
    db_url: str, tmp_path: Path
) -> None:
    async with serve(db_url, "--config", _config(tmp_path)) as gw:
        done = await asyncio.get_running_loop().run_in_executor(None, lambda: polyport(
            "users", "add", "bob", "--password-stdin", "--context", "default",
            "--database-url", db_url, stdin="pw\n"))
        assert done.returncode == 0, done.stderr
        clients = await _bson_on_both_workers(gw, username="bob", password="pw")
        try:
            done = await asyncio.get_running_loop().run_in_executor(None, lambda: polyport(
                "users", "remove", "bob", "--database-url", db_url))
            assert done.returncode == 0, done.stderr

            async def all_ended() -> bool:
                return all(c.error is not None for c in clients)

            await until(all_ended, 15, "bob's connections to end on both workers")
            assert {c.error.err_code for c in clients if c.error} == {"unauthenticated"}
            assert json.loads(await _cli(gw, "list", "--json", "--user", "bob")) == []
        finally:
            for c in clients:
                await c.close()


async def test_closing_a_res01_peer_disconnects_it(gateway_factory: GatewayFactory) -> None:
    """A ROUTER cannot drop one peer by its routing id; the gateway shuts
    the peer's TCP connection down under libzmq instead.  The DEALER sees
    the disconnect and connects again (a new TCP connection, counted)."""
    gw = await gateway_factory(admin_token=TOKEN)
    listener = gw.listeners["res01"]
    client = await Res01Client.connect(listener.address, timeout=20)
    try:
        await client.commit("default", "r", -1, [new_event("Made", "{}")])
        assert listener.stats.connections_total == 1
        [peer] = gw.connections.list(protocol="res01")
        host, port = gw.http_address
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http, http.delete(f"http://{host}:{port}/admin/connections/{peer.id}") as r:
            assert r.status == 204

        async def reconnected() -> bool:
            return listener.stats.connections_total == 2

        await until(reconnected, 15, "the peer to be disconnected and come back")
        # The client goes on over its new connection, as a new peer.
        await client.commit("default", "r", -1, [new_event("Made", "{}")])
        [again] = gw.connections.list(protocol="res01")
        assert again.id != peer.id
    finally:
        await client.close()
