"""AppendWriter and block building: layouts, acknowledgements, resends."""

from __future__ import annotations

import uuid

import pytest

from polyport.protocols.segment.client import AppendWriter, block_frames
from polyport.protocols.segment.errors import ProtocolError
from polyport.protocols.segment.frames import (
    BeginAppendBlock,
    EndAppendBlock,
    Event,
    PartialKind,
    PartialMessage,
    SetupAppend,
)

CID = uuid.UUID(int=7)


def test_whole_events() -> None:
    assert block_frames(CID, 5, [b"a", b"bc"]) == [
        BeginAppendBlock(CID, 5, 19),
        Event(b"a"),
        Event(b"bc"),
        EndAppendBlock(CID, 24, 19),
    ]


def test_split_last_event() -> None:
    # 9 bytes of "a", then a 9-byte partial header+kind and 3 bytes of "bc" framed.
    assert block_frames(CID, 0, [b"a", b"bc"], boundary=21) == [
        BeginAppendBlock(CID, 0, 21),
        Event(b"a"),
        PartialMessage(PartialKind.BEGIN, b"\x00\x00\x00"),
        EndAppendBlock(CID, 19, 19),
        PartialMessage(PartialKind.END, b"\x00\x00\x00\x00\x02bc"),
    ]


@pytest.mark.parametrize("boundary", [17, 18, 28, 100])
def test_boundary_must_cut_the_last_event(boundary: int) -> None:
    with pytest.raises(ValueError, match="does not cut the last event"):
        block_frames(CID, 0, [b"a", b"bc"], boundary=boundary)


def test_empty_block_with_boundary() -> None:
    assert block_frames(CID, 0, [], boundary=0)[0] == BeginAppendBlock(CID, 0, 0)
    with pytest.raises(ValueError, match="empty block"):
        block_frames(CID, 0, [], boundary=5)


def test_offsets_and_acknowledgements() -> None:
    writer = AppendWriter(CID, "s")
    assert writer.setup_append() == SetupAppend(CID, "s")
    writer.block([b"a", b"bb"])  # 0..9, 9..19
    writer.block([b"ccc"])  # 19..30
    assert writer.offset == 30
    writer.acknowledge(9)
    assert [start for start, _ in writer.unacked] == [9, 19]
    writer.acknowledge(5)  # stale acknowledgements change nothing
    assert writer.ack_level == 9
    with pytest.raises(ProtocolError, match="falls inside"):
        writer.acknowledge(20)


def test_resume_resends_the_rest() -> None:
    writer = AppendWriter(CID, "s")
    writer.block([b"a", b"bb", b"ccc"])
    frames = writer.resume(9)
    assert frames == block_frames(CID, 9, [b"bb", b"ccc"])
    assert writer.resume(30) == []
    assert writer.offset == 30


def test_resume_in_several_blocks() -> None:
    writer = AppendWriter(CID, "s")
    writer.block([b"a", b"b", b"c"])
    frames = writer.resume(0, block_size=18)
    begins = [f for f in frames if isinstance(f, BeginAppendBlock)]
    assert [(b.connection_offset, b.length_before_end) for b in begins] == [(0, 18), (18, 9)]


def test_fresh_writer_continues_after_stored_data() -> None:
    writer = AppendWriter(CID, "s")
    assert writer.resume(100) == []
    assert writer.offset == 100
    assert writer.block([b"x"])[0] == BeginAppendBlock(CID, 100, 9)


def test_resume_below_acknowledged_data_is_refused() -> None:
    writer = AppendWriter(CID, "s")
    writer.block([b"a", b"b"])
    writer.acknowledge(9)
    with pytest.raises(ProtocolError, match="can no longer be resent"):
        writer.resume(0)
