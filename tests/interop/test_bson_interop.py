"""BSON frames ⇄ the core: what BSON writes is readable by everyone, and what
anyone writes (every content type, with headers) reaches BSON clients as the
design brief's "Bodies across protocols" says."""

from __future__ import annotations

import asyncio
import json
import struct
import uuid
from datetime import UTC, datetime
from typing import Any

import bson
import msgpack
from bson.binary import Binary
from bson.int64 import Int64
from bson.objectid import ObjectId

from polyport.core.bodies import body_json_text, event_document
from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.protocols.bson.client import BsonClient


async def connect(gw: Any) -> BsonClient:
    host, port = gw.listeners["bson"].address
    return await BsonClient.connect(host, port)


async def test_bson_events_read_through_the_core(gateway_factory) -> None:
    gw = await gateway_factory()
    when = datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=UTC)
    oid = ObjectId()
    event = {
        "sku": "A1",
        "qty": 2,
        "price": 9.5,
        "big": Int64(1 << 40),
        "when": when,
        "id": oid,
        "raw": Binary(b"\x00\xff"),
        "uid": Binary(uuid.UUID(int=7).bytes, 4),
        "tags": ["a", "b"],
        "nested": {"x": None, "ok": True},
    }
    async with await connect(gw) as c:
        await c.emit("interop-out", "add_item", event)

    [ev] = await gw.store.read_stream(ReadStream("default", "interop-out"))
    assert ev.type == "add_item"
    assert ev.content_type == "application/bson"
    assert ev.origin == "bson"
    assert dict(ev.headers) == {}
    assert ev.version == 1
    # The body is the event document's BSON, byte for byte.
    assert ev.body == bson.encode(event)
    # Document consumers (binders, matchers) see the document.
    doc = event_document(ev)
    assert doc["sku"] == "A1" and doc["big"] == 1 << 40 and doc["id"] == oid
    # Text consumers get relaxed Extended JSON.
    text = json.loads(body_json_text(ev.content_type, ev.body))
    assert text["when"] == {"$date": "2024-05-01T12:30:15.123Z"}
    assert text["id"] == {"$oid": str(oid)}
    assert text["qty"] == 2 and text["big"] == 1 << 40 and text["tags"] == ["a", "b"]


def _ev(type_: str, body: bytes, content_type: str) -> EventData:
    return EventData(type_, body, content_type=content_type, headers={"h-" + type_: "v"})


CASES: list[tuple[EventData, dict[str, Any]]] = [
    (_ev("json-object", b'{"a": 1, "s": "x", "n": {"b": [1, 2]}}', "application/json"),
     {"a": 1, "s": "x", "n": {"b": [1, 2]}}),
    (_ev("json-array", b"[1, 2, 3]", "application/json"), {"data": [1, 2, 3]}),
    (_ev("json-scalar", b'"just a string"', "application/json"), {"data": "just a string"}),
    (_ev("json-huge-int", b'{"n": 1180591620717411303424}', "application/json"),
     # Beyond int64: BSON cannot hold the document, so the stored text comes as data.
     {"data": '{"n": 1180591620717411303424}'}),
    (_ev("msgpack-int-keys", msgpack.packb({"m": {1: "one", b"k": 2}}), "application/msgpack"),
     # Non-string keys, nested too, become their text (docs/bodies.md).
     {"m": {"1": "one", "k": 2}}),
    (_ev("bson", bson.encode({"d": datetime(2020, 1, 1, tzinfo=UTC), "i": Int64(5)}),
         "application/bson"),
     {"d": datetime(2020, 1, 1, tzinfo=UTC), "i": 5}),
    (_ev("msgpack-map", msgpack.packb({"k": "v", "n": 5, "l": [1, "a"]}),
         "application/msgpack"),
     {"k": "v", "n": 5, "l": [1, "a"]}),
    (_ev("msgpack-list", msgpack.packb([1, 2]), "application/msgpack"), {"data": [1, 2]}),
    (_ev("text", "héllo wörld".encode(), "text/plain"), {"data": "héllo wörld"}),
    (_ev("octets", b"\x00\xff\xfe binary", "application/octet-stream"),
     {"data": b"\x00\xff\xfe binary"}),
    (_ev("octets-utf8", b"plain ascii", "application/octet-stream"), {"data": "plain ascii"}),
]


async def test_every_content_type_reaches_bson_subscribers(gateway_factory) -> None:
    gw = await gateway_factory()
    for data, _expected in CASES:
        await gw.store.append(Append("default", "interop-in", (data,), origin="res01"))
    stored = await gw.store.read_stream(ReadStream("default", "interop-in"))

    async with await connect(gw) as c:
        sub = await c.subscribe("interop-in", start_seq=0)
        for (data, expected), ev in zip(CASES, stored, strict=True):
            got = await sub.next(5)
            assert got is not None
            assert got.event_type == data.type
            assert got.stream_name == "interop-in"
            assert got.seq_no == ev.version - 1
            assert got.timestamp == ev.recorded_at_ms
            assert got.event == expected, data.type

        # A matcher works on the documents, whatever protocol wrote them.
        matched = await c.subscribe("interop-in", start_seq=0, matcher={"k": "v"})
        got = await matched.next(5)
        assert got is not None and got.event_type == "msgpack-map"
        assert await matched.next(0.3) is None


async def test_recev_wire_fields(gateway_factory) -> None:
    """RECEV carries exactly the design brief's fields (headers and content
    type have no place in it), with int64 timestamp and seqNo."""
    gw = await gateway_factory()
    body = b'{"x": 1}'
    data = EventData("t", body, content_type="application/json", headers={"k": "v"})
    result = await gw.store.append(Append("default", "wire", (data,), origin="segment"))

    host, port = gw.listeners["bson"].address
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
        writer.write(bson.encode({"type": "SUBSCRIBE",
                                  "frame": {"streamName": "wire", "startSeq": 0}}))
        frames: list[bytes] = []
        buf = b""
        while len(frames) < 3:
            buf += await asyncio.wait_for(reader.read(65536), 5)
            while len(buf) >= 4 and len(buf) >= struct.unpack_from("<i", buf)[0]:
                n = struct.unpack_from("<i", buf)[0]
                frames.append(buf[:n])
                buf = buf[n:]
    finally:
        writer.close()
    connect_reply, sub_reply, recev = (bson.decode(f) for f in frames)
    assert connect_reply == {"type": "RESPONSE", "frame": {"ok": True}}
    assert sub_reply == {"type": "SUBRESPONSE", "frame": {"ok": True, "subID": 1}}
    assert recev["type"] == "RECEV"
    assert list(recev["frame"]) == ["subID", "streamName", "eventType", "timestamp", "seqNo",
                                    "event"]
    assert recev["frame"]["event"] == {"x": 1}
    assert recev["frame"]["seqNo"] == 0
    assert recev["frame"]["timestamp"] == int(result.recorded_at.timestamp() * 1000)
    # int64 on the wire (element type 0x12) even for small values.
    raw = frames[2]
    assert b"\x12seqNo\x00" in raw and b"\x12timestamp\x00" in raw
