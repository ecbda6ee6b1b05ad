"""The request-side state machine: appender setup, append blocks, partial
messages.  It is fed decoded request frames in wire order, by the server as it
receives them and by the client as it sends them, so both sides agree on what
is legal."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from polyport.protocols.enums import IdentityEnum
from polyport.protocols.errors import TOO_LARGE
from polyport.protocols.segment.errors import RemoteProtocolError
from polyport.protocols.segment.frames import (
    DEFAULT_MAX_BLOCK_SIZE,
    DEFAULT_MAX_CONNECTION_IDS,
    DEFAULT_MAX_MESSAGE_SIZE,
    EVENT,
    HEADER_SIZE,
    MAX_WIRE_LENGTH,
    BeginAppendBlock,
    EndAppendBlock,
    Event,
    KeepAlive,
    PartialKind,
    PartialMessage,
    ReadSegment,
    RequestFrame,
    SetupAppend,
    event_size,
    type_name,
)
from polyport.protocols.segment.wire import peek_header


@dataclass(frozen=True, slots=True)
class BlockEvents:
    """A complete append block: every event begun between BeginAppendBlock and
    EndAppendBlock (the one split across the End included), emitted once the
    last of them is complete, so the adapter can store the block atomically."""

    connection_id: uuid.UUID
    segment: str
    offset: int  # BeginAppendBlock's connection offset
    events: tuple[bytes, ...]  # event bodies, in order
    block_end: EndAppendBlock

    @property
    def end_offset(self) -> int:
        return self.block_end.connection_offset

    def event_offsets(self) -> tuple[int, ...]:
        """The connection offset at which each event starts."""
        offsets = []
        position = self.offset
        for data in self.events:
            offsets.append(position)
            position += event_size(data)
        return tuple(offsets)

    def events_after(self, ack_level: int) -> tuple[bytes, ...]:
        """The events not yet stored for an appender at ``ack_level``: those
        ending after it.  This is how resent data at or below the ack level is
        dropped (exactly-once appends)."""
        kept: list[bytes] = []
        position = self.offset
        for data in self.events:
            end = position + event_size(data)
            if end > ack_level:
                if position < ack_level:
                    raise RemoteProtocolError(
                        f"ack level {ack_level} falls inside the event at offsets "
                        f"{position}..{end} of segment {self.segment!r}",
                        segment=self.segment,
                    )
                kept.append(data)
            position = end
        return tuple(kept)


class BlockState(IdentityEnum):
    IDLE = "idle"  # between blocks
    IN_BLOCK = "in block"  # after BeginAppendBlock, no partial message open
    IN_BLOCK_PARTIAL = "in block, partial message open"
    SPLIT_PENDING = "after EndAppendBlock, split event not complete"


class Input(IdentityEnum):
    SETUP_APPEND = "SetupAppend"
    READ_SEGMENT = "ReadSegment"
    KEEP_ALIVE = "KeepAlive"
    BEGIN_BLOCK = "BeginAppendBlock"
    EVENT = "Event"
    PARTIAL_BEGIN = "PartialMessage(Begin)"
    PARTIAL_MIDDLE = "PartialMessage(Middle)"
    PARTIAL_END = "PartialMessage(End)"
    END_BLOCK = "EndAppendBlock"


S, In = BlockState, Input
# Which request is legal in which state, and the state it leads to.  Anything
# missing is a protocol error.  Inside a block nothing but events may appear
# (BeginAppendBlock announced their exact wire size); after an EndAppendBlock
# that cut an event, only the rest of that event may follow.
TRANSITIONS: dict[tuple[BlockState, Input], BlockState] = {
    (S.IDLE, In.SETUP_APPEND): S.IDLE,
    (S.IDLE, In.READ_SEGMENT): S.IDLE,
    (S.IDLE, In.KEEP_ALIVE): S.IDLE,
    (S.IDLE, In.BEGIN_BLOCK): S.IN_BLOCK,
    (S.IN_BLOCK, In.EVENT): S.IN_BLOCK,
    (S.IN_BLOCK, In.PARTIAL_BEGIN): S.IN_BLOCK_PARTIAL,
    (S.IN_BLOCK, In.END_BLOCK): S.IDLE,
    (S.IN_BLOCK_PARTIAL, In.PARTIAL_MIDDLE): S.IN_BLOCK_PARTIAL,
    (S.IN_BLOCK_PARTIAL, In.PARTIAL_END): S.IN_BLOCK,
    (S.IN_BLOCK_PARTIAL, In.END_BLOCK): S.SPLIT_PENDING,
    (S.SPLIT_PENDING, In.PARTIAL_MIDDLE): S.SPLIT_PENDING,
    (S.SPLIT_PENDING, In.PARTIAL_END): S.IDLE,
}
del S, In

_HINTS: dict[tuple[BlockState, Input], str] = {
    (BlockState.IDLE, Input.EVENT): "an EVENT is only valid inside an append block",
    (BlockState.IDLE, Input.END_BLOCK): "EndAppendBlock without a BeginAppendBlock",
    (BlockState.IDLE, Input.PARTIAL_BEGIN): "partial messages are only valid inside a block",
    (BlockState.IDLE, Input.PARTIAL_MIDDLE): "PartialMessage(Middle) without a Begin",
    (BlockState.IDLE, Input.PARTIAL_END): "PartialMessage(End) without a Begin",
    (BlockState.IN_BLOCK, Input.PARTIAL_MIDDLE): "PartialMessage(Middle) without a Begin",
    (BlockState.IN_BLOCK, Input.PARTIAL_END): "PartialMessage(End) without a Begin",
    (BlockState.IN_BLOCK, Input.BEGIN_BLOCK): "BeginAppendBlock inside an open block",
    (BlockState.IN_BLOCK_PARTIAL, Input.PARTIAL_BEGIN): (
        "a new partial message began before the previous one was complete"
    ),
    (BlockState.SPLIT_PENDING, Input.PARTIAL_BEGIN): (
        "a new partial message began before the previous one was complete"
    ),
}


def _classify(frame: RequestFrame) -> Input:
    if isinstance(frame, Event):
        return Input.EVENT
    if isinstance(frame, PartialMessage):
        return {
            PartialKind.BEGIN: Input.PARTIAL_BEGIN,
            PartialKind.MIDDLE: Input.PARTIAL_MIDDLE,
            PartialKind.END: Input.PARTIAL_END,
        }[PartialKind(frame.kind)]
    if isinstance(frame, SetupAppend):
        return Input.SETUP_APPEND
    if isinstance(frame, ReadSegment):
        return Input.READ_SEGMENT
    if isinstance(frame, KeepAlive):
        return Input.KEEP_ALIVE
    if isinstance(frame, BeginAppendBlock):
        return Input.BEGIN_BLOCK
    if isinstance(frame, EndAppendBlock):
        return Input.END_BLOCK
    raise RemoteProtocolError(f"{type(frame).__name__} is not a request")


@dataclass(slots=True)
class _Appender:
    segment: str
    established: bool = False
    ack_level: int = 0
    # Offset the next BeginAppendBlock must carry; None until the first block
    # after setup, which may restart at or below the ack level (a resend).
    next_offset: int | None = None


@dataclass(slots=True)
class _Block:
    begin: BeginAppendBlock
    segment: str
    wire_bytes: int = 0  # EVENT / PARTIAL bytes seen since the Begin
    events: list[bytes] = field(default_factory=list)
    event_bytes: int = 0  # EVENT-framed size of the complete events
    end: EndAppendBlock | None = None


class AppendTracker:
    """Validates request frames in order and assembles append blocks.

    ``handle`` returns the BlockEvents completed by a frame (at most one).
    Setup is two-step: ``handle(SetupAppend)`` makes the ConnectionId pending,
    ``establish`` (the AppendSetup reply) makes it usable.
    """

    def __init__(
        self,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_block_size: int = DEFAULT_MAX_BLOCK_SIZE,
        max_connection_ids: int = DEFAULT_MAX_CONNECTION_IDS,
    ) -> None:
        if not 0 < max_message_size <= MAX_WIRE_LENGTH:
            raise ValueError(f"max_message_size must be in 1..{MAX_WIRE_LENGTH}")
        self.max_message_size = max_message_size
        self.max_block_size = max_block_size
        self.max_connection_ids = max_connection_ids
        self.state = BlockState.IDLE
        self._appenders: dict[uuid.UUID, _Appender] = {}
        self._block: _Block | None = None
        self._partial = bytearray()
        # Total size of the split event, known once its header arrived.
        self._partial_total: int | None = None

    @property
    def held_bytes(self) -> int:
        """Bytes of a block and of a split event still being assembled."""
        block = self._block
        return len(self._partial) + (block.event_bytes if block is not None else 0)

    # --- appender table ------------------------------------------------------

    def segment_of(self, connection_id: uuid.UUID) -> str | None:
        appender = self._appenders.get(connection_id)
        return appender.segment if appender else None

    def is_established(self, connection_id: uuid.UUID) -> bool:
        appender = self._appenders.get(connection_id)
        return appender is not None and appender.established

    def is_pending(self, connection_id: uuid.UUID, segment: str) -> bool:
        appender = self._appenders.get(connection_id)
        return appender is not None and not appender.established and appender.segment == segment

    def establish(self, connection_id: uuid.UUID, segment: str, ack_level: int) -> None:
        """Record the AppendSetup reply; the caller checked ``is_pending``."""
        self._appenders[connection_id] = _Appender(
            segment=segment, established=True, ack_level=ack_level
        )

    # --- frames ----------------------------------------------------------------

    def handle(self, frame: RequestFrame, wire_size: int) -> BlockEvents | None:
        kind = _classify(frame)
        next_state = TRANSITIONS.get((self.state, kind))
        if next_state is None:
            hint = _HINTS.get((self.state, kind))
            raise RemoteProtocolError(
                hint or f"{kind.value} is not allowed {self.state.value}",
                segment=self._block.segment if self._block else "",
            )
        result: BlockEvents | None = None
        if isinstance(frame, SetupAppend):
            self._setup(frame)
        elif isinstance(frame, ReadSegment):
            self._check_read(frame)
        elif isinstance(frame, BeginAppendBlock):
            self._begin(frame)
        elif isinstance(frame, Event):
            block = self._count(wire_size)
            self._add_event(block, bytes(frame.data))
        elif isinstance(frame, PartialMessage):
            if self.state is not BlockState.SPLIT_PENDING:
                self._count(wire_size)
            result = self._partial_piece(frame)
        elif isinstance(frame, EndAppendBlock):
            result = self._end(frame)
        self.state = next_state
        return result

    def _setup(self, frame: SetupAppend) -> None:
        if frame.connection_id not in self._appenders and (
            len(self._appenders) >= self.max_connection_ids
        ):
            raise RemoteProtocolError(
                f"more than {self.max_connection_ids} ConnectionIds on one connection",
                code=TOO_LARGE,
                segment=frame.segment,
            )
        # A repeated SetupAppend re-synchronises that appender (new ack level).
        self._appenders[frame.connection_id] = _Appender(segment=frame.segment)

    def _check_read(self, frame: ReadSegment) -> None:
        if frame.offset < 0 or frame.suggested_length < 0:
            raise RemoteProtocolError(
                f"ReadSegment with negative offset {frame.offset} or suggested length "
                f"{frame.suggested_length}",
                segment=frame.segment,
            )

    def _begin(self, frame: BeginAppendBlock) -> None:
        appender = self._appenders.get(frame.connection_id)
        if appender is None:
            raise RemoteProtocolError(
                f"BeginAppendBlock for ConnectionId {frame.connection_id} before its SetupAppend"
            )
        segment = appender.segment
        if not appender.established:
            raise RemoteProtocolError(
                f"BeginAppendBlock for ConnectionId {frame.connection_id} before its "
                "AppendSetup reply",
                segment=segment,
            )
        if frame.connection_offset < 0 or frame.length_before_end < 0:
            raise RemoteProtocolError(
                f"BeginAppendBlock with negative offset {frame.connection_offset} or "
                f"length {frame.length_before_end}",
                segment=segment,
            )
        if frame.length_before_end > self.max_block_size:
            raise RemoteProtocolError(
                f"append block of {frame.length_before_end} bytes exceeds the maximum of "
                f"{self.max_block_size}",
                code=TOO_LARGE,
                segment=segment,
            )
        expected = appender.next_offset
        if expected is None:
            if frame.connection_offset > appender.ack_level:
                raise RemoteProtocolError(
                    f"BeginAppendBlock at offset {frame.connection_offset} leaves a gap after "
                    f"ack level {appender.ack_level}",
                    segment=segment,
                )
        elif frame.connection_offset != expected:
            raise RemoteProtocolError(
                f"BeginAppendBlock at offset {frame.connection_offset}; the previous block "
                f"ended at {expected}",
                segment=segment,
            )
        self._block = _Block(begin=frame, segment=segment)

    def _count(self, wire_size: int) -> _Block:
        block = self._block
        assert block is not None
        block.wire_bytes += wire_size
        if block.wire_bytes > block.begin.length_before_end:
            raise RemoteProtocolError(
                f"append block overruns: BeginAppendBlock announced "
                f"{block.begin.length_before_end} bytes before EndAppendBlock, got at "
                f"least {block.wire_bytes}",
                segment=block.segment,
            )
        return block

    def _add_event(self, block: _Block, data: bytes) -> None:
        block.events.append(data)
        block.event_bytes += event_size(data)

    def _partial_piece(self, frame: PartialMessage) -> BlockEvents | None:
        block = self._block
        assert block is not None
        if frame.kind == PartialKind.BEGIN:
            self._partial = bytearray()
            self._partial_total = None
        self._partial += frame.data
        self._check_partial(block)
        if frame.kind != PartialKind.END:
            return None
        total = self._partial_total
        if total is None or len(self._partial) != total:
            raise RemoteProtocolError(
                f"partial message ended after {len(self._partial)} bytes; its EVENT "
                f"header announced {total if total is not None else 'at least 8'}",
                segment=block.segment,
            )
        self._add_event(block, bytes(self._partial[HEADER_SIZE:]))
        self._partial = bytearray()
        self._partial_total = None
        if block.end is not None:
            return self._finish(block, block.end)
        return None

    def _check_partial(self, block: _Block) -> None:
        size = len(self._partial)
        if self._partial_total is None and size >= HEADER_SIZE:
            type_code, length = peek_header(self._partial)
            if type_code != EVENT:
                raise RemoteProtocolError(
                    f"a partial message inside an append block must carry an EVENT, "
                    f"not {type_name(type_code)}",
                    segment=block.segment,
                )
            if length > self.max_message_size:
                raise RemoteProtocolError(
                    f"split EVENT of {length} bytes exceeds the maximum message size of "
                    f"{self.max_message_size} bytes",
                    code=TOO_LARGE,
                    segment=block.segment,
                )
            self._partial_total = HEADER_SIZE + length
            if block.end is not None and self._partial_total != (
                block.end.block_length - block.event_bytes
            ):
                raise RemoteProtocolError(
                    f"split EVENT of {self._partial_total} bytes does not match the "
                    f"EndAppendBlock block length {block.end.block_length}",
                    segment=block.segment,
                )
        limit = self._partial_total
        if limit is None:
            limit = HEADER_SIZE + self.max_message_size
        if block.end is not None:
            # The End fixed the split event's size already.
            limit = min(limit, block.end.block_length - block.event_bytes)
        if size > limit:
            raise RemoteProtocolError(
                f"partial message of {size} bytes exceeds the {limit} bytes its event "
                "may have",
                segment=block.segment,
            )

    def _end(self, frame: EndAppendBlock) -> BlockEvents | None:
        block = self._block
        assert block is not None
        begin = block.begin
        if frame.connection_id != begin.connection_id:
            raise RemoteProtocolError(
                f"EndAppendBlock for ConnectionId {frame.connection_id} closes the block of "
                f"{begin.connection_id}",
                segment=block.segment,
            )
        if block.wire_bytes != begin.length_before_end:
            raise RemoteProtocolError(
                f"EndAppendBlock after {block.wire_bytes} bytes; BeginAppendBlock announced "
                f"{begin.length_before_end}",
                segment=block.segment,
            )
        if frame.block_length < 0 or (
            frame.connection_offset != begin.connection_offset + frame.block_length
        ):
            raise RemoteProtocolError(
                f"EndAppendBlock offset {frame.connection_offset} is not the block's start "
                f"{begin.connection_offset} plus its length {frame.block_length}",
                segment=block.segment,
            )
        if self.state is BlockState.IN_BLOCK:
            if frame.block_length != block.event_bytes:
                raise RemoteProtocolError(
                    f"EndAppendBlock block length {frame.block_length} differs from the "
                    f"{block.event_bytes} EVENT bytes in the block",
                    segment=block.segment,
                )
            return self._finish(block, frame)
        # An event is split across the End: its rest follows in partial messages.
        rest = frame.block_length - block.event_bytes
        if rest < max(HEADER_SIZE, len(self._partial), self._partial_total or 0) or (
            self._partial_total is not None and rest != self._partial_total
        ):
            raise RemoteProtocolError(
                f"EndAppendBlock block length {frame.block_length} does not match the "
                f"{block.event_bytes} EVENT bytes in the block plus the split event",
                segment=block.segment,
            )
        if rest > HEADER_SIZE + self.max_message_size:
            raise RemoteProtocolError(
                f"split EVENT of {rest} bytes exceeds the maximum message size",
                code=TOO_LARGE,
                segment=block.segment,
            )
        block.end = frame
        return None

    def _finish(self, block: _Block, end: EndAppendBlock) -> BlockEvents:
        if block.event_bytes != end.block_length:
            raise RemoteProtocolError(
                f"EndAppendBlock block length {end.block_length} differs from the "
                f"{block.event_bytes} EVENT bytes begun in the block",
                segment=block.segment,
            )
        appender = self._appenders[block.begin.connection_id]
        appender.next_offset = end.connection_offset
        self._block = None
        return BlockEvents(
            connection_id=block.begin.connection_id,
            segment=block.segment,
            offset=block.begin.connection_offset,
            events=tuple(block.events),
            block_end=end,
        )
