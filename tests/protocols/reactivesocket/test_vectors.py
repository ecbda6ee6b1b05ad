"""Byte-exact vectors: every frame type, TCP and WebSocket framing.

The hex is written by hand from the spec's drawings: big-endian; TCP length
u32 counting itself and the 12-byte header; version 0; flags (I 0x80, B 0x40,
E 0x20, C 0x10); type u16; stream id u64.
"""

from __future__ import annotations

import pytest

from polyport.protocols.reactivesocket import (
    Cancel,
    ErrorFrame,
    Ext,
    RemoteProtocolError,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Response,
    Setup,
    UnknownFrame,
    decode_frame,
    encode_frame,
    encode_tcp_frame,
    split_tcp_frames,
)
from polyport.protocols.reactivesocket.errors import LocalProtocolError
from polyport.protocols.reactivesocket.frames import DEFAULT_PORT, WEBSOCKET_PATH
from polyport.protocols.reactivesocket.wire import encode_for

from .util import h

# (frame, WebSocket message hex, TCP frame length hex)
VECTORS = [
    (Setup(b"\x80"), "00 00 0001 0000000000000000 80", "00000011"),
    (Setup(), "00 00 0001 0000000000000000", "00000010"),
    (RequestResponse(1, b"hi"), "00 00 0011 0000000000000001 6869", "00000012"),
    (RequestFnf(3, b"x"), "00 00 0012 0000000000000003 78", "00000011"),
    (
        RequestStream(5, 16, b"ab"),
        "00 00 0013 0000000000000005 0000000000000010 6162",
        "0000001a",
    ),
    (
        RequestSub(7, (1 << 63) - 1),
        "00 00 0014 0000000000000007 7fffffffffffffff",
        "00000018",
    ),
    (RequestN(5, 3), "00 00 0015 0000000000000005 0000000000000003", "00000018"),
    (RequestN(5, -1), "00 00 0015 0000000000000005 ffffffffffffffff", "00000018"),
    (RequestN(5, -(1 << 63)), "00 00 0015 0000000000000005 8000000000000000", "00000018"),
    (Cancel(5), "00 00 0016 0000000000000005", "00000010"),
    # A whole RESPONSE has both B and E ("contents represent a reassembled RESPONSE").
    (Response(1, b"ok"), "00 60 0020 0000000000000001 6f6b", "00000012"),
    (Response(1, b"", complete=True), "00 70 0020 0000000000000001", "00000010"),
    (Response(1, b"ok", complete=True), "00 70 0020 0000000000000001 6f6b", "00000012"),
    (Response(9, b"a", begin=True, end=False), "00 40 0020 0000000000000009 61", "00000011"),
    (Response(9, b"b", begin=False, end=False), "00 00 0020 0000000000000009 62", "00000011"),
    (
        Response(9, b"c", complete=True, begin=False, end=True),
        "00 30 0020 0000000000000009 63",
        "00000011",
    ),
    (Response(9, b"c", begin=False, end=True), "00 20 0020 0000000000000009 63", "00000011"),
    (
        ErrorFrame(0, h("82 a4 636f6465 a9 6d616c666f726d6564 a7 6d657373616765 a3 626164")),
        "00 00 0021 0000000000000000"
        " 82 a4 636f6465 a9 6d616c666f726d6564 a7 6d657373616765 a3 626164",
        "0000002c",
    ),
    (ErrorFrame(3), "00 00 0021 0000000000000003", "00000010"),
    (
        Ext(0, 1, b"z", ignore=True),
        "00 80 ffff 0000000000000000 00000001 7a",
        "00000015",
    ),
    (Ext(2, 0xFFFFFFFF), "00 00 ffff 0000000000000002 ffffffff", "00000014"),
    # Request fragments: B on the first, E on the last (see the docs).
    (RequestResponse(1, b"a", begin=True), "00 40 0011 0000000000000001 61", "00000011"),
    (
        RequestStream(1, 2, b"", begin=False, end=True),
        "00 20 0013 0000000000000001 0000000000000002",
        "00000018",
    ),
    (Cancel(0xFFFFFFFFFFFFFFFF), "00 00 0016 ffffffffffffffff", "00000010"),
    (
        UnknownFrame(0x0030, 0x80, 9, b"?"),
        "00 80 0030 0000000000000009 3f",
        "00000011",
    ),
    (UnknownFrame(0x0000, 0x00, 0), "00 00 0000 0000000000000000", "00000010"),
]


@pytest.mark.parametrize("frame,ws_hex,length_hex", VECTORS)
def test_websocket_vector(frame, ws_hex, length_hex):
    assert encode_frame(frame) == h(ws_hex)
    assert encode_for("websocket", frame) == h(ws_hex)
    assert decode_frame(h(ws_hex)) == frame


@pytest.mark.parametrize("frame,ws_hex,length_hex", VECTORS)
def test_tcp_vector(frame, ws_hex, length_hex):
    wire = h(length_hex + ws_hex)
    assert int(length_hex, 16) == len(wire)
    assert encode_tcp_frame(frame) == wire
    assert encode_for("tcp", frame) == wire
    buf = bytearray(wire + b"\x00\x00")
    assert split_tcp_frames(buf, 1 << 20) == [h(ws_hex)]
    assert buf == b"\x00\x00"


def test_all_vectors_in_one_tcp_stream():
    wire = b"".join(h(length + ws) for _, ws, length in VECTORS)
    buf = bytearray(wire)
    messages = split_tcp_frames(buf, 1 << 20)
    assert [decode_frame(m) for m in messages] == [f for f, _, _ in VECTORS]
    assert buf == b""


def test_constants():
    assert DEFAULT_PORT == 7070
    assert WEBSOCKET_PATH == "/reactivesocket"


def test_ignore_flag_on_known_frames_is_accepted_and_dropped():
    # I only matters for frames the receiver does not understand.
    assert decode_frame(h("00 80 0016 0000000000000005")) == Cancel(5)
    assert decode_frame(h("00 80 0001 0000000000000000")) == Setup()


def test_reserved_flag_bits_are_ignored():
    assert decode_frame(h("00 0f 0011 0000000000000001")) == RequestResponse(1)
    assert decode_frame(h("00 6f 0020 0000000000000001")) == Response(1)


@pytest.mark.parametrize(
    "hexdata,code,fragment",
    [
        ("00 00 0001 00000000000000", "malformed", "shorter than the 12-byte header"),
        ("", "malformed", "shorter"),
        ("01 00 0001 0000000000000000", "unsupported", "version 1"),
        ("ff 00 0016 0000000000000005", "unsupported", "version 255"),
        ("00 00 0001 0000000000000001", "malformed", "SETUP must use stream id 0"),
        ("00 00 0013 0000000000000001 00000000000000", "malformed", "Initial Request N"),
        ("00 00 0014 0000000000000001", "malformed", "Initial Request N"),
        ("00 00 0015 0000000000000001 00000000000001", "malformed", "must be 8 bytes"),
        ("00 00 0015 0000000000000001 000000000000000100", "malformed", "must be 8 bytes"),
        ("00 00 0016 0000000000000001 00", "malformed", "must be 0 bytes"),
        ("00 00 ffff 0000000000000001 000000", "malformed", "extended type"),
    ],
)
def test_malformed_frames(hexdata, code, fragment):
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(h(hexdata))
    assert info.value.code == code
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "length_hex,code",
    [
        ("80000010", "malformed"),  # reserved top bit
        ("0000000f", "malformed"),  # shorter than length + header
        ("00000000", "malformed"),
        ("00000405", "too_large"),  # 1029 - 4 > 1024
    ],
)
def test_bad_tcp_lengths_fail_at_once(length_hex, code):
    # Only the 4 length bytes are there: no waiting for the body.
    with pytest.raises(RemoteProtocolError) as info:
        split_tcp_frames(bytearray(h(length_hex)), 1024)
    assert info.value.code == code


def test_tcp_length_at_the_limit_waits_for_the_body():
    buf = bytearray(h("00000404"))  # 1028 - 4 == 1024
    assert split_tcp_frames(buf, 1024) == []
    assert buf == h("00000404")


@pytest.mark.parametrize(
    "frame",
    [
        RequestN(1, 1 << 63),
        RequestStream(1, -(1 << 63) - 1),
        Cancel(-1),
        Cancel(1 << 64),
        Ext(1, 1 << 32),
        UnknownFrame(0x10000, 0, 1),
    ],
)
def test_encoding_out_of_range_values_is_refused(frame):
    with pytest.raises(LocalProtocolError):
        encode_frame(frame)
