"""ReactiveSocket's row and column of the interop matrix, against the core.

ReactiveSocket is a byte consumer (design brief, "Bodies across protocols"):
bodies go in and come out as stored, with their content type and headers, in
both directions.
"""

from __future__ import annotations

import uuid
from typing import Any

import bson
import msgpack
import pytest

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient

BODIES: list[tuple[str, bytes]] = [
    ("application/json", b'{"amount": 42, "note": "caf\xc3\xa9"}'),
    ("application/bson", bson.encode({"amount": 42, "tags": ["a", "b"]})),
    ("application/msgpack", msgpack.packb({"amount": 42, "raw": b"\x00\x01"}, use_bin_type=True)),
    ("text/plain", "plain text, caf\u00e9".encode()),
    ("application/octet-stream", bytes(range(256))),
]
HEADERS = {"trace-id": "abc-123", "source": "interop"}


async def _client(gw: Any, transport: str) -> ReactiveSocketClient:
    if transport == "tcp":
        host, port = gw.listeners["reactivesocket"].address
        return await ReactiveSocketClient.connect(host, port)
    host, port = gw.http_address
    return await ReactiveSocketClient.connect_websocket(f"ws://{host}:{port}/reactivesocket")


@pytest.mark.parametrize("transport", ["tcp", "websocket"])
async def test_appended_through_reactivesocket_read_through_core(
    gateway_factory: Any, transport: str
) -> None:
    gw = await gateway_factory()
    c = await _client(gw, transport)
    stream = f"rs-in-{uuid.uuid4().hex[:6]}"
    ids = [uuid.uuid4() for _ in BODIES]
    try:
        await c.append(
            stream,
            [
                NewEvent(f"t{i}", body, HEADERS, ctype, ids[i])
                for i, (ctype, body) in enumerate(BODIES)
            ],
        )
        await c.append(stream, [NewEvent("untyped", b"no content type given")])
    finally:
        await c.close()
    events = await gw.store.read_stream(ReadStream("default", stream))
    assert [(e.content_type, e.body) for e in events[:-1]] == BODIES
    assert [e.event_id for e in events[:-1]] == ids
    assert all(dict(e.headers) == HEADERS for e in events[:-1])
    assert all(e.origin == "reactivesocket" for e in events)
    # Without content_type the bytes are taken as opaque.
    assert events[-1].content_type == "application/octet-stream"
    assert events[-1].headers == {}


@pytest.mark.parametrize("transport", ["tcp", "websocket"])
async def test_appended_through_core_comes_out_as_stored(
    gateway_factory: Any, transport: str
) -> None:
    gw = await gateway_factory()
    stream = f"rs-out-{uuid.uuid4().hex[:6]}"
    ids = [uuid.uuid4() for _ in BODIES]
    result = await gw.store.append(
        Append(
            "default",
            stream,
            tuple(
                EventData(f"t{i}", body, ids[i], HEADERS, ctype)
                for i, (ctype, body) in enumerate(BODIES)
            ),
        )
    )
    recorded = await gw.store.read_stream(ReadStream("default", stream))
    c = await _client(gw, transport)
    try:
        read = await c.read(stream)
        streamed = [e async for e in await c.read_stream(stream)]
        sub = await c.subscribe(stream=stream, start="beginning", initial_n=len(BODIES))
        subscribed = [await sub.next(5) for _ in BODIES]
        await sub.cancel()
    finally:
        await c.close()
    for got in (read, streamed, subscribed):
        assert [(e.content_type, e.body) for e in got if e] == BODIES
        for e, r in zip(got, recorded, strict=True):
            assert e is not None
            assert e.id == r.event_id
            assert dict(e.headers) == HEADERS
            assert (e.context, e.stream, e.version, e.position, e.type) == (
                r.context,
                r.stream,
                r.version,
                r.position,
                r.type,
            )
            assert e.recorded_at == r.recorded_at_ms
    assert read[-1].position == result.last_position
