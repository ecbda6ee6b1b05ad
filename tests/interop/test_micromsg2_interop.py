"""MicroMsg2 ⇄ the canonical core: bodies, content types, properties/headers
both ways (design brief, "Bodies across protocols")."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import bson
import msgpack
import pytest

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS
from polyport.protocols.micromsg2 import Message, encode_frame
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.micromsg2.filters import decode_properties

pytestmark = pytest.mark.timeout(60)

ONLY_MICROMSG2: dict[str, Any] = {
    **{f"{n}_port": None for n in DEFAULT_PORTS if n != "micromsg2"},
    "http_port": None,
}
WHEN = datetime(2014, 10, 13, 11, 0, tzinfo=UTC)


async def connect(gw: Gateway, **kwargs: Any) -> MicroMsg2Client:
    host, port = gw.listeners["micromsg2"].address
    return await MicroMsg2Client.connect(host, port, **kwargs)


async def wait_subscriptions(gw: Gateway, count: int) -> None:
    sessions = gw.listeners["micromsg2"].sessions  # type: ignore[attr-defined]
    for _ in range(500):
        if sum(s.subscription_count for s in sessions) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("subscriptions not in place")


async def test_micromsg2_messages_are_canonical_events(gateway_factory) -> None:
    gw = await gateway_factory(**ONLY_MICROMSG2)
    await gw.store.users.add("mm", "pw", default_context="interop")
    with_json = await connect(gw, user="mm", password="pw", required=["json", "batch-ack"])
    without_json = await connect(gw, user="mm", password="pw", required=["ack"])
    try:
        await with_json.publish(
            "topic/orders",
            '{"id": 1, "ü": "x"}',
            {
                "type": "OrderPlaced",
                "amount": 42,
                "at": WHEN,
                "who": 'Hello "world"',
                "odd key;x": "v",
            },
        )
        await with_json.publish("queue/orders", b"not json", {"amount": -3})
        await with_json.publish("topic/orders", b"")
        await with_json.flush(timeout=5)
        await without_json.publish("topic/orders", b'{"id": 2}', {"type": "Raw"})
        await without_json.flush(timeout=5)
    finally:
        await with_json.close()
        await without_json.close()

    events = await gw.store.read_stream(ReadStream("interop", "orders"))
    assert all(e.origin == "micromsg2" and e.context == "interop" for e in events)
    placed, not_json, empty, raw = events
    assert placed.type == "OrderPlaced"
    assert (placed.content_type, placed.body) == (
        "application/json",
        '{"id": 1, "ü": "x"}'.encode(),
    )
    assert dict(placed.headers) == {
        "amount": "42",
        "at": "2014-10-13T11:00:00Z",
        "who": 'Hello "world"',
        "odd key;x": "v",
    }
    # topic/ and queue/ name the same stream; a body that is not JSON stays bytes.
    assert (not_json.type, not_json.content_type, not_json.body) == (
        "message",
        "application/octet-stream",
        b"not json",
    )
    assert dict(not_json.headers) == {"amount": "-3"}
    assert (empty.content_type, empty.body, dict(empty.headers)) == (
        "application/octet-stream",
        b"",
        {},
    )
    # Without the json extension bodies are opaque bytes even when they parse.
    assert (raw.type, raw.content_type, raw.body) == (
        "Raw",
        "application/octet-stream",
        b'{"id": 2}',
    )


async def test_spec_filter_value_vectors_on_the_wire(gateway_factory) -> None:
    gw = await gateway_factory(**ONLY_MICROMSG2)
    client = await connect(gw)
    try:
        props = b"when:D1413198000.0;greeting:THello%20%22world%22;first_name:jonas;n:N-7;"
        dest = b"topic/vectors"
        frame = (
            b"\x00"
            + (1).to_bytes(2, "big")
            + bytes([len(dest)])
            + dest
            + len(props).to_bytes(2, "big")
            + props
            + b"\x02{}"
        )
        assert decode_properties(props)["when"] == WHEN  # 2014-10-13 12:00 UTC+1
        await client.send_raw(frame)
        await client.send_raw(encode_frame(Message(2, "topic/vectors", b"x")))
        for _ in range(250):
            events = await gw.store.read_stream(ReadStream("default", "vectors"))
            if len(events) == 2:
                break
            await asyncio.sleep(0.02)
        assert dict(events[0].headers) == {
            "when": "2014-10-13T11:00:00Z",
            "greeting": 'Hello "world"',
            "first_name": "jonas",
            "n": "-7",
        }
    finally:
        await client.close()


def _core_events() -> list[EventData]:
    headers = {
        "amount": "7",
        "at": "2014-10-13T11:00:00Z",
        "note": "007",
        "iso": "2014-10-13T11:00:00+02:00",
        "": "no name",
    }
    return [
        EventData("J", b'{"a": [1, 2]}', headers=headers, content_type="application/json"),
        EventData(
            "B", bson.encode({"a": 1, "b": "x"}), headers=headers, content_type="application/bson"
        ),
        EventData(
            "M", msgpack.packb({"k": [1, 2]}), headers=headers, content_type="application/msgpack"
        ),
        EventData("T", b"hello", headers=headers, content_type="text/plain"),
        EventData("O", b"\x00\xff", headers=headers, content_type="application/octet-stream"),
    ]


async def test_core_events_come_out_through_micromsg2(gateway_factory) -> None:
    gw = await gateway_factory(**ONLY_MICROMSG2)
    text_client = await connect(gw, required=["pubsub", "json"])
    byte_client = await connect(gw, required=["pubsub"])
    filtered = await connect(gw, required=["pubsub"])
    try:
        await text_client.subscribe("topic/mixed")
        await byte_client.subscribe("queue/mixed")
        await filtered.subscribe("topic/mixed", "amount>N5;at>D1413197999;note<T00;type!=TT")
        await wait_subscriptions(gw, 3)
        sent = _core_events()
        await gw.store.append(Append("default", "mixed", tuple(sent)))

        as_text = [await text_client.receive(timeout=5) for _ in sent]
        as_bytes = [await byte_client.receive(timeout=5) for _ in sent]
        as_filtered = [await filtered.receive(timeout=5) for _ in range(4)]
    finally:
        for c in (text_client, byte_client, filtered):
            await c.close()

    # Text consumers (json): JSON as written, BSON / MessagePack documents as
    # relaxed Extended JSON, text as is, other bytes as {"data": {"$binary": ...}}.
    assert [m.payload for m in as_text[:1]] == [b'{"a": [1, 2]}']
    assert json.loads(as_text[1].payload) == {"a": 1, "b": "x"}
    assert json.loads(as_text[2].payload) == {"k": [1, 2]}
    assert as_text[3].payload == b"hello"
    assert json.loads(as_text[4].payload) == {
        "data": {"$binary": {"base64": "AP8=", "subType": "00"}}
    }
    # Byte consumers: the stored bytes.
    assert [m.payload for m in as_bytes] == [e.body for e in sent]
    # Properties: headers typed back where they look like what MicroMsg2 writes
    # (canonical integers, ISO 8601 UTC "Z"), else text; plus the event type.
    for msg, ev in zip(as_bytes, sent, strict=True):
        assert dict(msg.properties) == {
            "amount": 7,
            "at": WHEN,
            "note": "007",
            "iso": "2014-10-13T11:00:00+02:00",
            "type": ev.type,
        }
        assert msg.destination == "queue/mixed"
    # Filters see the same properties.
    assert [m.properties["type"] for m in as_filtered] == ["J", "B", "M", "O"]


async def test_properties_round_trip_between_micromsg2_clients(gateway_factory) -> None:
    gw = await gateway_factory(**ONLY_MICROMSG2)
    sub = await connect(gw, required=["pubsub"])
    pub = await connect(gw, required=["ack"])
    precise = datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC)
    props: dict[str, Any] = {
        "n": -(2**63),
        "d": precise,
        "t": "x y;z:%",
        "leading": "007",
        "looks-like-number": "42",
    }
    try:
        await sub.subscribe("topic/rt")
        await wait_subscriptions(gw, 1)
        await pub.publish("topic/rt", b"p", props)
        await pub.flush(timeout=5)
        msg = await sub.receive(timeout=5)
    finally:
        await sub.close()
        await pub.close()
    expected = {**props, "looks-like-number": 42, "type": "message"}
    assert dict(msg.properties) == expected  # text that is a canonical integer comes back a Number
