"""The admin API's JSON schemas and the validation of what clients send.

The schema dicts here are OpenAPI 3.0 Schema Objects: :mod:`gateway.http.admin_routes`
puts them into ``/admin/openapi.json`` as they are, and :func:`validate` checks
request bodies and path parameters against the very same dicts with the
``jsonschema`` library, so the published document and the checks cannot
disagree.  Problems are reported as :class:`Malformed` naming the field and
what is wrong with it; only a malformed date-time is quoted back, other values
are not (one may be a password, or megabytes long).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from jsonschema import Draft4Validator, Draft6Validator, FormatChecker, ValidationError, validators

from polyport.core.errors import Malformed

MAX_POSITION = (1 << 63) - 1

# --- request schemas -----------------------------------------------------------------

NAME: dict[str, Any] = {
    "type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^\\u0000]+$",
}
TEXT: dict[str, Any] = {"type": "string", "maxLength": 1000, "pattern": "^[^\\u0000]*$"}
PASSWORD: dict[str, Any] = {
    "type": "string", "minLength": 1, "maxLength": 1024, "pattern": "^[^\\u0000]+$",
}
NAME_LIST: dict[str, Any] = {"type": "array", "items": NAME, "maxItems": 100}

USER_CREATE: dict[str, Any] = {
    "type": "object",
    "required": ["name", "password"],
    "additionalProperties": False,
    "properties": {
        "name": NAME,
        "password": PASSWORD,
        "default_context": NAME,
        "contexts": {**NAME_LIST, "nullable": True,
                     "description": "contexts the user may use; null or absent = every context"},
    },
}
USER_PASSWORD: dict[str, Any] = {
    "type": "object", "required": ["password"], "additionalProperties": False,
    "properties": {"password": PASSWORD},
}
USER_CONTEXTS: dict[str, Any] = {
    "type": "object",
    "required": ["contexts"],
    "additionalProperties": False,
    "properties": {
        "contexts": {**NAME_LIST, "nullable": True},
        "default_context": NAME,
    },
}
BINDER_CREATE: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": NAME,
        "context": NAME,
        "stream_prefix": TEXT,
        "types": {**NAME_LIST, "nullable": True},
        "fold": {"type": "string", "enum": ["merge", "replace"]},
    },
}
SUBSCRIPTION_RESET: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object", "required": ["position"], "additionalProperties": False,
            "properties": {"position": {
                "type": "integer", "minimum": 0, "maximum": MAX_POSITION,
                "description": "resume after this log position",
            }},
        },
        {
            "type": "object", "required": ["time"], "additionalProperties": False,
            "properties": {"time": {
                "type": "string", "format": "date-time",
                "description": "resume with the first event recorded at or after this time",
            }},
        },
    ]
}

# Persistent-subscription settings (core.parking); null clears a limit.
START: dict[str, Any] = {
    "description": "where a new subscription starts: beginning, end (default), "
    "after a position, or at a time",
    "oneOf": [
        {"type": "string", "enum": ["beginning", "end"]},
        {"type": "object", "required": ["position"], "additionalProperties": False,
         "properties": {"position": {"type": "integer", "minimum": 0,
                                     "maximum": MAX_POSITION}}},
        {"type": "object", "required": ["time"], "additionalProperties": False,
         "properties": {"time": {"type": "string", "format": "date-time"}}},
    ],
}
SETTINGS_PROPERTIES: dict[str, Any] = {
    "max_in_flight": {"type": "integer", "minimum": 1, "maximum": 1_000_000, "nullable": True,
                      "description": "unacknowledged events handed out at once"},
    "max_retries": {"type": "integer", "minimum": 0, "maximum": 1_000_000, "nullable": True,
                    "description": "failures after which an event is parked; null = never"},
    "message_timeout": {"type": "number", "minimum": 0.001, "maximum": 86400,
                        "nullable": True,
                        "description": "seconds a consumer may hold an event unacknowledged"},
}
SUBSCRIPTION_CREATE: dict[str, Any] = {
    "type": "object",
    "required": ["name", "context"],
    "additionalProperties": False,
    # One of stream and prefix, or neither (the whole context).
    "not": {"required": ["stream", "prefix"]},
    "properties": {
        "name": NAME,
        "context": NAME,
        "stream": NAME,
        "prefix": TEXT,
        "types": NAME_LIST,
        "start": START,
        **SETTINGS_PROPERTIES,
    },
}
SUBSCRIPTION_SETTINGS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"start": START, **SETTINGS_PROPERTIES},
}

# --- response schemas (documentation only: the server writes these) --------------------

USER: dict[str, Any] = {
    "type": "object",
    "required": ["name", "default_context", "contexts", "created_at"],
    "properties": {
        "name": {"type": "string"},
        "default_context": {"type": "string"},
        "contexts": {"type": "array", "items": {"type": "string"}, "nullable": True},
        "created_at": {"type": "string", "format": "date-time"},
    },
}
BINDER: dict[str, Any] = {
    "type": "object",
    "required": ["name", "context", "stream_prefix", "types", "fold", "position", "documents",
                 "failures"],
    "properties": {
        "name": {"type": "string"},
        "context": {"type": "string"},
        "stream_prefix": {"type": "string"},
        "types": {"type": "array", "items": {"type": "string"}, "nullable": True},
        "fold": {"type": "string", "enum": ["merge", "replace"]},
        "position": {"type": "integer"},
        "documents": {"type": "integer"},
        "failures": {
            "type": "object",
            "description": "events the binder could not fold and skipped",
            "required": ["count", "recent"],
            "properties": {
                "count": {"type": "integer"},
                "recent": {
                    "type": "array",
                    "description": "the latest few, newest first",
                    "items": {
                        "type": "object",
                        "required": ["position", "error", "recorded_at"],
                        "properties": {
                            "position": {"type": "integer"},
                            "error": {"type": "string"},
                            "recorded_at": {"type": "string", "format": "date-time"},
                        },
                    },
                },
            },
        },
    },
}
SUBSCRIPTION: dict[str, Any] = {
    "type": "object",
    "required": ["id", "context", "name", "selector", "checkpoint", "lag_events",
                 "updated_at", "settings", "parked"],
    "properties": {
        "id": {"type": "integer"},
        "context": {"type": "string", "description": "the context the name belongs to"},
        "name": {"type": "string"},
        "selector": {"type": "object"},
        "checkpoint": {"type": "integer", "description": "last position consumed"},
        "lag_events": {"type": "integer", "description": "log positions after the checkpoint"},
        "updated_at": {"type": "string", "format": "date-time"},
        "settings": {"type": "object", "description": "persistent-subscription settings"},
        "parked": {"type": "integer", "description": "events parked after too many retries"},
    },
}
PARKED_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["position", "context", "stream", "version", "type", "retries", "reason",
                 "parked_at", "replay"],
    "properties": {
        "position": {"type": "integer"},
        "context": {"type": "string"},
        "stream": {"type": "string"},
        "version": {"type": "integer"},
        "type": {"type": "string"},
        "retries": {"type": "integer"},
        "reason": {"type": "string", "description": "the last failure: nack, timeout, "
                   "consumer left, or fetched again"},
        "parked_at": {"type": "string", "format": "date-time"},
        "replay": {"type": "boolean", "description": "replay asked for, not yet acknowledged"},
    },
}
REPLAY: dict[str, Any] = {
    "type": "object", "required": ["replaying"],
    "properties": {"replaying": {"type": "integer", "description": "events marked for replay"}},
}
CONNECTION: dict[str, Any] = {
    "type": "object",
    "required": ["id", "protocol", "peer", "user", "since", "bytes_in", "bytes_out",
                 "events_in", "events_out", "subscriptions"],
    "properties": {
        "id": {"type": "integer"},
        "protocol": {"type": "string"},
        "peer": {"type": "string", "description": "address (Res01: zmq:<routing identity>)"},
        "user": {"type": "string", "nullable": True, "description": "null until a login"},
        "since": {"type": "string", "format": "date-time"},
        "bytes_in": {"type": "integer"},
        "bytes_out": {"type": "integer"},
        "events_in": {"type": "integer"},
        "events_out": {"type": "integer"},
        "subscriptions": {"type": "integer", "description": "open subscriptions"},
    },
}
ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}, "code": {"type": "string"}},
}

# The document's ``components/schemas``: routes name their bodies by these keys.
COMPONENTS: Mapping[str, dict[str, Any]] = {
    "UserCreate": USER_CREATE,
    "UserPassword": USER_PASSWORD,
    "UserContexts": USER_CONTEXTS,
    "BinderCreate": BINDER_CREATE,
    "SubscriptionReset": SUBSCRIPTION_RESET,
    "SubscriptionCreate": SUBSCRIPTION_CREATE,
    "SubscriptionSettings": SUBSCRIPTION_SETTINGS,
    "User": USER,
    "Binder": BINDER,
    "Subscription": SUBSCRIPTION,
    "ParkedEvent": PARKED_EVENT,
    "ReplayParked": REPLAY,
    "Connection": CONNECTION,
    "Error": ERROR,
}

# --- date-times ------------------------------------------------------------------------

_DATE_TIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?"
    r"([Zz]|[+-]\d{2}:\d{2}(?::\d{2})?)$"
)


def parse_date_time(text: str) -> datetime:
    """RFC 3339 date-time (as JSON Schema's ``date-time``) to an aware UTC
    datetime; values Python cannot hold are clamped (years 0 and 9999 edges,
    leap seconds)."""
    m = _DATE_TIME.match(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 date-time: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = m.group(7)
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    if hour > 23 or minute > 59 or second > 60:
        raise ValueError(f"not an RFC 3339 date-time: {text!r}")
    leap = second == 60
    zone = m.group(8)
    if zone in ("Z", "z"):
        tz = UTC
    else:
        sign = -1 if zone[0] == "-" else 1
        parts = [int(p) for p in zone[1:].split(":")]
        if parts[0] > 23 or parts[1] > 59:
            raise ValueError(f"not an RFC 3339 time offset: {zone!r}")
        offset = timedelta(hours=parts[0], minutes=parts[1],
                           seconds=parts[2] if len(parts) > 2 else 0)
        tz = timezone(sign * offset)
    if year == 0:
        return datetime.min.replace(tzinfo=UTC)
    local = datetime(year, month, day, hour, minute, 59 if leap else second, micro, tzinfo=tz)
    if leap:
        local = local.replace(microsecond=999999)
    try:
        return local.astimezone(UTC)
    except OverflowError:
        return (datetime.max if local.year > 1 else datetime.min).replace(tzinfo=UTC)


# --- validation ------------------------------------------------------------------------

# Only the formats the schemas use are asserted, each by the function the handlers
# use to read the value afterwards: whatever passes validation, they can parse.
_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or bool(parse_date_time(value))


_draft4_type = Draft4Validator.VALIDATORS["type"]


def _type_or_nullable(
    validator: Any, types: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    # OpenAPI 3.0 writes "may be null" as ``nullable: true`` beside the type
    # (it has no type lists); plain JSON Schema would ignore it and refuse null.
    if instance is None and schema.get("nullable") is True:
        return
    yield from _draft4_type(validator, types, instance, schema)


# OpenAPI 3.0 Schema Objects are a dialect of JSON Schema draft 4 (e.g. a boolean
# ``exclusiveMinimum``).  Two changes: ``nullable``, and draft 6's reading of
# integers, under which 3.0 is one (JSON has a single number type; the handlers
# convert with int()).
_OpenAPI30Validator = validators.extend(
    Draft4Validator, {"type": _type_or_nullable}, type_checker=Draft6Validator.TYPE_CHECKER,
)


def validate(value: Any, schema: Mapping[str, Any], where: str = "body") -> None:
    """Raise :class:`Malformed` when ``value`` does not satisfy ``schema``;
    ``where`` names the value in the message (``body``, or a path parameter)."""
    # Validation stops at the first problem, in the order the schema lists its
    # keywords (type, required, unknown fields, then each property).
    error = next(_OpenAPI30Validator(schema, format_checker=_FORMATS).iter_errors(value), None)
    if error is not None:
        raise Malformed(_describe(error, where))
    # A JSON string may spell half a surrogate pair (``"\ud800"``): Python holds
    # it, but it has no UTF-8 form, so PostgreSQL could never store it.
    bad = _unencodable(value, where)
    if bad is not None:
        raise Malformed(f"{bad}: not valid Unicode (unpaired surrogate)")


def parse_body(raw: bytes, schema: Mapping[str, Any]) -> dict[str, Any]:
    """A request body: JSON, valid under ``schema`` (which must want an object)."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise Malformed("the body must be a JSON document") from None
    validate(data, schema)
    if not isinstance(data, dict):
        raise AssertionError("a request body schema must require an object")
    return data


def _unencodable(value: Any, where: str) -> str | None:
    """Where in ``value`` a string (or a field name) has no UTF-8 form, if anywhere."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _unencodable(item, f"{where}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _unencodable(key, f"{where} (a field name)")
            found = found or _unencodable(item, f"{where}.{key}")
            if found is not None:
                return found
    return None


# The keywords whose problem is a phrase around the schema's limit.
_LIMIT_PROBLEMS = {
    "minLength": "must not be shorter than {}",
    "maxLength": "must not be longer than {}",
    "pattern": "must match {}",
    "minimum": "must be at least {}",
    "maximum": "must be at most {}",
    "maxItems": "at most {} items",
}


def _describe(error: ValidationError, root: str) -> str:
    """``root.path: what is wrong``, in words that do not repeat the value."""
    where = root
    for part in error.absolute_path:
        where += f"[{part}]" if isinstance(part, int) else f".{part}"
    template = _LIMIT_PROBLEMS.get(str(error.validator))
    problem = template.format(error.validator_value) if template else _problem(error, root)
    return f"{where}: {problem}"


def _problem(error: ValidationError, root: str) -> str:
    """What is wrong, for the keywords the table above does not phrase."""
    limit, instance = error.validator_value, error.instance
    match error.validator:
        case "type":
            problem = "must not be null" if instance is None else f"must be of type {limit}"
        case "required":
            missing = next(key for key in limit if key not in instance)
            problem = f"{missing!r} is required"
        case "additionalProperties":
            known = error.schema.get("properties", {})
            problem = f"unknown field {min(key for key in instance if key not in known)!r}"
        case "enum":
            problem = f"must be one of {', '.join(map(str, limit))}"
        case "not" if "required" in limit:
            problem = f"give at most one of {', '.join(limit['required'])}"
        case "format" if error.cause is not None:
            problem = str(error.cause)
        case "oneOf":
            # The first problem with each form (the context holds them all, in order);
            # none at all means the value fits more than one form.
            first: dict[Any, ValidationError] = {}
            for sub in error.context or ():
                first.setdefault(sub.relative_schema_path[0], sub)
            # (Their paths are absolute: each is described from the root.)
            reasons = "; ".join(_describe(sub, root) for sub in first.values())
            problem = f"must match exactly one of the allowed forms " \
                      f"({reasons or 'it matches several'})"
        case _:
            # A keyword no schema here uses yet: the library's own words.
            problem = error.message
    return problem
