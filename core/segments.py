"""A stream's segment view (the segment-wire protocol's byte sequence, which
any protocol's reader may address): each event framed as an EVENT command,
offsets counting those framed bytes.  Pure functions, no database, so that
protocol adapters may use them without reaching the store."""

from __future__ import annotations

from collections.abc import Sequence

from polyport.core.commands import SegmentChunk
from polyport.core.events import SEGMENT_EVENT_HEADER_SIZE, RecordedEvent


def segment_frame(ev: RecordedEvent) -> bytes:
    """An event as it appears in its stream's segment view: an EVENT command."""
    return (0).to_bytes(4, "big", signed=True) + len(ev.body).to_bytes(4, "big") + ev.body


def segment_chunk_from_live(offset: int, events: Sequence[RecordedEvent],
                            max_bytes: int) -> SegmentChunk | None:
    """What :meth:`EventStore.read_segment` would return from ``offset``,
    made from ``events`` a live subscription to the stream just delivered
    (every event it holds, in order), without a round trip; None when they
    do not start exactly at ``offset`` (then read the database).  The chunk
    is at the tail when it takes every delivered event: a later append
    would have been delivered too."""
    if not events or events[0].segment_offset != offset:
        return None
    out = bytearray()
    end = offset
    taken = 0
    for ev in events:
        if ev.segment_offset != end:
            break  # not contiguous: what follows comes from the database
        framed = segment_frame(ev)
        if out and len(out) + len(framed) > max_bytes:
            break
        out += framed
        end += len(framed)
        taken += 1
    last = events[-1]
    tail = max(end, last.segment_offset + SEGMENT_EVENT_HEADER_SIZE + len(last.body))
    return SegmentChunk(offset, bytes(out), taken == len(events), end, tail)

