"""Property tests: round trips, random input, truncation, arbitrary chunking,
and append blocks cut into partial messages in every legal way."""

from __future__ import annotations

import contextlib
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyport.protocols.segment.client import AppendWriter
from polyport.protocols.segment.connection import ClientConnection, FrameReader, ServerConnection
from polyport.protocols.segment.errors import ProtocolError
from polyport.protocols.segment.frames import (
    MAX_WIRE_LENGTH,
    TYPE_NAMES,
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
    event_size,
)
from polyport.protocols.segment.state import BlockEvents
from polyport.protocols.segment.wire import decode_frame, encode_frame

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
CID = uuid.UUID(int=0xC1D)

i64 = st.integers(-(2**63), 2**63 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
names = st.text(max_size=12)
blobs = st.binary(max_size=40)

frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(Event, blobs),
    st.builds(SetupAppend, st.uuids(), names, names),  # "" = no credentials field
    st.builds(AppendSetup, names, st.uuids(), i64),
    st.builds(BeginAppendBlock, st.uuids(), i64, i32),
    st.builds(EndAppendBlock, st.uuids(), i64, i32),
    st.builds(DataAppended, st.uuids(), i64),
    st.builds(ReadSegment, names, i64, i32, names),
    st.builds(SegmentRead, names, i64, st.booleans(), st.booleans(), blobs),
    st.builds(PartialMessage, st.sampled_from(PartialKind), blobs),
    st.builds(KeepAlive, blobs),
    st.builds(NoSuchSegment, names, names),
    st.builds(AuthFailed, names, names),
    st.builds(ErrorMessage, names, names, names),
)


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# --- frames ----------------------------------------------------------------------------


@SETTINGS
@given(frames)
def test_frame_round_trip(frame: Frame) -> None:
    data = encode_frame(frame)
    assert decode_frame(data) == frame
    assert encode_frame(decode_frame(data)) == data


@SETTINGS
@given(st.lists(frames, max_size=6), st.lists(st.integers(0, 10_000), max_size=8))
def test_reader_splits_anywhere(sequence: list[Frame], cuts: list[int]) -> None:
    data = b"".join(encode_frame(frame) for frame in sequence)
    reader = FrameReader(max_message_size=MAX_WIRE_LENGTH)
    got: list[Frame] = []
    for piece in chunks(data, cuts):
        got += [frame for frame, _size in reader.feed(piece)]
    assert got == sequence
    assert reader.buffered == 0


@SETTINGS
@given(frames, st.data())
def test_truncation_waits_for_more(frame: Frame, data: st.DataObject) -> None:
    encoded = encode_frame(frame)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    reader = FrameReader(max_message_size=MAX_WIRE_LENGTH)
    assert reader.feed(encoded[:cut]) == []
    assert [f for f, _ in reader.feed(encoded[cut:])] == [frame]


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_only_protocol_errors(data: bytes) -> None:
    for conn in (ServerConnection(max_message_size=1000), ClientConnection(1000)):
        with contextlib.suppress(ProtocolError):
            conn.receive_data(data)
    with contextlib.suppress(ProtocolError):
        decode_frame(data)


@SETTINGS
@given(st.sampled_from(sorted(TYPE_NAMES)), st.binary(max_size=60))
def test_random_bodies_decode_or_protocol_error(type_code: int, body: bytes) -> None:
    data = type_code.to_bytes(4, "big", signed=True) + len(body).to_bytes(4, "big") + body
    try:
        frame = decode_frame(data)
    except ProtocolError:
        return
    assert encode_frame(frame) == data


# --- append blocks cut into partial messages -----------------------------------------------


@st.composite
def split_points(draw: st.DrawFn, raw: bytes) -> list[bytes]:
    """``raw`` cut into at least two pieces (possibly empty ones)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), min_size=1, max_size=4)))
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


def pieces_as_partials(pieces: list[bytes]) -> list[PartialMessage]:
    kinds = [PartialKind.BEGIN] + [PartialKind.MIDDLE] * (len(pieces) - 2) + [PartialKind.END]
    return [PartialMessage(kind, piece) for kind, piece in zip(kinds, pieces, strict=True)]


@st.composite
def block_layouts(draw: st.DrawFn, offset: int) -> tuple[list[bytes], list[Frame]]:
    """A block's events and one legal wire layout of them: each event whole or
    in partial messages, the last one possibly split across the End."""
    events = draw(st.lists(blobs, max_size=5))
    inside: list[Frame] = []
    after: list[Frame] = []
    split_last = bool(events) and draw(st.booleans())
    for index, body in enumerate(events):
        raw = encode_frame(Event(body))
        if split_last and index == len(events) - 1:
            partials = pieces_as_partials(draw(split_points(raw)))
            before = draw(st.integers(1, len(partials) - 1))
            inside += partials[:before]
            after += partials[before:]
        elif draw(st.booleans()):
            inside.append(Event(body))
        else:
            inside += pieces_as_partials(draw(split_points(raw)))
    length = sum(len(encode_frame(frame)) for frame in inside)
    total = sum(event_size(body) for body in events)
    layout: list[Frame] = [
        BeginAppendBlock(CID, offset, length),
        *inside,
        EndAppendBlock(CID, offset + total, total),
        *after,
    ]
    return events, layout


def established(ack: int = 0) -> ServerConnection:
    server = ServerConnection()
    server.receive_data(encode_frame(SetupAppend(CID, "ctx/s")))
    server.send(AppendSetup("ctx/s", CID, ack))
    return server


@SETTINGS
@given(st.data(), st.lists(st.integers(0, 10_000), max_size=10))
def test_partial_layouts_reassemble_exactly(data: st.DataObject, cuts: list[int]) -> None:
    offset = 0
    expected: list[tuple[int, tuple[bytes, ...]]] = []
    stream = b""
    for _ in range(data.draw(st.integers(1, 3))):
        events, layout = data.draw(block_layouts(offset))
        expected.append((offset, tuple(events)))
        stream += b"".join(encode_frame(frame) for frame in layout)
        offset += sum(event_size(body) for body in events)
    # The client-side state machine accepts the same layouts.
    client = ClientConnection()
    client.send(SetupAppend(CID, "ctx/s"))
    client.receive_data(encode_frame(AppendSetup("ctx/s", CID, 0)))
    client.send_all(reframe(stream))  # type: ignore[arg-type]

    server = established()
    got: list[BlockEvents] = []
    for piece in chunks(stream, cuts):
        got += [item for item in server.receive_data(piece) if isinstance(item, BlockEvents)]
    assert [(block.offset, block.events) for block in got] == expected
    assert server.idle


def reframe(stream: bytes) -> list[Frame]:
    return [frame for frame, _ in FrameReader(max_message_size=MAX_WIRE_LENGTH).feed(stream)]


@SETTINGS
@given(st.data())
def test_truncated_block_stream_yields_prefix(data: st.DataObject) -> None:
    events, layout = data.draw(block_layouts(0))
    stream = b"".join(encode_frame(frame) for frame in layout)
    cut = data.draw(st.integers(0, len(stream)))
    server = established()
    head = server.receive_data(stream[:cut])
    tail = server.receive_data(stream[cut:])
    assert len(head + tail) == 1
    (block,) = head + tail
    assert isinstance(block, BlockEvents) and block.events == tuple(events)
    assert (head == []) == (cut < len(stream))


@SETTINGS
@given(st.data())
def test_mutated_block_stream_only_protocol_errors(data: st.DataObject) -> None:
    _events, layout = data.draw(block_layouts(0))
    stream = bytearray(b"".join(encode_frame(frame) for frame in layout))
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(stream) - 1))
        stream[position] = data.draw(st.integers(0, 255))
    server = established()
    with contextlib.suppress(ProtocolError):
        server.receive_data(bytes(stream))


# --- the writer ---------------------------------------------------------------------------


@SETTINGS
@given(st.lists(blobs, min_size=1, max_size=5), st.data())
def test_writer_boundary_blocks_reassemble(events: list[bytes], data: st.DataObject) -> None:
    total = sum(event_size(body) for body in events)
    before = total - event_size(events[-1])
    low, high = before + 10, before + 9 + event_size(events[-1]) - 1
    boundary = data.draw(st.one_of(st.none(), st.just(total), st.integers(low, high)))
    writer = AppendWriter(CID, "ctx/s")
    block = writer.block(events, boundary=boundary)
    begin = block[0]
    assert isinstance(begin, BeginAppendBlock)
    if boundary is not None:
        assert begin.length_before_end == boundary
    server = established()
    (got,) = server.receive_data(b"".join(encode_frame(frame) for frame in block))
    assert isinstance(got, BlockEvents) and got.events == tuple(events)
    assert writer.offset == got.end_offset == total


@SETTINGS
@given(st.lists(blobs, min_size=1, max_size=8), st.data())
def test_writer_resume_drops_acknowledged(events: list[bytes], data: st.DataObject) -> None:
    writer = AppendWriter(CID, "ctx/s")
    half = data.draw(st.integers(0, len(events)))
    writer.block(events[:half])
    writer.block(events[half:])
    acked = data.draw(st.integers(0, len(events)))
    ack_level = sum(event_size(body) for body in events[:acked])
    block_size = data.draw(st.one_of(st.none(), st.integers(1, 80)))
    frames = writer.resume(ack_level, block_size=block_size)
    assert [body for _start, body in writer.unacked] == events[acked:]
    server = established(ack=ack_level)
    got = server.receive_data(b"".join(encode_frame(frame) for frame in frames))
    resent = [body for block in got if isinstance(block, BlockEvents) for body in block.events]
    assert resent == events[acked:]
    assert all(
        block.events_after(ack_level) == block.events
        for block in got
        if isinstance(block, BlockEvents)
    )
