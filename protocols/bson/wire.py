"""Wire format of the BSON frames protocol: pure functions, no state.

A frame is one BSON document ``{type: str, frame: document}``; its first four
bytes are BSON's own little-endian int32 total length (counting themselves),
which is all the framing there is.

Encoding and decoding go through pymongo's ``bson`` with fixed options:

* ``DECODE_OPTIONS``: plain ``dict`` documents; datetimes timezone-aware UTC,
  and dates outside Python's range come back as ``bson.DatetimeMS`` instead of
  failing (``DATETIME_AUTO``); UUID binaries (subtypes 3 and 4) stay
  ``bson.Binary`` (``UNSPECIFIED``), so an event decodes and re-encodes to the
  same bytes; invalid UTF-8 is an error (``strict``).
* ``ENCODE_OPTIONS``: the same, but ``uuid.UUID`` values given by local code
  are encoded as standard subtype-4 binaries rather than refused.

Field types are checked strictly against the BSON element types.  The one
leniency: an int64 field also accepts an int32 element, because drivers
encode small integers as int32.  An int32 field never accepts an int64.  A
BSON null in an optional field means "absent"; unknown body fields and
unknown envelope keys are ignored.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import bson
from bson.binary import Binary, UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from polyport.core.builders import frozen_builder
from polyport.protocols.bson.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.bson.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_CLASSES,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    KEY_FRAME,
    KEY_TYPE,
    LENGTH_PREFIX_SIZE,
    MIN_DOCUMENT_SIZE,
    Document,
    Field,
    Frame,
    Kind,
    Response,
)
from polyport.protocols.errors import MALFORMED, TOO_LARGE, UNSUPPORTED

if not hasattr(bson, "decode") or not hasattr(bson, "encode"):  # pragma: no cover
    raise ImportError(
        "'import bson' did not find pymongo's bson package; is the protocols/ directory "
        "itself on sys.path (so that protocols/bson shadows it)?"
    )

DECODE_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict,
    tz_aware=True,
    tzinfo=UTC,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
    unicode_decode_error_handler="strict",
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)
ENCODE_OPTIONS: CodecOptions[dict[str, Any]] = DECODE_OPTIONS.with_options(
    uuid_representation=UuidRepresentation.STANDARD
)

_LENGTH = struct.Struct("<i")

# CONNECT versions the server accepts: 0.x and 1.x (the original client sent
# "0.1"), optionally with a pre-release/build suffix such as "1.0-SNAPSHOT".
_SUPPORTED_VERSION = re.compile(r"[01](?:\.\d+)*(?:[-+][0-9A-Za-z.+-]+)?")


# --- lengths -----------------------------------------------------------------


def read_length(buffer: bytes | bytearray | memoryview, offset: int = 0) -> int | None:
    """The declared length of the document starting at ``offset``, or None
    while fewer than four bytes are available."""
    if len(buffer) - offset < LENGTH_PREFIX_SIZE:
        return None
    (length,) = _LENGTH.unpack_from(buffer, offset)
    return int(length)


def check_length(length: int, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
    """Refuse a declared length before any of the body is waited for."""
    if length < MIN_DOCUMENT_SIZE:
        raise RemoteProtocolError(
            f"invalid frame length {length}: a BSON document is at least "
            f"{MIN_DOCUMENT_SIZE} bytes",
            code=MALFORMED,
        )
    if length > max_frame_size:
        raise RemoteProtocolError(
            f"frame length {length} exceeds the maximum frame size of {max_frame_size} bytes",
            code=TOO_LARGE,
        )


# --- type checks ---------------------------------------------------------------


def bson_type_name(value: Any) -> str:
    """The BSON type a decoded value came from, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, Int64):
        return "int64"
    if isinstance(value, int):
        return "int32" if INT32_MIN <= value <= INT32_MAX else "int64"
    simple: list[tuple[type | tuple[type, ...], str]] = [
        (float, "double"),
        (str, "string"),
        (DBRef, "dbref document"),
        (Mapping, "document"),
        ((list, tuple), "array"),
        ((bytes, Binary, uuid.UUID), "binary"),
        (ObjectId, "objectId"),
        ((datetime, DatetimeMS), "date"),
        ((Regex, re.Pattern), "regex"),
        (Timestamp, "timestamp"),
        (Decimal128, "decimal128"),
    ]
    for types, name in simple:
        if isinstance(value, types):
            return name
    return type(value).__name__


# The kinds whose decoded value is the attribute as it is, by exact type.
_AS_DECODED = frozenset({(Kind.STRING, str), (Kind.BOOL, bool), (Kind.DOCUMENT, dict)})


def _check_wire_value(frame_type: str, field: Field, value: Any) -> Any:
    """Validate one decoded body value; return it in its frame-attribute form."""
    kind = field.kind
    result: Any
    int32 = kind is Kind.INT32 and type(value) is int and INT32_MIN <= value <= INT32_MAX
    if int32 or (kind, type(value)) in _AS_DECODED:
        result = value
    elif kind is Kind.INT64 and type(value) in (int, Int64):
        result = int(value)
    elif kind is Kind.DOCUMENT and isinstance(value, DBRef):
        # pymongo turns any {$ref, $id, ...} document into a DBRef; it is
        # still a document on the wire.
        result = dict(value.as_doc())
    else:
        expected = "int32 or int64" if kind is Kind.INT64 else kind.value
        raise RemoteProtocolError(
            f"{frame_type}: field '{field.wire}' must be {expected}, got {bson_type_name(value)}",
            code=MALFORMED,
        )
    if field.min_value is not None and result < field.min_value:
        raise RemoteProtocolError(
            f"{frame_type}: field '{field.wire}' must be >= {field.min_value}, got {result}",
            code=MALFORMED,
        )
    return result


def _check_local_value(frame_type: str, field: Field, value: Any) -> Any:
    """Validate one attribute of a frame we are about to send; return the
    value to put in the BSON document."""
    kind = field.kind
    ok: bool
    if kind is Kind.STRING:
        ok = isinstance(value, str)
    elif kind is Kind.BOOL:
        ok = isinstance(value, bool)
    elif kind is Kind.INT32:
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok and INT32_MIN <= value <= INT32_MAX
    elif kind is Kind.INT64:
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok and INT64_MIN <= value <= INT64_MAX
    else:
        ok = isinstance(value, Mapping)
    if not ok:
        raise LocalProtocolError(
            f"cannot send {frame_type}: '{field.attr}' must be a {kind.value} value, got {value!r}"
        )
    if field.min_value is not None and value < field.min_value:
        raise LocalProtocolError(
            f"cannot send {frame_type}: '{field.attr}' must be >= {field.min_value}, got {value}"
        )
    if kind is Kind.INT64:
        # Always int64 on the wire, even when small, so strict peers accept it.
        return Int64(value)
    return value


# --- documents <-> frames ------------------------------------------------------


def decode_document(data: bytes | bytearray | memoryview) -> Document:
    """Decode exactly one BSON document; any defect is a RemoteProtocolError."""
    try:
        return bson.decode(bytes(data), codec_options=DECODE_OPTIONS)
    except Exception as exc:  # the C decoder raises several exception types
        raise RemoteProtocolError(f"invalid BSON document: {exc}", code=MALFORMED) from exc


def frame_from_document(document: Mapping[str, Any]) -> Frame:
    """Validate a decoded envelope ``{type, frame}`` and build its frame."""
    if KEY_TYPE not in document:
        raise RemoteProtocolError("frame document has no 'type' field", code=MALFORMED)
    frame_type = document[KEY_TYPE]
    if type(frame_type) is not str:
        raise RemoteProtocolError(
            f"frame field 'type' must be string, got {bson_type_name(frame_type)}", code=MALFORMED
        )
    cls = FRAME_CLASSES.get(frame_type)
    if cls is None:
        raise RemoteProtocolError(f"unknown frame type {frame_type!r}", code=UNSUPPORTED)
    if KEY_FRAME not in document:
        raise RemoteProtocolError(f"{frame_type}: missing 'frame' document", code=MALFORMED)
    body = document[KEY_FRAME]
    if type(body) is not dict:
        raise RemoteProtocolError(
            f"{frame_type}: 'frame' must be document, got {bson_type_name(body)}", code=MALFORMED
        )
    build, defaults = _BUILDS[cls]
    values: list[Any] = []
    for field, default in zip(cls.FIELDS, defaults, strict=True):
        value = body.get(field.wire, _ABSENT)
        if value is _ABSENT or (value is None and not field.required):
            if field.required:
                raise RemoteProtocolError(
                    f"{frame_type}: missing mandatory field '{field.wire}'", code=MALFORMED
                )
            values.append(default)
        elif type(value) is _EXACT.get(field.kind) and field.min_value is None:
            values.append(value)  # a string, boolean or document, as decoded
        else:
            values.append(_check_wire_value(frame_type, field, value))
    return build(*values)


_ABSENT = object()
# The kinds whose decoded value is the attribute as it is, by exact type
# (_AS_DECODED, looked up without a tuple per field).
_EXACT: dict[Kind, type] = {kind: t for kind, t in _AS_DECODED}


def _build_plan(cls: type[Frame]) -> tuple[Callable[..., Frame], tuple[Any, ...]]:
    """How a frame is made from its checked field values: positionally,
    without ``__init__`` (the frames have no ``__post_init__``), each absent
    optional field taking its default.  The keyword call with a dict per
    frame was a third of decoding an EMIT."""
    fields = dataclasses.fields(cls)
    if [f.attr for f in cls.FIELDS] != [f.name for f in fields]:
        raise TypeError(f"{cls.__name__}: FIELDS must name every field, in declaration order")
    if "__post_init__" in vars(cls):
        raise TypeError(f"{cls.__name__}: a frame with __post_init__ must be built by __init__")
    for wire_field, f in zip(cls.FIELDS, fields, strict=True):
        if f.default_factory is not dataclasses.MISSING or (
                not wire_field.required and f.default is dataclasses.MISSING):
            raise TypeError(f"{cls.__name__}.{f.name}: an optional field needs a plain default")
    return frozen_builder(cls), tuple(
        None if f.default is dataclasses.MISSING else f.default for f in fields
    )


_BUILDS = {cls: _build_plan(cls) for cls in FRAME_CLASSES.values()}


def frame_to_document(frame: Frame) -> Document:
    """The envelope document of a frame, validated as strictly as on input."""
    cls = type(frame)
    if FRAME_CLASSES.get(getattr(cls, "TYPE", "")) is not cls:
        raise LocalProtocolError(f"not a BSON frames frame: {frame!r}")
    body: Document = {}
    for field in cls.FIELDS:
        value = getattr(frame, field.attr)
        if value is None:
            if field.required:
                raise LocalProtocolError(
                    f"cannot send {cls.TYPE}: mandatory '{field.attr}' is None"
                )
            continue
        body[field.wire] = _check_local_value(cls.TYPE, field, value)
    return {KEY_TYPE: cls.TYPE, KEY_FRAME: body}


def _encode_document(document: Mapping[str, Any], what: str) -> bytes:
    try:
        return bson.encode(document, codec_options=ENCODE_OPTIONS)
    except Exception as exc:  # InvalidDocument, OverflowError, TypeError, ...
        raise LocalProtocolError(f"cannot encode {what} as BSON: {exc}") from exc


def encode_frame(frame: Frame) -> bytes:
    """The wire bytes of one frame."""
    if type(frame) is Response and frame.ok is True and frame.err_code is None \
            and frame.err_msg is None:
        return _OK_BYTES
    return _encode_document(frame_to_document(frame), type(frame).TYPE)


# A plain ok RESPONSE answers every EMIT: its bytes never change, and
# encoding them each time was 2.3 µs of every BSON event's CPU.
_OK_BYTES = _encode_document(frame_to_document(Response(ok=True)), Response.TYPE)


def decode_frame(
    data: bytes | bytearray | memoryview, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
) -> Frame:
    """Decode exactly one complete frame (no more, no less)."""
    length = read_length(data)
    if length is None:
        raise RemoteProtocolError(f"truncated frame: {len(data)} bytes", code=MALFORMED)
    check_length(length, max_frame_size)
    if length != len(data):
        raise RemoteProtocolError(
            f"frame length prefix says {length} bytes but {len(data)} were given", code=MALFORMED
        )
    return frame_from_document(decode_document(data))


# --- helpers for the adapter -----------------------------------------------------


def event_size(event: Mapping[str, Any]) -> int:
    """Encoded BSON size of an EMIT's ``event`` document, the figure the
    event size limit (``DEFAULT_MAX_EVENT_SIZE``) applies to."""
    return len(_encode_document(event, "event"))


def is_supported_version(version: str) -> bool:
    """Whether a CONNECT ``version`` is one the server accepts (0.x or 1.x)."""
    return _SUPPORTED_VERSION.fullmatch(version) is not None
