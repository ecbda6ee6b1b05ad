"""MicroMsg2 end to end: real sockets against a real gateway (issue 6)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.gateway.app import Gateway
from polyport.gateway.listeners.micromsg2 import MicroMsg2Listener
from polyport.protocols.micromsg2 import Command, Handshake, Message, encode_frame, encode_handshake
from polyport.protocols.micromsg2.client import ConnectionClosed, MicroMsg2Client, MicroMsg2Error
from tests.waiting import eventually

OTHERS_OFF = {
    "res01_port": None,
    "bson_port": None,
    "reactivesocket_port": None,
    "segment_port": None,
    "http_port": None,
}

GatewayFactory = Callable[..., Awaitable[Gateway]]


async def start_gateway(factory: GatewayFactory, **overrides: Any) -> Gateway:
    return await factory(**{**OTHERS_OFF, **overrides})


def listener(gw: Gateway) -> MicroMsg2Listener:
    return cast(MicroMsg2Listener, gw.listeners["micromsg2"])


async def connect(gw: Gateway, **kwargs: Any) -> MicroMsg2Client:
    host, port = gw.listeners["micromsg2"].address
    return await MicroMsg2Client.connect(host, port, **kwargs)


async def wait_subscriptions(gw: Gateway, count: int) -> None:
    """subscribe has no reply: wait until the server holds ``count`` subscriptions."""
    await eventually(lambda: sum(s.subscription_count for s in listener(gw).sessions) == count)


async def receive_n(client: MicroMsg2Client, n: int, *, ack: bool = False) -> list[Message]:
    out = []
    for _ in range(n):
        msg = await client.receive(timeout=5)
        out.append(msg)
        if ack:
            await client.ack(msg)
    return out


async def assert_silent(client: MicroMsg2Client, seconds: float = 0.3) -> None:
    with pytest.raises(TimeoutError):
        await client.receive(timeout=seconds)


class RawConnection:
    """A bare socket for byte-level tests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, gw: Gateway) -> RawConnection:
        host, port = gw.listeners["micromsg2"].address
        return cls(*await asyncio.open_connection(host, port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_until_eof(self, timeout: float = 5.0) -> bytes:
        return await asyncio.wait_for(self.reader.read(), timeout)

    def close(self) -> None:
        self.writer.close()


def error_text(data: bytes) -> str:
    """The message of the single ERROR frame ``data`` holds (short or large)."""
    assert data[0] & 0x04, f"not an ERROR frame: {data[:20]!r}"
    if data[0] & 0x08:
        length = int.from_bytes(data[1:5], "big")
        body = data[5 : 5 + length]
    else:
        length = data[1]
        body = data[2 : 2 + length]
    assert len(body) == length and len(data) == len(body) + (5 if data[0] & 0x08 else 2)
    return body.decode()


# --- negotiation -------------------------------------------------------------------------


async def test_handshake_success_negotiates_in_final_order(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory)
    client = await connect(
        gw, required=["pubsub"], optional=["json", "batch-ack:max-count=5", "xml"]
    )
    try:
        reply = client.server_reply
        assert reply is not None and reply.identity == "polyport"
        # The server suggests what it supports beyond what the client required.
        assert [s.name for s in reply.optional] == ["json", "ack", "batch-ack", "x-auth"]
        n = client.negotiated
        assert n.version == (1, 0)
        assert [(e.index, e.name) for e in n.extensions] == [
            (1, "pubsub"),
            (2, "json"),
            (3, "batch-ack"),
        ]
        assert n.ack_window == 5 and n.ack_index == 3
        # The connection works: a publish is acked after its commit.
        await client.publish("topic/hs", b'{"ok": true}', {"type": "Checked"})
        await client.flush(timeout=5)
        [ev] = await gw.store.read_stream(ReadStream("default", "hs"))
        assert ev.type == "Checked" and ev.content_type == "application/json"
        server_side = next(iter(listener(gw).sessions)).negotiated
        assert server_side is not None and server_side.extensions == n.extensions
    finally:
        await client.close()


async def test_server_lacks_a_required_extension(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory)
    with pytest.raises(MicroMsg2Error) as info:
        await connect(gw, required=["json", "dotnet"])
    assert info.value.code == "unsupported"
    assert "dotnet" in info.value.text
    # ...and the server disconnected after its ERROR frame.
    await eventually(lambda: listener(gw).stats.connections_open == 0)
    assert listener(gw).stats.errors["unsupported"] == 1


async def test_client_lacks_an_extension_the_server_requires(
    gateway_factory: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polyport.micromsg2")
    gw = await start_gateway(gateway_factory, extra={"micromsg2_required_extensions": "json"})
    raw = await RawConnection.open(gw)
    await raw.send(encode_handshake(Handshake("old-client", (), ())))
    reply_bytes = await asyncio.wait_for(raw.reader.read(4096), 5)
    assert b"json" in reply_bytes  # required by the server, in the reply's required list
    raw.close()

    # A client that cannot do json sends ERROR and disconnects; the server closes too.
    with pytest.raises(MicroMsg2Error) as info:
        await connect(gw, optional=["pubsub"])
    assert info.value.code == "unsupported" and "json" in info.value.text
    await eventually(lambda: listener(gw).stats.connections_open == 0)
    assert (
        "sent ERROR 'unsupported: client does not support extension(s) required by "
        "the server: json'; closing" in caplog.text
    )
    assert not listener(gw).stats.errors  # the server itself reported nothing

    # A client that can do json accepts it: it is negotiated first.
    client = await connect(gw, optional=["pubsub"], supported=["json"])
    try:
        assert [e.name for e in client.negotiated.extensions] == ["json", "pubsub"]
    finally:
        await client.close()


async def test_version_mismatch(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory)
    # Lower major the server does not speak: ERROR, then disconnect.
    raw = await RawConnection.open(gw)
    await raw.send(encode_handshake(Handshake("ancient", (), (), major=0, minor=9)))
    text = error_text(await raw.read_until_eof())
    assert text.startswith("unsupported: protocol version 0.9 is not supported")
    raw.close()

    # Higher versions negotiate down to the lowest (1.0), as the spec says.
    for version in ((1, 7), (2, 0)):
        client = await connect(gw, version=version, optional=["pubsub"])
        try:
            assert client.negotiated.version == (1, 0)
        finally:
            await client.close()


async def test_x_auth(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory, allow_anonymous=False)
    await gw.store.users.add("alice", "s3cret pw", default_context="tenant-a")

    client = await connect(gw, user="alice", password="s3cret pw", optional=["batch-ack"])
    try:
        await client.publish("queue/inbox", b"hi", {"n": 1})
        await client.flush(timeout=5)
    finally:
        await client.close()
    [ev] = await gw.store.read_stream(ReadStream("tenant-a", "inbox"))
    assert ev.body == b"hi" and ev.headers == {"n": "1"} and ev.origin == "micromsg2"

    for kwargs in ({"user": "alice", "password": "wrong"}, {}):
        client = await connect(gw, optional=["pubsub"], **kwargs)  # type: ignore[arg-type]
        with pytest.raises(MicroMsg2Error) as info:
            await client.receive(timeout=5)
        assert info.value.code == "unauthenticated"
        await client.wait_closed(timeout=5)
        await client.close()


# --- acks and the window -----------------------------------------------------------------


async def test_batch_ack_window_across_the_sequence_wrap(gateway_factory: GatewayFactory) -> None:
    first = 65530
    gw = await start_gateway(gateway_factory, extra={"micromsg2_initial_seq": first})
    sub = await connect(gw, required=["pubsub", "batch-ack:max-count=10"], first_inbound_seq=first)
    try:
        await sub.subscribe("topic/wrap")
        await wait_subscriptions(gw, 1)
        total = 45
        await gw.store.append(
            Append(
                "default",
                "wrap",
                tuple(EventData("n", str(i).encode(), headers={"i": str(i)}) for i in range(total)),
            )
        )
        got: list[Message] = []
        # No acks: exactly the window arrives, then nothing.
        got += await receive_n(sub, 10)
        await assert_silent(sub)
        # A partial ack frees exactly that many slots, across the wrap.
        await sub.ack(got[3])
        got += await receive_n(sub, 4)
        await assert_silent(sub)
        # Ack as we go for the rest; an early ack "resets the counter".
        while len(got) < total:
            await sub.ack(got[-1])
            batch = await receive_n(sub, min(10, total - len(got)))
            got += batch
        assert [m.payload for m in got] == [str(i).encode() for i in range(total)]
        expected_seqs = [((first - 1 + i) % 65535) + 1 for i in range(total)]
        assert [m.seq for m in got] == expected_seqs
        assert expected_seqs[5:7] == [65535, 1]
        # The client's codec enforces the window on what it receives: the server
        # never had more than 10 unacknowledged MESSAGEs out.
        assert sub._conn.inbound.outstanding <= 10
    finally:
        await sub.close()


async def test_single_ack_extension_one_in_flight(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory)
    sub = await connect(gw, required=["pubsub", "ack"])
    pub = await connect(gw, required=["ack"])
    try:
        await sub.subscribe("topic/one")
        await wait_subscriptions(gw, 1)
        for i in range(5):
            await pub.publish("topic/one", str(i).encode())
        await pub.flush(timeout=5)
        got = []
        for _ in range(5):
            msg = await sub.receive(timeout=5)
            got.append(msg.payload)
            await assert_silent(sub, 0.1)
            await sub.ack(msg)
        assert got == [b"0", b"1", b"2", b"3", b"4"]
    finally:
        await sub.close()
        await pub.close()


async def test_publish_with_acks_is_acked_after_commit(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory)
    pub = await connect(gw, required=["batch-ack:max-count=8"])
    try:
        seqs = [await pub.publish("topic/acked", f"m{i}".encode()) for i in range(50)]
        assert seqs == list(range(1, 51))
        await pub.flush(timeout=10)
        # Every ack came after the commit: all 50 are readable now.
        events = await gw.store.read_stream(ReadStream("default", "acked"))
        assert [e.body for e in events] == [f"m{i}".encode() for i in range(50)]
    finally:
        await pub.close()


async def test_a_message_the_store_refuses_ends_the_connection_after_the_acks_before_it(
    gateway_factory: GatewayFactory,
) -> None:
    """Acks go out from the runs' callbacks; a run the store refused (65
    properties: max_headers is 64) is handed to the confirmer task, which
    sends the ERROR and closes.  The MESSAGEs before it were stored and
    acked; none after it was."""
    gw = await start_gateway(gateway_factory)
    pub = await connect(gw, required=["batch-ack:max-count=8"])
    try:
        for i in range(3):
            await pub.publish("topic/refused", f"m{i}".encode())
        await pub.flush(timeout=10)
        await pub.publish("topic/refused", b"too many", {f"p{i}": i for i in range(65)})
        await pub.publish("topic/refused", b"after")
        with pytest.raises(MicroMsg2Error) as info:
            await pub.receive(timeout=5)
        assert info.value.code == "too_large"
        # The last two may arrive in one read, and then make one run.
        assert re.match(r"MESSAGEs? 4(\.\.5)? (was|were) not stored: 65 headers exceed",
                        info.value.text), info.value.text
        await pub.wait_closed(timeout=5)
        events = await gw.store.read_stream(ReadStream("default", "refused"))
        assert [e.body for e in events] == [b"m0", b"m1", b"m2"]
    finally:
        await pub.close()


async def test_pipelined_messages_to_several_streams_keep_their_order(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory)
    pub = await connect(gw, required=["batch-ack:max-count=60"])
    try:
        streams = ["a", "b", "a", "a", "c", "b"] * 10
        # One write, so the server sees the MESSAGEs in one chunk.
        await pub.send_raw(
            b"".join(
                pub._conn.send(Message(seq, f"topic/{s}", f"{seq}".encode()))
                for seq, s in enumerate(streams, start=1)
            )
        )
        await pub.flush(timeout=5)
        for name in "abc":
            events = await gw.store.read_stream(ReadStream("default", name))
            want = [str(i).encode() for i, s in enumerate(streams, start=1) if s == name]
            assert [e.body for e in events] == want
            assert [e.version for e in events] == list(range(1, len(want) + 1))
    finally:
        await pub.close()


# --- topics and queues -------------------------------------------------------------------


async def test_topic_three_subscribers_each_get_everything(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory)
    subs = [
        await connect(gw, required=["pubsub"]),
        await connect(gw, required=["pubsub", "batch-ack:max-count=4"]),
        await connect(gw, required=["pubsub", "json"]),
    ]
    pub = await connect(gw, required=["ack"])
    try:
        for s in subs:
            await s.subscribe("topic/news")
        await wait_subscriptions(gw, 3)
        total = 30
        for i in range(total):
            await pub.publish("topic/news", json.dumps({"i": i}), {"type": "Story", "i": i})
        await pub.flush(timeout=10)
        for index, s in enumerate(subs):
            got = await receive_n(s, total, ack=index == 1)
            assert [json.loads(m.payload)["i"] for m in got] == list(range(total))
            assert all(m.destination == "topic/news" for m in got)
            assert [m.properties["i"] for m in got] == list(range(total))
            assert {m.properties["type"] for m in got} == {"Story"}
            await assert_silent(s, 0.1)
    finally:
        for s in [*subs, pub]:
            await s.close()


@pytest.mark.parametrize("acks", [True, False])
async def test_queue_three_consumers_disjoint_union(
    gateway_factory: GatewayFactory, acks: bool
) -> None:
    gw = await start_gateway(gateway_factory)
    required = ["pubsub", "batch-ack:max-count=3"] if acks else ["pubsub"]
    consumers = [await connect(gw, required=required) for _ in range(3)]
    try:
        for c in consumers:
            await c.subscribe("queue/jobs")
        await wait_subscriptions(gw, 3)
        total = 90
        await gw.store.append(
            Append(
                "default", "jobs", tuple(EventData("job", str(i).encode()) for i in range(total))
            )
        )
        received: list[list[int]] = [[], [], []]

        async def consume(i: int) -> None:
            while True:
                try:
                    msg = await consumers[i].receive(timeout=1.0)
                except TimeoutError:
                    return
                received[i].append(int(msg.payload))
                if acks:
                    await consumers[i].ack(msg)

        await asyncio.gather(*(consume(i) for i in range(3)))
        sets = [set(r) for r in received]
        assert sum(len(r) for r in received) == total  # no duplicates...
        assert set().union(*sets) == set(range(total))  # ...and nothing missing
        assert all(sets), "each consumer got a share"
        for r in received:
            assert r == sorted(r)  # each consumer sees its share in order
    finally:
        for c in consumers:
            await c.close()


async def test_queue_keeps_messages_for_later_consumers(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory)
    c = await connect(gw, required=["pubsub", "ack"])
    await c.subscribe("queue/work")
    await wait_subscriptions(gw, 1)
    await c.close()
    await wait_subscriptions(gw, 0)
    pub = await connect(gw)
    for i in range(3):
        await pub.publish("queue/work", str(i).encode())
    await pub.close()
    c = await connect(gw, required=["pubsub", "ack"])
    try:
        await c.subscribe("queue/work")
        got = await receive_n(c, 3, ack=True)
        assert [m.payload for m in got] == [b"0", b"1", b"2"]
    finally:
        await c.close()


async def leave_three_unacked(gw: Gateway, a: MicroMsg2Client, b: MicroMsg2Client,
                              stream: str) -> None:
    """``a`` takes messages 0..4 of queue/<stream> and acknowledges 0 and 1; ``b``
    subscribes too; ``a`` leaves with 2..4 unacknowledged."""
    await a.subscribe(f"queue/{stream}")
    await wait_subscriptions(gw, 1)
    await gw.store.append(
        Append("default", stream, tuple(EventData("t", str(i).encode()) for i in range(5)))
    )
    first = await receive_n(a, 5)
    await a.ack(first[1])
    await b.subscribe(f"queue/{stream}")
    await wait_subscriptions(gw, 2)
    await a.unsubscribe(f"queue/{stream}")


async def test_unacked_queue_messages_go_to_the_other_consumer(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory)
    a = await connect(gw, required=["pubsub", "batch-ack:max-count=5"])
    b = await connect(gw, required=["pubsub", "batch-ack:max-count=5"])
    try:
        await leave_three_unacked(gw, a, b, "retry")
        await gw.store.append(Append("default", "retry", (EventData("t", b"5"),)))
        got = await receive_n(b, 4, ack=True)
        assert sorted(m.payload for m in got) == [b"2", b"3", b"4", b"5"]
        await assert_silent(b, 0.2)
    finally:
        await a.close()
        await b.close()


async def test_unacked_queue_messages_are_redelivered_without_new_traffic(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory)
    a = await connect(gw, required=["pubsub", "batch-ack:max-count=5"])
    b = await connect(gw, required=["pubsub", "batch-ack:max-count=5"])
    try:
        await leave_three_unacked(gw, a, b, "retry2")
        got = []
        for _ in range(3):
            msg = await b.receive(timeout=1)
            got.append(msg.payload)
            await b.ack(msg)
        assert got == [b"2", b"3", b"4"]
    finally:
        await a.close()
        await b.close()


# --- filters -----------------------------------------------------------------------------

BASE = datetime(2014, 10, 13, 11, 0, tzinfo=UTC)
TEXTS = ["abc", "abd", "xbc", "ab", "c", "zzz", "Abc", "b", "cab", "abcabc"]


def _props(i: int) -> dict[str, Any]:
    return {
        "n": i,
        "d": BASE + timedelta(hours=i),
        "t": TEXTS[i],
        "type": "Even" if i % 2 == 0 else "Odd",
    }


D5 = (BASE + timedelta(hours=5)).timestamp()
FILTERS: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
    ("n=N5", lambda p: p["n"] == 5),
    ("n!=N5", lambda p: p["n"] != 5),
    ("n<N5", lambda p: p["n"] < 5),
    ("n<=N5", lambda p: p["n"] <= 5),
    ("n>N5", lambda p: p["n"] > 5),
    (f"d=D{D5}", lambda p: p["n"] == 5),
    (f"d!=D{D5}", lambda p: p["n"] != 5),
    (f"d<D{D5}", lambda p: p["n"] < 5),
    (f"d<=D{D5}", lambda p: p["n"] <= 5),
    (f"d>D{D5}", lambda p: p["n"] > 5),
    ("t=Tabc", lambda p: p["t"] == "abc"),
    ("t!=Tabc", lambda p: p["t"] != "abc"),
    ("t<Tab", lambda p: p["t"].startswith("ab")),
    ("t>Tc", lambda p: p["t"].endswith("c")),
    ("t~Tb", lambda p: "b" not in p["t"]),
    ("t&Tb", lambda p: "b" in p["t"]),
    ("type=TEven", lambda p: p["type"] == "Even"),
    ("n>N2;t&Tb;type!=TOdd", lambda p: p["n"] > 2 and "b" in p["t"] and p["type"] != "Odd"),
    ("missing=N1", lambda p: False),
]


async def test_filters_select_exactly_the_matching_messages(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory)
    subs = [await connect(gw, required=["pubsub"]) for _ in FILTERS]
    pub = await connect(gw, required=["batch-ack"])
    try:
        for client, (text, _) in zip(subs, FILTERS, strict=True):
            await client.subscribe("topic/filtered", text)
        await wait_subscriptions(gw, len(FILTERS))
        for i in range(len(TEXTS)):
            await pub.publish("topic/filtered", str(i).encode(), _props(i))
        await pub.flush(timeout=10)
        for client, (text, predicate) in zip(subs, FILTERS, strict=True):
            expected = [str(i).encode() for i in range(len(TEXTS)) if predicate(_props(i))]
            got = [m.payload for m in await receive_n(client, len(expected))]
            await assert_silent(client, 0.1)
            assert got == expected, text
    finally:
        for c in [*subs, pub]:
            await c.close()


# --- bad input ---------------------------------------------------------------------------

BAD_INPUTS: list[tuple[str, list[str], bytes, str]] = [
    ("unknown flag bits", [], b"\xe0\x00", "malformed: unknown frame flag bits"),
    (
        "message to a bad destination",
        [],
        encode_frame(Message(1, "nowhere", b"x")),
        "malformed: destination 'nowhere' is not 'topic/<stream>' or 'queue/<stream>'",
    ),
    (
        "bad filter",
        ["pubsub"],
        encode_frame(Command("subscribe", {"destination": "topic/x", "filter": "a>=N5"})),
        "malformed: filter condition 'a>=N5': '>=' is not an operator",
    ),
    (
        "unknown command",
        ["pubsub"],
        encode_frame(Command("publish", {"destination": "topic/x"})),
        "unsupported: unknown command 'publish'",
    ),
    (
        "subscribe without pubsub",
        [],
        encode_frame(Command("subscribe", {"destination": "topic/x"})),
        "unsupported: command 'subscribe' needs the 'pubsub' extension",
    ),
    (
        "ack without an ack extension",
        ["json"],
        b"\x02\x01\x02\x00\x01",
        "unsupported: EXTENSION frames are not defined for extension 'json'",
    ),
    (
        "ack for nothing in flight",
        ["batch-ack"],
        b"\x02\x01\x02\x00\x07",
        "malformed: ack for 7 matches no MESSAGE in flight",
    ),
    (
        "message out of sequence with acks",
        ["ack"],
        encode_frame(Message(9, "topic/x", b"x")),
        "malformed: MESSAGE sequence number 9, expected 1",
    ),
]


@pytest.mark.parametrize(
    ("required", "data", "expected"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
async def test_bad_input_gets_error_then_disconnect_others_unaffected(
    gateway_factory: GatewayFactory, required: list[str], data: bytes, expected: str
) -> None:
    gw = await start_gateway(gateway_factory)
    bystander = await connect(gw, required=["pubsub", "ack"])
    try:
        await bystander.subscribe("topic/calm")
        await wait_subscriptions(gw, 1)
        bad = await connect(gw, required=required)
        await bad.send_raw(data)
        with pytest.raises(MicroMsg2Error) as info:
            await bad.receive(timeout=5)
        assert f"{info.value.code}: {info.value.text}".startswith(expected)
        await bad.wait_closed(timeout=5)
        with pytest.raises(ConnectionClosed):
            await bad.receive(timeout=1)
        await bad.close()
        # The other connection carries on.
        await bystander.publish("topic/calm", b"still here")
        msg = await bystander.receive(timeout=5)
        assert msg.payload == b"still here"
        assert listener(gw).stats.connections_open == 1
    finally:
        await bystander.close()


async def test_garbage_handshake_gets_error_then_disconnect(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory)
    raw = await RawConnection.open(gw)
    # A hello whose required list is not an extension list.
    await raw.send(b"\x01\x00\x00\x01h\x00\x05no pe\x00\x00")
    text = error_text(await raw.read_until_eof())
    assert text.startswith("malformed: extension name 'no pe' is not a FIELD")
    raw.close()


async def test_too_large_message_gets_error_then_disconnect(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory, max_event_bytes=1000)
    client = await connect(gw)
    await client.publish("topic/big", b"x" * 2000)
    with pytest.raises(MicroMsg2Error) as info:
        await client.receive(timeout=5)
    assert info.value.code == "too_large" and "limit of 1000" in info.value.text
    await client.wait_closed(timeout=5)
    await client.close()


async def test_failed_subscribe_commands_keep_the_connection(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await start_gateway(gateway_factory)
    client = await connect(gw, required=["pubsub"])
    try:
        await client.unsubscribe("topic/never")
        with pytest.raises(MicroMsg2Error) as info:
            await client.receive(timeout=5)
        assert info.value.code == "not_found"
        assert "unsubscribe topic/never" in info.value.text
        # Still open and working.
        await client.subscribe("topic/after")
        await client.subscribe("topic/after")  # again: no duplicate delivery
        await wait_subscriptions(gw, 1)
        await gw.store.append(Append("default", "after", (EventData("e", b"1"),)))
        assert (await client.receive(timeout=5)).payload == b"1"
        await client.unsubscribe("topic/after")
        await wait_subscriptions(gw, 0)
        await gw.store.append(Append("default", "after", (EventData("e", b"2"),)))
        await assert_silent(client, 0.3)
    finally:
        await client.close()


async def test_handshake_timeout_and_idle_subscribers(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory, idle_timeout=0.5)
    raw = await RawConnection.open(gw)
    subscriber = await connect(gw, required=["pubsub"])
    try:
        await subscriber.subscribe("topic/quiet")
        await wait_subscriptions(gw, 1)
        text = error_text(await raw.read_until_eof(timeout=5))
        assert text == "timeout: handshake not completed within 0.5 seconds"
        await asyncio.sleep(0.8)
        # A subscriber waiting for messages is not idle.
        await gw.store.append(Append("default", "quiet", (EventData("e", b"late"),)))
        assert (await subscriber.receive(timeout=5)).payload == b"late"
    finally:
        raw.close()
        await subscriber.close()


def test_default_port_is_7090() -> None:
    from polyport.gateway.listeners.micromsg2 import LISTENER

    assert LISTENER.default_port == 7090 and LISTENER.name == "micromsg2"


async def test_disconnect_releases_subscriptions(gateway_factory: GatewayFactory) -> None:
    gw = await start_gateway(gateway_factory)
    client = await connect(gw, required=["pubsub", "batch-ack"])
    await client.subscribe("topic/gone")
    await client.subscribe("queue/gone")
    await wait_subscriptions(gw, 2)
    await gw.store.append(Append("default", "gone", (EventData("e", b"1"),)))
    assert len(await receive_n(client, 2)) == 2  # one per subscription, not acked
    assert gw.store.tailer.live_count >= 1
    await client.close()
    await eventually(lambda: not listener(gw).sessions)
    await eventually(lambda: gw.store.tailer.live_count == 0)
    await eventually(lambda: not gw.store._groups)
