"""Tenant isolation on every protocol (design brief, "Security model").

Two users with disjoint contexts (alice: ``ctx-a``, bob: ``ctx-b``) and
anonymous (``default`` only) against BSON, MicroMsg2, ReactiveSocket, RSocket
and segment: what a principal may use works; another tenant's context is
refused with the protocol's own form of ``forbidden``, and nothing is
delivered, stored or moved.  Group (durable) names are the context's own: the
same name in two contexts is two groups.  With ``allow_anonymous = false`` a
client without credentials is refused on every protocol.

Each protocol's checks are one function in :data:`ISOLATION` and
:data:`ANONYMOUS_OFF` (Res01 logs in with ZeroMQ PLAIN on its login port).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import pytest
import zmq

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig
from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.micromsg2.client import MicroMsg2Client, MicroMsg2Error
from polyport.protocols.micromsg2.frames import Message
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient, RemoteError
from polyport.protocols.res01.client import Res01Client, Res01ServerError, new_event
from polyport.protocols.res01.errors import ErrorCode
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import SegmentError, SegmentReader, SegmentWriter
from tests.conftest import create_database
from tests.gateway.test_res01 import T0, _commit_frames, handshake, nothing_through, watched_dealer

pytestmark = pytest.mark.timeout(90)

A, B = "ctx-a", "ctx-b"
ALICE, BOB, PASSWORD = "alice", "bob", "pw"
GROUP = "shared"  # the same group name in both contexts
QUIET = 0.5  # how long "nothing more arrives" is watched


@dataclass(frozen=True)
class World:
    gw: Gateway

    def address(self, listener: str) -> tuple[str, int]:
        host, port = self.gw.listeners[listener].address
        return host, port

    async def seed(self, context: str, stream: str, n: int = 2) -> None:
        """``n`` events appended by the operator (not through a protocol)."""
        events = tuple(
            EventData("t", f'{{"owner": "{context}"}}'.encode(), content_type="application/json")
            for _ in range(n)
        )
        await self.gw.store.append(Append(context, stream, events))

    async def count(self, context: str, stream: str) -> int:
        return len(await self.gw.store.read_stream(ReadStream(context, stream)))

    async def durable(self) -> set[tuple[str, str]]:
        return {(s["context"], s["name"]) for s in await self.gw.store.list_subscriptions()}

    async def wait_durable(self, *keys: tuple[str, str]) -> None:
        """Until the groups' checkpoint rows exist: events appended after
        that reach them (a new group starts where its row says)."""
        for _ in range(200):
            if set(keys) <= await self.durable():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"durable subscriptions {keys} never appeared")


async def _gateway(admin_url: str, **overrides: object) -> Gateway:
    base = GatewayConfig(
        database_url=await create_database(admin_url),
        http_port=0,
        poll_interval=0.2,
        **{f"{n}_port": 0 for n in DEFAULT_PORTS},  # type: ignore[arg-type]
        res01_login_port=0,  # Res01 logs in with ZeroMQ PLAIN on its own port
    )
    gw = Gateway(replace(base, **overrides))  # type: ignore[arg-type]
    await gw.start()
    return gw


@pytest.fixture(scope="module")
async def world(admin_url: str, template_url: str) -> AsyncIterator[World]:
    gw = await _gateway(admin_url)
    try:
        await gw.store.users.add(ALICE, PASSWORD, default_context=A, contexts=[A])
        await gw.store.users.add(BOB, PASSWORD, default_context=B, contexts=[B])
        await gw.store.binders.create("docs-a", context=A)
        await gw.store.binders.create("docs-b", context=B)
        yield World(gw)
    finally:
        await gw.stop()


@pytest.fixture(scope="module")
async def closed(admin_url: str, template_url: str) -> AsyncIterator[World]:
    gw = await _gateway(admin_url, allow_anonymous=False)
    try:
        yield World(gw)
    finally:
        await gw.stop()


def _stream(proto: str, what: str) -> str:
    return f"{proto}-{what}-{uuid.uuid4().hex[:6]}"


# --- BSON: CONNECT's username/password; the context is the user's default ---------------


async def bson_isolation(w: World) -> None:
    host, port = w.address("bson")
    alice = await BsonClient.connect(host, port, username=ALICE, password=PASSWORD)
    bob = await BsonClient.connect(host, port, username=BOB, password=PASSWORD)
    anon = await BsonClient.connect(host, port)
    try:
        own = _stream("bson", "own")
        await alice.emit(own, "t", {"n": 1})
        assert await w.count(A, own) == 1 and await w.count(B, own) == 0
        assert await alice.query_all("docs-a") is not None
        for client in (alice, anon):
            with pytest.raises(BsonError) as refused:
                await client.query_all("docs-b")
            assert refused.value.err_code == "forbidden"

        # Same durable name, two contexts: each sees its own events only.
        grouped = _stream("bson", "group")
        sub_a = await alice.subscribe(grouped, durable_id=GROUP)
        sub_b = await bob.subscribe(grouped, durable_id=GROUP)
        await w.seed(A, grouped, 2)
        await w.seed(B, grouped, 3)
        got_a = [await sub_a.next(5) for _ in range(2)]
        got_b = [await sub_b.next(5) for _ in range(3)]
        assert {r.event["owner"] for r in got_a if r} == {A}
        assert {r.event["owner"] for r in got_b if r} == {B}
        assert await sub_a.next(QUIET) is None and await sub_b.next(QUIET) is None
        assert {(A, GROUP), (B, GROUP)} <= await w.durable()
    finally:
        for c in (alice, bob, anon):
            await c.close()


async def bson_anonymous_off(w: World) -> None:
    with pytest.raises(BsonError) as refused:
        await BsonClient.connect(*w.address("bson"))
    assert refused.value.err_code == "unauthenticated"


# --- MicroMsg2: x-auth; the context is the user's default --------------------------------


async def _receive_acked(client: MicroMsg2Client, n: int) -> list[Message]:
    # The ack window may be a single message: ack each to get the next.
    got = []
    for _ in range(n):
        got.append(await client.receive(5))
        await client.ack(got[-1])
    return got


async def micromsg2_isolation(w: World) -> None:
    host, port = w.address("micromsg2")
    alice = await MicroMsg2Client.connect(
        host, port, user=ALICE, password=PASSWORD, required=["pubsub", "ack"]
    )
    bob = await MicroMsg2Client.connect(
        host, port, user=BOB, password=PASSWORD, required=["pubsub", "ack"]
    )
    try:
        own = _stream("mm", "own")
        await alice.publish(f"topic/{own}", b"x")
        await alice.flush(5)
        assert await w.count(A, own) == 1 and await w.count(B, own) == 0

        # Queue = consumer group named by the destination: the same queue in
        # two contexts is two groups.
        queue = _stream("mm", "queue")
        await alice.subscribe(f"queue/{queue}")
        await bob.subscribe(f"queue/{queue}")
        name = f"micromsg2:{{}}:queue/{queue}"  # protocols/micromsg2: queue_group_name
        await w.wait_durable((A, name.format(A)), (B, name.format(B)))
        await w.seed(A, queue, 2)
        await w.seed(B, queue, 3)
        got_a = await _receive_acked(alice, 2)
        got_b = await _receive_acked(bob, 3)
        assert {m.payload for m in got_a} == {b'{"owner": "ctx-a"}'}
        assert {m.payload for m in got_b} == {b'{"owner": "ctx-b"}'}
        for client in (alice, bob):
            with pytest.raises(asyncio.TimeoutError):
                await client.receive(QUIET)
    finally:
        await alice.close()
        await bob.close()


async def micromsg2_anonymous_off(w: World) -> None:
    # The handshake completes; the server then answers ERROR and closes.
    client = await MicroMsg2Client.connect(*w.address("micromsg2"), optional=["pubsub"])
    try:
        with pytest.raises(MicroMsg2Error) as refused:
            await client.receive(timeout=5)
        assert refused.value.code == "unauthenticated"
    finally:
        await client.close()


# --- ReactiveSocket: SETUP's user/password/context ---------------------------------------


async def reactivesocket_isolation(w: World) -> None:
    host, port = w.address("reactivesocket")
    alice = await ReactiveSocketClient.connect(host, port, user=ALICE, password=PASSWORD)
    bob = await ReactiveSocketClient.connect(host, port, user=BOB, password=PASSWORD)
    try:
        own = _stream("rs", "own")
        await alice.append(own, [NewEvent("t", b"x")])
        assert [e.context for e in await alice.read(own)] == [A]
        assert isinstance(await alice.query("docs-a"), list)
        with pytest.raises(RemoteError) as refused:
            await alice.query("docs-b")
        assert refused.value.code == "forbidden"

        # A SETUP naming a context the principal may not use is rejected:
        # nothing it sends afterwards is stored.
        for user in (ALICE, None):
            other = await ReactiveSocketClient.connect(
                host, port, user=user, password=PASSWORD if user else None, context=B
            )
            try:
                with pytest.raises(RemoteError) as refused:
                    await other.append(own, [NewEvent("t", b"intruder")])
                assert (refused.value.code, refused.value.stream_id) == ("forbidden", 0)
            finally:
                await other.close()
        assert await w.count(B, own) == 0

        grouped = _stream("rs", "group")
        sub_a = await alice.subscribe(stream=grouped, group=GROUP, start="beginning")
        sub_b = await bob.subscribe(stream=grouped, group=GROUP, start="beginning")
        await w.seed(A, grouped, 2)
        await w.seed(B, grouped, 3)
        got_a = [await sub_a.next(5) for _ in range(2)]
        got_b = [await sub_b.next(5) for _ in range(3)]
        assert {e.context for e in got_a if e} == {A} and {e.context for e in got_b if e} == {B}
        assert await sub_a.next(QUIET) is None and await sub_b.next(QUIET) is None
    finally:
        await alice.close()
        await bob.close()


async def reactivesocket_anonymous_off(w: World) -> None:
    client = await ReactiveSocketClient.connect(*w.address("reactivesocket"))
    try:
        with pytest.raises(RemoteError) as refused:
            await client.read("s")
        assert (refused.value.code, refused.value.stream_id) == ("unauthenticated", 0)
    finally:
        await client.close()


# --- RSocket 1.0: credentials in SETUP metadata, a context per request -------------------


async def rsocket_isolation(w: World) -> None:
    host, port = w.address("rsocket")
    alice = await RSocketClient.connect(host, port, user=ALICE, password=PASSWORD)
    bob = await RSocketClient.connect(host, port, user=BOB, password=PASSWORD)
    anon = await RSocketClient.connect(host, port)
    try:
        own = _stream("rso", "own")
        await alice.append(own, [NewEvent("t", b"x")])
        assert [e.context for e in await alice.read(own)] == [A]
        assert isinstance(await alice.query("docs-a"), list)
        await w.seed(B, own, 1)
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: alice.append(own, [NewEvent("t", b"intruder")], context=B),
            lambda: alice.read(own, context=B),
            lambda: alice.query("docs-b"),
            lambda: anon.append(own, [NewEvent("t", b"intruder")], context=A),
            lambda: anon.read(own, context=B),
            lambda: anon.query("docs-a"),
        ]
        for attempt in attempts:
            with pytest.raises(RemoteError) as refused:
                await attempt()
            assert refused.value.code == "forbidden"
        for client in (alice, anon):
            sub = await client.subscribe(stream=own, context=B, start="beginning")
            with pytest.raises(RemoteError) as refused:
                await sub.next(5)
            assert refused.value.code == "forbidden"
        assert await w.count(A, own) == 1 and await w.count(B, own) == 1

        grouped = _stream("rso", "group")
        sub_a = await alice.subscribe(stream=grouped, group=GROUP, start="beginning")
        sub_b = await bob.subscribe(stream=grouped, group=GROUP, start="beginning")
        await w.seed(A, grouped, 2)
        await w.seed(B, grouped, 3)
        got_a = [await sub_a.next(5) for _ in range(2)]
        got_b = [await sub_b.next(5) for _ in range(3)]
        assert {e.context for e in got_a if e} == {A} and {e.context for e in got_b if e} == {B}
        assert await sub_a.next(QUIET) is None and await sub_b.next(QUIET) is None
    finally:
        for c in (alice, bob, anon):
            await c.close()


async def rsocket_anonymous_off(w: World) -> None:
    client = await RSocketClient.connect(*w.address("rsocket"))
    try:
        with pytest.raises(RemoteError) as refused:
            await client.read("s")
        assert (refused.value.code, refused.value.stream_id) == ("unauthenticated", 0)
    finally:
        await client.close()


# --- Segment wire: optional "<user>:<password>" at the end of SetupAppend/ReadSegment ---


def assert_forbidden(error: SegmentError) -> None:
    # AUTH_FAILED carries no code (the client reports "unauthenticated"); the
    # message tells forbidden from a failed login.
    assert error.code == "unauthenticated" and "may not use context" in error.message, error


async def segment_isolation(w: World) -> None:
    host, port = w.address("segment")
    alice_creds = f"{ALICE}:{PASSWORD}"
    own = _stream("seg", "own")
    writer = await SegmentWriter.connect(host, port, credentials=alice_creds)
    try:
        appender = await writer.open_segment(f"{A}/{own}")
        await appender.append([b"x"])
        await appender.flush()
    finally:
        await writer.close()
    assert await w.count(A, own) == 1

    await w.seed(B, own, 1)
    reader = await SegmentReader.connect(host, port, credentials=alice_creds)
    anon = await SegmentReader.connect(host, port)
    try:
        assert (await reader.read(f"{A}/{own}")).data
        for client, segment in ((reader, f"{B}/{own}"), (anon, f"{A}/{own}")):
            with pytest.raises(SegmentError) as refused:
                await client.read(segment)
            assert_forbidden(refused.value)
    finally:
        await reader.close()
        await anon.close()

    for creds, segment in ((alice_creds, f"{B}/{own}"), ("", f"{A}/{own}")):
        intruder = await SegmentWriter.connect(host, port, credentials=creds)
        try:
            with pytest.raises(SegmentError) as refused:
                await intruder.open_segment(segment)
            assert_forbidden(refused.value)
        finally:
            await intruder.close()
    assert await w.count(A, own) == 1 and await w.count(B, own) == 1


async def segment_anonymous_off(w: World) -> None:
    reader = await SegmentReader.connect(*w.address("segment"))
    try:
        with pytest.raises(SegmentError) as refused:
            await reader.read("default/s")
        assert refused.value.code == "unauthenticated"
    finally:
        await reader.close()


# --- Res01: ZeroMQ PLAIN (ZAP) on the login port; the main port is anonymous ----------


async def res01_isolation(w: World) -> None:
    listener = w.gw.listeners["res01"]
    login = listener.login_address  # type: ignore[attr-defined]
    alice = await Res01Client.connect(login, timeout=10, plain_username=ALICE,
                                      plain_password=PASSWORD)
    bob = await Res01Client.connect(login, timeout=10, plain_username=BOB,
                                    plain_password=PASSWORD)
    anon = await Res01Client.connect(listener.address, timeout=10)
    own = _stream("res01", "own")
    try:
        await alice.commit(A, own, -1, [new_event("t", '{"owner": "a"}')])
        assert await w.count(A, own) == 1
        for client, context in ((alice, B), (anon, A)):
            with pytest.raises(Res01ServerError) as refused:
                await client.commit(context, own, -1, [new_event("t", "{}")])
            assert refused.value.code == ErrorCode.FORBIDDEN
        assert (await w.count(A, own), await w.count(B, own)) == (1, 0)
        # The same subscriber name in both contexts: two subscriptions.
        [a_sub] = await alice.subscribe(GROUP, [(A, own, T0)])
        [b_sub] = await bob.subscribe(GROUP, [(B, own, T0)])
        assert a_sub != b_sub
        await w.seed(B, own, 2)
        [mine] = await alice.fetch([(a_sub, 10)])
        assert [e.context for e in mine.events] == [A]
        # Bob's context or his (guessable) subscription id: forbidden, nothing moved.
        attempts = (lambda: alice.subscribe(GROUP, [(B, own, T0)]),
                    lambda: alice.fetch([(b_sub, 10)]),
                    lambda: alice.progress([(b_sub, T0)]))
        for attempt in attempts:
            with pytest.raises(Res01ServerError) as refused:
                await attempt()
            assert refused.value.code == ErrorCode.FORBIDDEN
        [his] = await bob.fetch([(b_sub, 10)])
        assert [e.context for e in his.events] == [B, B]
    finally:
        for client in (alice, bob, anon):
            await client.close()


async def res01_anonymous_off(w: World) -> None:
    # Anonymous off: the main port speaks PLAIN, a NULL DEALER gets nothing.
    async with watched_dealer(w.address("res01")) as (sock, monitor):
        assert (await handshake(monitor))["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert await nothing_through(sock, _commit_frames("default"))


ISOLATION: dict[str, Callable[[World], Awaitable[None]]] = {
    "bson": bson_isolation,
    "micromsg2": micromsg2_isolation,
    "res01": res01_isolation,
    "reactivesocket": reactivesocket_isolation,
    "rsocket": rsocket_isolation,
    "segment": segment_isolation,
}
ANONYMOUS_OFF: dict[str, Callable[[World], Awaitable[None]]] = {
    "bson": bson_anonymous_off,
    "micromsg2": micromsg2_anonymous_off,
    "res01": res01_anonymous_off,
    "reactivesocket": reactivesocket_anonymous_off,
    "rsocket": rsocket_anonymous_off,
    "segment": segment_anonymous_off,
}


@pytest.mark.parametrize("protocol", sorted(ISOLATION))
async def test_tenants_are_isolated(world: World, protocol: str) -> None:
    await ISOLATION[protocol](world)


@pytest.mark.parametrize("protocol", sorted(ANONYMOUS_OFF))
async def test_anonymous_off_is_refused(closed: World, protocol: str) -> None:
    await ANONYMOUS_OFF[protocol](closed)
    assert await closed.gw.store.read_all() == []
