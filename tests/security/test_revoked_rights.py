"""Open connections follow their user's rights (issue 27, item 9).

An operator removes a user, or narrows its contexts, with the CLI in a
process of its own; connections that user has open on a running gateway
end (in their protocol's error form) or are narrowed at once, not when they
next log in.  Real gateway, real sockets, the real database, the CLI as a
separate process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.micromsg2.client import MicroMsg2Client, MicroMsg2Error
from polyport.protocols.reactive.client import ConnectionClosed, NewEvent, RemoteError
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.res01.client import Res01Client, Res01ServerError, new_event
from polyport.protocols.res01.errors import ErrorCode
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import SegmentError, SegmentReader

pytestmark = pytest.mark.timeout(90)

GatewayFactory = Callable[..., Awaitable[Any]]
# Ends well within this; generous for a loaded 2-core machine.
WITHIN = 10.0


async def polyport(db_url: str, *args: str) -> None:
    """The CLI in a process of its own (as an operator runs it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "polyport.gateway.cli.main", *args, "--database-url", db_url],
            check=False, capture_output=True, text=True, timeout=60, env=env,
        )

    done = await asyncio.get_running_loop().run_in_executor(None, run)
    assert done.returncode == 0, done.stderr


async def _gateway(gateway_factory: GatewayFactory, **overrides: Any) -> Any:
    gw = await gateway_factory(idle_timeout=300, **overrides)
    await gw.store.users.add("alice", "pw", default_context="a", contexts=["a", "b"])
    assert gw._user_changes is not None
    await asyncio.wait_for(gw._user_changes.listening.wait(), WITHIN)
    return gw


async def _eventually(check: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while not check():
        assert loop.time() < deadline, "not within the time allowed"
        await asyncio.sleep(0.05)


def _one(event: str) -> list[NewEvent]:
    return [NewEvent("t", event.encode())]


async def test_a_removed_user_loses_its_open_connections(
    gateway_factory: GatewayFactory, db_url: str
) -> None:
    gw = await _gateway(gateway_factory)
    bson = await BsonClient.connect(*gw.listeners["bson"].address, username="alice",
                                    password="pw", timeout=20)
    rsocket = await RSocketClient.connect(*gw.listeners["rsocket"].address,
                                          user="alice", password="pw")
    reactive = await ReactiveSocketClient.connect(*gw.listeners["reactivesocket"].address,
                                                  user="alice", password="pw")
    host, port = gw.listeners["micromsg2"].address
    micro = await MicroMsg2Client.connect(host, port, user="alice", password="pw")
    anonymous = await BsonClient.connect(*gw.listeners["bson"].address, timeout=20)
    try:
        # Served before.
        await bson.ping()
        await rsocket.append("s", _one("before"))
        await reactive.append("s", _one("before"))
        await _eventually(lambda: len(gw.connections.list(user="alice")) == 4)

        await polyport(db_url, "users", "remove", "alice")

        # Every connection of alice ends, each in its protocol's error form.
        await _eventually(lambda: not gw.connections.list(user="alice"))
        await _eventually(lambda: bson.error is not None)
        assert bson.error is not None and bson.error.err_code == "unauthenticated"
        with pytest.raises(BsonError):
            await bson.ping()
        with pytest.raises((RemoteError, ConnectionClosed)) as refused:
            await asyncio.wait_for(rsocket.append("s", _one("after")), WITHIN)
        if isinstance(refused.value, RemoteError):
            assert refused.value.code == "unauthenticated"
        with pytest.raises((RemoteError, ConnectionClosed)):
            await asyncio.wait_for(reactive.append("s", _one("after")), WITHIN)
        with pytest.raises(MicroMsg2Error) as ended:
            await micro.receive(timeout=WITHIN)
        assert ended.value.code == "unauthenticated"
        # Nothing alice sent after the removal was stored; others go on.
        assert [e.type for e in await gw.store.read_all()] == ["t", "t"]
        await anonymous.ping()
    finally:
        for c in (bson, rsocket, reactive, micro, anonymous):
            await c.close()


async def test_narrowed_contexts_apply_to_the_open_connection(
    gateway_factory: GatewayFactory, db_url: str
) -> None:
    gw = await _gateway(gateway_factory)
    client = await RSocketClient.connect(*gw.listeners["rsocket"].address,
                                         user="alice", password="pw")
    try:
        await client.append("s", _one("1"), context="b")
        await client.append("s", _one("2"), context="a")

        await polyport(db_url, "users", "contexts", "alice", "--context", "a")

        # The same connection stays open, but context b is now forbidden.
        async def refused() -> bool:
            try:
                await client.append("s", _one("3"), context="b")
            except RemoteError as exc:
                assert exc.code == "forbidden"
                return True
            return False

        loop = asyncio.get_running_loop()
        deadline = loop.time() + WITHIN
        while not await refused():
            assert loop.time() < deadline, "context b still served on the open connection"
            await asyncio.sleep(0.1)
        await client.append("s", _one("4"), context="a")
        assert len(gw.connections.list(user="alice")) == 1
    finally:
        await client.close()


async def test_a_subscription_in_a_removed_context_ends_its_connection(
    gateway_factory: GatewayFactory, db_url: str
) -> None:
    gw = await _gateway(gateway_factory)
    client = await ReactiveSocketClient.connect(*gw.listeners["reactivesocket"].address,
                                                user="alice", password="pw", context="b")
    try:
        events = await client.subscribe(stream="s", start="beginning")
        await _eventually(lambda: any(
            c.subscription_count for c in gw.connections.list(user="alice")))

        await polyport(db_url, "users", "contexts", "alice", "--context", "a")

        # A live subscription cannot be narrowed: its connection ends.
        with pytest.raises((RemoteError, ConnectionClosed)) as ended:
            await asyncio.wait_for(anext(aiter(events)), WITHIN)
        if isinstance(ended.value, RemoteError):
            assert ended.value.code == "forbidden"
        await _eventually(lambda: not gw.connections.list(user="alice"))
    finally:
        await client.close()


async def test_res01_peers_of_a_removed_or_narrowed_user_follow_at_once(
    gateway_factory: GatewayFactory, db_url: str
) -> None:
    """Res01 re-read a peer's rights only every 30 s; now the change applies
    at once: narrowed in place, and a removed user's peer is disconnected
    (its DEALER's reconnection then fails ZAP's PLAIN check)."""
    # Without anonymous access the Res01 port takes PLAIN logins.
    gw = await _gateway(gateway_factory, allow_anonymous=False)
    client = await Res01Client.connect(gw.listeners["res01"].address, timeout=20,
                                       plain_username="alice", plain_password="pw")
    try:
        await client.commit("b", "r", -1, [new_event("Made", "{}")])
        await polyport(db_url, "users", "contexts", "alice", "--context", "a")

        async def forbidden() -> bool:
            try:
                await client.commit("b", "r", -1, [new_event("Made", "{}")])
            except Res01ServerError as exc:
                assert exc.code == ErrorCode.FORBIDDEN
                return True
            return False

        loop = asyncio.get_running_loop()
        deadline = loop.time() + WITHIN
        while not await forbidden():
            assert loop.time() < deadline, "context b still served to the Res01 peer"
            await asyncio.sleep(0.1)
        await client.commit("a", "r", -1, [new_event("Made", "{}")])

        await polyport(db_url, "users", "remove", "alice")
        await _eventually(lambda: not gw.connections.list(user="alice"))
        client.timeout = 2
        with pytest.raises(TimeoutError):
            await client.commit("a", "r", -1, [new_event("Made", "{}")])
        assert [e.context for e in await gw.store.read_all()] == ["b", "a"]
    finally:
        await client.close()


async def test_a_segment_reader_of_a_removed_user_is_cut_off(
    gateway_factory: GatewayFactory, db_url: str
) -> None:
    """The segment session keeps a login per credentials string; it must not
    outlive the user."""
    gw = await _gateway(gateway_factory)
    await gw.store.append(Append("a", "s", (EventData("t", b"x"),)))
    reader = await SegmentReader.connect(*gw.listeners["segment"].address,
                                         credentials="alice:pw")
    try:
        assert (await reader.read("a/s")).data
        await polyport(db_url, "users", "remove", "alice")
        await _eventually(lambda: not gw.connections.list(user="alice"))
        with pytest.raises(SegmentError):
            await reader.read("a/s")
    finally:
        await reader.close()


async def test_removal_through_the_admin_api_ends_the_connections_too(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await _gateway(gateway_factory, admin_token="rights-token")
    client = await BsonClient.connect(*gw.listeners["bson"].address, username="alice",
                                      password="pw", timeout=20)
    try:
        await client.ping()
        host, port = gw.http_address
        async with aiohttp.ClientSession(
            headers={"Authorization": "Bearer rights-token"}
        ) as http, http.delete(f"http://{host}:{port}/admin/users/alice") as r:
            assert r.status == 204, await r.text()
        await _eventually(lambda: client.error is not None)
        assert client.error is not None and client.error.err_code == "unauthenticated"
    finally:
        await client.close()
