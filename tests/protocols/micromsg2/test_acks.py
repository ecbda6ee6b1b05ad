"""Ack bookkeeping: numbering, windows, cumulative acks across the wrap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyport.protocols.micromsg2 import (
    Ack,
    AckWindow,
    Message,
    ProtocolError,
    decode_ack_payload,
    encode_ack_payload,
    encode_frame,
)
from polyport.protocols.micromsg2.acks import next_seq

from ._support import open_pair


def _window_acked_up_to(last: int, size: int = 10) -> AckWindow:
    window = AckWindow(size)
    for seq in range(1, last + 1):
        window.on_sent(seq)
        window.on_ack(seq)
    return window


def test_numbering_starts_at_one_and_wraps_to_one() -> None:
    assert AckWindow().next_seq == 1
    assert next_seq(1) == 2 and next_seq(65534) == 65535 and next_seq(65535) == 1
    window = AckWindow()  # no ack extension: numbering only
    for seq in range(1, 65536):
        window.on_sent(seq)
    assert window.next_seq == 1
    window.on_sent(1)
    assert window.outstanding == 0 and window.can_send()


def test_spec_wrap_example() -> None:
    # Last acked 65533; 65534, 65535, 1, 2, 3 sent; an ack for 3 frees all five.
    window = _window_acked_up_to(65533)
    assert window.last_acked == 65533
    for seq in (65534, 65535, 1, 2, 3):
        window.on_sent(seq)
    assert window.outstanding == 5
    assert window.on_ack(3) == (65534, 65535, 1, 2, 3)
    assert window.outstanding == 0 and window.last_acked == 3 and window.next_seq == 4


def test_window_limits_messages_in_flight() -> None:
    window = AckWindow(3)
    for seq in (1, 2, 3):
        assert window.can_send()
        window.on_sent(seq)
    assert not window.can_send()
    with pytest.raises(ProtocolError, match="exceeds the ack window"):
        window.on_sent(4)
    assert window.on_ack(1) == (1,)  # an early ack reopens the window
    window.on_sent(4)
    assert window.on_ack(4) == (2, 3, 4)


def test_single_ack_window() -> None:
    window = AckWindow(1)
    window.on_sent(1)
    assert not window.can_send()
    window.on_ack(1)
    window.on_sent(2)


def test_bad_acks() -> None:
    window = AckWindow(10)
    with pytest.raises(ProtocolError, match="matches no MESSAGE in flight"):
        window.on_ack(1)
    window.on_sent(1)
    window.on_sent(2)
    with pytest.raises(ProtocolError, match="matches no MESSAGE in flight"):
        window.on_ack(3)
    with pytest.raises(ProtocolError, match=r"outside 1..65535"):
        window.on_ack(0)
    assert window.on_ack(2) == (1, 2)
    assert window.on_ack(2) == ()  # repeating the last ack is harmless
    with pytest.raises(ProtocolError, match="matches no MESSAGE"):
        window.on_ack(1)  # an older one is not
    with pytest.raises(ProtocolError, match="no ack extension"):
        AckWindow().on_ack(1)


def test_out_of_order_sequence_number() -> None:
    window = AckWindow(5)
    with pytest.raises(ProtocolError, match="expected 1"):
        window.on_sent(2)
    assert window.next_seq == 1 and window.outstanding == 0


@pytest.mark.parametrize("size", [0, 65535, -1])
def test_window_size_bounds(size: int) -> None:
    with pytest.raises(ValueError):
        AckWindow(size)


def test_ack_payload() -> None:
    assert encode_ack_payload(65535) == b"\xff\xff"
    assert decode_ack_payload(b"\x00\x03") == 3
    for bad in (b"", b"\x00", b"\x00\x00\x01", b"\x00\x00"):
        with pytest.raises(ProtocolError):
            decode_ack_payload(bad)


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(0, 65534),
    size=st.integers(1, 12),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=60),
)
def test_window_matches_a_model(start: int, size: int, steps: list[tuple[bool, int]]) -> None:
    window = AckWindow(size)
    # Fast-forward the numbering (acks keep the window empty) to test the wrap.
    window._next = next_seq(start) if start else 1
    window._last_acked = start or 65535
    window._any_acked = bool(start)
    in_flight: list[int] = []
    for send, drawn in steps:
        if send:
            if len(in_flight) < size:
                seq = window.next_seq
                window.on_sent(seq)
                in_flight.append(seq)
            else:
                assert not window.can_send()
        elif in_flight:
            k = min(drawn, len(in_flight) - 1)
            assert window.on_ack(in_flight[k]) == tuple(in_flight[: k + 1])
            del in_flight[: k + 1]
        assert window.outstanding == len(in_flight)


def test_connection_enforces_windows_both_ways() -> None:
    server, client = open_pair(required=["batch-ack:max-count=2"])
    for _ in range(2):
        client.receive_data(server.send(Message(server.next_seq, "topic/t")))
    assert not server.can_send_message()
    with pytest.raises(ProtocolError, match="exceeds the ack window"):
        server.send(Message(3, "topic/t"))
    assert server.next_seq == 3  # the refused send changed nothing

    [ack] = server.receive_data(client.send(Ack(2)))
    assert isinstance(ack, Ack) and ack.acked == (1, 2)
    assert server.can_send_message()

    # The client cannot ack what it has not received.
    with pytest.raises(ProtocolError, match="no MESSAGE in flight"):
        client.send(Ack(3))

    # Client -> server MESSAGE frames follow the same window: a peer that
    # ignores it is refused.
    raw = b"".join(encode_frame(Message(seq, "topic/t")) for seq in (1, 2, 3))
    with pytest.raises(ProtocolError, match="exceeds the ack window"):
        server.receive_data(raw)


def test_connection_checks_inbound_numbering_with_acks() -> None:
    _server, client = open_pair(required=["ack"])
    with pytest.raises(ProtocolError, match="expected 1"):
        client.receive_data(encode_frame(Message(5, "topic/t")))


def test_without_acks_inbound_numbers_are_not_checked() -> None:
    server, client = open_pair()
    frames = client.receive_data(encode_frame(Message(0, "t")) + encode_frame(Message(9, "t")))
    assert [f.seq for f in frames if isinstance(f, Message)] == [0, 9]
    with pytest.raises(ProtocolError, match="no ack extension"):
        server.send(Ack(1))


# --- a chosen first sequence number (tests reach the wrap without 65535 messages) --


def test_first_seq_starts_numbering_there() -> None:
    window = AckWindow(10, first_seq=65530)
    assert window.next_seq == 65530 and window.last_acked is None
    sent = []
    while window.can_send():
        sent.append(window.next_seq)
        window.on_sent(window.next_seq)
    assert sent == [65530, 65531, 65532, 65533, 65534, 65535, 1, 2, 3, 4]
    with pytest.raises(ProtocolError, match="matches no MESSAGE in flight"):
        window.on_ack(65529)  # the number before the first is not in flight
    assert window.on_ack(2) == (65530, 65531, 65532, 65533, 65534, 65535, 1, 2)
    assert window.outstanding == 2 and window.can_send()


@pytest.mark.parametrize("first", [0, 65536])
def test_first_seq_bounds(first: int) -> None:
    with pytest.raises(ValueError):
        AckWindow(10, first_seq=first)


@pytest.mark.parametrize("size", [1, 7, 10, 65534])
def test_window_through_two_full_wraps(size: int) -> None:
    """Every message of more than two full cycles of numbers: the window is
    never exceeded, each ack releases exactly the oldest messages in order."""
    window = AckWindow(size)
    expected = 1
    in_flight: list[int] = []
    total = 2 * 65535 + 17
    for i in range(total):
        if not window.can_send():
            assert len(in_flight) == size
            # Ack a varying prefix of what is in flight (at least one).
            k = (i % size) + 1
            assert window.on_ack(in_flight[k - 1]) == tuple(in_flight[:k])
            del in_flight[:k]
        seq = window.next_seq
        assert seq == expected
        window.on_sent(seq)
        in_flight.append(seq)
        assert window.outstanding == len(in_flight) <= size
        expected = next_seq(expected)
    assert window.on_ack(in_flight[-1]) == tuple(in_flight)
    assert window.outstanding == 0


def test_connection_pair_with_first_seq_wraps() -> None:
    from polyport.protocols.micromsg2 import ClientConnection, ServerConnection

    from ._support import run_handshake

    server = ServerConnection("polyport", first_outbound_seq=65534)
    client = ClientConnection(
        "test", ["batch-ack:max-count=3"], first_inbound_seq=65534
    )
    run_handshake(server, client)
    received: list[int] = []
    for _ in range(4):
        while server.can_send_message():
            for frame in client.receive_data(server.send(Message(server.next_seq, "topic/t"))):
                assert isinstance(frame, Message)
                received.append(frame.seq)
        [ack] = server.receive_data(client.send(Ack(received[-1])))
        assert isinstance(ack, Ack) and len(ack.acked) == 3
    assert received == [65534, 65535, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
