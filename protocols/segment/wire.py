"""Pure encoding and decoding of segment-wire messages: bytes in, frames out
and back, no state.  The reader that cuts a byte stream into messages is in
``connection.py``."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Collection

from polyport.protocols.errors import TOO_LARGE, UNSUPPORTED
from polyport.protocols.segment import mutf8
from polyport.protocols.segment.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.segment.frames import (
    APPEND_SETUP,
    AUTH_FAILED,
    BEGIN_APPEND_BLOCK,
    BEGIN_APPEND_BLOCK_SIZE,
    DATA_APPENDED,
    DATA_APPENDED_SIZE,
    END_APPEND_BLOCK,
    END_APPEND_BLOCK_SIZE,
    ERROR_MESSAGE,
    EVENT,
    FLAG_AT_TAIL,
    FLAG_END_OF_SEGMENT,
    FRAME_TYPES,
    HEADER_SIZE,
    KEEP_ALIVE,
    MAX_STRING_BYTES,
    MAX_WIRE_LENGTH,
    NO_SUCH_SEGMENT,
    PARTIAL_MESSAGE,
    READ_SEGMENT,
    SEGMENT_READ,
    SEGMENT_READ_FLAGS,
    SETUP_APPEND,
    TYPE_NAMES,
    UUID_SIZE,
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
    type_name,
)

_HEADER = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
_UUID_I64_I32 = struct.Struct(">16sqi")
_UUID_I64 = struct.Struct(">16sq")

# --- field encoders ----------------------------------------------------------


def _string(text: str) -> bytes:
    try:
        raw = mutf8.encode(text)
    except ValueError as exc:
        raise LocalProtocolError(str(exc)) from None
    if len(raw) > MAX_STRING_BYTES:
        raise LocalProtocolError(
            f"string of {len(raw)} bytes exceeds the {MAX_STRING_BYTES}-byte limit"
        )
    return _U16.pack(len(raw)) + raw


def _uuid(value: uuid.UUID) -> bytes:
    return value.bytes


def _i64(value: int) -> bytes:
    try:
        return _I64.pack(value)
    except struct.error:
        raise LocalProtocolError(f"{value} does not fit a signed 64-bit long") from None


def _i32(value: int) -> bytes:
    try:
        return _I32.pack(value)
    except struct.error:
        raise LocalProtocolError(f"{value} does not fit a signed 32-bit integer") from None


def _message(type_code: int, body: bytes) -> bytes:
    if len(body) > MAX_WIRE_LENGTH:
        raise LocalProtocolError(
            f"{type_name(type_code)} body of {len(body)} bytes exceeds the wire limit "
            f"of {MAX_WIRE_LENGTH}"
        )
    return _HEADER.pack(type_code, len(body)) + body


# --- message encoders ----------------------------------------------------------


def encode_event(frame: Event) -> bytes:
    return _message(EVENT, bytes(frame.data))


def _credentials(credentials: str) -> bytes:
    # Optional trailing field: written only when there is something to say,
    # so an anonymous request is byte for byte the original message.
    return _string(credentials) if credentials else b""


def encode_setup_append(frame: SetupAppend) -> bytes:
    body = _uuid(frame.connection_id) + _string(frame.segment) + _credentials(frame.credentials)
    return _message(SETUP_APPEND, body)


def encode_append_setup(frame: AppendSetup) -> bytes:
    body = _string(frame.segment) + _uuid(frame.connection_id) + _i64(frame.ack_level)
    return _message(APPEND_SETUP, body)


def encode_begin_append_block(frame: BeginAppendBlock) -> bytes:
    body = (
        _uuid(frame.connection_id)
        + _i64(frame.connection_offset)
        + _i32(frame.length_before_end)
    )
    return _message(BEGIN_APPEND_BLOCK, body)


def encode_end_append_block(frame: EndAppendBlock) -> bytes:
    body = _uuid(frame.connection_id) + _i64(frame.connection_offset) + _i32(frame.block_length)
    return _message(END_APPEND_BLOCK, body)


def encode_data_appended(frame: DataAppended) -> bytes:
    return _message(DATA_APPENDED, _uuid(frame.connection_id) + _i64(frame.ack_level))


def encode_read_segment(frame: ReadSegment) -> bytes:
    body = (
        _string(frame.segment)
        + _i64(frame.offset)
        + _i32(frame.suggested_length)
        + _credentials(frame.credentials)
    )
    return _message(READ_SEGMENT, body)


def encode_segment_read(frame: SegmentRead) -> bytes:
    flags = (FLAG_AT_TAIL if frame.at_tail else 0) | (
        FLAG_END_OF_SEGMENT if frame.end_of_segment else 0
    )
    body = _string(frame.segment) + _i64(frame.offset) + bytes([flags]) + bytes(frame.data)
    return _message(SEGMENT_READ, body)


def encode_partial_message(frame: PartialMessage) -> bytes:
    try:
        kind = PartialKind(frame.kind)
    except ValueError:
        raise LocalProtocolError(f"unknown partial message kind {frame.kind!r}") from None
    return _message(PARTIAL_MESSAGE, bytes([kind]) + bytes(frame.data))


def encode_keep_alive(frame: KeepAlive) -> bytes:
    return _message(KEEP_ALIVE, bytes(frame.data))


def encode_no_such_segment(frame: NoSuchSegment) -> bytes:
    return _message(NO_SUCH_SEGMENT, _string(frame.segment) + _string(frame.message))


def encode_auth_failed(frame: AuthFailed) -> bytes:
    return _message(AUTH_FAILED, _string(frame.segment) + _string(frame.message))


def encode_error_message(frame: ErrorMessage) -> bytes:
    body = _string(frame.segment) + _string(frame.code) + _string(frame.message)
    return _message(ERROR_MESSAGE, body)


_ENCODERS: dict[type, Callable[[Frame], bytes]] = {
    Event: encode_event,  # type: ignore[dict-item]
    SetupAppend: encode_setup_append,  # type: ignore[dict-item]
    AppendSetup: encode_append_setup,  # type: ignore[dict-item]
    BeginAppendBlock: encode_begin_append_block,  # type: ignore[dict-item]
    EndAppendBlock: encode_end_append_block,  # type: ignore[dict-item]
    DataAppended: encode_data_appended,  # type: ignore[dict-item]
    ReadSegment: encode_read_segment,  # type: ignore[dict-item]
    SegmentRead: encode_segment_read,  # type: ignore[dict-item]
    PartialMessage: encode_partial_message,  # type: ignore[dict-item]
    KeepAlive: encode_keep_alive,  # type: ignore[dict-item]
    NoSuchSegment: encode_no_such_segment,  # type: ignore[dict-item]
    AuthFailed: encode_auth_failed,  # type: ignore[dict-item]
    ErrorMessage: encode_error_message,  # type: ignore[dict-item]
}


def encode_frame(frame: Frame) -> bytes:
    encoder = _ENCODERS.get(type(frame))
    if encoder is None:
        raise LocalProtocolError(f"not a segment-wire frame: {frame!r}")
    return encoder(frame)


# --- field decoders ------------------------------------------------------------


class _Body:
    """Cursor over one message body; running short is a RemoteProtocolError
    because the header already promised these bytes."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise RemoteProtocolError(
                f"{self.what} body of {len(self.data)} bytes is too short for its fields"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def string(self) -> str:
        (size,) = _U16.unpack(self.take(2))
        return mutf8.decode(self.take(size))

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.take(UUID_SIZE))

    def i64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def u8(self) -> int:
        return self.take(1)[0]

    def optional_string(self) -> str:
        """A trailing optional string: empty when the body ends before it."""
        return self.string() if self.pos < len(self.data) else ""

    def rest(self) -> bytes:
        chunk = self.data[self.pos :]
        self.pos = len(self.data)
        return chunk

    def done(self) -> None:
        if self.pos != len(self.data):
            raise RemoteProtocolError(
                f"{self.what} body has {len(self.data) - self.pos} bytes after its last field"
            )


def _decode_event(body: _Body) -> Frame:
    return Event(data=body.rest())


def _decode_setup_append(body: _Body) -> Frame:
    return SetupAppend(
        connection_id=body.uuid(), segment=body.string(), credentials=body.optional_string()
    )


def _decode_append_setup(body: _Body) -> Frame:
    return AppendSetup(segment=body.string(), connection_id=body.uuid(), ack_level=body.i64())


def _decode_begin_append_block(body: _Body) -> Frame:
    cid, offset, length = _UUID_I64_I32.unpack(body.take(_UUID_I64_I32.size))
    return BeginAppendBlock(
        connection_id=uuid.UUID(bytes=cid), connection_offset=offset, length_before_end=length
    )


def _decode_end_append_block(body: _Body) -> Frame:
    cid, offset, length = _UUID_I64_I32.unpack(body.take(_UUID_I64_I32.size))
    return EndAppendBlock(
        connection_id=uuid.UUID(bytes=cid), connection_offset=offset, block_length=length
    )


def _decode_data_appended(body: _Body) -> Frame:
    cid, ack = _UUID_I64.unpack(body.take(_UUID_I64.size))
    return DataAppended(connection_id=uuid.UUID(bytes=cid), ack_level=ack)


def _decode_read_segment(body: _Body) -> Frame:
    return ReadSegment(
        segment=body.string(),
        offset=body.i64(),
        suggested_length=body.i32(),
        credentials=body.optional_string(),
    )


def _decode_segment_read(body: _Body) -> Frame:
    segment, offset, flags = body.string(), body.i64(), body.u8()
    if flags & ~SEGMENT_READ_FLAGS:
        raise RemoteProtocolError(
            f"SEGMENT_READ flags 0x{flags:02x} set reserved bits", segment=segment
        )
    return SegmentRead(
        segment=segment,
        offset=offset,
        at_tail=bool(flags & FLAG_AT_TAIL),
        end_of_segment=bool(flags & FLAG_END_OF_SEGMENT),
        data=body.rest(),
    )


def _decode_partial_message(body: _Body) -> Frame:
    raw_kind = body.u8()
    try:
        kind = PartialKind(raw_kind)
    except ValueError:
        raise RemoteProtocolError(f"PARTIAL_MESSAGE kind {raw_kind} is not 0, 1 or 2") from None
    return PartialMessage(kind=kind, data=body.rest())


def _decode_keep_alive(body: _Body) -> Frame:
    return KeepAlive(data=body.rest())


def _decode_no_such_segment(body: _Body) -> Frame:
    return NoSuchSegment(segment=body.string(), message=body.string())


def _decode_auth_failed(body: _Body) -> Frame:
    return AuthFailed(segment=body.string(), message=body.string())


def _decode_error_message(body: _Body) -> Frame:
    return ErrorMessage(segment=body.string(), code=body.string(), message=body.string())


_DECODERS: dict[int, Callable[[_Body], Frame]] = {
    EVENT: _decode_event,
    SETUP_APPEND: _decode_setup_append,
    APPEND_SETUP: _decode_append_setup,
    BEGIN_APPEND_BLOCK: _decode_begin_append_block,
    END_APPEND_BLOCK: _decode_end_append_block,
    DATA_APPENDED: _decode_data_appended,
    READ_SEGMENT: _decode_read_segment,
    SEGMENT_READ: _decode_segment_read,
    PARTIAL_MESSAGE: _decode_partial_message,
    KEEP_ALIVE: _decode_keep_alive,
    NO_SUCH_SEGMENT: _decode_no_such_segment,
    AUTH_FAILED: _decode_auth_failed,
    ERROR_MESSAGE: _decode_error_message,
}
assert set(_DECODERS) == set(TYPE_NAMES) == set(FRAME_TYPES.values())

_FIXED_BODY_SIZES = {
    BEGIN_APPEND_BLOCK: BEGIN_APPEND_BLOCK_SIZE,
    END_APPEND_BLOCK: END_APPEND_BLOCK_SIZE,
    DATA_APPENDED: DATA_APPENDED_SIZE,
}
_MIN_BODY_SIZES = {
    SETUP_APPEND: UUID_SIZE + 2,
    APPEND_SETUP: 2 + UUID_SIZE + 8,
    READ_SEGMENT: 2 + 8 + 4,
    SEGMENT_READ: 2 + 8 + 1,
    PARTIAL_MESSAGE: 1,
    NO_SUCH_SEGMENT: 2 + 2,
    AUTH_FAILED: 2 + 2,
    ERROR_MESSAGE: 2 + 2 + 2,
}


def decode_body(type_code: int, body: bytes) -> Frame:
    """The frame of one message given its type code and body."""
    decoder = _DECODERS.get(type_code)
    if decoder is None:
        raise RemoteProtocolError(f"unknown message type {type_code}", code=UNSUPPORTED)
    cursor = _Body(body, TYPE_NAMES[type_code])
    frame = decoder(cursor)
    cursor.done()
    return frame


def check_header(
    type_code: int,
    length: int,
    *,
    max_message_size: int,
    accepted_types: Collection[int] | None = None,
    peer: str = "peer",
) -> None:
    """Everything a header alone can prove wrong, so that a bad message is
    refused before its body is awaited or buffered."""
    if type_code not in TYPE_NAMES:
        raise RemoteProtocolError(f"unknown message type {type_code}", code=UNSUPPORTED)
    name = TYPE_NAMES[type_code]
    if accepted_types is not None and type_code not in accepted_types:
        raise RemoteProtocolError(f"{name} is not a message a {peer} may send")
    if length > MAX_WIRE_LENGTH:
        raise RemoteProtocolError(
            f"{name} declares a length of {length} bytes; messages must be under 2^24"
        )
    if length > max_message_size:
        raise RemoteProtocolError(
            f"{name} of {length} bytes exceeds the maximum message size of "
            f"{max_message_size} bytes",
            code=TOO_LARGE,
        )
    fixed = _FIXED_BODY_SIZES.get(type_code)
    if fixed is not None and length != fixed:
        raise RemoteProtocolError(f"{name} body must be {fixed} bytes, header says {length}")
    minimum = _MIN_BODY_SIZES.get(type_code, 0)
    if length < minimum:
        raise RemoteProtocolError(
            f"{name} body must be at least {minimum} bytes, header says {length}"
        )


def decode_frame(data: bytes, *, max_message_size: int = MAX_WIRE_LENGTH) -> Frame:
    """Decode exactly one complete message (header and body)."""
    if len(data) < HEADER_SIZE:
        raise RemoteProtocolError(f"a message needs {HEADER_SIZE} header bytes, got {len(data)}")
    type_code, length = _HEADER.unpack_from(data)
    check_header(type_code, length, max_message_size=max_message_size)
    if len(data) != HEADER_SIZE + length:
        raise RemoteProtocolError(
            f"{type_name(type_code)} header says {length} body bytes, got {len(data) - HEADER_SIZE}"
        )
    return decode_body(type_code, bytes(data[HEADER_SIZE:]))


def peek_header(data: bytes | bytearray, offset: int = 0) -> tuple[int, int]:
    """(type code, body length) of the header at ``data[offset:]``."""
    type_code, length = _HEADER.unpack_from(data, offset)
    return int(type_code), int(length)


def split_segment_name(name: str) -> tuple[str, str]:
    """``<context>/<stream>`` -> (context, stream); without a slash the context
    is ``default``.  Only the first slash separates, so a stream name may hold
    more of them."""
    context, slash, stream = name.partition("/")
    if not slash:
        context, stream = "default", name
    if not context or not stream:
        raise RemoteProtocolError(
            f"segment name {name!r} has an empty context or stream", segment=name
        )
    return context, stream
