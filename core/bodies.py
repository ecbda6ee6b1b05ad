"""Event bodies across content types.

Every event keeps the content type it was written with.  These helpers give
each kind of consumer its view: a document (binders, BSON, matchers), JSON text
(Res01, MicroMsg2 with ``json``) or the stored bytes.  They are about formats,
not protocols: no wire framing lives here.
"""

from __future__ import annotations

import json
from typing import Any

import bson
import msgpack
from bson import json_util
from bson.codec_options import CodecOptions, DatetimeConversion

from core.events import RecordedEvent

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


def guess_text_content_type(body: bytes) -> str:
    """Res01-style bodies: JSON when they parse as JSON, else plain text."""
    try:
        json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return TEXT
    return JSON


def body_document(content_type: str, body: bytes) -> dict[str, Any]:
    """The body as a document: JSON objects, BSON documents and MessagePack
    maps as themselves; anything else as ``{"data": <string or bytes>}``."""
    try:
        if content_type == BSON:
            return dict(bson.decode(body))
        if content_type == MSGPACK:
            value = msgpack.unpackb(body, raw=False)
            if isinstance(value, dict):
                return {str(k): v for k, v in value.items()}
            return {"data": value}
        if content_type == JSON:
            value = json.loads(body)
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
    if content_type == BSON:
        try:
            doc = bson.decode(body, codec_options=_BSON_TEXT_OPTIONS)
            return json_util.dumps(doc, json_options=_RELAXED)
        except Exception:
            pass
    if content_type == MSGPACK:
        try:
            return json_util.dumps(msgpack.unpackb(body, raw=False), json_options=_RELAXED)
        except Exception:
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return json_util.dumps({"data": bson.Binary(body)}, json_options=_RELAXED)


def document_to_bson(doc: dict[str, Any]) -> bytes:
    return bson.encode(doc)
