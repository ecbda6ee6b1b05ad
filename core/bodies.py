"""Event bodies across content types.

Every event keeps the content type it was written with.  These helpers give
each kind of consumer its view: a document (binders, BSON, matchers), JSON text
(Res01, MicroMsg2 with ``json``) or the stored bytes.  They are about formats,
not protocols: no wire framing lives here.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable
from typing import Any

import bson
import msgpack
from bson import json_util
from bson.codec_options import CodecOptions, DatetimeConversion

from polyport.core.events import RecordedEvent

JSON = "application/json"
BSON = "application/bson"
MSGPACK = "application/msgpack"
TEXT = "text/plain"
OCTETS = "application/octet-stream"

_RELAXED = json_util.JSONOptions(json_mode=json_util.JSONMode.RELAXED)
# For text consumers: dates outside Python's range stay dates (as DatetimeMS)
# and so still become {"$date": ...} in relaxed Extended JSON.
_BSON_TEXT_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)


# Other names for the same formats (registered, legacy x- and vnd. forms).
_ALIASES = {
    "application/json": JSON,
    "text/json": JSON,
    "application/bson": BSON,
    "application/msgpack": MSGPACK,
    "application/x-msgpack": MSGPACK,
    "application/vnd.msgpack": MSGPACK,
}


@functools.lru_cache(maxsize=1024)
def media_type(content_type: str) -> str:
    """The format a content type names: parameters dropped and case folded
    (``Application/JSON; charset=utf-8`` is JSON, RFC 9110 8.3.1), aliases
    mapped, and structured ``+json`` types (RFC 6839) taken as JSON."""
    essence = content_type.split(";", 1)[0].strip().lower()
    if essence in _ALIASES:
        return _ALIASES[essence]
    if essence.endswith("+json"):
        return JSON
    return essence


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One decoder for every call: json.loads with any keyword builds a decoder
# (and its scanner) per call, half the cost of parsing a small body.
_STRICT_JSON = json.JSONDecoder(parse_constant=_no_constants)


def loads_json(data: bytes | str) -> Any:
    """Strict JSON: Python's parser also accepts NaN and Infinity, which no
    other JSON consumer does.  Otherwise exactly ``json.loads``."""
    if isinstance(data, str):
        if data.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    else:
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    return _STRICT_JSON.decode(data)


def _msgpack_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + key.hex()
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)
    return str(key)


def _msgpack_map(pairs: Iterable[tuple[Any, Any]]) -> dict[str, Any]:
    # Documents (BSON, JSON, matchers) have text keys; MessagePack allows any.
    return {_msgpack_key(k): v for k, v in pairs}


def loads_msgpack(body: bytes) -> Any:
    """MessagePack with text map keys (binary keys as UTF-8, else ``0x`` hex;
    numbers as their JSON text) and timestamps as datetimes."""
    return msgpack.unpackb(
        body, raw=False, strict_map_key=False, object_pairs_hook=_msgpack_map, timestamp=3
    )


def guess_text_content_type(body: bytes) -> str:
    """Res01-style bodies: JSON when they parse as JSON, else plain text."""
    try:
        loads_json(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return TEXT
    return JSON


# Bytes that can open a nested document or array: JSON brackets; BSON's
# embedded document and array element types; MessagePack's map and array
# markers.  Counting them (C speed) bounds the depth from above, so the common
# shallow body needs no further look.
_JSON_OPENERS = b"[{"
_BSON_OPENERS = b"\x03\x04"
_MSGPACK_OPENERS = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
# JSON strings are dropped before brackets are counted: brackets in them do not nest.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
# Openers become +1 and closers -1 (as signed bytes); everything else goes.
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def _openers(body: bytes, openers: bytes) -> int:
    return len(body) - len(body.translate(None, openers))


def _json_depth_exceeds(body: bytes, limit: int) -> bool:
    """The deepest bracket outside strings, valid JSON or not; every step
    runs in C (a running sum over +1/-1 bytes), no recursion, no per-byte
    Python loop."""
    steps = _JSON_STRING.sub(b"", body).translate(_BRACKET_STEPS, _NOT_BRACKETS)
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0) > limit


def _value_depth_exceeds(value: Any, limit: int) -> bool:
    """Nesting of dicts and lists in a decoded value, one level at a time
    (no recursion)."""
    level = [value]
    depth = 1
    while level:
        if depth > limit:
            return True
        below: list[Any] = []
        for v in level:
            below += [c for c in (v.values() if isinstance(v, dict) else v)
                      if isinstance(c, dict | list)]
        level = below
        depth += 1
    return False


def body_depth_exceeds(content_type: str, body: bytes, limit: int) -> bool:
    """Whether a JSON, BSON or MessagePack body nests documents and arrays
    deeper than ``limit`` (the top level is 1).  Other content types, and
    bodies their format cannot decode (they are stored as opaque data), never
    exceed it.  No step recurses, so a hostile body cannot exhaust the stack."""
    kind = media_type(content_type)
    if kind == JSON:
        return _openers(body, _JSON_OPENERS) > limit and _json_depth_exceeds(body, limit)
    value: Any
    if kind == BSON:
        # +1: the top-level document has no type byte of its own.
        if _openers(body, _BSON_OPENERS) + 1 <= limit:
            return False
        try:
            value = bson.decode(body)
        except Exception as exc:  # noqa: BLE001 - fails many ways; recursion counts
            # The C decoder's recursion guard surfaces as InvalidBSON; any
            # other failure is a body stored as opaque data.
            return "recursion" in str(exc)
    elif kind == MSGPACK:
        if _openers(body, _MSGPACK_OPENERS) <= limit:
            return False
        try:
            value = loads_msgpack(body)
        except (RecursionError, msgpack.StackError):
            return True
        except Exception:  # noqa: BLE001 - any other decoder failure: opaque data, not too deep
            return False
    else:
        return False
    return isinstance(value, dict | list) and _value_depth_exceeds(value, limit)


def body_document(content_type: str, body: bytes) -> dict[str, Any]:
    """The body as a document: JSON objects, BSON documents and MessagePack
    maps as themselves; anything else as ``{"data": <string or bytes>}``."""
    kind = media_type(content_type)
    try:
        if kind == BSON:
            return dict(bson.decode(body))
        if kind == MSGPACK:
            value = loads_msgpack(body)
            if isinstance(value, dict):
                return value
            return {"data": value}
        if kind == JSON:
            value = loads_json(body)
            if isinstance(value, dict):
                return value
            return {"data": value}
    except Exception:  # noqa: BLE001 - undecodable bodies fall through to the raw form
        pass
    try:
        return {"data": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"data": body}


def event_document(ev: RecordedEvent) -> dict[str, Any]:
    return body_document(ev.content_type, ev.body)


def body_json_text(content_type: str, body: bytes) -> str:
    """The body as text for text consumers: JSON stays as written; BSON and
    MessagePack documents become (relaxed Extended) JSON; other text as is."""
    kind = media_type(content_type)
    if kind == BSON:
        try:
            doc = bson.decode(body, codec_options=_BSON_TEXT_OPTIONS)
            return json_util.dumps(doc, json_options=_RELAXED)
        except Exception:  # noqa: BLE001 - undecodable BSON falls through to the text form
            pass
    if kind == MSGPACK:
        try:
            return json_util.dumps(loads_msgpack(body), json_options=_RELAXED)
        except Exception:  # noqa: BLE001 - undecodable MessagePack falls through to the text form
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return json_util.dumps({"data": bson.Binary(body)}, json_options=_RELAXED)
