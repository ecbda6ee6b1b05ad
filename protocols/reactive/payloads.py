"""MessagePack payloads of the event service the ReactiveSocket draft and
RSocket 1.0 both offer (RSocket names the operation by route and may carry
the same maps as JSON: ``protocols/rsocket/payloads.py``).

The frames carry opaque bytes; this module gives them the schema of the design
brief ("ReactiveSocket MessagePack schema").  The draft's own SETUP and ERROR
data are in ``protocols/reactivesocket/payloads.py`` and ``errors.py``.
Every ``decode_*`` validates and raises :class:`PayloadError` (a
``ProtocolError``) with a message that names the payload and the field.
Keys the schema does not know are ignored, so clients may send more than we
read.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from polyport.protocols.errors import MALFORMED, UNSUPPORTED
from polyport.protocols.reactive.errors import PayloadError

START_KINDS = ("beginning", "end", "position", "version", "time")


# --- msgpack helpers ---------------------------------------------------------------


def pack(obj: Any) -> bytes:
    """MessagePack with the bin type for bytes (str stays str)."""
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def unpack(data: bytes, what: str) -> Any:
    try:
        # strict_map_key keeps keys hashable (str/bytes); raw=False gives str.
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except msgpack.ExtraData:
        raise PayloadError(f"{what}: trailing bytes after the MessagePack value") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise PayloadError(f"{what}: not valid MessagePack ({exc})") from None


def read_map(data: bytes, what: str) -> dict[str, Any]:
    obj = unpack(data, what)
    if not isinstance(obj, dict):
        raise PayloadError(f"{what}: expected a MessagePack map, got {_tname(obj)}")
    return obj


def _tname(value: Any) -> str:
    if value is None:
        return "nil"
    return {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        bytes: "binary",
        list: "array",
        dict: "map",
    }.get(type(value), type(value).__name__)


def read_str(
    obj: Mapping[str, Any], key: str, what: str, *, required: bool = True, empty_ok: bool = False
) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise PayloadError(f"{what}: '{key}' is required")
        return None
    if not isinstance(value, str):
        raise PayloadError(f"{what}: '{key}' must be a string, got {_tname(value)}")
    if not value and not empty_ok:
        raise PayloadError(f"{what}: '{key}' must not be empty")
    return value


def required_str(obj: Mapping[str, Any], key: str, what: str, *, empty_ok: bool = False) -> str:
    value = read_str(obj, key, what, empty_ok=empty_ok)
    assert value is not None
    return value


def _int(
    obj: Mapping[str, Any],
    key: str,
    what: str,
    *,
    required: bool = True,
    minimum: int | None = None,
) -> int | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise PayloadError(f"{what}: '{key}' is required")
        return None
    # bool is an int subclass in Python but a distinct MessagePack type.
    if not isinstance(value, int) or isinstance(value, bool):
        raise PayloadError(f"{what}: '{key}' must be an integer, got {_tname(value)}")
    if minimum is not None and value < minimum:
        raise PayloadError(f"{what}: '{key}' must be at least {minimum}, got {value}")
    return value


def _req_int(obj: Mapping[str, Any], key: str, what: str, *, minimum: int | None = None) -> int:
    value = _int(obj, key, what, minimum=minimum)
    assert value is not None
    return value


def _bytes(value: Any, key: str, what: str) -> bytes:
    # Clients on MessagePack libraries without the bin type send bytes as str.
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise PayloadError(f"{what}: '{key}' must be binary, got {_tname(value)}")


def _uuid(value: Any, key: str, what: str) -> uuid.UUID:
    if isinstance(value, bytes):
        if len(value) != 16:
            raise PayloadError(f"{what}: '{key}' must be 16 bytes, got {len(value)}")
        return uuid.UUID(bytes=value)
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            raise PayloadError(f"{what}: '{key}' is not a UUID: {value!r}") from None
    raise PayloadError(f"{what}: '{key}' must be 16 bytes, got {_tname(value)}")


def _headers(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(f"{what}: 'headers' must be a map, got {_tname(value)}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise PayloadError(f"{what}: 'headers' must map strings to strings")
    return dict(value)


# --- event map --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventMap:
    id: uuid.UUID
    context: str
    stream: str
    version: int
    position: int
    type: str
    headers: Mapping[str, str]
    body: bytes
    content_type: str
    recorded_at: int  # epoch milliseconds


def event_to_map(event: EventMap) -> dict[str, Any]:
    return {
        "id": event.id.bytes,
        "context": event.context,
        "stream": event.stream,
        "version": event.version,
        "position": event.position,
        "type": event.type,
        "headers": dict(event.headers),
        "body": event.body,
        "content_type": event.content_type,
        "recorded_at": event.recorded_at,
    }


def event_from_map(obj: Any, what: str = "event") -> EventMap:
    # A client decodes one per event: the common, well-formed map is checked
    # in one expression.  Anything else takes the field-by-field checks
    # below, which say which field is wrong; both accept exactly the same maps.
    if type(obj) is dict:
        get = obj.get
        eid, context, stream = get("id"), get("context"), get("stream")
        version, position, type_ = get("version"), get("position"), get("type")
        headers, body, ctype, at = get("headers"), get("body"), get("content_type"), get(
            "recorded_at")
        if (type(eid) is bytes and len(eid) == 16 and type(context) is str and context
                and type(stream) is str and stream and type(version) is int and version >= 1
                and type(position) is int and position >= 0 and type(type_) is str
                and type(body) is bytes and type(ctype) is str and type(at) is int
                and (headers is None or type(headers) is dict)):
            return EventMap(uuid.UUID(bytes=eid), context, stream, version, position, type_,
                            _headers(headers, what), body, ctype, at)
    return _checked_event_from_map(obj, what)


def _checked_event_from_map(obj: Any, what: str) -> EventMap:
    if not isinstance(obj, dict):
        raise PayloadError(f"{what}: expected a map, got {_tname(obj)}")
    if "id" not in obj:
        raise PayloadError(f"{what}: 'id' is required")
    if "body" not in obj:
        raise PayloadError(f"{what}: 'body' is required")
    # Positional, in the fields' order: a client decodes one per event.
    return EventMap(
        _uuid(obj["id"], "id", what),
        required_str(obj, "context", what),
        required_str(obj, "stream", what),
        _req_int(obj, "version", what, minimum=1),
        _req_int(obj, "position", what, minimum=0),
        required_str(obj, "type", what, empty_ok=True),
        _headers(obj.get("headers"), what),
        _bytes(obj["body"], "body", what),
        required_str(obj, "content_type", what, empty_ok=True),
        _req_int(obj, "recorded_at", what),
    )


def encode_event(event: EventMap) -> bytes:
    """One event map: the data of a RESPONSE on REQUEST_STREAM / REQUEST_SUB."""
    return pack(event_to_map(event))


def decode_event(data: bytes) -> EventMap:
    return event_from_map(read_map(data, "event"))


# --- requests ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendEvent:
    type: str
    body: bytes
    id: uuid.UUID | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class AppendRequest:
    stream: str
    events: tuple[AppendEvent, ...]
    # The stream's current last version; 0 = the stream must not exist;
    # None = no check.
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class ReadRequest:
    stream: str
    from_version: int = 1
    max: int | None = None


@dataclass(frozen=True, slots=True)
class QueryRequest:
    binder: str
    matcher: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AckRequest:
    """``{op: "ack" | "nack", subscription: <REQUEST_SUB stream id>, positions: [n…]}``:
    settles events of a group subscription opened with ``ack: "manual"``.  A
    nack is a failure: the event is retried, or parked once it failed more
    than the subscription's ``max_retries``."""

    subscription: int
    positions: tuple[int, ...]
    negative: bool = False


ServiceRequest = AppendRequest | ReadRequest | QueryRequest | AckRequest


def encode_request(request: ServiceRequest) -> bytes:
    obj: dict[str, Any]
    if isinstance(request, AppendRequest):
        events = []
        for e in request.events:
            m: dict[str, Any] = {"type": e.type, "body": e.body}
            if e.id is not None:
                m["id"] = e.id.bytes
            if e.headers:
                m["headers"] = dict(e.headers)
            if e.content_type is not None:
                m["content_type"] = e.content_type
            events.append(m)
        obj = {"op": "append", "stream": request.stream, "events": events}
        if request.expected_version is not None:
            obj["expected_version"] = request.expected_version
    elif isinstance(request, ReadRequest):
        obj = {"op": "read", "stream": request.stream, "from_version": request.from_version}
        if request.max is not None:
            obj["max"] = request.max
    elif isinstance(request, AckRequest):
        obj = {"op": "nack" if request.negative else "ack",
               "subscription": request.subscription, "positions": list(request.positions)}
    else:
        obj = {"op": "query", "binder": request.binder, "matcher": dict(request.matcher)}
    return pack(obj)


def _append_event(obj: Any, index: int) -> AppendEvent:
    what = f"append request: events[{index}]"
    if not isinstance(obj, dict):
        raise PayloadError(f"{what}: expected a map, got {_tname(obj)}")
    if "body" not in obj:
        raise PayloadError(f"{what}: 'body' is required")
    raw_id = obj.get("id")
    return AppendEvent(
        type=required_str(obj, "type", what),
        body=_bytes(obj["body"], "body", what),
        id=None if raw_id is None else _uuid(raw_id, "id", what),
        headers=_headers(obj.get("headers"), what),
        content_type=read_str(obj, "content_type", what, required=False),
    )


def decode_request(data: bytes) -> ServiceRequest:
    """Data of REQUEST_RESPONSE / REQUEST_FNF / REQUEST_STREAM: ``{op: ...}``."""
    return request_from_map(read_map(data, "request"))


def request_from_map(obj: Mapping[str, Any]) -> ServiceRequest:
    """A request already decoded to a map (RSocket 1.0 shares the schema)."""
    op = obj.get("op")
    if op is None:
        raise PayloadError("request: 'op' is required")
    if op == "append":
        what = "append request"
        events = obj.get("events")
        if not isinstance(events, list) or not events:
            raise PayloadError(f"{what}: 'events' must be a non-empty array")
        return AppendRequest(
            stream=required_str(obj, "stream", what),
            events=tuple(_append_event(e, i) for i, e in enumerate(events)),
            expected_version=_int(obj, "expected_version", what, required=False, minimum=0),
        )
    if op == "read":
        what = "read request"
        from_version = _int(obj, "from_version", what, required=False, minimum=1)
        return ReadRequest(
            stream=required_str(obj, "stream", what),
            from_version=1 if from_version is None else from_version,
            max=_int(obj, "max", what, required=False, minimum=1),
        )
    if op == "query":
        what = "query request"
        matcher = obj.get("matcher", {})
        if matcher is None:
            matcher = {}
        if not isinstance(matcher, dict):
            raise PayloadError(f"{what}: 'matcher' must be a map, got {_tname(matcher)}")
        return QueryRequest(binder=required_str(obj, "binder", what), matcher=matcher)
    if op in ("ack", "nack"):
        what = f"{op} request"
        positions = obj.get("positions")
        if (not isinstance(positions, list) or not positions
                or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0
                           for p in positions)):
            raise PayloadError(f"{what}: 'positions' must be a non-empty array of positions")
        subscription = _int(obj, "subscription", what, minimum=1)
        assert subscription is not None
        return AckRequest(subscription, tuple(positions), negative=op == "nack")
    if isinstance(op, str):
        raise PayloadError(
            f"request: unknown op {op!r} (expected append, read, query, ack or nack)",
            code=UNSUPPORTED,
        )
    raise PayloadError(f"request: 'op' must be a string, got {_tname(op)}")


# --- responses --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendResponse:
    first_version: int
    last_version: int
    position: int


@dataclass(frozen=True, slots=True)
class ReadResponse:
    events: tuple[EventMap, ...]


@dataclass(frozen=True, slots=True)
class QueryResponse:
    documents: tuple[Any, ...]


def encode_append_response(resp: AppendResponse) -> bytes:
    return pack(
        {
            "first_version": resp.first_version,
            "last_version": resp.last_version,
            "position": resp.position,
        }
    )


def decode_append_response(data: bytes) -> AppendResponse:
    what = "append response"
    obj = read_map(data, what)
    return AppendResponse(
        first_version=_req_int(obj, "first_version", what, minimum=0),
        last_version=_req_int(obj, "last_version", what, minimum=0),
        position=_req_int(obj, "position", what, minimum=0),
    )


def encode_read_response(resp: ReadResponse) -> bytes:
    return pack({"events": [event_to_map(e) for e in resp.events]})


def decode_read_response(data: bytes) -> ReadResponse:
    what = "read response"
    obj = read_map(data, what)
    events = obj.get("events")
    if not isinstance(events, list):
        raise PayloadError(f"{what}: 'events' must be an array")
    return ReadResponse(
        tuple(event_from_map(e, f"{what}: events[{i}]") for i, e in enumerate(events))
    )


def encode_query_response(resp: QueryResponse) -> bytes:
    return pack({"documents": list(resp.documents)})


def decode_query_response(data: bytes) -> QueryResponse:
    what = "query response"
    obj = read_map(data, what)
    documents = obj.get("documents")
    if not isinstance(documents, list):
        raise PayloadError(f"{what}: 'documents' must be an array")
    return QueryResponse(tuple(documents))


# --- REQUEST_SUB ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartAt:
    """``from`` of a subscription: ``kind`` is one of START_KINDS; ``value``
    is the position, version or epoch-ms time for the last three."""

    kind: str
    value: int | None = None


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    stream: str | None = None
    prefix: str | None = None
    types: tuple[str, ...] = ()
    # None: the client did not say; the adapter applies the service default.
    start: StartAt | None = None
    group: str | None = None
    # ``ack: "manual"`` (groups only): events are settled by ack / nack
    # requests instead of counting as acknowledged once sent.
    manual_ack: bool = False


def encode_subscribe_request(req: SubscribeRequest) -> bytes:
    obj: dict[str, Any] = {}
    if req.stream is not None:
        obj["stream"] = req.stream
    if req.prefix is not None:
        obj["prefix"] = req.prefix
    if req.types:
        obj["types"] = list(req.types)
    if req.start is not None:
        if req.start.kind in ("beginning", "end"):
            obj["from"] = req.start.kind
        else:
            obj["from"] = {req.start.kind: req.start.value}
    if req.group is not None:
        obj["group"] = req.group
    if req.manual_ack:
        obj["ack"] = "manual"
    return pack(obj)


def _start(value: Any, what: str) -> StartAt | None:
    if value is None:
        return None
    if value in ("beginning", "end"):
        return StartAt(value)
    if isinstance(value, dict) and len(value) == 1:
        ((kind, _n),) = value.items()
        if kind in ("position", "version", "time"):
            minimum = {"position": 0, "version": 1, "time": 0}[kind]
            checked = _int(value, kind, f"{what}: 'from'", minimum=minimum)
            return StartAt(kind, checked)
    raise PayloadError(
        f'{what}: \'from\' must be "beginning", "end", {{position: n}}, {{version: n}} '
        f"or {{time: epoch ms}}, got {value!r}"
    )


def decode_subscribe_request(data: bytes) -> SubscribeRequest:
    return subscribe_request_from_map(read_map(data, "subscription request") if data else {})


def subscribe_request_from_map(obj: Mapping[str, Any]) -> SubscribeRequest:
    what = "subscription request"
    stream = read_str(obj, "stream", what, required=False)
    prefix = read_str(obj, "prefix", what, required=False, empty_ok=True)
    if stream is not None and prefix is not None:
        raise PayloadError(f"{what}: give 'stream' or 'prefix', not both")
    types = obj.get("types")
    if types is None:
        types = []
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise PayloadError(f"{what}: 'types' must be an array of strings")
    start = _start(obj.get("from"), what)
    if start is not None and start.kind == "version" and stream is None:
        raise PayloadError(f"{what}: 'from' {{version: n}} needs an exact 'stream'")
    group = read_str(obj, "group", what, required=False)
    ack = obj.get("ack", "delivery")
    if ack not in ("delivery", "manual"):
        raise PayloadError(f"{what}: 'ack' must be \"delivery\" or \"manual\"")
    if ack == "manual" and group is None:
        raise PayloadError(f"{what}: 'ack': \"manual\" needs a 'group'")
    return SubscribeRequest(
        stream=stream,
        prefix=prefix,
        types=tuple(types),
        start=start,
        group=group,
        manual_ack=ack == "manual",
    )


__all__ = [
    "MALFORMED",
    "START_KINDS",
    "AckRequest",
    "AppendEvent",
    "AppendRequest",
    "AppendResponse",
    "EventMap",
    "PayloadError",
    "QueryRequest",
    "QueryResponse",
    "ReadRequest",
    "ReadResponse",
    "ServiceRequest",
    "StartAt",
    "SubscribeRequest",
    "decode_append_response",
    "decode_event",
    "decode_query_response",
    "decode_read_response",
    "decode_request",
    "decode_subscribe_request",
    "encode_append_response",
    "encode_event",
    "encode_query_response",
    "encode_read_response",
    "encode_request",
    "encode_subscribe_request",
    "event_from_map",
    "event_to_map",
    "pack",
    "read_map",
    "read_str",
    "request_from_map",
    "required_str",
    "subscribe_request_from_map",
    "unpack",
]
