"""Routes and data of polyport's RSocket service.

The operations and fields are those of the ReactiveSocket draft's MessagePack
schema (``protocols/reactive/payloads.py``, which validates them for
both protocols); RSocket names the operation by route instead of ``op`` and
carries the data as MessagePack or JSON, per the SETUP's data MIME type:

- MessagePack: exactly the draft's maps (``id`` 16 bytes, ``body`` binary).
- JSON: ``id`` is UUID text; ``body_encoding`` tells bodies apart: ``"json"``
  means ``body`` is the JSON value itself, ``"base64"`` that it is base64
  text of the bytes.  The server always sends it; in an appended event it
  may be left out, and ``content_type`` decides (absent or a JSON type: json,
  anything else: base64).

Every request may name a ``context``; without one the principal's default
context is used.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import json_util

from polyport.core.bodies import JSON, MSGPACK, loads_json, media_type
from polyport.protocols.reactive import payloads as schema
from polyport.protocols.reactive.payloads import (
    AppendRequest,
    AppendResponse,
    EventMap,
    PayloadError,
    QueryRequest,
    QueryResponse,
    ReadRequest,
    ReadResponse,
    SubscribeRequest,
)

# The schema's names, for the adapter and the client.
__all__ = [
    "AppendRequest", "AppendResponse", "EventMap", "PayloadError", "QueryRequest",
    "QueryResponse", "ReadRequest", "ReadResponse", "SubscribeRequest",
]

JSON_MIME = "application/json"
MSGPACK_MIME = "application/x-msgpack"

ROUTE_APPEND = "events.append"
ROUTE_READ = "events.read"
ROUTE_STREAM = "events.stream"
ROUTE_SUBSCRIBE = "events.subscribe"
ROUTE_QUERY = "events.query"

RR, FNF, STREAM = "request-response", "fire-and-forget", "request-stream"
# The interactions each route serves.
ROUTES: dict[str, frozenset[str]] = {
    ROUTE_APPEND: frozenset({RR, FNF}),
    ROUTE_READ: frozenset({RR, STREAM}),
    ROUTE_STREAM: frozenset({STREAM}),
    ROUTE_SUBSCRIBE: frozenset({STREAM}),
    ROUTE_QUERY: frozenset({RR}),
}

BODY_JSON = "json"
BODY_BASE64 = "base64"

_RELAXED = json_util.JSONOptions(json_mode=json_util.JSONMode.RELAXED)


def data_format(mime_type: str) -> str | None:
    """``"json"``, ``"msgpack"`` or None (not served) for a data MIME type."""
    kind = media_type(mime_type)
    if kind == JSON:
        return "json"
    if kind == MSGPACK:
        return "msgpack"
    return None


# --- reading requests ----------------------------------------------------------------


def _load(data: bytes, fmt: str, what: str) -> dict[str, Any]:
    if not data:
        return {}
    if fmt == "msgpack":
        obj = schema.unpack(data, what)
    else:
        try:
            obj = loads_json(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PayloadError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise PayloadError(f"{what}: expected an object (map)")
    return obj


def _json_body(obj: Mapping[str, Any], what: str) -> tuple[bytes, str | None]:
    """Bytes and content type of a JSON-encoded appended event's body."""
    content_type = obj.get("content_type")
    encoding = obj.get("body_encoding")
    if encoding is None:
        is_json = content_type is None or (
            isinstance(content_type, str) and media_type(content_type) == JSON
        )
        encoding = BODY_JSON if is_json else BODY_BASE64
    value = obj["body"]
    if encoding == BODY_JSON:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8"), content_type if content_type is not None else JSON_MIME
    if encoding == BODY_BASE64:
        if not isinstance(value, str):
            raise PayloadError(f"{what}: a base64 'body' must be a string")
        try:
            return base64.b64decode(value, validate=True), content_type
        except (binascii.Error, ValueError):
            raise PayloadError(f"{what}: 'body' is not valid base64") from None
    raise PayloadError(f"{what}: 'body_encoding' must be \"json\" or \"base64\", got {encoding!r}")


def _from_json_append(obj: dict[str, Any]) -> dict[str, Any]:
    events = obj.get("events")
    if not isinstance(events, list):
        return obj  # the shared schema reports it
    converted = []
    for i, e in enumerate(events):
        item = e
        if isinstance(e, dict) and "body" in e:
            body, content_type = _json_body(e, f"append request: events[{i}]")
            item = {**e, "body": body}
            if content_type is not None:
                item["content_type"] = content_type
        converted.append(item)
    return {**obj, "events": converted}


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    route: str
    # The context the data names; None = the principal's default context.
    context: str | None
    request: AppendRequest | ReadRequest | QueryRequest | SubscribeRequest


def decode_request(route: str, data: bytes, fmt: str) -> RoutedRequest:
    """The request a route's data describes.  Raises :class:`PayloadError`."""
    what = f"{route} request"
    obj = _load(data, fmt, what)
    context = obj.get("context")
    if context is not None and (not isinstance(context, str) or not context):
        raise PayloadError(f"{what}: 'context' must be a non-empty string")
    request: AppendRequest | ReadRequest | QueryRequest | SubscribeRequest
    if route == ROUTE_APPEND:
        if fmt == "json":
            obj = _from_json_append(obj)
        decoded = schema.request_from_map({**obj, "op": "append"})
        assert isinstance(decoded, AppendRequest)
        request = decoded
    elif route in (ROUTE_READ, ROUTE_STREAM):
        decoded = schema.request_from_map({**obj, "op": "read"})
        assert isinstance(decoded, ReadRequest)
        request = decoded
    elif route == ROUTE_QUERY:
        decoded = schema.request_from_map({**obj, "op": "query"})
        assert isinstance(decoded, QueryRequest)
        request = decoded
    elif route == ROUTE_SUBSCRIBE:
        request = schema.subscribe_request_from_map(obj)
    else:
        raise PayloadError(f"unknown route {route!r}", code="unsupported")
    return RoutedRequest(route, context, request)


# --- writing answers ---------------------------------------------------------------------


def _json_event(ev: EventMap) -> dict[str, Any]:
    obj = schema.event_to_map(ev)
    obj["id"] = str(ev.id)
    if media_type(ev.content_type) == JSON:
        try:
            obj["body"] = loads_json(ev.body)
            obj["body_encoding"] = BODY_JSON
            return obj
        except (ValueError, UnicodeDecodeError):
            pass  # labelled JSON but not JSON: sent as bytes
    obj["body"] = base64.b64encode(ev.body).decode("ascii")
    obj["body_encoding"] = BODY_BASE64
    return obj


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def encode_event(ev: EventMap, fmt: str) -> bytes:
    """One event map: the data of a PAYLOAD on events.stream / events.subscribe."""
    return schema.encode_event(ev) if fmt == "msgpack" else _dumps(_json_event(ev))


def encode_append_response(resp: AppendResponse, fmt: str) -> bytes:
    if fmt == "msgpack":
        return schema.encode_append_response(resp)
    return _dumps(
        {
            "first_version": resp.first_version,
            "last_version": resp.last_version,
            "position": resp.position,
        }
    )


def encode_read_response(resp: ReadResponse, fmt: str) -> bytes:
    if fmt == "msgpack":
        return schema.encode_read_response(resp)
    return _dumps({"events": [_json_event(e) for e in resp.events]})


def encode_query_response(resp: QueryResponse, fmt: str) -> bytes:
    if fmt == "msgpack":
        return schema.encode_query_response(resp)
    # Binder documents may hold BSON types: relaxed Extended JSON, as text
    # consumers get them elsewhere.
    return json_util.dumps({"documents": list(resp.documents)}, json_options=_RELAXED).encode()


# --- the client's side ----------------------------------------------------------------------


def encode_request(route: str, request: Any, fmt: str, context: str | None = None) -> bytes:
    """Data for ``route`` (our client): the draft's map without ``op``."""
    if isinstance(request, SubscribeRequest):
        obj = schema.unpack(schema.encode_subscribe_request(request), "request")
    else:
        obj = schema.unpack(schema.encode_request(request), "request")
        obj.pop("op", None)
    if context is not None:
        obj["context"] = context
    if fmt == "msgpack":
        return schema.pack(obj)
    if isinstance(request, AppendRequest):
        for e in obj["events"]:
            e["id"] = str(uuid.UUID(bytes=e["id"])) if "id" in e else None
            if e["id"] is None:
                del e["id"]
            e["body"] = base64.b64encode(e["body"]).decode("ascii")
            e["body_encoding"] = BODY_BASE64
    return _dumps(obj)


def _json_to_event_map(obj: Any) -> EventMap:
    if isinstance(obj, dict) and "body" in obj:
        encoding = obj.get("body_encoding", BODY_BASE64)
        if encoding == BODY_JSON:
            body = json.dumps(obj["body"], ensure_ascii=False, separators=(",", ":")).encode()
        else:
            try:
                body = base64.b64decode(obj["body"], validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise PayloadError("event: 'body' is not valid base64") from None
        obj = {**obj, "body": body}
    return schema.event_from_map(obj)


def decode_event(data: bytes, fmt: str) -> EventMap:
    if fmt == "msgpack":
        return schema.decode_event(data)
    return _json_to_event_map(_load(data, fmt, "event"))


def decode_append_response(data: bytes, fmt: str) -> AppendResponse:
    if fmt == "msgpack":
        return schema.decode_append_response(data)
    return schema.decode_append_response(schema.pack(_load(data, fmt, "append response")))


def decode_read_response(data: bytes, fmt: str) -> ReadResponse:
    if fmt == "msgpack":
        return schema.decode_read_response(data)
    obj = _load(data, fmt, "read response")
    events = obj.get("events")
    if not isinstance(events, list):
        raise PayloadError("read response: 'events' must be an array")
    return ReadResponse(tuple(_json_to_event_map(e) for e in events))


def decode_query_response(data: bytes, fmt: str) -> QueryResponse:
    if fmt == "msgpack":
        return schema.decode_query_response(data)
    obj = json_util.loads(data, json_options=_RELAXED)
    if not isinstance(obj, dict) or not isinstance(obj.get("documents"), list):
        raise PayloadError("query response: 'documents' must be an array")
    return QueryResponse(tuple(obj["documents"]))
