"""Segment wire <-> core: what one side writes, the other reads (design brief,
"Bodies across protocols": segment reads are a byte consumer — bodies exactly
as stored; the wire has no place for content type or headers)."""

from __future__ import annotations

import json
import struct

import bson
import msgpack
import pytest

from polyport.core.commands import Append, FromBeginning, ReadStream, Selector, Subscribe
from polyport.core.events import EventData
from polyport.protocols.segment.client import SegmentReader, SegmentWriter, iter_events

CONTENT_TYPES = {
    "application/json": json.dumps({"name": "Ada", "n": 1}).encode(),
    "application/bson": bson.encode({"name": "Ada", "n": 1, "raw": bson.Binary(b"\x00\xff")}),
    "application/msgpack": msgpack.packb({"name": "Ada", "n": 1, "raw": b"\x00\xff"}),
    "text/plain": "plain text, not JSON — ünïcode".encode(),
    "application/octet-stream": bytes(range(256)),
}


def framed(body: bytes) -> bytes:
    return struct.pack(">iI", 0, len(body)) + body


# Segment logs in with the optional credentials string of SetupAppend and
# ReadSegment (anonymous may use only "default").
USER, PASSWORD = "seg", "pw"
LOGIN = f"{USER}:{PASSWORD}"


async def test_segment_appends_read_through_the_core(gateway_factory, store) -> None:
    gw = await gateway_factory()
    await gw.store.users.add(USER, PASSWORD, default_context="interop", contexts=["interop"])
    writer = await SegmentWriter.connect(*gw.listeners["segment"].address, credentials=LOGIN)
    app = await writer.open_segment("interop/from-segment")
    bodies = [b"", b"\x00\x01\x02", b'{"looks": "like json"}', "текст".encode()]
    await app.append(bodies)
    await app.flush(5)
    await writer.close()

    events = await store.read_stream(ReadStream("interop", "from-segment"))
    assert [e.body for e in events] == bodies
    for e in events:
        assert e.type == "segment-event"
        assert e.content_type == "application/octet-stream"
        assert dict(e.headers) == {}
        assert e.origin == "segment"
        assert e.context == "interop" and e.stream == "from-segment"
    # The segment offsets the core assigns are the EVENT-framed byte offsets.
    assert [e.segment_offset for e in events] == [0, 8, 19, 49]

    sub = await store.subscribe(
        Subscribe(Selector(context="interop", stream="from-segment"), start=FromBeginning())
    )
    try:
        seen = [(await sub.next(5)) for _ in bodies]
    finally:
        sub.close()
    assert [e.body for e in seen if e is not None] == bodies


@pytest.mark.parametrize("content_type", list(CONTENT_TYPES))
async def test_core_events_of_every_content_type_read_through_segment(
    gateway_factory, store, content_type: str
) -> None:
    gw = await gateway_factory(extra={"segment_read_wait": 0.2})
    body = CONTENT_TYPES[content_type]
    await store.append(Append("interop", "from-core", (
        EventData("created", body, content_type=content_type, headers={"trace": "t-1"}),
        EventData("noted", b"second", content_type="text/plain"),
    ), origin="bson"))
    await gw.store.users.add(USER, PASSWORD, default_context="interop", contexts=["interop"])
    reader = await SegmentReader.connect(*gw.listeners["segment"].address, credentials=LOGIN)
    data = await reader.read_to_tail("interop/from-core")
    assert data == framed(body) + framed(b"second")
    assert list(iter_events(data)) == [body, b"second"]
    # And from the second event's boundary.
    assert (await reader.read("interop/from-core", len(framed(body)))).data == framed(b"second")
    await reader.close()
