"""Byte-exact vectors: every message type against hand-written hex."""

from __future__ import annotations

import uuid

import pytest

from polyport.protocols.segment import frames as f
from polyport.protocols.segment.connection import ClientConnection, ServerConnection
from polyport.protocols.segment.errors import ProtocolError
from polyport.protocols.segment.frames import (
    AppendSetup,
    AuthFailed,
    BeginAppendBlock,
    DataAppended,
    EndAppendBlock,
    ErrorMessage,
    Event,
    KeepAlive,
    NoSuchSegment,
    PartialKind,
    PartialMessage,
    ReadSegment,
    SegmentRead,
    SetupAppend,
)
from polyport.protocols.segment.state import BlockEvents
from polyport.protocols.segment.wire import decode_frame, encode_frame

CID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
CID_HEX = "00112233445566778899aabbccddeeff"


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", "").replace("\n", ""))


VECTORS = [
    (Event(b"hi"), "00000000 00000002 6869"),
    (Event(b""), "00000000 00000000"),
    (SetupAppend(CID, "a/b"), f"00000001 00000015 {CID_HEX} 0003 612f62"),
    # NUL is C0 80, U+1F600 is a surrogate pair of two three-byte forms.
    (
        SetupAppend(CID, "a\x00\U0001f600"),
        f"00000001 0000001b {CID_HEX} 0009 61 c080 eda0bd edb880",
    ),
    (AppendSetup("a/b", CID, 42), f"00000002 0000001d 0003 612f62 {CID_HEX} 000000000000002a"),
    (AppendSetup("é", CID, 0), f"00000002 0000001c 0002 c3a9 {CID_HEX} 0000000000000000"),
    (
        BeginAppendBlock(CID, 256, 47),
        f"00000003 0000001c {CID_HEX} 0000000000000100 0000002f",
    ),
    (
        EndAppendBlock(CID, 312, 56),
        f"00000004 0000001c {CID_HEX} 0000000000000138 00000038",
    ),
    (DataAppended(CID, 312), f"00000007 00000018 {CID_HEX} 0000000000000138"),
    (DataAppended(CID, -1), f"00000007 00000018 {CID_HEX} ffffffffffffffff"),
    (ReadSegment("s", 1024, 4096), "00000009 0000000f 0001 73 0000000000000400 00001000"),
    # The optional credentials string at the very end (docs/protocols/segment.md).
    (SetupAppend(CID, "a/b", "alice:pw"),
     f"00000001 0000001f {CID_HEX} 0003 612f62 0008 616c6963653a7077"),
    (ReadSegment("s", 1024, 4096, "bob:x"),
     "00000009 00000016 0001 73 0000000000000400 00001000 0005 626f623a78"),
    (
        SegmentRead("s", 1024, True, False, b"\x00\x01"),
        "0000000a 0000000e 0001 73 0000000000000400 01 0001",
    ),
    (SegmentRead("s", 0, False, True, b""), "0000000a 0000000c 0001 73 0000000000000000 02"),
    (SegmentRead("s", 0, True, True, b""), "0000000a 0000000c 0001 73 0000000000000000 03"),
    (SegmentRead("s", 0, False, False, b"z"), "0000000a 0000000d 0001 73 0000000000000000 00 7a"),
    (PartialMessage(PartialKind.BEGIN, b""), "fffffffe 00000001 00"),
    (PartialMessage(PartialKind.MIDDLE, b"ab"), "fffffffe 00000003 01 6162"),
    (PartialMessage(PartialKind.END, b"\xff"), "fffffffe 00000002 02 ff"),
    (KeepAlive(), "00000064 00000000"),
    (KeepAlive(b"\x01\x02"), "00000064 00000002 0102"),
    (NoSuchSegment("s", "gone"), "00000035 00000009 0001 73 0004 676f6e65"),
    (AuthFailed("s", "no"), "0000003c 00000007 0001 73 0002 6e6f"),
    (ErrorMessage("", "malformed", "x"), "0000003d 00000010 0000 0009 6d616c666f726d6564 0001 78"),
]


@pytest.mark.parametrize(("frame", "hexdata"), VECTORS)
def test_encode(frame: f.Frame, hexdata: str) -> None:
    assert encode_frame(frame) == h(hexdata)


@pytest.mark.parametrize(("frame", "hexdata"), VECTORS)
def test_decode(frame: f.Frame, hexdata: str) -> None:
    assert decode_frame(h(hexdata)) == frame


def test_every_type_has_a_vector() -> None:
    assert {f.FRAME_TYPES[type(frame)] for frame, _ in VECTORS} == set(f.TYPE_NAMES)


def test_type_codes_are_the_original_numbering() -> None:
    assert (f.EVENT, f.SETUP_APPEND, f.APPEND_SETUP, f.BEGIN_APPEND_BLOCK) == (0, 1, 2, 3)
    assert (f.END_APPEND_BLOCK, f.DATA_APPENDED, f.READ_SEGMENT, f.SEGMENT_READ) == (4, 7, 9, 10)
    assert (f.PARTIAL_MESSAGE, f.KEEP_ALIVE) == (-2, 100)
    assert (f.NO_SUCH_SEGMENT, f.AUTH_FAILED, f.ERROR_MESSAGE) == (53, 60, 61)
    assert (f.FLAG_AT_TAIL, f.FLAG_END_OF_SEGMENT) == (0x01, 0x02)
    assert f.DEFAULT_PORT == 12345


def test_uuid_is_most_significant_byte_first() -> None:
    data = encode_frame(DataAppended(uuid.UUID(int=1), 0))
    assert data[8:24] == b"\x00" * 15 + b"\x01"


def test_split_block_wire_bytes() -> None:
    """The spec's trick: [Begin][Event][Partial Begin][End][Partial End]."""
    from polyport.protocols.segment.client import encode_block

    # Event "ab" framed: 00000000 00000002 6162 (10 bytes); event "xyz": 11 bytes,
    # cut after 4 bytes.  Boundary = 10 + (9 + 4) = 23 wire bytes before End.
    data = encode_block(CID, 100, [b"ab", b"xyz"], boundary=23)
    assert data == h(
        f"00000003 0000001c {CID_HEX} 0000000000000064 00000017"
        "00000000 00000002 6162"
        "fffffffe 00000005 00 00000000"
        f"00000004 0000001c {CID_HEX} 0000000000000079 00000015"
        "fffffffe 00000008 02 00000003 78797a"
    )
    server = ServerConnection()
    server.receive_data(encode_frame(SetupAppend(CID, "s")))
    server.send(AppendSetup("s", CID, 100))
    (block,) = server.receive_data(data)
    assert isinstance(block, BlockEvents)
    assert block.events == (b"ab", b"xyz")
    assert (block.offset, block.end_offset) == (100, 121)


@pytest.mark.parametrize(
    ("hexdata", "reason"),
    [
        ("0000000a 0000000c 0001 73 0000000000000000 04", "reserved bits"),
        ("fffffffe 00000001 03", "kind 3"),
        ("00000001 00000013 " + CID_HEX + " 0002 61", "too short"),
        # One byte after the segment: a credentials length cut short.
        ("00000001 00000014 " + CID_HEX + " 0001 61 62", "too short for its fields"),
        ("00000001 00000017 " + CID_HEX + " 0001 61 0001 62 63", "after its last field"),
        ("00000009 00000013 0001 73 0000000000000400 00001000 0003 6263",
         "too short for its fields"),
        ("00000001 00000013 " + CID_HEX + " 0001 00", "zero byte"),
        ("00000003 0000001b " + CID_HEX + " 0000000000000000 000000", "must be 28"),
        ("00000007 00000019 " + CID_HEX + " 0000000000000000 00", "must be 24"),
        ("0000000b 00000000", "unknown message type 11"),
        ("00000000 01000000", "under 2^24"),
        ("00000009 00000002 0000", "at least 14"),
    ],
)
def test_malformed(hexdata: str, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason.replace("^", r"\^")):
        decode_frame(h(hexdata))


def test_length_above_limit_fails_on_the_header_alone() -> None:
    server = ServerConnection(max_message_size=1000)
    with pytest.raises(ProtocolError, match="maximum message size") as info:
        server.receive_data(h("00000000 000003e9"))
    assert info.value.code == "too_large"
    with pytest.raises(ProtocolError, match="2\\^24"):
        ServerConnection().receive_data(h("00000000 ff000000"))


def test_direction_is_checked_on_the_header() -> None:
    with pytest.raises(ProtocolError, match="APPEND_SETUP is not a message a client may send"):
        ServerConnection().receive_data(h("00000002 0000001d"))
    with pytest.raises(ProtocolError, match="SETUP_APPEND is not a message a server may send"):
        ClientConnection().receive_data(h("00000001 00000015"))


@pytest.mark.parametrize(
    ("credentials", "expected"),
    [("", (None, None)), ("alice:pw", ("alice", "pw")), ("alice:p:w", ("alice", "p:w")),
     ("alice", ("alice", "")), (":pw", ("", "pw"))],
)
def test_credentials_split_at_the_first_colon(
    credentials: str, expected: tuple[str | None, str | None]
) -> None:
    assert f.split_credentials(credentials) == expected


def test_credentials_stay_out_of_repr() -> None:
    assert "secret" not in repr(SetupAppend(CID, "a/b", "alice:secret"))
    assert "secret" not in repr(ReadSegment("a/b", 0, 1, "alice:secret"))
