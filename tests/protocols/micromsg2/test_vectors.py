"""Byte-exact vectors: the spec's examples (corrected per the design brief's
errata) and one hand-written vector per frame type."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from polyport.protocols.micromsg2 import (
    Ack,
    ClientConnection,
    Command,
    Error,
    Extension,
    ExtensionSpec,
    Handshake,
    Message,
    ServerConnection,
    State,
    decode_ack_payload,
    decode_frame,
    decode_handshake,
    decode_properties,
    encode_ack_payload,
    encode_frame,
    encode_handshake,
    format_value,
    parse_value,
)
from polyport.protocols.micromsg2.negotiation import parse_extensions

from ._support import open_pair

# Spec "Client request": json;dotnet is 11 bytes (0x0b), not the printed 10.
CLIENT_HELLO = bytes.fromhex("01 00 00 04") + b"hulk" + bytes.fromhex("00 0b") + b"json;dotnet"
CLIENT_HELLO += bytes.fromhex("00 00")
# Spec "Server reply": the identity is printed as five letters "s r v e r" with
# length 5, which is self-consistent, so the vector keeps it.
SERVER_REPLY = bytes.fromhex("01 00 00 05") + b"srver" + bytes.fromhex("00 00 00 09") + b"batch-ack"
CLIENT_FINAL = CLIENT_HELLO[:-2] + bytes.fromhex("00 09") + b"batch-ack"


def test_client_hello_vector() -> None:
    hello = Handshake("hulk", (ExtensionSpec("json"), ExtensionSpec("dotnet")))
    assert encode_handshake(hello) == CLIENT_HELLO
    assert decode_handshake(CLIENT_HELLO) == (hello, len(CLIENT_HELLO))


def test_server_reply_vector() -> None:
    reply = Handshake("srver", optional=(ExtensionSpec("batch-ack"),))
    assert encode_handshake(reply) == SERVER_REPLY
    assert decode_handshake(SERVER_REPLY) == (reply, len(SERVER_REPLY))


def test_complete_handshake_example() -> None:
    server = ServerConnection("srver", ["json", "dotnet", "batch-ack"])
    client = ClientConnection("hulk", ["json", "dotnet"], supported=["batch-ack"])

    assert client.send(client.hello_frame()) == CLIENT_HELLO
    [hello] = server.receive_data(CLIENT_HELLO)
    assert isinstance(hello, Handshake) and hello.identity == "hulk"

    assert server.send(server.reply_frame()) == SERVER_REPLY
    client.receive_data(SERVER_REPLY)

    assert client.send(client.final_frame()) == CLIENT_FINAL
    server.receive_data(CLIENT_FINAL)

    for conn, peer in ((server, "hulk"), (client, "srver")):
        assert conn.state is State.OPEN
        neg = conn.negotiated
        assert neg is not None and neg.version == (1, 0) and neg.peer_identity == peer
        # "the extensions are indexed using the order in the final handshake message"
        assert [(e.index, e.name) for e in neg.extensions] == [
            (1, "json"),
            (2, "dotnet"),
            (3, "batch-ack"),
        ]
        assert neg.ack_window == 10  # batch-ack without max-count


def test_batch_ack_extension_frame_example() -> None:
    # Spec: "Flags Id Length SequenceNumber / 4 2 2 0 4"; extension frames carry
    # flag 2, so the frame is 02 02 02 00 04 and acks 1, 2, 3 and 4.
    frame = bytes.fromhex("02 02 02 00 04")
    assert encode_frame(Extension(2, encode_ack_payload(4))) == frame
    assert decode_frame(frame) == (Extension(2, b"\x00\x04"), 5)
    assert decode_ack_payload(b"\x00\x04") == 4

    server, client = open_pair(required=["json", "batch-ack"])
    assert server.negotiated is not None and server.negotiated.ack_index == 2
    for _ in range(4):
        client.receive_data(server.send(Message(server.next_seq, "topic/a", b"x")))
    assert client.send(Ack(4)) == frame
    [ack] = server.receive_data(frame)
    assert ack == Ack(4) and ack.acked == (1, 2, 3, 4)
    assert server.outbound.outstanding == 0


def test_dotnet_extension_frame_example() -> None:
    # Spec's DOTNET example with flag 2 and the id byte it leaves out (2 =
    # dotnet's index in the complete handshake example); the name is 50 bytes.
    type_name = b"OneTrueError.Contracts.Reports,OneTrueError.Client"
    frame = bytes.fromhex("02 02 32") + type_name
    assert encode_frame(Extension(2, type_name)) == frame
    assert decode_frame(frame) == (Extension(2, type_name), len(frame))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "extensionName1:propName1=propValue2,propName2=Hello%20%25%20mother%20fucker!;",
            [
                ExtensionSpec(
                    "extensionName1",
                    {"propName1": "propValue2", "propName2": "Hello % mother fucker!"},
                )
            ],
        ),
        (
            "json;xml;protobuf",
            [ExtensionSpec("json"), ExtensionSpec("xml"), ExtensionSpec("protobuf")],
        ),
        (
            "json;xml;protobuf;",
            [ExtensionSpec("json"), ExtensionSpec("xml"), ExtensionSpec("protobuf")],
        ),
        (
            "batch-ack:max-count=10;json;microauth",
            [
                ExtensionSpec("batch-ack", {"max-count": "10"}),
                ExtensionSpec("json"),
                ExtensionSpec("microauth"),
            ],
        ),
        (
            "json;ack;batch-ack",
            [ExtensionSpec("json"), ExtensionSpec("ack"), ExtensionSpec("batch-ack")],
        ),
        ("batch-ack:max-count=100;", [ExtensionSpec("batch-ack", {"max-count": "100"})]),
        (
            "x-auth:user=jonas,password=p%40ss%3Bword",
            [ExtensionSpec("x-auth", {"user": "jonas", "password": "p@ss;word"})],
        ),
    ],
)
def test_extension_list_examples(text: str, expected: list[ExtensionSpec]) -> None:
    assert list(parse_extensions(text)) == expected


def test_message_vector() -> None:
    msg = Message(1, "topic/orders", b'{"a":1}', {"first_name": "jonas"})
    wire = (
        bytes.fromhex("00 0001 0c")
        + b"topic/orders"
        + bytes.fromhex("0012")
        + b"first_name:Tjonas;"
        + bytes.fromhex("07")
        + b'{"a":1}'
    )
    assert encode_frame(msg) == wire
    assert decode_frame(wire) == (msg, len(wire))


def test_spec_properties_example() -> None:
    props = decode_properties(b"first_name:jonas;twitter:jgauffin;")
    assert props == {"first_name": "jonas", "twitter": "jgauffin"}


def test_command_vector() -> None:
    cmd = Command("subscribe", {"destination": "topic/orders", "filter": "age>N18;name<TJo"})
    payload = b"subscribe;destination=topic%2Forders,filter=age%3EN18%3Bname%3CTJo"
    wire = bytes.fromhex("01 42") + payload
    assert len(payload) == 0x42
    assert encode_frame(cmd) == wire
    assert decode_frame(wire) == (cmd, len(wire))
    assert decode_frame(bytes.fromhex("01 09") + b"subscribe") == (Command("subscribe"), 11)


def test_error_vector() -> None:
    err = Error.from_code("unsupported", "no")
    wire = bytes.fromhex("04 0f") + b"unsupported: no"
    assert encode_frame(err) == wire
    assert decode_frame(wire) == (err, len(wire))
    assert err.code == "unsupported" and err.text == "no"
    assert Error("plain words").code is None


def test_large_payload_vector() -> None:
    ext = Extension(1, b"x" * 300)
    wire = bytes.fromhex("0a 01 0000012c") + b"x" * 300
    assert encode_frame(ext) == wire
    assert decode_frame(wire) == (ext, len(wire))
    # LARGE_PAYLOAD on a short payload is accepted too.
    assert decode_frame(bytes.fromhex("0c 00000002") + b"hi") == (Error("hi"), 7)
    # 255 bytes still fit the one-byte length; 256 do not.
    assert encode_frame(Extension(1, b"y" * 255))[:3] == bytes.fromhex("02 01 ff")
    assert encode_frame(Extension(1, b"y" * 256))[:6] == bytes.fromhex("0a 01 00000100")


def test_continued_vector() -> None:
    msg = Message(7, "q", b"abcdef")
    wire = bytes.fromhex("10 0007 01 71 0000 04 61626364  00 0007 01 71 0000 02 6566")
    assert encode_frame(msg, fragment_size=4) == wire
    assert decode_frame(wire) == (msg, len(wire))
    assert decode_frame(wire[:11]) is None  # first fragment alone: waits


def test_filter_value_vectors() -> None:
    when = datetime(2014, 10, 13, 11, 0, tzinfo=UTC)  # "2014-10-13 12:00 UTC+1"
    assert parse_value("D1413198000.0", strict=True) == when
    assert format_value(when) == "D1413198000.0"
    assert parse_value("THello%20%22world%22", strict=True) == 'Hello "world"'
    assert format_value('Hello "world"') == "THello%20%22world%22"
    assert parse_value("N1", strict=True) == 1
    assert format_value(1) == "N1"
