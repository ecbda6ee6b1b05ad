"""Client-side append helpers: build append blocks and keep the bookkeeping
that makes appends exactly-once across reconnects.

An ``AppendWriter`` outlives connections: after a reconnect, send its
``setup_append()`` on the new ClientConnection, then pass the AppendSetup's
ack level to ``resume`` and send the frames it returns.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Sequence

from polyport.protocols.segment.errors import RemoteProtocolError
from polyport.protocols.segment.frames import (
    PARTIAL_OVERHEAD,
    BeginAppendBlock,
    EndAppendBlock,
    Event,
    PartialKind,
    PartialMessage,
    RequestFrame,
    SetupAppend,
    event_size,
)
from polyport.protocols.segment.wire import encode_event, encode_frame


def block_frames(
    connection_id: uuid.UUID,
    connection_offset: int,
    events: Sequence[bytes],
    *,
    boundary: int | None = None,
) -> list[RequestFrame]:
    """The frames of one append block carrying ``events`` from ``connection_offset``.

    Without ``boundary`` every event is a whole EVENT message.  With it, the
    block announces exactly ``boundary`` wire bytes before its EndAppendBlock
    (the original client's fixed-size blocks): every event but the last is
    whole, the last one's EVENT bytes are cut into PartialMessage(Begin)
    before the EndAppendBlock and PartialMessage(End) after it.  A boundary
    that would leave either piece empty, or cut an earlier event, is a
    ValueError.
    """
    total = sum(event_size(data) for data in events)
    begin_offset = connection_offset
    end = EndAppendBlock(
        connection_id=connection_id,
        connection_offset=begin_offset + total,
        block_length=total,
    )
    if boundary is None or boundary == total:
        return [
            BeginAppendBlock(connection_id, begin_offset, total),
            *(Event(data) for data in events),
            end,
        ]
    if not events:
        raise ValueError(f"an empty block cannot reach boundary {boundary}")
    *whole, last = events
    before = sum(event_size(data) for data in whole)
    framed_last = encode_event(Event(last))
    cut = boundary - before - PARTIAL_OVERHEAD
    if not 1 <= cut < len(framed_last):
        low = before + PARTIAL_OVERHEAD + 1
        high = before + PARTIAL_OVERHEAD + len(framed_last) - 1
        raise ValueError(
            f"boundary {boundary} does not cut the last event: use {total} (no cut) or "
            f"{low}..{high}"
        )
    return [
        BeginAppendBlock(connection_id, begin_offset, boundary),
        *(Event(data) for data in whole),
        PartialMessage(PartialKind.BEGIN, framed_last[:cut]),
        end,
        PartialMessage(PartialKind.END, framed_last[cut:]),
    ]


def encode_block(
    connection_id: uuid.UUID,
    connection_offset: int,
    events: Sequence[bytes],
    *,
    boundary: int | None = None,
) -> bytes:
    frames = block_frames(connection_id, connection_offset, events, boundary=boundary)
    return b"".join(encode_frame(frame) for frame in frames)


class AppendWriter:
    """One appender (ConnectionId) to one segment."""

    def __init__(self, connection_id: uuid.UUID, segment: str, *, credentials: str = "") -> None:
        self.connection_id = connection_id
        self.segment = segment
        # "<user>:<password>" sent with every SetupAppend; empty = anonymous.
        self.credentials = credentials
        # Connection offset after every event handed to ``block`` so far.
        self.offset = 0
        self.ack_level = 0
        self._unacked: deque[tuple[int, bytes]] = deque()

    @property
    def unacked(self) -> tuple[tuple[int, bytes], ...]:
        """(start offset, body) of every event written but not acknowledged."""
        return tuple(self._unacked)

    def setup_append(self) -> SetupAppend:
        return SetupAppend(
            connection_id=self.connection_id, segment=self.segment, credentials=self.credentials
        )

    def block(self, events: Sequence[bytes], *, boundary: int | None = None) -> list[RequestFrame]:
        """Frames appending ``events`` after everything written so far."""
        frames = block_frames(self.connection_id, self.offset, events, boundary=boundary)
        for data in events:
            self._unacked.append((self.offset, bytes(data)))
            self.offset += event_size(data)
        return frames

    def acknowledge(self, ack_level: int) -> None:
        """Forget the events stored up to ``ack_level`` (from DataAppended or
        AppendSetup)."""
        while self._unacked:
            start, data = self._unacked[0]
            end = start + event_size(data)
            if end > ack_level:
                if start < ack_level:
                    raise RemoteProtocolError(
                        f"ack level {ack_level} falls inside the event at offsets {start}..{end}",
                        segment=self.segment,
                    )
                break
            self._unacked.popleft()
        self.ack_level = max(self.ack_level, ack_level)

    def resume(self, ack_level: int, *, block_size: int | None = None) -> list[RequestFrame]:
        """After an AppendSetup with ``ack_level``: drop the events it covers
        (end offset <= ack level) and return blocks resending the rest from
        their original offsets, each at most ``block_size`` wire bytes unless
        a single event is larger.  A fresh writer whose ConnectionId already
        has data stored continues after it."""
        self.acknowledge(ack_level)
        first = self._unacked[0][0] if self._unacked else self.offset
        if ack_level < first:
            raise RemoteProtocolError(
                f"ack level {ack_level} is below data already acknowledged up to {first}; "
                "that data can no longer be resent",
                segment=self.segment,
            )
        if not self._unacked:
            self.offset = max(self.offset, ack_level)
            return []
        groups: list[list[bytes]] = [[]]
        size = 0
        for _start, data in self._unacked:
            if groups[-1] and block_size is not None and size + event_size(data) > block_size:
                groups.append([])
                size = 0
            groups[-1].append(data)
            size += event_size(data)
        frames: list[RequestFrame] = []
        offset = self._unacked[0][0]
        for group in groups:
            frames += block_frames(self.connection_id, offset, group)
            offset += sum(event_size(data) for data in group)
        return frames
