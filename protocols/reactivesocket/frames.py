"""ReactiveSocket frames (draft spec, version 0) as immutable values.

Every frame travels with the 12-byte header ``version u8 | flags u8 | type u16 |
stream id u64`` (big-endian).  Over TCP a ``u32`` frame length (counting itself
and the header; top bit reserved 0) comes first; over WebSocket a binary
message is exactly one frame.

Flags that only matter on the wire (I, B, E) appear as fields where they carry
meaning: ``begin``/``end`` on RESPONSE and on the four request frames (which may
be fragmented, see docs/protocols/reactivesocket.md), ``ignore`` on EXT and on
unknown frames.  The I bit of a frame the receiver understands has no effect,
so known frames do not keep it.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyport.protocols.reactive import frames as reactive
from polyport.protocols.reactive.frames import CONNECTION_STREAM_ID as CONNECTION_STREAM_ID
from polyport.protocols.reactive.frames import Cancel as Cancel
from polyport.protocols.reactive.frames import ConnectionFrame, frame_names
from polyport.protocols.reactive.frames import RequestN as RequestN

# The listener's name, its settings' prefix (``reactivesocket_<name>``) and
# the origin of the events it appends.
PROTOCOL = "reactivesocket"
DEFAULT_PORT = 7070
WEBSOCKET_PATH = "/reactivesocket"

VERSION = 0

# --- frame types ---------------------------------------------------------------
TYPE_RESERVED = 0x0000
TYPE_SETUP = 0x0001
TYPE_REQUEST_RESPONSE = 0x0011
TYPE_REQUEST_FNF = 0x0012
TYPE_REQUEST_STREAM = 0x0013
TYPE_REQUEST_SUB = 0x0014
TYPE_REQUEST_N = 0x0015
TYPE_CANCEL = 0x0016
TYPE_RESPONSE = 0x0020
TYPE_ERROR = 0x0021
TYPE_EXT = 0xFFFF

REQUEST_TYPES = frozenset(
    {TYPE_REQUEST_RESPONSE, TYPE_REQUEST_FNF, TYPE_REQUEST_STREAM, TYPE_REQUEST_SUB}
)

# --- flags ---------------------------------------------------------------------
FLAG_IGNORE = 0x80
FLAG_BEGIN = 0x40
FLAG_END = 0x20
FLAG_COMPLETE = 0x10

# --- sizes and limits ------------------------------------------------------------
LENGTH_SIZE = 4
HEADER_SIZE = 12
TCP_HEADER_SIZE = LENGTH_SIZE + HEADER_SIZE
REQUEST_N_SIZE = 8
MAX_FRAME_LENGTH = 0x7FFF_FFFF  # 31 bits: the top bit of the length is reserved
MAX_STREAM_ID = 0xFFFF_FFFF_FFFF_FFFF
MAX_EXT_TYPE = 0xFFFF_FFFF
MIN_I64 = -(1 << 63)
MAX_I64 = (1 << 63) - 1

# Defaults of the connection objects (all configurable).
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024  # header + body, without the TCP length
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024  # a reassembled request / response
DEFAULT_MAX_FRAGMENT = 64 * 1024  # data bytes per fragment we send


@dataclass(frozen=True, slots=True)
class Setup(ConnectionFrame):
    """Capabilities of the client; always on stream 0."""

    data: bytes = b""


@dataclass(frozen=True, slots=True)
class RequestResponse(reactive.StreamFrame):
    data: bytes = b""
    # A whole request has neither bit (as in the spec) or both; see fragmentation.
    begin: bool = False
    end: bool = False


@dataclass(frozen=True, slots=True)
class RequestFnf(reactive.StreamFrame):
    data: bytes = b""
    begin: bool = False
    end: bool = False


@dataclass(frozen=True, slots=True)
class RequestStream(reactive.CreditedRequest):
    data: bytes = b""
    begin: bool = False
    end: bool = False


@dataclass(frozen=True, slots=True)
class RequestSub(reactive.CreditedRequest):
    data: bytes = b""
    begin: bool = False
    end: bool = False


@dataclass(frozen=True, slots=True)
class Response(reactive.StreamFrame):
    """NEXT (``complete`` False) or COMPLETE.  ``begin`` and ``end`` both set
    (the default) is a whole response; B alone begins a fragmented one, neither
    continues it, E alone ends it."""

    data: bytes = b""
    complete: bool = False
    begin: bool = True
    end: bool = True


@dataclass(frozen=True, slots=True)
class ErrorFrame(reactive.StreamFrame):
    """Stream error from a responder, or (stream 0) a rejected SETUP /
    connection error followed by close."""

    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Ext(reactive.StreamFrame):
    extended_type: int
    data: bytes = b""
    ignore: bool = False


@dataclass(frozen=True, slots=True)
class UnknownFrame(reactive.UnknownFrame):
    ignore_flag = FLAG_IGNORE
    data: bytes = b""


Request = RequestResponse | RequestFnf | RequestStream | RequestSub
Frame = (
    Setup | RequestResponse | RequestFnf | RequestStream | RequestSub | RequestN | Cancel
    | Response | ErrorFrame | Ext | UnknownFrame
)

FRAME_TYPE_OF: dict[type, int] = {
    Setup: TYPE_SETUP, RequestResponse: TYPE_REQUEST_RESPONSE, RequestFnf: TYPE_REQUEST_FNF,
    RequestStream: TYPE_REQUEST_STREAM, RequestSub: TYPE_REQUEST_SUB, RequestN: TYPE_REQUEST_N,
    Cancel: TYPE_CANCEL, Response: TYPE_RESPONSE, ErrorFrame: TYPE_ERROR, Ext: TYPE_EXT,
}

FRAME_NAMES: dict[int, str] = frame_names(globals())


def frame_name(frame_type: int) -> str:
    return FRAME_NAMES.get(frame_type, f"0x{frame_type:04X}")
