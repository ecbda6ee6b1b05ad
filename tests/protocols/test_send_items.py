"""``send_items``, the reactive family's batch of items on one stream: the
same bytes and the same stream state as sending the items one by one, for
both versions and both transports, and all or nothing when one is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyport.protocols.reactivesocket import ServerConnection as DraftServer
from polyport.protocols.reactivesocket.errors import LocalProtocolError as DraftError
from polyport.protocols.reactivesocket.frames import RequestStream as DraftRequestStream
from polyport.protocols.reactivesocket.wire import encode_frame as draft_encode
from polyport.protocols.rsocket.connection import ServerConnection as RSocketServer
from polyport.protocols.rsocket.errors import LocalProtocolError as RSocketError
from polyport.protocols.rsocket.frames import RequestStream, Setup
from polyport.protocols.rsocket.metadata import COMPOSITE
from polyport.protocols.rsocket.wire import encode_frame as rsocket_encode
from polyport.protocols.rsocket.wire import encode_tcp_frame

MAX_FRAGMENT = 16
MAX_I64 = (1 << 63) - 1
MAX_U31 = (1 << 31) - 1


def _draft(transport: str, credits: int) -> tuple[Any, Callable[[Any, int, bytes], list[bytes]]]:
    conn = DraftServer(transport, max_fragment=MAX_FRAGMENT)  # type: ignore[arg-type]
    setup = bytes.fromhex("00 00 0001 0000000000000000".replace(" ", ""))
    request = draft_encode(DraftRequestStream(1, credits, b"q"))
    if transport == "tcp":
        setup = (len(setup) + 4).to_bytes(4, "big") + setup
        request = (len(request) + 4).to_bytes(4, "big") + request
    assert conn.receive_data(setup)
    assert conn.receive_data(request)
    return conn, lambda c, sid, data: c.send_response(sid, data)


def _rsocket(transport: str, credits: int) -> tuple[Any, Callable[[Any, int, bytes], list[bytes]]]:
    conn = RSocketServer(transport, max_fragment=MAX_FRAGMENT)  # type: ignore[arg-type]
    encode = encode_tcp_frame if transport == "tcp" else rsocket_encode
    assert conn.receive_data(encode(Setup(500, 30_000, COMPOSITE, "application/json")))
    assert conn.receive_data(encode(RequestStream(1, credits, None, b"q")))
    return conn, lambda c, sid, data: c.send_payload(sid, data)


VERSIONS = {"reactivesocket": (_draft, DraftError), "rsocket": (_rsocket, RSocketError)}


def _state(conn: Any) -> tuple[object, object] | None:
    rec = conn.streams.get(1) if hasattr(conn, "streams") else conn._streams.get(1)
    return None if rec is None else (rec.phase, rec.credits)


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(sorted(VERSIONS)),
    transport=st.sampled_from(["tcp", "websocket"]),
    credits=st.one_of(st.integers(1, 12), st.just(-1)),  # -1: unbounded
    sizes=st.lists(st.integers(0, 3 * MAX_FRAGMENT), min_size=1, max_size=10),
)
def test_a_batch_is_the_items_one_by_one(
    version: str, transport: str, credits: int, sizes: list[int]
) -> None:
    make, error = VERSIONS[version]
    if credits < 0:
        credits = MAX_I64 if version == "reactivesocket" else MAX_U31
    datas = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
    one_by_one, send_one = make(transport, credits)
    batched, _ = make(transport, credits)
    expected: list[bytes] = []
    refused = False
    for data in datas:
        try:
            expected += send_one(one_by_one, 1, data)
        except error:
            refused = True
            break
    before = _state(batched)
    if refused:
        # All or nothing: the stream is as it was before the batch.
        with pytest.raises(error):
            batched.send_items(1, datas)
        assert _state(batched) == before
    else:
        assert batched.send_items(1, datas) == expected
        assert _state(batched) == _state(one_by_one)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_a_batch_on_a_cancelled_stream_is_refused(version: str) -> None:
    make, error = VERSIONS[version]
    conn, _ = make("tcp", 5)
    conn.send_error(1, "internal", "gone")
    with pytest.raises(error):
        conn.send_items(1, [b"a", b"b"])
