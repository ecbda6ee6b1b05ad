"""Byte-exact vectors, written by hand from the BSON spec (bsonspec.org):
document = int32 total length (LE, counts itself) + elements + 0x00;
element = type byte + cstring key + value.  0x02 string (int32 length
counting the NUL, bytes, NUL), 0x03 document, 0x08 boolean, 0x10 int32,
0x12 int64."""

from __future__ import annotations

import pytest
from bson.int64 import Int64

from polyport.protocols.bson import (
    AbortTx,
    AckEv,
    CommitTx,
    Connect,
    Emit,
    Ping,
    Query,
    QueryAck,
    QueryResponse,
    QueryResult,
    Recev,
    RemoteProtocolError,
    Response,
    ServerConnection,
    StartTx,
    SubResponse,
    Subscribe,
    Unsubscribe,
    decode_frame,
    encode_frame,
)
from polyport.protocols.bson.frames import FRAME_CLASSES, Frame
from tests.protocols.bson.strategies import h

# The example in the spec: CONNECT {version "1.0", username "tim", password "1234"}.
CONNECT_SPEC = h("""
    59000000                                    # length 89
    02 7479706500 08000000 434f4e4e45435400     # type: "CONNECT"
    03 6672616d6500                             # frame:
       3b000000                                 #   length 59
       02 76657273696f6e00 04000000 312e3000    #   version: "1.0"
       02 757365726e616d6500 04000000 74696d00  #   username: "tim"
       02 70617373776f726400 05000000 3132333400  # password: "1234"
       00
    00
""")

CONNECT_MINIMAL = h("""
    34000000                                    # length 52
    02 7479706500 08000000 434f4e4e45435400     # type: "CONNECT"
    03 6672616d6500 16000000                    # frame (22 bytes):
       02 76657273696f6e00 04000000 302e3100    #   version: "0.1"
       00
    00
""")

RESPONSE_OK = h("""
    29000000                                    # length 41
    02 7479706500 09000000 524553504f4e534500   # type: "RESPONSE"
    03 6672616d6500 0a000000                    # frame (10 bytes):
       08 6f6b00 01                             #   ok: true
       00
    00
""")

RESPONSE_ERROR = h("""
    5a000000                                    # length 90
    02 7479706500 09000000 524553504f4e534500   # type: "RESPONSE"
    03 6672616d6500 3b000000                    # frame (59 bytes):
       08 6f6b00 00                             #   ok: false
       02 657272436f646500 0c000000 756e737570706f7274656400  # errCode: "unsupported"
       02 6572724d736700 0c000000 6261642076657273696f6e00    # errMsg: "bad version"
       00
    00
""")

EMIT = h("""
    7c000000                                    # length 124
    02 7479706500 05000000 454d495400           # type: "EMIT"
    03 6672616d6500 61000000                    # frame (97 bytes):
       02 73747265616d4e616d6500 07000000 6f726465727300  # streamName: "orders"
       02 6576656e745479706500 09000000 6164645f6974656d00  # eventType: "add_item"
       03 6576656e7400 1a000000                 #   event (26 bytes):
          02 736b7500 03000000 413100           #     sku: "A1"
          10 71747900 02000000                  #     qty: int32 2
          00
       10 73657373494400 07000000               #   sessID: int32 7
       00
    00
""")

STARTTX = h("""
    2f000000 02 7479706500 08000000 5354415254545800   # type: "STARTTX"
    03 6672616d6500 11000000 10 73657373494400 07000000 00  # frame: {sessID: 7}
    00
""")

COMMITTX = h("""
    30000000 02 7479706500 09000000 434f4d4d4954545800  # type: "COMMITTX"
    03 6672616d6500 11000000 10 73657373494400 07000000 00  # frame: {sessID: 7}
    00
""")

ABORTTX = h("""
    2f000000 02 7479706500 08000000 41424f5254545800   # type: "ABORTTX"
    03 6672616d6500 11000000 10 73657373494400 07000000 00  # frame: {sessID: 7}
    00
""")

SUBSCRIBE = h("""
    a7000000                                    # length 167
    02 7479706500 0a000000 53554253435249424500 # type: "SUBSCRIBE"
    03 6672616d6500 87000000                    # frame (135 bytes):
       02 73747265616d4e616d6500 07000000 6f726465727300    # streamName: "orders"
       02 6576656e745479706500 09000000 6164645f6974656d00  # eventType: "add_item"
       12 7374617274536571 00 0500000000000000  #   startSeq: int64 5
       12 737461727454696d657374616d7000 0068e5cf8b010000  # startTimestamp: int64 1.7e12
       02 64757261626c65494400 03000000 643100  #   durableID: "d1"
       03 6d61746368657200 0e000000             #   matcher (14 bytes):
          10 71747900 02000000 00               #     qty: int32 2
       00
    00
""")

SUBSCRIBE_MINIMAL = h("""
    3c000000 02 7479706500 0a000000 53554253435249424500   # type: "SUBSCRIBE"
    03 6672616d6500 1c000000                                # frame (28 bytes):
       02 73747265616d4e616d6500 07000000 6f726465727300    # streamName: "orders"
       00
    00
""")

# startSeq sent as int32 (as drivers do for small numbers): accepted.
SUBSCRIBE_INT32_START = h("""
    4a000000 02 7479706500 0a000000 53554253435249424500   # type: "SUBSCRIBE"
    03 6672616d6500 2a000000                                # frame (42 bytes):
       02 73747265616d4e616d6500 07000000 6f726465727300    # streamName: "orders"
       10 737461727453657100 05000000                       # startSeq: int32 5
       00
    00
""")

SUBRESPONSE = h("""
    37000000 02 7479706500 0c000000 535542524553504f4e534500  # type: "SUBRESPONSE"
    03 6672616d6500 15000000                    # frame (21 bytes):
       08 6f6b00 01                             #   ok: true
       10 737562494400 01000000                 #   subID: 1
       00
    00
""")

UNSUBSCRIBE = h("""
    32000000 02 7479706500 0c000000 554e53554253435249424500  # type: "UNSUBSCRIBE"
    03 6672616d6500 10000000 10 737562494400 01000000 00       # frame: {subID: 1}
    00
""")

RECEV = h("""
    9e000000                                    # length 158
    02 7479706500 06000000 524543455600         # type: "RECEV"
    03 6672616d6500 82000000                    # frame (130 bytes):
       10 737562494400 01000000                 #   subID: 1
       02 73747265616d4e616d6500 07000000 6f726465727300    # streamName: "orders"
       02 6576656e745479706500 09000000 6164645f6974656d00  # eventType: "add_item"
       12 74696d657374616d7000 0068e5cf8b010000 #   timestamp: int64 1700000000000
       12 7365714e6f00 0000000000000000         #   seqNo: int64 0
       03 6576656e7400 1a000000                 #   event (26 bytes):
          02 736b7500 03000000 413100           #     sku: "A1"
          10 71747900 02000000                  #     qty: 2
          00
       00
    00
""")

ACKEV = h("""
    37000000 02 7479706500 06000000 41434b455600  # type: "ACKEV"
    03 6672616d6500 1b000000                    # frame (27 bytes):
       10 737562494400 01000000                 #   subID: 1
       10 627974657300 9e000000                 #   bytes: 158
       00
    00
""")

QUERY = h("""
    63000000 02 7479706500 06000000 515545525900  # type: "QUERY"
    03 6672616d6500 47000000                    # frame (71 bytes):
       10 71756572794944 00 03000000            #   queryID: 3
       02 62696e64657200 08000000 6261736b65747300  # binder: "baskets"
       03 6d61746368657200 18000000             #   matcher (24 bytes):
          03 71747900 0e000000                  #     qty (14 bytes):
             10 24677400 01000000 00            #       $gt: 1
          00
       00
    00
""")

QUERYRESPONSE = h("""
    4a000000 02 7479706500 0e000000 5155455259524553504f4e534500  # type: "QUERYRESPONSE"
    03 6672616d6500 26000000                    # frame (38 bytes):
       10 7175657279494400 03000000             #   queryID: 3
       12 6e756d526573756c747300 0200000000000000  # numResults: int64 2
       00
    00
""")

QUERYRESULT = h("""
    4c000000 02 7479706500 0c000000 5155455259524553554c5400  # type: "QUERYRESULT"
    03 6672616d6500 2a000000                    # frame (42 bytes):
       10 7175657279494400 03000000             #   queryID: 3
       03 726573756c7400 10000000               #   result (16 bytes):
          02 696400 03000000 623100 00          #     id: "b1"
       00
    00
""")

QUERYACK = h("""
    31000000 02 7479706500 09000000 51554552594143 4b00  # type: "QUERYACK"
    03 6672616d6500 12000000 10 7175657279494400 03000000 00  # frame: {queryID: 3}
    00
""")

PING = h("""
    20000000 02 7479706500 05000000 50494e4700  # type: "PING"
    03 6672616d6500 05000000 00                 # frame: {}
    00
""")

EVENT = {"sku": "A1", "qty": 2}

VECTORS: list[tuple[str, bytes, Frame]] = [
    ("connect-spec", CONNECT_SPEC, Connect(version="1.0", username="tim", password="1234")),
    ("connect-minimal", CONNECT_MINIMAL, Connect(version="0.1")),
    ("response-ok", RESPONSE_OK, Response(ok=True)),
    (
        "response-error",
        RESPONSE_ERROR,
        Response(ok=False, err_code="unsupported", err_msg="bad version"),
    ),
    ("emit", EMIT, Emit("orders", "add_item", EVENT, sess_id=7)),
    ("starttx", STARTTX, StartTx(7)),
    ("committx", COMMITTX, CommitTx(7)),
    ("aborttx", ABORTTX, AbortTx(7)),
    (
        "subscribe",
        SUBSCRIBE,
        Subscribe(
            "orders",
            event_type="add_item",
            start_seq=5,
            start_timestamp=1_700_000_000_000,
            durable_id="d1",
            matcher={"qty": 2},
        ),
    ),
    ("subscribe-minimal", SUBSCRIBE_MINIMAL, Subscribe("orders")),
    ("subresponse", SUBRESPONSE, SubResponse(ok=True, sub_id=1)),
    ("unsubscribe", UNSUBSCRIBE, Unsubscribe(1)),
    ("recev", RECEV, Recev(1, "orders", "add_item", 1_700_000_000_000, 0, EVENT)),
    ("ackev", ACKEV, AckEv(1, num_bytes=158)),
    ("query", QUERY, Query(3, "baskets", {"qty": {"$gt": 1}})),
    ("queryresponse", QUERYRESPONSE, QueryResponse(3, 2)),
    ("queryresult", QUERYRESULT, QueryResult(3, {"id": "b1"})),
    ("queryack", QUERYACK, QueryAck(3)),
    ("ping", PING, Ping()),
]


@pytest.mark.parametrize(("name", "wire", "frame"), VECTORS, ids=[v[0] for v in VECTORS])
def test_encode_matches_vector(name: str, wire: bytes, frame: Frame) -> None:
    assert encode_frame(frame) == wire


@pytest.mark.parametrize(("name", "wire", "frame"), VECTORS, ids=[v[0] for v in VECTORS])
def test_decode_matches_vector(name: str, wire: bytes, frame: Frame) -> None:
    assert decode_frame(wire) == frame


def test_every_frame_type_has_a_vector() -> None:
    assert {type(frame) for _, _, frame in VECTORS} == set(FRAME_CLASSES.values())


def test_recev_vector_length_is_the_ackev_byte_count() -> None:
    # ACKEV bytes counts whole RECEV frames: the vector above acks this one.
    assert len(RECEV) == 158 == decode_frame(ACKEV).num_bytes  # type: ignore[union-attr]


def test_int32_accepted_where_int64_expected() -> None:
    frame = decode_frame(SUBSCRIBE_INT32_START)
    assert frame == Subscribe("orders", start_seq=5)
    # Re-encoded canonically as int64.
    assert b"\x12startSeq\x00" in encode_frame(frame)


def test_int64_values_encoded_as_int64_even_when_small() -> None:
    wire = encode_frame(QueryResponse(3, 0))
    assert b"\x12numResults\x00" + bytes(8) in wire


def test_decoded_int64_is_plain_int() -> None:
    frame = decode_frame(RECEV)
    assert isinstance(frame, Recev)
    assert type(frame.timestamp) is int and not isinstance(frame.timestamp, Int64)


# --- malformed vectors -------------------------------------------------------------

ERROR_VECTORS: list[tuple[str, bytes, str, str]] = [
    ("empty-document", h("05000000 00"), "malformed", "no 'type'"),
    ("length-4", h("04000000"), "malformed", "invalid frame length 4"),
    ("length-negative", h("ffffffff"), "malformed", "invalid frame length -1"),
    ("length-huge", h("ffffff7f"), "too_large", "exceeds the maximum frame size"),
    (
        "unknown-type",
        h("""1f000000 02 7479706500 04000000 464f4f00   # type: "FOO"
             03 6672616d6500 05000000 00 00"""),
        "unsupported",
        "unknown frame type 'FOO'",
    ),
    (
        "type-not-string",
        h("""1b000000 10 7479706500 01000000          # type: int32 1
             03 6672616d6500 05000000 00 00"""),
        "malformed",
        "'type' must be string, got int32",
    ),
    (
        "frame-missing",
        h("14000000 02 7479706500 05000000 50494e4700 00"),
        "malformed",
        "PING: missing 'frame'",
    ),
    (
        "frame-is-array",
        h("""20000000 02 7479706500 05000000 50494e4700
             04 6672616d6500 05000000 00 00"""),
        "malformed",
        "'frame' must be document, got array",
    ),
    (
        "response-ok-int32",
        h("""2c000000 02 7479706500 09000000 524553504f4e534500
             03 6672616d6500 0d000000 10 6f6b00 01000000 00 00"""),
        "malformed",
        "RESPONSE: field 'ok' must be boolean, got int32",
    ),
    (
        "connect-without-version",
        h("""2c000000 02 7479706500 08000000 434f4e4e45435400
             03 6672616d6500 0e000000 02 7800 02000000 7900 00 00"""),
        "malformed",
        "CONNECT: missing mandatory field 'version'",
    ),
    (
        "starttx-sessid-int64",
        h("""33000000 02 7479706500 08000000 5354415254545800
             03 6672616d6500 15000000 12 73657373494400 0700000000000000 00 00"""),
        "malformed",
        "STARTTX: field 'sessID' must be int32, got int64",
    ),
    (
        "bad-utf8",
        h("""20000000 02 7479706500 05000000 50ff4e4700
             03 6672616d6500 05000000 00 00"""),
        "malformed",
        "invalid BSON",
    ),
    (
        "missing-terminator",
        h("""20000000 02 7479706500 05000000 50494e4700
             03 6672616d6500 05000000 00 01"""),
        "malformed",
        "invalid BSON",
    ),
]


@pytest.mark.parametrize(
    ("name", "wire", "code", "message"), ERROR_VECTORS, ids=[v[0] for v in ERROR_VECTORS]
)
def test_error_vectors(name: str, wire: bytes, code: str, message: str) -> None:
    # Through a connection in CONNECTED state, fed byte-complete input.
    conn = ServerConnection()
    conn.receive_data(CONNECT_MINIMAL)
    conn.send(Response(ok=True))
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(wire)
    assert info.value.code == code
    assert message in info.value.message
