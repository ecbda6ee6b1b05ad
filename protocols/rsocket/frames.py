"""RSocket 1.0 frames as immutable values.

Every frame starts with the 6-byte header ``0 | stream id (31 bits)``,
``frame type (6 bits) | flags (10 bits)``, big-endian.  Over TCP a 24-bit
frame length (not counting itself) comes first; over WebSocket a binary
message is exactly one frame.

Flags appear as fields where they carry meaning.  ``metadata`` is ``None``
when the M flag is clear and bytes (possibly empty) when it is set, so a frame
round-trips bit for bit.  The I flag is kept only on frames whose meaning
depends on it (EXT and unknown types).
"""

from __future__ import annotations

from dataclasses import dataclass

from polyport.protocols.reactive import frames as reactive
from polyport.protocols.reactive.frames import CONNECTION_STREAM_ID as CONNECTION_STREAM_ID
from polyport.protocols.reactive.frames import Cancel as Cancel
from polyport.protocols.reactive.frames import ConnectionFrame, frame_names
from polyport.protocols.reactive.frames import RequestN as RequestN

PROTOCOL = "rsocket"
DEFAULT_PORT = 7878
WEBSOCKET_PATH = "/rsocket"

MAJOR_VERSION = 1
MINOR_VERSION = 0

# --- frame types (6 bits) -----------------------------------------------------------
TYPE_RESERVED = 0x00
TYPE_SETUP = 0x01
TYPE_LEASE = 0x02
TYPE_KEEPALIVE = 0x03
TYPE_REQUEST_RESPONSE = 0x04
TYPE_REQUEST_FNF = 0x05
TYPE_REQUEST_STREAM = 0x06
TYPE_REQUEST_CHANNEL = 0x07
TYPE_REQUEST_N = 0x08
TYPE_CANCEL = 0x09
TYPE_PAYLOAD = 0x0A
TYPE_ERROR = 0x0B
TYPE_METADATA_PUSH = 0x0C
TYPE_RESUME = 0x0D
TYPE_RESUME_OK = 0x0E
TYPE_EXT = 0x3F

# --- flags (10 bits; the upper two are common to every frame type) ---------------------
FLAG_IGNORE = 0x200
FLAG_METADATA = 0x100
FLAG_FOLLOWS = 0x80  # REQUEST_*, PAYLOAD
FLAG_RESUME = 0x80  # SETUP
FLAG_RESPOND = 0x80  # KEEPALIVE
FLAG_LEASE = 0x40  # SETUP
FLAG_COMPLETE = 0x40  # PAYLOAD, REQUEST_CHANNEL
FLAG_NEXT = 0x20  # PAYLOAD

# --- error codes ----------------------------------------------------------------------
INVALID_SETUP = 0x001
UNSUPPORTED_SETUP = 0x002
REJECTED_SETUP = 0x003
REJECTED_RESUME = 0x004
CONNECTION_ERROR = 0x101
CONNECTION_CLOSE = 0x102
APPLICATION_ERROR = 0x201
REJECTED = 0x202
CANCELED = 0x203
INVALID = 0x204

# Codes that only make sense on stream 0 (the others only on a stream > 0).
CONNECTION_ERROR_CODES = frozenset(
    {INVALID_SETUP, UNSUPPORTED_SETUP, REJECTED_SETUP, REJECTED_RESUME, CONNECTION_ERROR,
     CONNECTION_CLOSE}
)

# --- sizes and limits -----------------------------------------------------------------
LENGTH_SIZE = 3
HEADER_SIZE = 6
MAX_FRAME_LENGTH = 0xFF_FFFF  # the spec's limit, whatever the transport
MAX_U24 = 0xFF_FFFF
MAX_STREAM_ID = 0x7FFF_FFFF
MAX_U31 = 0x7FFF_FFFF
MAX_U63 = 0x7FFF_FFFF_FFFF_FFFF
# Request N of 2^31-1 is "unbounded" (rsocket-java, rsocket-js, rsocket-py).
MAX_REQUEST_N = MAX_U31

# Defaults of the connection objects (all configurable).
DEFAULT_MAX_FRAME_SIZE = MAX_FRAME_LENGTH  # header + body, without the TCP length
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024  # metadata + data of a reassembled frame
DEFAULT_MAX_FRAGMENT = 64 * 1024  # metadata + data bytes per fragment we send


@dataclass(frozen=True, slots=True)
class Setup(ConnectionFrame):
    """The client's first frame: versions, keepalive interval and max lifetime
    (milliseconds), MIME types of metadata and data, and the setup payload."""

    keepalive: int
    lifetime: int
    metadata_mime: str
    data_mime: str
    metadata: bytes | None = None
    data: bytes = b""
    major: int = MAJOR_VERSION
    minor: int = MINOR_VERSION
    lease: bool = False
    # Present (R flag) when the client asks for resumption.
    resume_token: bytes | None = None


@dataclass(frozen=True, slots=True)
class Lease(ConnectionFrame):
    """The responder's grant: ``requests`` requests within ``ttl`` ms."""

    ttl: int
    requests: int
    metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class Keepalive(ConnectionFrame):
    respond: bool = False
    last_position: int = 0
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class RequestResponse(reactive.StreamFrame):
    metadata: bytes | None = None
    data: bytes = b""
    follows: bool = False


@dataclass(frozen=True, slots=True)
class RequestFnf(reactive.StreamFrame):
    metadata: bytes | None = None
    data: bytes = b""
    follows: bool = False


@dataclass(frozen=True, slots=True)
class RequestStream(reactive.CreditedRequest):
    metadata: bytes | None = None
    data: bytes = b""
    follows: bool = False


@dataclass(frozen=True, slots=True)
class RequestChannel(reactive.CreditedRequest):
    metadata: bytes | None = None
    data: bytes = b""
    follows: bool = False
    complete: bool = False


@dataclass(frozen=True, slots=True)
class ErrorFrame(reactive.StreamFrame):
    """``code`` is one of the error codes above; ``data`` is UTF-8 text."""

    code: int
    data: bytes = b""

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Payload(reactive.StreamFrame):
    """NEXT (``next``), COMPLETE (``complete``) or both; ``follows`` marks a
    fragment that more fragments follow."""

    metadata: bytes | None = None
    data: bytes = b""
    follows: bool = False
    complete: bool = False
    next: bool = False


@dataclass(frozen=True, slots=True)
class MetadataPush:
    metadata: bytes = b""
    # The spec says a non-zero id is ignored; kept so the codec can report it.
    stream_id: int = CONNECTION_STREAM_ID


@dataclass(frozen=True, slots=True)
class Resume(ConnectionFrame):
    token: bytes
    last_server_position: int
    first_client_position: int
    major: int = MAJOR_VERSION
    minor: int = MINOR_VERSION


@dataclass(frozen=True, slots=True)
class ResumeOk(ConnectionFrame):
    last_client_position: int


@dataclass(frozen=True, slots=True)
class UnknownFrame(reactive.UnknownFrame):
    """(Its body kept whole.)"""

    ignore_flag = FLAG_IGNORE
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Ext(reactive.StreamFrame):
    extended_type: int
    metadata: bytes | None = None
    data: bytes = b""
    ignore: bool = False


Request = RequestResponse | RequestFnf | RequestStream | RequestChannel
Frame = (
    Setup | Lease | Keepalive | RequestResponse | RequestFnf | RequestStream
    | RequestChannel | RequestN | Cancel | Payload | ErrorFrame | MetadataPush | Resume
    | ResumeOk | Ext | UnknownFrame
)

FRAME_TYPE_OF: dict[type, int] = {
    Setup: TYPE_SETUP, Lease: TYPE_LEASE, Keepalive: TYPE_KEEPALIVE,
    RequestResponse: TYPE_REQUEST_RESPONSE, RequestFnf: TYPE_REQUEST_FNF,
    RequestStream: TYPE_REQUEST_STREAM, RequestChannel: TYPE_REQUEST_CHANNEL,
    RequestN: TYPE_REQUEST_N, Cancel: TYPE_CANCEL, Payload: TYPE_PAYLOAD,
    ErrorFrame: TYPE_ERROR, MetadataPush: TYPE_METADATA_PUSH, Resume: TYPE_RESUME,
    ResumeOk: TYPE_RESUME_OK, Ext: TYPE_EXT,
}

FRAME_NAMES: dict[int, str] = frame_names(globals())


def frame_name(frame_type: int) -> str:
    return FRAME_NAMES.get(frame_type, f"0x{frame_type:02X}")


def describe(frame: Frame) -> str:
    if isinstance(frame, UnknownFrame):
        return f"frame type 0x{frame.frame_type:02X}"
    return frame_name(FRAME_TYPE_OF[type(frame)])
