"""Pure encoding and decoding of ReactiveSocket frames.

``encode_frame`` / ``decode_frame`` work on one frame without the TCP length
(the WebSocket form: one frame per binary message).  ``encode_tcp_frame`` adds
the length, ``split_tcp_frames`` takes complete frames off a TCP byte buffer.
The connection objects (``connection.py``) add the stream rules on top.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from polyport.protocols.reactive.wire import TRANSPORTS as TRANSPORTS
from polyport.protocols.reactive.wire import encode_by_type, for_transport
from polyport.protocols.reactivesocket.errors import (
    MALFORMED,
    TOO_LARGE,
    UNSUPPORTED,
    LocalProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.reactivesocket.frames import (
    CONNECTION_STREAM_ID,
    FLAG_BEGIN,
    FLAG_COMPLETE,
    FLAG_END,
    FLAG_IGNORE,
    FRAME_TYPE_OF,
    HEADER_SIZE,
    LENGTH_SIZE,
    MAX_EXT_TYPE,
    MAX_FRAME_LENGTH,
    MAX_I64,
    MAX_STREAM_ID,
    MIN_I64,
    REQUEST_N_SIZE,
    TCP_HEADER_SIZE,
    TYPE_CANCEL,
    TYPE_ERROR,
    TYPE_EXT,
    TYPE_REQUEST_FNF,
    TYPE_REQUEST_N,
    TYPE_REQUEST_RESPONSE,
    TYPE_REQUEST_STREAM,
    TYPE_REQUEST_SUB,
    TYPE_RESPONSE,
    TYPE_SETUP,
    VERSION,
    Cancel,
    ErrorFrame,
    Ext,
    Frame,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Response,
    Setup,
    UnknownFrame,
    frame_name,
)

_HEADER = struct.Struct(">BBHQ")
_LENGTH = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")



# --- encoding ------------------------------------------------------------------


def _check_stream_id(stream_id: int) -> None:
    if not 0 <= stream_id <= MAX_STREAM_ID:
        raise LocalProtocolError(f"stream id {stream_id} is outside 0..2**64-1")


def _check_i64(name: str, value: int) -> None:
    if not MIN_I64 <= value <= MAX_I64:
        raise LocalProtocolError(f"{name} {value} does not fit a signed 64-bit integer")


def _header(frame_type: int, flags: int, stream_id: int) -> bytes:
    _check_stream_id(stream_id)
    return _HEADER.pack(VERSION, flags, frame_type, stream_id)


def _fragment_flags(begin: bool, end: bool) -> int:
    return (FLAG_BEGIN if begin else 0) | (FLAG_END if end else 0)


def encode_setup(frame: Setup) -> bytes:
    return _header(TYPE_SETUP, 0, CONNECTION_STREAM_ID) + frame.data


def encode_request_response(frame: RequestResponse) -> bytes:
    flags = _fragment_flags(frame.begin, frame.end)
    return _header(TYPE_REQUEST_RESPONSE, flags, frame.stream_id) + frame.data


def encode_request_fnf(frame: RequestFnf) -> bytes:
    flags = _fragment_flags(frame.begin, frame.end)
    return _header(TYPE_REQUEST_FNF, flags, frame.stream_id) + frame.data


def encode_request_stream(frame: RequestStream) -> bytes:
    _check_i64("initial request N", frame.initial_n)
    flags = _fragment_flags(frame.begin, frame.end)
    head = _header(TYPE_REQUEST_STREAM, flags, frame.stream_id)
    return head + _I64.pack(frame.initial_n) + frame.data


def encode_request_sub(frame: RequestSub) -> bytes:
    _check_i64("initial request N", frame.initial_n)
    flags = _fragment_flags(frame.begin, frame.end)
    head = _header(TYPE_REQUEST_SUB, flags, frame.stream_id)
    return head + _I64.pack(frame.initial_n) + frame.data


def encode_request_n(frame: RequestN) -> bytes:
    _check_i64("request N", frame.n)
    return _header(TYPE_REQUEST_N, 0, frame.stream_id) + _I64.pack(frame.n)


def encode_cancel(frame: Cancel) -> bytes:
    return _header(TYPE_CANCEL, 0, frame.stream_id)


def encode_response(frame: Response) -> bytes:
    flags = _fragment_flags(frame.begin, frame.end) | (FLAG_COMPLETE if frame.complete else 0)
    return _header(TYPE_RESPONSE, flags, frame.stream_id) + frame.data


def encode_error(frame: ErrorFrame) -> bytes:
    return _header(TYPE_ERROR, 0, frame.stream_id) + frame.data


def encode_ext(frame: Ext) -> bytes:
    if not 0 <= frame.extended_type <= MAX_EXT_TYPE:
        raise LocalProtocolError(f"extended type {frame.extended_type} does not fit 32 bits")
    flags = FLAG_IGNORE if frame.ignore else 0
    head = _header(TYPE_EXT, flags, frame.stream_id)
    return head + _U32.pack(frame.extended_type) + frame.data


def encode_unknown(frame: UnknownFrame) -> bytes:
    if not 0 <= frame.frame_type <= 0xFFFF or not 0 <= frame.flags <= 0xFF:
        raise LocalProtocolError("unknown frame: type must fit 16 bits and flags 8 bits")
    return _header(frame.frame_type, frame.flags, frame.stream_id) + frame.data


_ENCODERS: dict[type, Callable[..., bytes]] = {
    Setup: encode_setup, RequestResponse: encode_request_response,
    RequestFnf: encode_request_fnf, RequestStream: encode_request_stream,
    RequestSub: encode_request_sub, RequestN: encode_request_n, Cancel: encode_cancel,
    Response: encode_response, ErrorFrame: encode_error, Ext: encode_ext,
    UnknownFrame: encode_unknown,
}


def encode_frame(frame: Frame) -> bytes:
    """One frame without the TCP length: a WebSocket binary message."""
    return encode_by_type(_ENCODERS, frame, "a ReactiveSocket frame", LocalProtocolError)


def add_tcp_length(message: bytes) -> bytes:
    length = LENGTH_SIZE + len(message)
    if length > MAX_FRAME_LENGTH:
        raise LocalProtocolError(f"frame of {length} bytes exceeds the 31-bit frame length")
    return _LENGTH.pack(length) + message


encode_tcp_frame, encode_for = for_transport(encode_frame, add_tcp_length)


# --- decoding ------------------------------------------------------------------


def _malformed(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, code=MALFORMED)


def _fixed_body(name: str, body: bytes, size: int) -> None:
    if len(body) != size:
        raise _malformed(f"{name} frame body must be {size} bytes, got {len(body)}")


def _request_n_prefix(name: str, body: bytes) -> tuple[int, bytes]:
    if len(body) < REQUEST_N_SIZE:
        raise _malformed(
            f"{name} frame needs an 8-byte Initial Request N, body has {len(body)} bytes"
        )
    (n,) = _I64.unpack_from(body)
    return n, body[REQUEST_N_SIZE:]


def decode_frame(message: bytes) -> Frame:
    """Decode one frame given without the TCP length.

    Raises :class:`RemoteProtocolError` for a short header, a version other than 0
    (code ``unsupported``) or a body that does not fit the frame type's layout.
    Unknown frame types come back as :class:`UnknownFrame`.
    """
    if len(message) < HEADER_SIZE:
        raise _malformed(f"frame of {len(message)} bytes is shorter than the 12-byte header")
    version, flags, frame_type, stream_id = _HEADER.unpack_from(message)
    if version != VERSION:
        raise RemoteProtocolError(
            f"unsupported protocol version {version} (only version {VERSION} is spoken)",
            code=UNSUPPORTED,
        )
    body = bytes(message[HEADER_SIZE:])
    begin = bool(flags & FLAG_BEGIN)
    end = bool(flags & FLAG_END)
    if frame_type == TYPE_SETUP:
        if stream_id != CONNECTION_STREAM_ID:
            raise _malformed(f"SETUP must use stream id 0, not {stream_id}")
        return Setup(body)
    if frame_type == TYPE_REQUEST_RESPONSE:
        return RequestResponse(stream_id, body, begin, end)
    if frame_type == TYPE_REQUEST_FNF:
        return RequestFnf(stream_id, body, begin, end)
    if frame_type == TYPE_REQUEST_STREAM:
        n, data = _request_n_prefix("REQUEST_STREAM", body)
        return RequestStream(stream_id, n, data, begin, end)
    if frame_type == TYPE_REQUEST_SUB:
        n, data = _request_n_prefix("REQUEST_SUB", body)
        return RequestSub(stream_id, n, data, begin, end)
    if frame_type == TYPE_REQUEST_N:
        _fixed_body("REQUEST_N", body, REQUEST_N_SIZE)
        return RequestN(stream_id, _I64.unpack(body)[0])
    if frame_type == TYPE_CANCEL:
        _fixed_body("CANCEL", body, 0)
        return Cancel(stream_id)
    if frame_type == TYPE_RESPONSE:
        return Response(stream_id, body, bool(flags & FLAG_COMPLETE), begin, end)
    if frame_type == TYPE_ERROR:
        return ErrorFrame(stream_id, body)
    if frame_type == TYPE_EXT:
        if len(body) < 4:
            raise _malformed(f"EXT frame needs a 4-byte extended type, body has {len(body)}")
        (ext_type,) = _U32.unpack_from(body)
        return Ext(stream_id, ext_type, body[4:], bool(flags & FLAG_IGNORE))
    return UnknownFrame(frame_type, flags, stream_id, body)


def check_tcp_length(length: int, max_frame_size: int) -> None:
    """Validate a TCP Frame Length as soon as its 4 bytes are in: we never wait
    for (or allocate) a frame above the limit."""
    if length & 0x8000_0000:
        raise _malformed("frame length has the reserved top bit set")
    if length < TCP_HEADER_SIZE:
        raise _malformed(
            f"frame length {length} is shorter than the {TCP_HEADER_SIZE}-byte length + header"
        )
    if length - LENGTH_SIZE > max_frame_size:
        raise RemoteProtocolError(
            f"frame of {length - LENGTH_SIZE} bytes exceeds the limit of {max_frame_size}",
            code=TOO_LARGE,
        )


def split_tcp_frames(buffer: bytearray, max_frame_size: int) -> list[bytes]:
    """Remove every complete frame from ``buffer`` and return them without
    their length.  An incomplete frame stays in the buffer."""
    messages: list[bytes] = []
    pos = 0
    available = len(buffer)
    while available - pos >= LENGTH_SIZE:
        (length,) = _LENGTH.unpack_from(buffer, pos)
        check_tcp_length(length, max_frame_size)
        if available - pos < length:
            break
        messages.append(bytes(buffer[pos + LENGTH_SIZE : pos + length]))
        pos += length
    del buffer[:pos]
    return messages


def check_message_size(message: bytes, max_frame_size: int) -> None:
    if len(message) > max_frame_size:
        raise RemoteProtocolError(
            f"frame of {len(message)} bytes exceeds the limit of {max_frame_size}",
            code=TOO_LARGE,
        )


def describe(frame: Frame) -> str:
    if isinstance(frame, UnknownFrame):
        return f"frame type 0x{frame.frame_type:04X}"
    return frame_name(FRAME_TYPE_OF[type(frame)])
