"""Segment-wire messages: one frozen dataclass per wire type, plus constants.

Every message on the wire is ``type (i32) | length (u32) | body`` in big-endian
order.  The type codes are the ones of the system the protocol comes from, so
existing clients interoperate.  Layouts are documented in
``docs/protocols/segment.md``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum

# The listener's name, its settings prefix and the origin of appended events.
PROTOCOL = "segment"
DEFAULT_PORT = 12345

HEADER_SIZE = 8
# The length field is a u32 whose upper 8 bits stay zero: messages are < 2^24.
MAX_WIRE_LENGTH = (1 << 24) - 1
# Event bodies up to 8 MiB (the original system's limit); configurable per
# connection, never above MAX_WIRE_LENGTH.
DEFAULT_MAX_MESSAGE_SIZE = 8 * 1024 * 1024
# An append block is buffered until its EndAppendBlock so that it can be stored
# atomically; this bounds that buffer.
DEFAULT_MAX_BLOCK_SIZE = 16 * 1024 * 1024
# Bounds the per-connection table of appenders (pending and established).
DEFAULT_MAX_CONNECTION_IDS = 1024

MAX_STRING_BYTES = 0xFFFF
UUID_SIZE = 16

# --- type codes -------------------------------------------------------------

EVENT = 0
SETUP_APPEND = 1
APPEND_SETUP = 2
BEGIN_APPEND_BLOCK = 3
END_APPEND_BLOCK = 4
DATA_APPENDED = 7
READ_SEGMENT = 9
SEGMENT_READ = 10
PARTIAL_MESSAGE = -2
KEEP_ALIVE = 100
NO_SUCH_SEGMENT = 53
AUTH_FAILED = 60
ERROR_MESSAGE = 61

TYPE_NAMES: dict[int, str] = {
    EVENT: "EVENT",
    SETUP_APPEND: "SETUP_APPEND",
    APPEND_SETUP: "APPEND_SETUP",
    BEGIN_APPEND_BLOCK: "BEGIN_APPEND_BLOCK",
    END_APPEND_BLOCK: "END_APPEND_BLOCK",
    DATA_APPENDED: "DATA_APPENDED",
    READ_SEGMENT: "READ_SEGMENT",
    SEGMENT_READ: "SEGMENT_READ",
    PARTIAL_MESSAGE: "PARTIAL_MESSAGE",
    KEEP_ALIVE: "KEEP_ALIVE",
    NO_SUCH_SEGMENT: "NO_SUCH_SEGMENT",
    AUTH_FAILED: "AUTH_FAILED",
    ERROR_MESSAGE: "ERROR_MESSAGE",
}

# KEEP_ALIVE and PARTIAL_MESSAGE travel both ways.
REQUEST_TYPES = frozenset(
    {
        EVENT,
        SETUP_APPEND,
        BEGIN_APPEND_BLOCK,
        END_APPEND_BLOCK,
        READ_SEGMENT,
        PARTIAL_MESSAGE,
        KEEP_ALIVE,
    }
)
REPLY_TYPES = frozenset(
    {
        APPEND_SETUP,
        DATA_APPENDED,
        SEGMENT_READ,
        NO_SUCH_SEGMENT,
        AUTH_FAILED,
        ERROR_MESSAGE,
        PARTIAL_MESSAGE,
        KEEP_ALIVE,
    }
)

# SegmentRead's two booleans share one byte.
FLAG_AT_TAIL = 0x01
FLAG_END_OF_SEGMENT = 0x02
SEGMENT_READ_FLAGS = FLAG_AT_TAIL | FLAG_END_OF_SEGMENT

# Fixed body sizes, checked from the header before the body is awaited.
BEGIN_APPEND_BLOCK_SIZE = UUID_SIZE + 8 + 4
END_APPEND_BLOCK_SIZE = UUID_SIZE + 8 + 4
DATA_APPENDED_SIZE = UUID_SIZE + 8
# A PARTIAL_MESSAGE costs its header and the kind byte on top of its data.
PARTIAL_OVERHEAD = HEADER_SIZE + 1


class PartialKind(IntEnum):
    BEGIN = 0
    MIDDLE = 1
    END = 2


# --- requests ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One event body; legal only inside an append block."""

    data: bytes


@dataclass(frozen=True, slots=True)
class SetupAppend:
    connection_id: uuid.UUID
    segment: str
    # Optional, at the very end of the body (where Pravega's later wire
    # versions put the delegation token): "<user>:<password>"; empty or
    # absent = anonymous.  Kept out of repr: it holds a password.
    credentials: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class BeginAppendBlock:
    connection_id: uuid.UUID
    # EVENT-framed bytes this appender had written to the segment before the block.
    connection_offset: int
    # Wire bytes (EVENT and PARTIAL_MESSAGE messages, headers included)
    # between this message and the EndAppendBlock.
    length_before_end: int


@dataclass(frozen=True, slots=True)
class EndAppendBlock:
    connection_id: uuid.UUID
    # BeginAppendBlock's offset + block_length.
    connection_offset: int
    # EVENT-framed bytes of the events begun in the block; an event split
    # across the EndAppendBlock counts whole.
    block_length: int


@dataclass(frozen=True, slots=True)
class ReadSegment:
    segment: str
    offset: int
    suggested_length: int
    # As SetupAppend's: optional "<user>:<password>" at the end of the body.
    credentials: str = field(default="", repr=False)


def split_credentials(credentials: str) -> tuple[str | None, str | None]:
    """(user, password) of a credentials string; (None, None) when empty
    (anonymous).  The user name ends at the first ':' (the password may hold
    more); without one the whole string is the user name, with no password."""
    if not credentials:
        return None, None
    user, _, password = credentials.partition(":")
    return user, password


# --- replies ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendSetup:
    segment: str
    connection_id: uuid.UUID
    ack_level: int


@dataclass(frozen=True, slots=True)
class DataAppended:
    connection_id: uuid.UUID
    ack_level: int


@dataclass(frozen=True, slots=True)
class SegmentRead:
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes


@dataclass(frozen=True, slots=True)
class NoSuchSegment:
    segment: str
    message: str


@dataclass(frozen=True, slots=True)
class AuthFailed:
    segment: str
    message: str


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    """Every other failure.  ``code`` is the canonical error name
    (``malformed``, ``too_large``, ``busy`` ...); ``segment`` may be empty."""

    segment: str
    code: str
    message: str


# --- both ways --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartialMessage:
    kind: PartialKind
    data: bytes


@dataclass(frozen=True, slots=True)
class KeepAlive:
    data: bytes = b""


RequestFrame = (
    Event
    | SetupAppend
    | BeginAppendBlock
    | EndAppendBlock
    | ReadSegment
    | PartialMessage
    | KeepAlive
)
ReplyFrame = (
    AppendSetup
    | DataAppended
    | SegmentRead
    | NoSuchSegment
    | AuthFailed
    | ErrorMessage
    | PartialMessage
    | KeepAlive
)
ErrorReply = NoSuchSegment | AuthFailed | ErrorMessage
Frame = (
    Event
    | SetupAppend
    | AppendSetup
    | BeginAppendBlock
    | EndAppendBlock
    | DataAppended
    | ReadSegment
    | SegmentRead
    | PartialMessage
    | KeepAlive
    | NoSuchSegment
    | AuthFailed
    | ErrorMessage
)

FRAME_TYPES: dict[type, int] = {
    Event: EVENT,
    SetupAppend: SETUP_APPEND,
    AppendSetup: APPEND_SETUP,
    BeginAppendBlock: BEGIN_APPEND_BLOCK,
    EndAppendBlock: END_APPEND_BLOCK,
    DataAppended: DATA_APPENDED,
    ReadSegment: READ_SEGMENT,
    SegmentRead: SEGMENT_READ,
    PartialMessage: PARTIAL_MESSAGE,
    KeepAlive: KEEP_ALIVE,
    NoSuchSegment: NO_SUCH_SEGMENT,
    AuthFailed: AUTH_FAILED,
    ErrorMessage: ERROR_MESSAGE,
}


def type_name(type_code: int) -> str:
    return TYPE_NAMES.get(type_code, f"unknown type {type_code}")


def event_size(data: bytes) -> int:
    """Bytes an event occupies in the segment view (and in offsets)."""
    return HEADER_SIZE + len(data)
