"""Round trips and fuzzing of the byte layer and the connections."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyport.protocols.micromsg2 import (
    Ack,
    ClientConnection,
    Command,
    Error,
    Extension,
    Frame,
    Handshake,
    Message,
    ProtocolError,
    ServerConnection,
    decode_frame,
    decode_handshake,
    encode_frame,
    encode_handshake,
)
from polyport.protocols.micromsg2.wire import WireFrame, starts_error_frame

from ._support import open_pair
from .strategies import commands, errors, extensions, handshakes, messages, wire_frames

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
fragment_sizes = st.integers(1, 700)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# --- pure functions ----------------------------------------------------------------


@FUZZ
@given(wire_frames, fragment_sizes)
def test_frames_round_trip(frame: WireFrame, fragment_size: int) -> None:
    data = encode_frame(frame, fragment_size=fragment_size)
    assert decode_frame(data + b"\x00rest") == (frame, len(data))


@FUZZ
@given(messages, fragment_sizes)
def test_a_decoded_message_is_frozen_as_init_leaves_it(message: Message, size: int) -> None:
    # Decoding builds messages without __init__ (wire.build_frame): its
    # properties must still be read-only and its payload bytes.
    decoded, _ = decode_frame(encode_frame(message, fragment_size=size))
    assert isinstance(decoded, Message) and type(decoded.payload) is bytes
    with pytest.raises(TypeError):
        decoded.properties["added"] = 1  # type: ignore[index]


@FUZZ
@given(handshakes)
def test_handshakes_round_trip(hs: Handshake) -> None:
    data = encode_handshake(hs)
    assert decode_handshake(data + b"more") == (hs, len(data))


@FUZZ
@given(wire_frames, fragment_sizes, st.data())
def test_truncated_frame_waits(frame: WireFrame, fragment_size: int, data: st.DataObject) -> None:
    encoded = encode_frame(frame, fragment_size=fragment_size)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    assert decode_frame(encoded[:cut]) is None


@FUZZ
@given(handshakes, st.data())
def test_truncated_handshake_waits(hs: Handshake, data: st.DataObject) -> None:
    encoded = encode_handshake(hs)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    assert decode_handshake(encoded[:cut]) is None
    if not starts_error_frame(encoded[0]):  # majors 4, 12, 20, 28 read as ERROR
        assert ServerConnection("srv").receive_data(encoded[:cut]) == []


def test_every_truncation_of_each_frame_type() -> None:
    samples: list[WireFrame] = [
        Message(1, "topic/a", b"x" * 300, {"k": 1}),
        Message(2, "q", b"abc", {"t": "v"}),
    ]
    samples += [Command("subscribe", {"destination": "topic/a"}), Extension(7, b"p"), Error("e")]
    for frame in samples:
        for fragment_size in (2, 1 << 20):
            encoded = encode_frame(frame, fragment_size=fragment_size)
            for cut in range(len(encoded)):
                assert decode_frame(encoded[:cut]) is None


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_protocol_error(data: bytes) -> None:
    for decode in (decode_frame, decode_handshake):
        with contextlib.suppress(ProtocolError):
            decode(data)


# --- connections -------------------------------------------------------------------


def _fresh_open_pair() -> tuple[ServerConnection, ClientConnection]:
    return open_pair(optional=["json", "pubsub", "x-auth:user=u"], max_payload=4096)


open_frames = st.one_of(messages, commands, extensions(st.integers(1, 3)), errors)


@FUZZ
@given(st.binary(max_size=300), st.sampled_from(["hello", "reply", "open"]))
def test_connections_only_raise_protocol_error(data: bytes, where: str) -> None:
    conn: ServerConnection | ClientConnection
    if where == "hello":
        conn = ServerConnection("srv")
    elif where == "reply":
        conn = ClientConnection("c", ["json"])
        conn.send(conn.hello_frame())
    else:
        conn = _fresh_open_pair()[0]
    try:
        for piece in (data[:7], data[7:]):
            conn.receive_data(piece)
    except ProtocolError:
        pass


@FUZZ
@given(st.lists(open_frames, max_size=6), fragment_sizes, st.lists(st.integers(0, 10_000)))
def test_random_splits_give_the_same_frames(
    frames: list[WireFrame], fragment_size: int, cuts: list[int]
) -> None:
    data = b"".join(encode_frame(f, fragment_size=fragment_size) for f in frames)
    _, whole = _fresh_open_pair()
    expected = whole.receive_data(data)
    assert expected == frames
    _, pieces = _fresh_open_pair()
    got: list[Frame] = []
    for piece in _split(data, cuts):
        got += pieces.receive_data(piece)
    assert got == expected


@FUZZ
@given(open_frames, fragment_sizes, st.data())
def test_connection_waits_on_truncated_frames(
    frame: WireFrame, fragment_size: int, data: st.DataObject
) -> None:
    encoded = encode_frame(frame, fragment_size=fragment_size)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    _, client = _fresh_open_pair()
    assert client.receive_data(encoded[:cut]) == []
    assert client.receive_data(encoded[cut:]) == [frame]


@FUZZ
@given(
    st.lists(st.integers(0, 10_000)),
    st.lists(st.integers(0, 10_000)),
    st.lists(st.integers(0, 10_000)),
)
def test_handshake_split_anywhere(cuts1: list[int], cuts2: list[int], cuts3: list[int]) -> None:
    server = ServerConnection("srv", ["json", "batch-ack"])
    client = ClientConnection("cli", ["json"], ["batch-ack:max-count=3"])
    for piece in _split(client.send(client.hello_frame()), cuts1):
        server.receive_data(piece)
    for piece in _split(server.send(server.reply_frame()), cuts2):
        client.receive_data(piece)
    final = client.send(client.final_frame())
    # The client may pipeline frames right behind its final handshake.
    final += client.send(Message(1, "topic/x", b"hi"))
    got: list[Frame] = []
    for piece in _split(final, cuts3):
        got += server.receive_data(piece)
    assert got[-1] == Message(1, "topic/x", b"hi")
    assert server.negotiated is not None and server.negotiated.ack_window == 3


@FUZZ
@given(st.lists(st.booleans(), max_size=40), st.integers(1, 5))
def test_acked_traffic_through_a_pair(plan: list[bool], window: int) -> None:
    server, client = open_pair(required=[f"batch-ack:max-count={window}"])
    received: list[int] = []
    for send in plan:
        if send and server.can_send_message():
            for frame in client.receive_data(server.send(Message(server.next_seq, "topic/t"))):
                assert isinstance(frame, Message)
                received.append(frame.seq)
        elif received:
            [ack] = server.receive_data(client.send(Ack(received[-1])))
            assert isinstance(ack, Ack) and ack.acked == tuple(received)
            received.clear()
        assert server.outbound.outstanding == len(received) == client.inbound.outstanding
