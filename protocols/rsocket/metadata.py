"""The metadata conventions of rsocket-java/Spring, rsocket-js and rsocket-py.

- Composite metadata (``message/x.rsocket.composite-metadata.v0``): entries
  of ``mime | u24 length | content``; the MIME type is one byte ``0x80 | id``
  for a well-known type, else ``length - 1`` (7 bits) and the US-ASCII name.
- Routing (``message/x.rsocket.routing.v0``): tags, each ``u8 length | UTF-8``.
- Authentication (``message/x.rsocket.authentication.v0``): the auth type as
  ``0x80 | id`` (0 = simple, 1 = bearer) or ``length - 1`` and a name, then
  for simple ``u16 user length | user | password`` (UTF-8).

Extensions/ in the rsocket/rsocket repository specifies all three.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from polyport.protocols.rsocket.errors import MALFORMED, UNSUPPORTED, ProtocolError

COMPOSITE = "message/x.rsocket.composite-metadata.v0"
ROUTING = "message/x.rsocket.routing.v0"
AUTHENTICATION = "message/x.rsocket.authentication.v0"

# The well-known MIME types and their ids (Extensions/WellKnownMimeTypes.md).
WELL_KNOWN_MIME_TYPES: dict[int, str] = {
    0x00: "application/avro",
    0x01: "application/cbor",
    0x02: "application/graphql",
    0x03: "application/gzip",
    0x04: "application/javascript",
    0x05: "application/json",
    0x06: "application/octet-stream",
    0x07: "application/pdf",
    0x08: "application/vnd.apache.thrift.binary",
    0x09: "application/vnd.google.protobuf",
    0x0A: "application/xml",
    0x0B: "application/zip",
    0x0C: "audio/aac",
    0x0D: "audio/mp3",
    0x0E: "audio/mp4",
    0x0F: "audio/mpeg3",
    0x10: "audio/mpeg",
    0x11: "audio/ogg",
    0x12: "audio/opus",
    0x13: "audio/vorbis",
    0x14: "image/bmp",
    0x15: "image/gif",
    0x16: "image/heic-sequence",
    0x17: "image/heic",
    0x18: "image/heif-sequence",
    0x19: "image/heif",
    0x1A: "image/jpeg",
    0x1B: "image/png",
    0x1C: "image/tiff",
    0x1D: "multipart/mixed",
    0x1E: "text/css",
    0x1F: "text/csv",
    0x20: "text/html",
    0x21: "text/plain",
    0x22: "text/xml",
    0x23: "video/H264",
    0x24: "video/H265",
    0x25: "video/VP8",
    0x26: "application/x-hessian",
    0x27: "application/x-java-object",
    0x28: "application/cloudevents+json",
    0x7A: "message/x.rsocket.mime-type.v0",
    0x7B: "message/x.rsocket.accept-mime-types.v0",
    0x7C: AUTHENTICATION,
    0x7D: "message/x.rsocket.tracing-zipkin.v0",
    0x7E: ROUTING,
    0x7F: COMPOSITE,
}
MIME_TYPE_IDS = {name: i for i, name in WELL_KNOWN_MIME_TYPES.items()}

AUTH_SIMPLE = "simple"
AUTH_BEARER = "bearer"
WELL_KNOWN_AUTH_TYPES = {0x00: AUTH_SIMPLE, 0x01: AUTH_BEARER}
AUTH_TYPE_IDS = {name: i for i, name in WELL_KNOWN_AUTH_TYPES.items()}


class MetadataError(ProtocolError):
    """Metadata that cannot be read: the request (or SETUP) it came with is
    refused; the connection stays up for a request."""

    def __init__(self, message: str, *, code: str = MALFORMED) -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True, slots=True)
class Entry:
    mime_type: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Credentials:
    """``auth_type`` simple carries user and password; any other type keeps
    its bytes in ``token`` (bearer)."""

    auth_type: str
    user: str = ""
    password: str = ""
    token: bytes = b""


# --- the type byte shared by composite entries and authentication -------------------------


def _encode_type(name: str, ids: dict[str, int]) -> bytes:
    known = ids.get(name)
    if known is not None:
        return bytes([0x80 | known])
    raw = name.encode("ascii")
    if not 1 <= len(raw) <= 128:
        raise ValueError(f"type name must be 1..128 US-ASCII characters: {name!r}")
    return bytes([len(raw) - 1]) + raw


def _decode_type(data: bytes, pos: int, known: dict[int, str], what: str) -> tuple[str, int]:
    if pos >= len(data):
        raise MetadataError(f"{what}: missing type")
    first = data[pos]
    if first & 0x80:
        name = known.get(first & 0x7F)
        if name is None:
            # A well-known id we do not know yet: keep it readable and skip it.
            return f"unknown-well-known/0x{first & 0x7F:02X}", pos + 1
        return name, pos + 1
    length = (first & 0x7F) + 1
    raw = data[pos + 1 : pos + 1 + length]
    if len(raw) < length:
        raise MetadataError(f"{what}: type name of {length} bytes is cut short")
    try:
        return raw.decode("ascii"), pos + 1 + length
    except UnicodeDecodeError:
        raise MetadataError(f"{what}: type name is not US-ASCII") from None


# --- composite metadata --------------------------------------------------------------------


def encode_composite(entries: Iterable[Entry]) -> bytes:
    out = bytearray()
    for e in entries:
        if len(e.content) > 0xFF_FFFF:
            raise ValueError("a metadata entry holds at most 2**24-1 bytes")
        out += _encode_type(e.mime_type, MIME_TYPE_IDS)
        out += len(e.content).to_bytes(3, "big") + e.content
    return bytes(out)


def decode_composite(data: bytes) -> list[Entry]:
    entries: list[Entry] = []
    pos = 0
    while pos < len(data):
        mime, pos = _decode_type(data, pos, WELL_KNOWN_MIME_TYPES, "composite metadata")
        if len(data) - pos < 3:
            raise MetadataError("composite metadata: entry length is cut short")
        length = int.from_bytes(data[pos : pos + 3], "big")
        pos += 3
        content = data[pos : pos + length]
        if len(content) < length:
            raise MetadataError(
                f"composite metadata: {mime} entry of {length} bytes has {len(content)}"
            )
        pos += length
        entries.append(Entry(mime, content))
    return entries


# --- routing -------------------------------------------------------------------------------


def encode_routing(tags: Sequence[str]) -> bytes:
    out = bytearray()
    for tag in tags:
        raw = tag.encode("utf-8")
        if not 1 <= len(raw) <= 0xFF:
            raise ValueError(f"a route tag is 1..255 UTF-8 bytes: {tag!r}")
        out += bytes([len(raw)]) + raw
    return bytes(out)


def decode_routing(data: bytes) -> list[str]:
    tags: list[str] = []
    pos = 0
    while pos < len(data):
        length = data[pos]
        raw = data[pos + 1 : pos + 1 + length]
        if len(raw) < length:
            raise MetadataError("routing metadata: tag is cut short")
        try:
            tags.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise MetadataError("routing metadata: tag is not UTF-8") from None
        pos += 1 + length
    return tags


# --- authentication --------------------------------------------------------------------------


def encode_simple_auth(user: str, password: str) -> bytes:
    raw_user = user.encode("utf-8")
    if len(raw_user) > 0xFFFF:
        raise ValueError("user name longer than 65535 bytes")
    head = _encode_type(AUTH_SIMPLE, AUTH_TYPE_IDS)
    return head + len(raw_user).to_bytes(2, "big") + raw_user + password.encode("utf-8")


def encode_bearer_auth(token: str) -> bytes:
    return _encode_type(AUTH_BEARER, AUTH_TYPE_IDS) + token.encode("utf-8")


def decode_auth(data: bytes) -> Credentials:
    auth_type, pos = _decode_type(data, 0, WELL_KNOWN_AUTH_TYPES, "authentication metadata")
    if auth_type != AUTH_SIMPLE:
        return Credentials(auth_type, token=data[pos:])
    if len(data) - pos < 2:
        raise MetadataError("simple authentication: user name length is cut short")
    length = int.from_bytes(data[pos : pos + 2], "big")
    raw_user = data[pos + 2 : pos + 2 + length]
    if len(raw_user) < length:
        raise MetadataError("simple authentication: user name is cut short")
    try:
        user = raw_user.decode("utf-8")
        password = data[pos + 2 + length :].decode("utf-8")
    except UnicodeDecodeError:
        raise MetadataError("simple authentication: user or password is not UTF-8") from None
    return Credentials(AUTH_SIMPLE, user, password)


# --- what a request's metadata says -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestMetadata:
    """The entries polyport reads: the first route tag and the credentials;
    other entries (tracing, per-stream MIME types) are passed over."""

    route: str | None = None
    credentials: Credentials | None = None


def read_metadata(metadata: bytes | None, mime_type: str) -> RequestMetadata:
    """Route and credentials of a frame's metadata, given the connection's
    metadata MIME type (composite, or routing alone)."""
    if not metadata:
        return RequestMetadata()
    if mime_type == ROUTING:
        tags = decode_routing(metadata)
        return RequestMetadata(tags[0] if tags else None)
    if mime_type != COMPOSITE:
        raise MetadataError(f"metadata MIME type {mime_type!r} is not served", code=UNSUPPORTED)
    route: str | None = None
    credentials: Credentials | None = None
    for entry in decode_composite(metadata):
        if entry.mime_type == ROUTING and route is None:
            tags = decode_routing(entry.content)
            route = tags[0] if tags else None
        elif entry.mime_type == AUTHENTICATION and credentials is None:
            credentials = decode_auth(entry.content)
    return RequestMetadata(route, credentials)


def request_metadata(
    route: str | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
) -> bytes:
    """Composite metadata with a route and, when ``user`` is given, simple
    authentication (what our client sends)."""
    entries = []
    if route is not None:
        entries.append(Entry(ROUTING, encode_routing([route])))
    if user is not None:
        entries.append(Entry(AUTHENTICATION, encode_simple_auth(user, password or "")))
    return encode_composite(entries)
