"""Event bodies across content types.

Every event keeps the content type it was written with.  These helpers give
each kind of consumer its view: a document (binders, BSON, matchers), JSON text
(Res01, MicroMsg2 with ``json``) or the stored bytes.  They are about formats,
not protocols: no wire framing lives here.
"""

from __future__ import annotations

import functools
import json
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


def loads_json(data: bytes | str) -> Any:
    """Strict JSON: Python's parser also accepts NaN and Infinity, which no
    other JSON consumer does."""
    return json.loads(data, parse_constant=_no_constants)


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
    except Exception:  # undecodable bodies fall through to the raw form
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
        except Exception:
            pass
    if kind == MSGPACK:
        try:
            return json_util.dumps(loads_msgpack(body), json_options=_RELAXED)
        except Exception:
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return json_util.dumps({"data": bson.Binary(body)}, json_options=_RELAXED)
