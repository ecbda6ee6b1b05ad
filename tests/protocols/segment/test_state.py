"""Connection state machines: legal flows and every class of illegal sequence."""

from __future__ import annotations

import uuid

import pytest

from polyport.protocols.segment.connection import ClientConnection, ServerConnection
from polyport.protocols.segment.errors import LocalProtocolError, ProtocolError, error_reply
from polyport.protocols.segment.frames import (
    AppendSetup,
    AuthFailed,
    BeginAppendBlock,
    DataAppended,
    EndAppendBlock,
    ErrorMessage,
    Event,
    Frame,
    KeepAlive,
    NoSuchSegment,
    PartialKind,
    PartialMessage,
    ReadSegment,
    SegmentRead,
    SetupAppend,
)
from polyport.protocols.segment.state import TRANSITIONS, BlockEvents, BlockState
from polyport.protocols.segment.wire import encode_frame, split_segment_name

A = uuid.UUID(int=0xA)
B = uuid.UUID(int=0xB)
BEGIN, MIDDLE, END = PartialKind.BEGIN, PartialKind.MIDDLE, PartialKind.END


def wire(*frames: Frame) -> bytes:
    return b"".join(encode_frame(frame) for frame in frames)


def framed(body: bytes) -> bytes:
    return encode_frame(Event(body))


def ready(*appenders: tuple[uuid.UUID, str, int], **kwargs: int) -> ServerConnection:
    server = ServerConnection(**kwargs)
    for cid, segment, ack in appenders:
        assert server.receive_data(wire(SetupAppend(cid, segment))) == [SetupAppend(cid, segment)]
        server.send(AppendSetup(segment, cid, ack))
    return server


def fails(server: ServerConnection, *frames: Frame, match: str) -> ProtocolError:
    with pytest.raises(ProtocolError, match=match) as info:
        server.receive_data(wire(*frames))
    assert server.failed
    return info.value


# --- legal flows -----------------------------------------------------------------


def test_simple_block() -> None:
    server = ready((A, "ctx/s", 0))
    out = server.receive_data(
        wire(
            BeginAppendBlock(A, 0, 24),
            Event(b"one"),
            Event(b"two!!"),
            EndAppendBlock(A, 24, 24),
        )
    )
    assert out == [
        BlockEvents(A, "ctx/s", 0, (b"one", b"two!!"), EndAppendBlock(A, 24, 24)),
    ]
    assert server.state is BlockState.IDLE and server.idle


def test_several_appenders_share_a_connection() -> None:
    server = ready((A, "s1", 0), (B, "s2", 30))
    out = server.receive_data(
        wire(
            BeginAppendBlock(A, 0, 9),
            Event(b"a"),
            EndAppendBlock(A, 9, 9),
            BeginAppendBlock(B, 30, 9),
            Event(b"b"),
            EndAppendBlock(B, 39, 9),
            BeginAppendBlock(A, 9, 9),
            Event(b"c"),
            EndAppendBlock(A, 18, 9),
        )
    )
    assert [(b.segment, b.offset, b.events) for b in out if isinstance(b, BlockEvents)] == [
        ("s1", 0, (b"a",)),
        ("s2", 30, (b"b",)),
        ("s1", 9, (b"c",)),
    ]
    assert server.segment_of(B) == "s2"


def test_split_event_completes_after_the_end() -> None:
    server = ready((A, "s", 0))
    event = framed(b"0123456789")  # 18 bytes
    first = server.receive_data(
        wire(
            BeginAppendBlock(A, 0, 10 + 9 + 3),
            Event(b"xy"),
            PartialMessage(BEGIN, event[:3]),
            EndAppendBlock(A, 28, 28),
        )
    )
    assert first == []
    assert server.state is BlockState.SPLIT_PENDING
    assert server.receive_data(wire(PartialMessage(MIDDLE, event[3:12]))) == []
    (block,) = server.receive_data(wire(PartialMessage(END, event[12:])))
    assert isinstance(block, BlockEvents)
    assert block.events == (b"xy", b"0123456789")
    assert block.event_offsets() == (0, 10)
    assert block.end_offset == 28
    # The next block continues at the End's offset.
    (block2,) = server.receive_data(
        wire(BeginAppendBlock(A, 28, 8), Event(b""), EndAppendBlock(A, 36, 8))
    )
    assert isinstance(block2, BlockEvents) and block2.offset == 28


def test_partial_event_completed_inside_the_block() -> None:
    server = ready((A, "s", 0))
    event = framed(b"hello")
    out = server.receive_data(
        wire(
            BeginAppendBlock(A, 0, 9 + 2 + 9 + 0 + 9 + 11),
            PartialMessage(BEGIN, event[:2]),
            PartialMessage(MIDDLE, b""),
            PartialMessage(END, event[2:]),
            EndAppendBlock(A, 13, 13),
        )
    )
    assert [b.events for b in out if isinstance(b, BlockEvents)] == [(b"hello",)]


def test_empty_block() -> None:
    server = ready((A, "s", 0))
    (block,) = server.receive_data(wire(BeginAppendBlock(A, 0, 0), EndAppendBlock(A, 0, 0)))
    assert isinstance(block, BlockEvents) and block.events == ()


def test_resend_at_or_below_ack_level_is_accepted() -> None:
    server = ready((A, "s", 18))
    (block,) = server.receive_data(
        wire(
            BeginAppendBlock(A, 9, 27),
            Event(b"b"),
            Event(b"c"),
            Event(b"d"),
            EndAppendBlock(A, 36, 27),
        )
    )
    assert isinstance(block, BlockEvents)
    assert block.events_after(18) == (b"c", b"d")
    assert block.events_after(0) == (b"b", b"c", b"d")
    assert block.events_after(36) == ()
    with pytest.raises(ProtocolError, match="falls inside"):
        block.events_after(20)


def test_keep_alive_and_read_are_handed_over() -> None:
    server = ServerConnection()
    assert server.receive_data(wire(KeepAlive(b"x"), ReadSegment("s", 5, 100))) == [
        KeepAlive(b"x"),
        ReadSegment("s", 5, 100),
    ]


def _block(offset: int, body: bytes) -> list[BlockEvents]:
    end = EndAppendBlock(A, offset + 8 + len(body), 8 + len(body))
    return [BlockEvents(A, "s", offset, (body,), end)]


@pytest.mark.parametrize("ack", [9, 0])
def test_repeated_setup_resynchronises(ack: int) -> None:
    """A second SetupAppend mid-stream is handed over again, and the next
    block must start where the new AppendSetup reply says: past the first
    block when it was stored (9), at 0 again when it was not."""
    server = ready((A, "s", 0))
    assert server.receive_data(
        wire(BeginAppendBlock(A, 0, 9), Event(b"a"), EndAppendBlock(A, 9, 9))) == _block(0, b"a")
    assert server.receive_data(wire(SetupAppend(A, "s"))) == [SetupAppend(A, "s")]
    server.send(AppendSetup("s", A, ack))
    assert server.receive_data(
        wire(BeginAppendBlock(A, ack, 9), Event(b"b"), EndAppendBlock(A, ack + 9, 9))
    ) == _block(ack, b"b")
    # Anywhere else is refused: the reply, not the bytes seen before, decides.
    fails(server, BeginAppendBlock(A, ack + 1, 9), match="previous block ended")


def test_state_table_covers_the_block_lifecycle() -> None:
    assert set(TRANSITIONS.values()) == set(BlockState)


# --- illegal sequences --------------------------------------------------------------


def test_append_before_setup() -> None:
    fails(ServerConnection(), BeginAppendBlock(A, 0, 0), match="before its SetupAppend")


def test_append_before_append_setup_reply() -> None:
    server = ServerConnection()
    server.receive_data(wire(SetupAppend(A, "s")))
    err = fails(server, BeginAppendBlock(A, 0, 0), match="before its AppendSetup reply")
    assert err.segment == "s"


def test_end_without_begin() -> None:
    fails(ready((A, "s", 0)), EndAppendBlock(A, 0, 0), match="without a BeginAppendBlock")


def test_event_outside_block() -> None:
    fails(ready((A, "s", 0)), Event(b"x"), match="only valid inside an append block")


def test_partial_outside_block() -> None:
    fails(ready((A, "s", 0)), PartialMessage(BEGIN, b""), match="only valid inside a block")


def test_middle_without_begin() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 10),
        PartialMessage(MIDDLE, b"x"),
        match="Middle\\) without a Begin",
    )


def test_new_partial_before_previous_completes() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 20),
        PartialMessage(BEGIN, b"\x00"),
        PartialMessage(BEGIN, b"\x00"),
        match="before the previous one was complete",
    )


def test_nothing_else_while_split_event_pending() -> None:
    base = (
        BeginAppendBlock(A, 0, 10),
        PartialMessage(BEGIN, b"\x00"),
        EndAppendBlock(A, 9, 9),
    )
    fails(ready((A, "s", 0)), *base, KeepAlive(), match="not allowed after EndAppendBlock")
    fails(ready((A, "s", 0)), *base, BeginAppendBlock(A, 9, 0), match="not allowed")
    fails(ready((A, "s", 0)), *base, Event(b""), match="not allowed")


def test_setup_inside_block() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 9),
        SetupAppend(B, "t"),
        match="SetupAppend is not allowed in block",
    )


def test_connection_id_mismatch() -> None:
    fails(
        ready((A, "s", 0), (B, "t", 0)),
        BeginAppendBlock(A, 0, 9),
        Event(b"a"),
        EndAppendBlock(B, 9, 9),
        match="closes the block of",
    )


def test_block_shorter_than_announced() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 18),
        Event(b"a"),
        EndAppendBlock(A, 9, 9),
        match="EndAppendBlock after 9 bytes; BeginAppendBlock announced 18",
    )


def test_block_overrun() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 9),
        Event(b"a"),
        Event(b"b"),
        match="overruns",
    )


def test_block_length_must_match_events() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 9),
        Event(b"a"),
        EndAppendBlock(A, 10, 10),
        match="differs from the 9 EVENT bytes",
    )


def test_end_offset_must_be_begin_plus_length() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 9),
        Event(b"a"),
        EndAppendBlock(A, 10, 9),
        match="not the block's start 0 plus its length 9",
    )


def test_gap_after_ack_level() -> None:
    fails(ready((A, "s", 10)), BeginAppendBlock(A, 11, 0), match="gap after ack level 10")


def test_blocks_must_be_contiguous() -> None:
    server = ready((A, "s", 0))
    server.receive_data(wire(BeginAppendBlock(A, 0, 9), Event(b"a"), EndAppendBlock(A, 9, 9)))
    fails(server, BeginAppendBlock(A, 8, 0), match="previous block ended at 9")


def test_negative_fields() -> None:
    fails(ready((A, "s", 0)), BeginAppendBlock(A, -1, 0), match="negative")
    fails(ready((A, "s", 0)), BeginAppendBlock(A, 0, -1), match="negative")
    fails(ServerConnection(), ReadSegment("s", -1, 10), match="negative")


def test_partial_must_carry_an_event() -> None:
    inner = encode_frame(KeepAlive(b""))
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 9 + 8),
        PartialMessage(BEGIN, inner),
        match="must carry an EVENT, not KEEP_ALIVE",
    )


def test_partial_overrunning_its_event() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 100),
        PartialMessage(BEGIN, framed(b"ab") + b"!"),
        match="exceeds the 10 bytes",
    )


def test_partial_ending_short() -> None:
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 100),
        PartialMessage(BEGIN, framed(b"abc")[:5]),
        PartialMessage(END, b""),
        match="ended after 5 bytes",
    )


def test_split_event_size_must_match_block_length() -> None:
    event = framed(b"abcd")  # 12 bytes
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 9 + 8),
        PartialMessage(BEGIN, event[:8]),
        EndAppendBlock(A, 13, 13),
        match="does not match",
    )
    # Header still unknown at the End: the mismatch shows once it arrives.
    fails(
        ready((A, "s", 0)),
        BeginAppendBlock(A, 0, 9 + 2),
        PartialMessage(BEGIN, event[:2]),
        EndAppendBlock(A, 13, 13),
        PartialMessage(END, event[2:]),
        match="split EVENT of 12 bytes does not match",
    )


def test_split_event_bounded_by_max_message_size() -> None:
    err = fails(
        ready((A, "s", 0), max_message_size=100),
        BeginAppendBlock(A, 0, 9 + 8),
        PartialMessage(BEGIN, bytes.fromhex("00000000 00000065")),
        match="exceeds the maximum message size",
    )
    assert err.code == "too_large"
    err = fails(
        ready((A, "s", 0), max_message_size=100),
        BeginAppendBlock(A, 0, 10),
        PartialMessage(BEGIN, b"\x00"),
        EndAppendBlock(A, 1000, 1000),
        match="exceeds the maximum message size",
    )
    assert err.code == "too_large"


def test_block_size_limit_fails_on_begin() -> None:
    err = fails(
        ready((A, "s", 0), max_block_size=1000),
        BeginAppendBlock(A, 0, 1001),
        match="exceeds the maximum of 1000",
    )
    assert err.code == "too_large"


def test_connection_id_limit() -> None:
    server = ServerConnection(max_connection_ids=2)
    server.receive_data(wire(SetupAppend(A, "s"), SetupAppend(B, "s")))
    fails(server, SetupAppend(uuid.UUID(int=3), "s"), match="more than 2 ConnectionIds")


def test_failed_connection_stays_failed() -> None:
    server = ServerConnection()
    fails(server, Event(b""), match="only valid inside")
    with pytest.raises(ProtocolError, match="connection already failed"):
        server.receive_data(wire(KeepAlive()))


# --- error replies -------------------------------------------------------------------


def test_protocol_error_reply() -> None:
    server = ready((A, "ctx/s", 0))
    err = fails(server, BeginAppendBlock(A, 5, 0), match="gap")
    reply = err.reply()
    assert isinstance(reply, ErrorMessage)
    assert (reply.segment, reply.code) == ("ctx/s", "malformed")
    assert err.reply_type == 61
    assert server.send(reply)[:4] == b"\x00\x00\x00\x3d"


def test_error_reply_mapping() -> None:
    assert error_reply("not_found", "no", segment="s") == NoSuchSegment("s", "no")
    assert error_reply("unauthenticated", "who") == AuthFailed("", "who")
    assert error_reply("forbidden", "no", segment="s") == AuthFailed("s", "no")
    assert error_reply("busy", "later") == ErrorMessage("", "busy", "later")
    long = error_reply("internal", "x" * 100_000 + "\ud800")
    assert len(encode_frame(long)) < 70_000


# --- the sending side ------------------------------------------------------------------


def test_server_send_checks() -> None:
    server = ServerConnection()
    with pytest.raises(LocalProtocolError, match="no pending SetupAppend"):
        server.send(AppendSetup("s", A, 0))
    server.receive_data(wire(SetupAppend(A, "s")))
    with pytest.raises(LocalProtocolError, match="no pending SetupAppend"):
        server.send(AppendSetup("other", A, 0))
    with pytest.raises(LocalProtocolError, match="not set up"):
        server.send(DataAppended(A, 0))
    server.send(AppendSetup("s", A, 0))
    assert server.send(DataAppended(A, 0)) == encode_frame(DataAppended(A, 0))
    with pytest.raises(LocalProtocolError, match="does not send SetupAppend"):
        server.send(SetupAppend(A, "s"))  # type: ignore[arg-type]


def test_client_refuses_illegal_sends() -> None:
    client = ClientConnection()
    with pytest.raises(LocalProtocolError, match="only valid inside"):
        client.send(Event(b"x"))
    assert client.failed
    client = ClientConnection()
    client.send(SetupAppend(A, "s"))
    with pytest.raises(LocalProtocolError, match="before its AppendSetup reply"):
        client.send(BeginAppendBlock(A, 0, 0))
    with pytest.raises(LocalProtocolError, match="does not send"):
        ClientConnection().send(DataAppended(A, 0))  # type: ignore[arg-type]


def test_client_checks_replies() -> None:
    with pytest.raises(ProtocolError, match="no pending SetupAppend"):
        ClientConnection().receive_data(wire(AppendSetup("s", A, 0)))
    with pytest.raises(ProtocolError, match="not set up"):
        ClientConnection().receive_data(wire(DataAppended(A, 0)))


def test_client_full_exchange_and_partial_replies() -> None:
    client = ClientConnection()
    server = ServerConnection()
    server.receive_data(client.send(SetupAppend(A, "s")))
    assert client.receive_data(server.send(AppendSetup("s", A, 0))) == [AppendSetup("s", A, 0)]
    assert client.is_established(A)
    big = encode_frame(SegmentRead("s", 0, True, False, b"payload"))
    pieces = [
        PartialMessage(BEGIN, big[:5]),
        PartialMessage(MIDDLE, big[5:20]),
        PartialMessage(END, big[20:]),
    ]
    data = b"".join(server.send(p) for p in pieces) + server.send(KeepAlive())
    assert client.receive_data(data) == [SegmentRead("s", 0, True, False, b"payload"), KeepAlive()]


@pytest.mark.parametrize(
    ("pieces", "match"),
    [
        ([PartialMessage(MIDDLE, b"")], "without a Begin"),
        ([PartialMessage(BEGIN, b""), PartialMessage(BEGIN, b"")], "previous one"),
        ([PartialMessage(BEGIN, b"\x00\x00"), PartialMessage(END, b"")], "ended before"),
        (
            [PartialMessage(BEGIN, encode_frame(KeepAlive()) + b"x")],
            "overrun",
        ),
        (
            [PartialMessage(BEGIN, encode_frame(PartialMessage(BEGIN, b"")))],
            "inside a partial",
        ),
    ],
)
def test_client_partial_errors(pieces: list[PartialMessage], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        ClientConnection().receive_data(wire(*pieces))


def test_split_segment_name() -> None:
    assert split_segment_name("ctx/orders/eu") == ("ctx", "orders/eu")
    assert split_segment_name("orders") == ("default", "orders")
    for bad in ("/x", "x/", ""):
        with pytest.raises(ProtocolError):
            split_segment_name(bad)
