"""Sans-IO segment-wire connections.

``ServerConnection`` turns received bytes into what the adapter acts on
(SetupAppend, ReadSegment, KeepAlive and complete append blocks as
``BlockEvents``) and encodes replies.  ``ClientConnection`` is its mirror.
Both refuse what the peer sends wrong with ``RemoteProtocolError``; after one
the connection is unusable, the caller sends ``exc.reply()`` (server side) and
closes.  What this side may not send raises ``LocalProtocolError``.

The pure per-message functions live in ``wire.py``; :class:`FrameReader`, the
buffer that cuts a byte stream into messages, is the state kept here.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable

from polyport.protocols.budgets import BudgetAccount, frame_refusal
from polyport.protocols.errors import BUSY
from polyport.protocols.framing import InputBuffer
from polyport.protocols.segment.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.segment.frames import (
    DEFAULT_MAX_BLOCK_SIZE,
    DEFAULT_MAX_CONNECTION_IDS,
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_TYPES,
    HEADER_SIZE,
    MAX_WIRE_LENGTH,
    PARTIAL_MESSAGE,
    REPLY_TYPES,
    REQUEST_TYPES,
    AppendSetup,
    AuthFailed,
    DataAppended,
    ErrorMessage,
    Frame,
    KeepAlive,
    NoSuchSegment,
    PartialKind,
    PartialMessage,
    ReadSegment,
    ReplyFrame,
    RequestFrame,
    SegmentRead,
    SetupAppend,
)
from polyport.protocols.segment.state import AppendTracker, BlockEvents, BlockState
from polyport.protocols.segment.wire import (
    check_header,
    decode_body,
    encode_frame,
    peek_header,
)

__all__ = [
    "ClientConnection",
    "ClientInput",
    "FrameReader",
    "ServerConnection",
    "ServerInput",
]

# What a ServerConnection hands its adapter.
ServerInput = SetupAppend | ReadSegment | KeepAlive | BlockEvents
# What a ClientConnection hands its user (partial messages are reassembled).
ClientInput = (
    AppendSetup
    | DataAppended
    | SegmentRead
    | NoSuchSegment
    | AuthFailed
    | ErrorMessage
    | KeepAlive
)

_SERVER_SENDS = (
    AppendSetup,
    DataAppended,
    SegmentRead,
    NoSuchSegment,
    AuthFailed,
    ErrorMessage,
    KeepAlive,
    PartialMessage,
)


class FrameReader:
    """Cuts a byte stream into frames.  Holds at most one incomplete message,
    and refuses a header that declares too much before reading its body."""

    def __init__(
        self,
        *,
        max_message_size: int,
        accepted_types: Collection[int] | None = None,
        peer: str = "peer",
    ) -> None:
        self._buffer = InputBuffer()
        self._max = max_message_size
        self._accepted = accepted_types
        self._peer = peer

    @property
    def input_buffer(self) -> InputBuffer:
        """Received bytes not decoded yet: the start of a frame still arriving."""
        return self._buffer

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[Frame, int]]:
        """Every complete frame in the input so far, each with its wire size."""
        self._buffer += data
        out: list[tuple[Frame, int]] = []
        buffer = self._buffer
        pos = 0
        try:
            while len(buffer) - pos >= HEADER_SIZE:
                type_code, length = peek_header(buffer, pos)
                check_header(
                    type_code,
                    length,
                    max_message_size=self._max,
                    accepted_types=self._accepted,
                    peer=self._peer,
                )
                end = pos + HEADER_SIZE + length
                if end > len(buffer):
                    break
                frame = decode_body(type_code, bytes(buffer[pos + HEADER_SIZE : end]))
                out.append((frame, HEADER_SIZE + length))
                pos = end
        finally:
            del buffer[:pos]
        return out


class _Failed:
    """Remembers the first error: after it the byte stream cannot be trusted."""

    def __init__(self) -> None:
        self.error: ProtocolError | None = None

    def check(self) -> None:
        if self.error is not None:
            # The same class: whoever broke the stream is still to blame.
            raise type(self.error)(
                f"connection already failed: {self.error.message}",
                code=self.error.code,
                segment=self.error.segment,
            )


class ServerConnection:
    """The server side of one TCP connection."""

    def __init__(
        self,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        max_block_size: int = DEFAULT_MAX_BLOCK_SIZE,
        max_connection_ids: int = DEFAULT_MAX_CONNECTION_IDS,
    ) -> None:
        self._tracker = AppendTracker(
            max_message_size=max_message_size,
            max_block_size=max_block_size,
            max_connection_ids=max_connection_ids,
        )
        self._reader = FrameReader(
            max_message_size=max_message_size, accepted_types=REQUEST_TYPES, peer="client"
        )
        self._failed = _Failed()
        # This connection's share of a budget other connections draw on too
        # (the gateway's): a message not yet whole, and a block or split
        # event being assembled, are held against it, as the peer can leave
        # them unfinished as long as it likes.  None: only the size limits.
        self.budget: BudgetAccount | None = None

    @property
    def input_buffer(self) -> InputBuffer:
        """Received bytes not decoded yet: the start of a frame still arriving."""
        return self._reader.input_buffer

    @property
    def state(self) -> BlockState:
        return self._tracker.state

    @property
    def failed(self) -> bool:
        return self._failed.error is not None

    @property
    def idle(self) -> bool:
        """True between messages and outside blocks: closing now loses nothing."""
        return self._reader.buffered == 0 and self._tracker.state is BlockState.IDLE

    def segment_of(self, connection_id: uuid.UUID) -> str | None:
        """The segment a set-up (or pending) ConnectionId appends to."""
        return self._tracker.segment_of(connection_id)

    def receive_data(self, data: bytes) -> list[ServerInput]:
        self._failed.check()
        out: list[ServerInput] = []
        try:
            for frame, size in self._reader.feed(data):
                block = self._tracker.handle(frame, size)  # type: ignore[arg-type]
                if block is not None:
                    out.append(block)
                elif isinstance(frame, (SetupAppend, ReadSegment, KeepAlive)):
                    out.append(frame)
            if self.budget is not None:
                held = self._reader.buffered + self._tracker.held_bytes
                refused = self.budget.hold(held)
                if refused is not None:
                    raise RemoteProtocolError(frame_refusal(held, refused), code=BUSY)
        except RemoteProtocolError as exc:
            self._failed.error = exc
            raise
        return out

    def send(self, frame: ReplyFrame) -> bytes:
        if not isinstance(frame, _SERVER_SENDS):
            raise LocalProtocolError(f"a server does not send {type(frame).__name__}")
        if isinstance(frame, AppendSetup):
            if not self._tracker.is_pending(frame.connection_id, frame.segment):
                raise LocalProtocolError(
                    f"AppendSetup for ConnectionId {frame.connection_id} on "
                    f"{frame.segment!r} answers no pending SetupAppend"
                )
            data = encode_frame(frame)
            self._tracker.establish(frame.connection_id, frame.segment, frame.ack_level)
            return data
        if isinstance(frame, DataAppended) and not self._tracker.is_established(
            frame.connection_id
        ):
            raise LocalProtocolError(
                f"DataAppended for ConnectionId {frame.connection_id}, which is not set up"
            )
        return encode_frame(frame)


class ClientConnection:
    """The client side of one TCP connection.  ``send`` runs the same request
    state machine as the server, so a sequence it accepts is one the server
    accepts (given the server's size limits)."""

    def __init__(self, max_message_size: int = MAX_WIRE_LENGTH) -> None:
        self._tracker = AppendTracker(
            max_message_size=MAX_WIRE_LENGTH,
            max_block_size=(1 << 31) - 1,
            max_connection_ids=1 << 31,
        )
        self._reader = FrameReader(
            max_message_size=max_message_size, accepted_types=REPLY_TYPES, peer="server"
        )
        self._max = max_message_size
        self._partial: bytearray | None = None
        self._failed = _Failed()

    @property
    def input_buffer(self) -> InputBuffer:
        """Received bytes not decoded yet: the start of a frame still arriving."""
        return self._reader.input_buffer

    @property
    def state(self) -> BlockState:
        return self._tracker.state

    @property
    def failed(self) -> bool:
        return self._failed.error is not None

    def is_established(self, connection_id: uuid.UUID) -> bool:
        return self._tracker.is_established(connection_id)

    def send(self, frame: RequestFrame) -> bytes:
        self._failed.check()
        if FRAME_TYPES.get(type(frame)) not in REQUEST_TYPES:
            raise LocalProtocolError(f"a client does not send {type(frame).__name__}")
        data = encode_frame(frame)
        try:
            self._tracker.handle(frame, len(data))
        except RemoteProtocolError as exc:
            # The state machine is shared with the server, where it judges the
            # peer; here the request is ours.
            error = LocalProtocolError(exc.message, code=exc.code, segment=exc.segment)
            self._failed.error = error
            raise error from None
        return data

    def send_all(self, frames: Iterable[RequestFrame]) -> bytes:
        return b"".join(self.send(frame) for frame in frames)

    def receive_data(self, data: bytes) -> list[ClientInput]:
        self._failed.check()
        out: list[ClientInput] = []
        try:
            for read, _size in self._reader.feed(data):
                frame = read
                if isinstance(read, PartialMessage):
                    whole = self._reassemble(read)
                    if whole is None:
                        continue
                    frame = whole
                out.append(self._accept(frame))
        except RemoteProtocolError as exc:
            self._failed.error = exc
            raise
        return out

    def _reassemble(self, frame: PartialMessage) -> Frame | None:
        if frame.kind == PartialKind.BEGIN:
            if self._partial is not None:
                raise RemoteProtocolError(
                    "a new partial message began before the previous one was complete"
                )
            self._partial = bytearray()
        elif self._partial is None:
            raise RemoteProtocolError(
                f"PartialMessage({PartialKind(frame.kind).name}) without a Begin"
            )
        self._partial += frame.data
        if len(self._partial) >= HEADER_SIZE:
            type_code, length = peek_header(self._partial)
            accepted = REPLY_TYPES - {PARTIAL_MESSAGE}
            check_header(
                type_code, length, max_message_size=self._max, accepted_types=accepted,
                peer="server (inside a partial message)",
            )
            if len(self._partial) > HEADER_SIZE + length:
                raise RemoteProtocolError("partial message pieces overrun the message they carry")
        if frame.kind != PartialKind.END:
            return None
        whole, self._partial = bytes(self._partial), None
        if len(whole) < HEADER_SIZE or len(whole) != HEADER_SIZE + peek_header(whole)[1]:
            raise RemoteProtocolError("partial message ended before the message it carries")
        return decode_body(peek_header(whole)[0], whole[HEADER_SIZE:])

    def _accept(self, frame: Frame) -> ClientInput:
        if isinstance(frame, AppendSetup):
            if not self._tracker.is_pending(frame.connection_id, frame.segment):
                raise RemoteProtocolError(
                    f"AppendSetup for ConnectionId {frame.connection_id} on {frame.segment!r} "
                    "answers no pending SetupAppend",
                    segment=frame.segment,
                )
            self._tracker.establish(frame.connection_id, frame.segment, frame.ack_level)
        elif isinstance(frame, DataAppended) and not self._tracker.is_established(
            frame.connection_id
        ):
            raise RemoteProtocolError(
                f"DataAppended for ConnectionId {frame.connection_id}, which is not set up"
            )
        return frame  # type: ignore[return-value]
