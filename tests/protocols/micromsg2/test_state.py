"""Illegal sequences, malformed frames and bounds."""

from __future__ import annotations

import pytest

from polyport.protocols.micromsg2 import (
    Ack,
    ClientConnection,
    Command,
    Error,
    Extension,
    Handshake,
    Message,
    ProtocolError,
    ServerConnection,
    State,
    encode_frame,
    encode_handshake,
    error_frame,
)
from polyport.protocols.micromsg2.state import CLIENT_TRANSITIONS, SERVER_TRANSITIONS, Direction

from ._support import open_pair


def test_tables_only_open_carries_frames() -> None:
    for table in (SERVER_TRANSITIONS, CLIENT_TRANSITIONS):
        for (state, _direction, frame_type), _next in table.items():
            if frame_type in (Message, Command, Extension, Ack):
                assert state is State.OPEN


def test_server_cannot_send_frames_before_the_handshake() -> None:
    server = ServerConnection("srv")
    for frame in (Message(1, "topic/a"), Command("subscribe"), Extension(1), Ack(1)):
        with pytest.raises(ProtocolError, match=r"cannot send a .* in state await_hello"):
            server.send(frame)
    assert server.state is State.AWAIT_HELLO


def test_server_cannot_reply_twice() -> None:
    server = ServerConnection("srv")
    server.receive_data(encode_handshake(Handshake("c")))
    server.send(server.reply_frame())
    with pytest.raises(ProtocolError, match="cannot send a Handshake frame in state await_final"):
        server.send(Handshake("srv"))


def test_client_sending_two_hellos_in_a_row() -> None:
    server = ServerConnection("srv")
    hello = encode_handshake(Handshake("c"))
    with pytest.raises(
        ProtocolError, match="cannot receive a Handshake frame in state hello_received"
    ):
        server.receive_data(hello + hello)
    assert server.state is State.CLOSED
    server.send(Error("malformed: two hellos"))  # the one thing left to do
    with pytest.raises(ProtocolError):
        server.send(Message(1, "topic/a"))


def test_an_error_may_arrive_in_every_state_but_closed() -> None:
    for table in (SERVER_TRANSITIONS, CLIENT_TRANSITIONS):
        states = {state for (state, _, _) in table} - {State.CLOSED}
        for state in states:
            assert (state, Direction.RECEIVE, Error) in table
    server = ServerConnection("srv")
    frames = server.receive_data(encode_handshake(Handshake("c")) + encode_frame(Error("bye")))
    assert frames[1] == Error("bye") and server.state is State.CLOSED


def test_client_cannot_send_before_hello_or_twice_final() -> None:
    client = ClientConnection("c")
    with pytest.raises(ProtocolError, match="state start"):
        client.send(Message(1, "topic/a"))
    _server, client = open_pair()
    with pytest.raises(ProtocolError, match="cannot send a Handshake frame in state open"):
        client.send(client.hello_frame())


def test_received_bytes_in_open_state_are_frames_not_handshakes() -> None:
    server, _client = open_pair()
    # A handshake's first byte (major 1) reads as COMMAND; its length 0 gives
    # an empty command name.
    with pytest.raises(ProtocolError, match="command name"):
        server.receive_data(encode_handshake(Handshake("c")))


def test_error_after_handshake_keeps_the_connection_open() -> None:
    server, client = open_pair(optional=["pubsub"])
    [err] = client.receive_data(server.send(Error.from_code("not_found", "no such stream")))
    assert isinstance(err, Error) and err.code == "not_found"
    assert client.state is State.OPEN and server.state is State.OPEN


def test_protocol_error_closes_and_allows_one_error_frame() -> None:
    server, client = open_pair()
    with pytest.raises(ProtocolError, match="unknown frame flag bits") as info:
        server.receive_data(b"\x80")
    assert server.state is State.CLOSED
    data = server.send(error_frame(info.value))
    assert client.receive_data(data) == [Error("malformed: unknown frame flag bits 0x80")]
    with pytest.raises(ProtocolError, match="connection is closed"):
        server.receive_data(b"\x00")


@pytest.mark.parametrize("flags", [0x03, 0x05, 0x06, 0x07, 0x0B, 0x20, 0x40])
def test_bad_flags(flags: int) -> None:
    server, _ = open_pair()
    with pytest.raises(ProtocolError):
        server.receive_data(bytes([flags]))


def test_extension_ids_are_checked() -> None:
    server, client = open_pair(optional=["json", "pubsub"])
    assert client.receive_data(server.send(Extension(2, b"p"))) == [Extension(2, b"p")]
    for bad in (0, 3, 255):
        with pytest.raises(ProtocolError, match=f"id {bad}, but 2 extension"):
            server.send(Extension(bad))
    with pytest.raises(ProtocolError, match="id 3, but 2 extension"):
        client.receive_data(encode_frame(Extension(3)))


def test_raw_extension_frame_for_the_ack_index_is_an_ack() -> None:
    server, client = open_pair(required=["json", "ack"])
    client.receive_data(server.send(Message(1, "topic/a")))
    data = client.send(Extension(2, b"\x00\x01"))
    assert server.receive_data(data) == [Ack(1)]
    with pytest.raises(ProtocolError, match="ack payload must be 2 bytes"):
        server.receive_data(encode_frame(Extension(2, b"\x01")))


def test_outbound_numbering_is_enforced() -> None:
    server, _ = open_pair()
    with pytest.raises(ProtocolError, match="expected 1"):
        server.send(Message(2, "topic/a"))
    server.send(Message(1, "topic/a"))
    assert server.next_seq == 2


def test_continued_frames_must_not_interleave() -> None:
    _server, client = open_pair(optional=["json"])
    first = encode_frame(Message(1, "topic/a", b"abcdef"), fragment_size=3)
    part = first[: len(first) // 2]
    assert client.receive_data(part) == []
    with pytest.raises(ProtocolError, match="COMMAND frame arrived inside a CONTINUED MESSAGE"):
        client.receive_data(encode_frame(Command("x")))


def test_continued_header_must_not_change() -> None:
    _server, client = open_pair()
    a = encode_frame(Message(1, "topic/a", b"abcdef"), fragment_size=3)
    b = encode_frame(Message(1, "topic/b", b"abcdef"), fragment_size=3)
    half = len(a) // 2
    with pytest.raises(ProtocolError, match="header changed"):
        client.receive_data(a[:half] + b[half:])


def test_error_interrupts_a_continued_frame() -> None:
    _server, client = open_pair()
    a = encode_frame(Message(1, "topic/a", b"abcdef"), fragment_size=3)
    frames = client.receive_data(a[: len(a) // 2] + encode_frame(Error("gave up")))
    assert frames == [Error("gave up")]
    assert client.receive_data(encode_frame(Message(2, "q", b"ok"))) == [Message(2, "q", b"ok")]


def test_declared_length_over_the_limit_fails_at_once() -> None:
    server, _client = open_pair(max_payload=1000)
    header = bytes.fromhex("08 0001 01 71 0000 000003e9")  # 1001 bytes declared, none sent
    with pytest.raises(ProtocolError, match="exceeds the limit of 1000") as info:
        server.receive_data(header)
    assert info.value.code == "too_large"


def test_continued_total_is_bounded() -> None:
    server, _client = open_pair(max_payload=1000)
    data = encode_frame(Message(1, "q", b"x" * 1001), fragment_size=600)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        server.receive_data(data)
    server, _client = open_pair(max_payload=1000)
    data = encode_frame(Message(1, "q", b"x" * 1000), fragment_size=300)
    assert server.receive_data(data) == [Message(1, "q", b"x" * 1000)]


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (Message(1, "d" * 256), "destination is 256 bytes"),
        (Message(1, "q", properties={"k": "v" * 70000}), "properties is"),
        (Message(70000, "q"), "does not fit 16 bits"),
        (Command("Bad Name"), "command name"),
        (Command("x", {"bad key": "v"}), "argument name"),
        (Extension(256), "does not fit one byte"),
    ],
)
def test_unencodable_frames(frame: Message | Command | Extension, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        encode_frame(frame)


def test_unencodable_handshakes() -> None:
    with pytest.raises(ProtocolError, match="identity is 256 bytes"):
        encode_handshake(Handshake("i" * 256))
    with pytest.raises(ProtocolError, match="major version 256"):
        encode_handshake(Handshake("c", major=256))


@pytest.mark.parametrize(
    "payload",
    [b"", b";a=b", b"sub;a", b"sub;a=1,a=2", b"s\xff", b"sub;a=%ff", b"s t"],
)
def test_malformed_commands(payload: bytes) -> None:
    server, _ = open_pair()
    with pytest.raises(ProtocolError):
        server.receive_data(bytes([1, len(payload)]) + payload)


def test_malformed_message_fields() -> None:
    for dest, props in ((b"\xff", b""), (b"q", b"novalue;"), (b"q", b"a:1;a:2;"), (b"q", b":x;")):
        frame = b"\x00\x00\x01" + bytes([len(dest)]) + dest
        frame += len(props).to_bytes(2, "big") + props + b"\x00"
        server, _ = open_pair()
        with pytest.raises(ProtocolError):
            server.receive_data(frame)


def test_error_message_that_is_not_utf8_is_still_shown() -> None:
    _server, client = open_pair()
    assert client.receive_data(b"\x04\x02\xffA") == [Error("\ufffdA")]
