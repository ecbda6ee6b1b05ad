"""Pure encoding and decoding of RSocket 1.0 frames.

``encode_frame`` / ``decode_frame`` work on one frame without the TCP length
(the WebSocket form: one frame per binary message).  ``add_tcp_length`` puts
the 24-bit length in front; the connection objects (``connection.py``) take
frames off a TCP byte stream and add the stream rules on top.

Reserved top bits of 31- and 63-bit fields are masked off on decoding, as the
spec asks of bits it gives no meaning ("not interpreted on reception").
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace

from polyport.protocols.reactive.wire import TRANSPORTS as TRANSPORTS
from polyport.protocols.reactive.wire import encode_by_type, for_transport
from polyport.protocols.rsocket.errors import (
    MALFORMED,
    TOO_LARGE,
    LocalProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.rsocket.frames import (
    CONNECTION_ERROR,
    FLAG_COMPLETE,
    FLAG_FOLLOWS,
    FLAG_IGNORE,
    FLAG_LEASE,
    FLAG_METADATA,
    FLAG_NEXT,
    FLAG_RESPOND,
    FLAG_RESUME,
    HEADER_SIZE,
    LENGTH_SIZE,
    MAX_FRAME_LENGTH,
    MAX_STREAM_ID,
    MAX_U24,
    MAX_U31,
    MAX_U63,
    TYPE_CANCEL,
    TYPE_ERROR,
    TYPE_EXT,
    TYPE_KEEPALIVE,
    TYPE_LEASE,
    TYPE_METADATA_PUSH,
    TYPE_PAYLOAD,
    TYPE_REQUEST_CHANNEL,
    TYPE_REQUEST_FNF,
    TYPE_REQUEST_N,
    TYPE_REQUEST_RESPONSE,
    TYPE_REQUEST_STREAM,
    TYPE_RESUME,
    TYPE_RESUME_OK,
    TYPE_SETUP,
    Cancel,
    ErrorFrame,
    Ext,
    Frame,
    Keepalive,
    Lease,
    MetadataPush,
    Payload,
    Request,
    RequestChannel,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    Resume,
    ResumeOk,
    Setup,
    UnknownFrame,
    describe,
    frame_name,
)

# The frame header (stream id, type and flags) and the big-endian integers.
_HEADER, _U16, _U32, _U64 = map(struct.Struct, (">IH", ">H", ">I", ">Q"))



# --- encoding -----------------------------------------------------------------------


def _u31(name: str, value: int, minimum: int = 0) -> bytes:
    if not minimum <= value <= MAX_U31:
        raise LocalProtocolError(f"{name} {value} is outside {minimum}..2**31-1")
    return _U32.pack(value)


def _u63(name: str, value: int) -> bytes:
    if not 0 <= value <= MAX_U63:
        raise LocalProtocolError(f"{name} {value} is outside 0..2**63-1")
    return _U64.pack(value)


def _header(frame_type: int, flags: int, stream_id: int) -> bytes:
    if not 0 <= stream_id <= MAX_STREAM_ID:
        raise LocalProtocolError(f"stream id {stream_id} is outside 0..2**31-1")
    return _HEADER.pack(stream_id, (frame_type << 10) | flags)


def _with_metadata(metadata: bytes | None, data: bytes) -> tuple[int, bytes]:
    """M flag and the ``metadata length | metadata | data`` part of a frame
    that may carry both."""
    if metadata is None:
        return 0, data
    if len(metadata) > MAX_U24:
        raise LocalProtocolError(f"metadata of {len(metadata)} bytes exceeds 2**24-1")
    return FLAG_METADATA, len(metadata).to_bytes(3, "big") + metadata + data


def _mime(name: str, value: str) -> bytes:
    raw = value.encode("ascii", "strict") if value.isascii() else b""
    if not raw or len(raw) > 0xFF:
        raise LocalProtocolError(f"{name} must be 1..255 US-ASCII characters, got {value!r}")
    return bytes([len(raw)]) + raw


def encode_setup(f: Setup) -> bytes:
    flags = (FLAG_LEASE if f.lease else 0) | (FLAG_RESUME if f.resume_token is not None else 0)
    if not (0 <= f.major <= 0xFFFF and 0 <= f.minor <= 0xFFFF):
        raise LocalProtocolError("versions must fit 16 bits")
    body = _U16.pack(f.major) + _U16.pack(f.minor)
    body += _u31("keepalive interval", f.keepalive, 1) + _u31("max lifetime", f.lifetime, 1)
    if f.resume_token is not None:
        if len(f.resume_token) > 0xFFFF:
            raise LocalProtocolError("resume token longer than 65535 bytes")
        body += _U16.pack(len(f.resume_token)) + f.resume_token
    body += _mime("metadata MIME type", f.metadata_mime) + _mime("data MIME type", f.data_mime)
    m, rest = _with_metadata(f.metadata, f.data)
    return _header(TYPE_SETUP, flags | m, 0) + body + rest


def encode_lease(f: Lease) -> bytes:
    # Metadata only: no length field (the spec).
    flags = FLAG_METADATA if f.metadata is not None else 0
    body = _u31("lease TTL", f.ttl) + _u31("lease requests", f.requests)
    return _header(TYPE_LEASE, flags, 0) + body + (f.metadata or b"")


def encode_keepalive(f: Keepalive) -> bytes:
    flags = FLAG_RESPOND if f.respond else 0
    return _header(TYPE_KEEPALIVE, flags, 0) + _u63("last position", f.last_position) + f.data


def _encode_request(frame_type: int, f: Request, prefix: bytes = b"", extra: int = 0) -> bytes:
    m, rest = _with_metadata(f.metadata, f.data)
    flags = m | (FLAG_FOLLOWS if f.follows else 0) | extra
    return _header(frame_type, flags, f.stream_id) + prefix + rest


def encode_request_response(f: RequestResponse) -> bytes:
    return _encode_request(TYPE_REQUEST_RESPONSE, f)


def encode_request_fnf(f: RequestFnf) -> bytes:
    return _encode_request(TYPE_REQUEST_FNF, f)


def encode_request_stream(f: RequestStream) -> bytes:
    return _encode_request(TYPE_REQUEST_STREAM, f, _u31("initial request N", f.initial_n, 1))


def encode_request_channel(f: RequestChannel) -> bytes:
    prefix = _u31("initial request N", f.initial_n, 1)
    return _encode_request(TYPE_REQUEST_CHANNEL, f, prefix, FLAG_COMPLETE if f.complete else 0)


def encode_request_n(f: RequestN) -> bytes:
    return _header(TYPE_REQUEST_N, 0, f.stream_id) + _u31("request N", f.n, 1)


def encode_cancel(f: Cancel) -> bytes:
    return _header(TYPE_CANCEL, 0, f.stream_id)


def encode_payload(f: Payload) -> bytes:
    if not (f.next or f.complete):
        raise LocalProtocolError("a PAYLOAD has N (next), C (complete) or both")
    m, rest = _with_metadata(f.metadata, f.data)
    flags = (
        m
        | (FLAG_FOLLOWS if f.follows else 0)
        | (FLAG_COMPLETE if f.complete else 0)
        | (FLAG_NEXT if f.next else 0)
    )
    return _header(TYPE_PAYLOAD, flags, f.stream_id) + rest


def encode_error(f: ErrorFrame) -> bytes:
    if not 0 <= f.code <= 0xFFFF_FFFF:
        raise LocalProtocolError(f"error code {f.code} does not fit 32 bits")
    return _header(TYPE_ERROR, 0, f.stream_id) + _U32.pack(f.code) + f.data


def encode_metadata_push(f: MetadataPush) -> bytes:
    return _header(TYPE_METADATA_PUSH, FLAG_METADATA, f.stream_id) + f.metadata


def encode_resume(f: Resume) -> bytes:
    if len(f.token) > 0xFFFF:
        raise LocalProtocolError("resume token longer than 65535 bytes")
    body = _U16.pack(f.major) + _U16.pack(f.minor) + _U16.pack(len(f.token)) + f.token
    body += _u63("last server position", f.last_server_position)
    body += _u63("first client position", f.first_client_position)
    return _header(TYPE_RESUME, 0, 0) + body


def encode_resume_ok(f: ResumeOk) -> bytes:
    return _header(TYPE_RESUME_OK, 0, 0) + _u63("last client position", f.last_client_position)


def encode_ext(f: Ext) -> bytes:
    m, rest = _with_metadata(f.metadata, f.data)
    flags = m | (FLAG_IGNORE if f.ignore else 0)
    return _header(TYPE_EXT, flags, f.stream_id) + _u31("extended type", f.extended_type, 1) + rest


def encode_unknown(f: UnknownFrame) -> bytes:
    if not 0 <= f.frame_type <= 0x3F or not 0 <= f.flags <= 0x3FF:
        raise LocalProtocolError("unknown frame: type must fit 6 bits and flags 10 bits")
    return _header(f.frame_type, f.flags, f.stream_id) + f.body


_ENCODERS: dict[type, Callable[..., bytes]] = {
    Setup: encode_setup, Lease: encode_lease, Keepalive: encode_keepalive,
    RequestResponse: encode_request_response, RequestFnf: encode_request_fnf,
    RequestStream: encode_request_stream, RequestChannel: encode_request_channel,
    RequestN: encode_request_n, Cancel: encode_cancel, Payload: encode_payload,
    ErrorFrame: encode_error, MetadataPush: encode_metadata_push, Resume: encode_resume,
    ResumeOk: encode_resume_ok, Ext: encode_ext, UnknownFrame: encode_unknown,
}


def encode_frame(frame: Frame) -> bytes:
    """One frame without the TCP length: a WebSocket binary message."""
    message = encode_by_type(_ENCODERS, frame, "an RSocket frame", LocalProtocolError)
    if len(message) > MAX_FRAME_LENGTH:
        raise LocalProtocolError(
            f"{describe(frame)} of {len(message)} bytes exceeds the 2**24-1 frame limit; "
            "fragment it",
            code=TOO_LARGE,
        )
    return message


def add_tcp_length(message: bytes) -> bytes:
    if len(message) > MAX_FRAME_LENGTH:
        raise LocalProtocolError(f"frame of {len(message)} bytes exceeds the 24-bit length")
    return len(message).to_bytes(LENGTH_SIZE, "big") + message


encode_tcp_frame, encode_for = for_transport(encode_frame, add_tcp_length)


# --- decoding -----------------------------------------------------------------------


class _Layout(ValueError):
    """The body does not fit the frame type's layout (internal)."""


class _Reader:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if len(self.body) - self.pos < n:
            raise _Layout(f"{what} needs {n} bytes, {len(self.body) - self.pos} left")
        chunk = self.body[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u16(self, what: str) -> int:
        return int(_U16.unpack(self.take(2, what))[0])

    def u31(self, what: str) -> int:
        return int(_U32.unpack(self.take(4, what))[0]) & MAX_U31

    def u32(self, what: str) -> int:
        return int(_U32.unpack(self.take(4, what))[0])

    def u63(self, what: str) -> int:
        return int(_U64.unpack(self.take(8, what))[0]) & MAX_U63

    def rest(self) -> bytes:
        chunk = self.body[self.pos :]
        self.pos = len(self.body)
        return chunk

    def end(self, what: str) -> None:
        if self.pos != len(self.body):
            raise _Layout(f"{what} has {len(self.body) - self.pos} bytes after its last field")

    def metadata_and_data(self, flags: int) -> tuple[bytes | None, bytes]:
        if not flags & FLAG_METADATA:
            return None, self.rest()
        length = int.from_bytes(self.take(3, "metadata length"), "big")
        metadata = self.take(length, f"metadata of {length} bytes")
        return metadata, self.rest()

    def mime(self, what: str) -> str:
        length = self.take(1, f"{what} length")[0]
        raw = self.take(length, what)
        if not raw:
            raise _Layout(f"{what} is empty")
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise _Layout(f"{what} is not US-ASCII") from None


# --- one decoder per frame type: (flags, stream id, body reader) -> frame -----------


def _decode_setup(flags: int, sid: int, r: _Reader) -> Frame:
    major, minor = r.u16("major version"), r.u16("minor version")
    keepalive, lifetime = r.u31("keepalive interval"), r.u31("max lifetime")
    token = None
    if flags & FLAG_RESUME:
        token = r.take(r.u16("resume token length"), "resume token")
    metadata_mime = r.mime("metadata MIME type")
    data_mime = r.mime("data MIME type")
    metadata, data = r.metadata_and_data(flags)
    return Setup(
        keepalive, lifetime, metadata_mime, data_mime, metadata, data, major, minor,
        bool(flags & FLAG_LEASE), token,
    )


def _decode_lease(flags: int, sid: int, r: _Reader) -> Frame:
    ttl, requests = r.u31("lease TTL"), r.u31("lease requests")
    return Lease(ttl, requests, r.rest() if flags & FLAG_METADATA else None)


def _decode_keepalive(flags: int, sid: int, r: _Reader) -> Frame:
    return Keepalive(bool(flags & FLAG_RESPOND), r.u63("last received position"), r.rest())


def _decode_request_response(flags: int, sid: int, r: _Reader) -> Frame:
    return RequestResponse(sid, *r.metadata_and_data(flags), bool(flags & FLAG_FOLLOWS))


def _decode_request_fnf(flags: int, sid: int, r: _Reader) -> Frame:
    return RequestFnf(sid, *r.metadata_and_data(flags), bool(flags & FLAG_FOLLOWS))


def _decode_request_stream(flags: int, sid: int, r: _Reader) -> Frame:
    n = r.u31("initial request N")
    return RequestStream(sid, n, *r.metadata_and_data(flags), bool(flags & FLAG_FOLLOWS))


def _decode_request_channel(flags: int, sid: int, r: _Reader) -> Frame:
    n = r.u31("initial request N")
    metadata, data = r.metadata_and_data(flags)
    return RequestChannel(
        sid, n, metadata, data, bool(flags & FLAG_FOLLOWS), bool(flags & FLAG_COMPLETE)
    )


def _decode_request_n(flags: int, sid: int, r: _Reader) -> Frame:
    n = r.u31("request N")
    r.end("REQUEST_N")
    return RequestN(sid, n)


def _decode_cancel(flags: int, sid: int, r: _Reader) -> Frame:
    r.end("CANCEL")
    return Cancel(sid)


def _decode_payload(flags: int, sid: int, r: _Reader) -> Frame:
    metadata, data = r.metadata_and_data(flags)
    complete = bool(flags & FLAG_COMPLETE)
    # "A PAYLOAD with both F and C flags set implicitly ignores the F flag."
    return Payload(sid, metadata, data, bool(flags & FLAG_FOLLOWS) and not complete, complete,
                   bool(flags & FLAG_NEXT))


def _decode_error(flags: int, sid: int, r: _Reader) -> Frame:
    return ErrorFrame(sid, r.u32("error code"), r.rest())


def _decode_metadata_push(flags: int, sid: int, r: _Reader) -> Frame:
    return MetadataPush(r.rest(), sid)


def _decode_resume(flags: int, sid: int, r: _Reader) -> Frame:
    major, minor = r.u16("major version"), r.u16("minor version")
    token = r.take(r.u16("resume token length"), "resume token")
    last, first = r.u63("last server position"), r.u63("first client position")
    r.end("RESUME")
    return Resume(token, last, first, major, minor)


def _decode_resume_ok(flags: int, sid: int, r: _Reader) -> Frame:
    position = r.u63("last client position")
    r.end("RESUME_OK")
    return ResumeOk(position)


def _decode_ext(flags: int, sid: int, r: _Reader) -> Frame:
    ext = r.u31("extended type")
    metadata, data = r.metadata_and_data(flags)
    return Ext(sid, ext, metadata, data, bool(flags & FLAG_IGNORE))


_DECODERS: dict[int, Callable[[int, int, _Reader], Frame]] = {
    TYPE_SETUP: _decode_setup,
    TYPE_LEASE: _decode_lease,
    TYPE_KEEPALIVE: _decode_keepalive,
    TYPE_REQUEST_RESPONSE: _decode_request_response,
    TYPE_REQUEST_FNF: _decode_request_fnf,
    TYPE_REQUEST_STREAM: _decode_request_stream,
    TYPE_REQUEST_CHANNEL: _decode_request_channel,
    TYPE_REQUEST_N: _decode_request_n,
    TYPE_CANCEL: _decode_cancel,
    TYPE_PAYLOAD: _decode_payload,
    TYPE_ERROR: _decode_error,
    TYPE_METADATA_PUSH: _decode_metadata_push,
    TYPE_RESUME: _decode_resume,
    TYPE_RESUME_OK: _decode_resume_ok,
    TYPE_EXT: _decode_ext,
}


def _decode_body(frame_type: int, flags: int, sid: int, r: _Reader) -> Frame:
    decoder = _DECODERS.get(frame_type)
    if decoder is None:
        return UnknownFrame(frame_type, flags, sid, r.rest())
    return decoder(flags, sid, r)


def decode_frame(message: bytes) -> Frame:
    """Decode one frame given without the TCP length.

    Raises :class:`RemoteProtocolError` (CONNECTION_ERROR) for a short header
    or a body that does not fit its type's layout.  A frame whose layout is
    broken but whose I flag is set comes back as an ignorable
    :class:`UnknownFrame` (the spec: close "unless the frame's IGNORE flag is
    set"), as do frame types this codec does not know.
    """
    if len(message) < HEADER_SIZE:
        raise RemoteProtocolError(
            f"frame of {len(message)} bytes is shorter than the 6-byte header",
            error_code=CONNECTION_ERROR,
        )
    raw_id, type_flags = _HEADER.unpack_from(message)
    sid = raw_id & MAX_STREAM_ID
    frame_type, flags = type_flags >> 10, type_flags & 0x3FF
    body = bytes(message[HEADER_SIZE:])
    try:
        return _decode_body(frame_type, flags, sid, _Reader(body))
    except _Layout as exc:
        if flags & FLAG_IGNORE:
            return UnknownFrame(frame_type, flags, sid, body)
        raise RemoteProtocolError(
            f"{frame_name(frame_type)} on stream {sid}: {exc}",
            code=MALFORMED,
            error_code=CONNECTION_ERROR,
        ) from None


# --- fragmentation --------------------------------------------------------------------


def fragment(frame: Payload | Request, max_fragment: int) -> list[Payload | Request]:
    """Split a PAYLOAD or request into frames carrying at most
    ``max_fragment`` bytes of metadata + data each (metadata first, as the
    spec orders).  A frame that fits comes back whole.

    The first fragment keeps the frame's type (and Initial Request N); the
    rest are PAYLOAD frames.  Every fragment but the last has F.  A PAYLOAD's
    N goes on every fragment (rsocket-py takes the flags of the last one) and
    its C on the last only; request continuations carry N.
    """
    if max_fragment < 1:
        raise LocalProtocolError("max_fragment must be at least 1 byte")
    metadata = frame.metadata or b""
    total = len(metadata) + len(frame.data)
    if total <= max_fragment:
        return [frame]
    joined = metadata + frame.data
    cut = len(metadata)
    out: list[Payload | Request] = []
    for start in range(0, total, max_fragment):
        end = min(start + max_fragment, total)
        meta_part = joined[start : min(end, cut)] if start < cut else b""
        data_part = joined[max(start, cut) : end]
        first, last = start == 0, end == total
        # The first fragment keeps the M flag of the whole frame (even for
        # empty metadata); later ones have M only when they carry metadata.
        md: bytes | None
        if first:
            md = meta_part if frame.metadata is not None else None
        else:
            md = meta_part if meta_part else None
        if first and not isinstance(frame, Payload):
            out.append(replace(frame, metadata=md, data=data_part, follows=True))
        elif isinstance(frame, Payload):
            out.append(
                Payload(frame.stream_id, md, data_part, follows=not last,
                        complete=frame.complete and last, next=frame.next)
            )
        else:
            out.append(Payload(frame.stream_id, md, data_part, follows=not last, next=True))
    return out
