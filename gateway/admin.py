"""The admin API under ``/admin/``: users, binders, durable subscriptions.

Guarded by ``Authorization: Bearer <admin_token>``; with no ``admin_token``
configured the API is off (every ``/admin/`` path answers 404).  The OpenAPI
document at ``/admin/openapi.json`` is built from the same schemas that
validate request bodies (:func:`validate`), so the two cannot drift apart.
Every error answers JSON ``{"error": message, "code": canonical code}``.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import asyncpg
from aiohttp import web
from aiohttp.typedefs import Middleware

from polyport.core.commands import FromPosition, FromTime
from polyport.core.errors import Malformed, NotFound, PolyportError, StorageUnavailable
from polyport.gateway.telemetry import polyport_version

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

log = logging.getLogger("polyport.admin")

PREFIX = "/admin"
OPENAPI_PATH = "/admin/openapi.json"
MAX_POSITION = (1 << 63) - 1

# --- schemas ---------------------------------------------------------------------------

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
    "required": ["id", "name", "selector", "checkpoint", "lag_events", "updated_at"],
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "selector": {"type": "object"},
        "checkpoint": {"type": "integer", "description": "last position consumed"},
        "lag_events": {"type": "integer", "description": "log positions after the checkpoint"},
        "updated_at": {"type": "string", "format": "date-time"},
    },
}
ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}, "code": {"type": "string"}},
}

# --- a validator for the subset of JSON Schema used above --------------------------------

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


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "boolean":
        return isinstance(value, bool)
    raise AssertionError(f"schema type {kind!r} not supported")


def validate(value: Any, schema: dict[str, Any], where: str = "body") -> None:
    """Raise :class:`Malformed` when ``value`` does not satisfy ``schema``."""
    if "oneOf" in schema:
        ok = 0
        reasons = []
        for option in schema["oneOf"]:
            try:
                validate(value, option, where)
                ok += 1
            except Malformed as exc:
                reasons.append(exc.message)
        if ok != 1:
            raise Malformed(f"{where}: must match exactly one of the allowed forms "
                            f"({'; '.join(reasons) or 'it matches several'})")
        return
    if value is None:
        if schema.get("nullable"):
            return
        raise Malformed(f"{where}: must not be null")
    kind = schema.get("type")
    if kind is not None and not _type_ok(value, kind):
        raise Malformed(f"{where}: must be of type {kind}")
    if "enum" in schema and value not in schema["enum"]:
        raise Malformed(f"{where}: must be one of {', '.join(map(str, schema['enum']))}")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Malformed(f"{where}: not valid Unicode (unpaired surrogate)") from None
        if len(value) < schema.get("minLength", 0):
            raise Malformed(f"{where}: must not be shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise Malformed(f"{where}: must not be longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise Malformed(f"{where}: must match {schema['pattern']}")
        if schema.get("format") == "date-time":
            try:
                parse_date_time(value)
            except ValueError as exc:
                raise Malformed(f"{where}: {exc}") from None
    if kind == "integer":
        if "minimum" in schema and value < schema["minimum"]:
            raise Malformed(f"{where}: must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise Malformed(f"{where}: must be at most {schema['maximum']}")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise Malformed(f"{where}: at most {schema['maxItems']} items")
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), f"{where}[{i}]")
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                raise Malformed(f"{where}: {key!r} is required")
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                raise Malformed(f"{where}: unknown field {extra[0]!r}")
        for key, sub in props.items():
            if key in value:
                validate(value[key], sub, f"{where}.{key}")


# --- the OpenAPI document ----------------------------------------------------------------


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "invalid request", 401: "missing or wrong admin token", 404: "not found",
        409: "already exists", 503: "database unavailable",
    }
    return {str(c): _json({"$ref": "#/components/schemas/Error"}, text[c]) for c in codes}


def _body(schema_name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(schema_name)}}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _name_param(what: str) -> list[dict[str, Any]]:
    return [{"name": "name", "in": "path", "required": True, "description": f"{what} name",
             "schema": NAME}]


def openapi() -> dict[str, Any]:
    list_of = lambda name: {"type": "array", "items": _ref(name)}  # noqa: E731
    user_param, binder_param, sub_param = (
        _name_param("user"), _name_param("binder"), _name_param("subscription")
    )
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "polyport admin API",
            "version": polyport_version(),
            "description": "Users, binders and durable subscriptions of a polyport gateway. "
            "Send `Authorization: Bearer <admin_token>`.",
        },
        "servers": [{"url": "/admin"}],
        "security": [{"adminToken": []}],
        "paths": {
            "/users": {
                "get": {"operationId": "listUsers", "summary": "List users",
                        "responses": {"200": _json(list_of("User"), "users"),
                                      **_errors(401)}},
                "post": {"operationId": "addUser", "summary": "Add a user",
                         "requestBody": _body("UserCreate"),
                         "responses": {"201": _json(_ref("User"), "added"),
                                       **_errors(400, 401, 409)}},
            },
            "/users/{name}": {
                "parameters": user_param,
                "get": {"operationId": "getUser", "summary": "One user",
                        "responses": {"200": _json(_ref("User"), "the user"),
                                      **_errors(400, 401, 404)}},
                "delete": {"operationId": "removeUser", "summary": "Remove a user",
                           "responses": {"204": {"description": "removed"},
                                         **_errors(400, 401, 404)}},
            },
            "/users/{name}/password": {
                "parameters": user_param,
                "put": {"operationId": "setPassword", "summary": "Set a user's password",
                        "requestBody": _body("UserPassword"),
                        "responses": {"204": {"description": "changed"},
                                      **_errors(400, 401, 404)}},
            },
            "/users/{name}/contexts": {
                "parameters": user_param,
                "put": {"operationId": "setContexts",
                        "summary": "Set the contexts a user may use (and the default one)",
                        "requestBody": _body("UserContexts"),
                        "responses": {"200": _json(_ref("User"), "changed"),
                                      **_errors(400, 401, 404)}},
            },
            "/binders": {
                "get": {"operationId": "listBinders", "summary": "List binders",
                        "responses": {"200": _json(list_of("Binder"), "binders"),
                                      **_errors(401)}},
                "post": {"operationId": "createBinder", "summary": "Create a binder",
                         "requestBody": _body("BinderCreate"),
                         "responses": {"201": _json(_ref("Binder"), "created"),
                                       **_errors(400, 401, 409)}},
            },
            "/binders/{name}": {
                "parameters": binder_param,
                "get": {"operationId": "getBinder", "summary": "One binder",
                        "responses": {"200": _json(_ref("Binder"), "the binder"),
                                      **_errors(400, 401, 404)}},
                "delete": {"operationId": "dropBinder", "summary": "Drop a binder",
                           "responses": {"204": {"description": "dropped"},
                                         **_errors(400, 401, 404)}},
            },
            "/binders/{name}/rebuild": {
                "parameters": binder_param,
                "post": {"operationId": "rebuildBinder",
                         "summary": "Empty a binder; the gateways refill it from the log",
                         "responses": {"202": _json(_ref("Binder"), "rebuilding"),
                                       **_errors(400, 401, 404)}},
            },
            "/subscriptions": {
                "get": {"operationId": "listSubscriptions",
                        "summary": "List durable subscriptions and consumer groups",
                        "responses": {"200": _json(list_of("Subscription"), "subscriptions"),
                                      **_errors(401)}},
            },
            "/subscriptions/{name}": {
                "parameters": sub_param,
                "get": {"operationId": "getSubscription", "summary": "One subscription",
                        "responses": {"200": _json(_ref("Subscription"), "the subscription"),
                                      **_errors(400, 401, 404)}},
                "delete": {"operationId": "deleteSubscription",
                           "summary": "Delete a subscription and its checkpoint",
                           "responses": {"204": {"description": "deleted"},
                                         **_errors(400, 401, 404)}},
            },
            "/subscriptions/{name}/reset": {
                "parameters": sub_param,
                "post": {"operationId": "resetSubscription",
                         "summary": "Move the checkpoint to a position or a time "
                         "(takes effect when its consumers next start)",
                         "requestBody": _body("SubscriptionReset"),
                         "responses": {"200": _json(_ref("Subscription"), "moved"),
                                       **_errors(400, 401, 404)}},
            },
        },
        "components": {
            "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "UserCreate": USER_CREATE,
                "UserPassword": USER_PASSWORD,
                "UserContexts": USER_CONTEXTS,
                "BinderCreate": BINDER_CREATE,
                "SubscriptionReset": SUBSCRIPTION_RESET,
                "User": USER,
                "Binder": BINDER,
                "Subscription": SUBSCRIPTION,
                "Error": ERROR,
            },
        },
    }


# --- handlers ------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, code: str, **headers: str) -> web.Response:
    return web.json_response({"error": message, "code": code}, status=status, headers=headers)


async def _read_body(request: web.Request, schema: dict[str, Any]) -> dict[str, Any]:
    raw = await request.read()
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise Malformed("the body must be a JSON document") from None
    validate(data, schema)
    assert isinstance(data, dict)
    return data


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    validate(name, NAME, "name")
    return name


def _peer(request: web.Request) -> str:
    return request.remote or "?"


def routes(gw: Gateway) -> list[tuple[str, str, Handler]]:
    store = lambda: gw.store  # noqa: E731  (the store exists once the gateway runs)

    async def list_users(request: web.Request) -> web.Response:
        return web.json_response([u.as_json() for u in await store().users.list()])

    async def _user(name: str) -> dict[str, Any]:
        for u in await store().users.list():
            if u.name == name:
                return u.as_json()
        raise NotFound(f"no user {name!r}")

    async def add_user(request: web.Request) -> web.Response:
        body = await _read_body(request, USER_CREATE)
        name = body["name"]
        if any(u.name == name for u in await store().users.list()):
            return _error(409, f"user {name!r} already exists", "conflict")
        await store().users.add(
            name, body["password"], default_context=body.get("default_context", "default"),
            contexts=body.get("contexts"),
        )
        log.info("admin: user %s added (from %s)", name, _peer(request))
        return web.json_response(await _user(name), status=201)

    async def get_user(request: web.Request) -> web.Response:
        return web.json_response(await _user(_name(request)))

    async def remove_user(request: web.Request) -> web.Response:
        name = _name(request)
        await store().users.remove(name)
        log.info("admin: user %s removed (from %s)", name, _peer(request))
        return web.Response(status=204)

    async def set_password(request: web.Request) -> web.Response:
        name = _name(request)
        body = await _read_body(request, USER_PASSWORD)
        await store().users.set_password(name, body["password"])
        log.info("admin: password of %s changed (from %s)", name, _peer(request))
        return web.Response(status=204)

    async def set_contexts(request: web.Request) -> web.Response:
        name = _name(request)
        body = await _read_body(request, USER_CONTEXTS)
        await store().users.set_contexts(name, body["contexts"], body.get("default_context"))
        log.info("admin: contexts of %s set to %s (from %s)", name, body["contexts"],
                 _peer(request))
        return web.json_response(await _user(name))

    async def list_binders(request: web.Request) -> web.Response:
        return web.json_response([b.as_json() for b in await store().binders.list()])

    async def create_binder(request: web.Request) -> web.Response:
        body = await _read_body(request, BINDER_CREATE)
        name = body["name"]
        try:
            await store().binders.get(name)
        except NotFound:
            pass
        else:
            return _error(409, f"binder {name!r} already exists", "conflict")
        spec = await store().binders.create(
            name,
            context=body.get("context", "default"),
            stream_prefix=body.get("stream_prefix", ""),
            types=body.get("types"),
            fold=body.get("fold", "merge"),
        )
        log.info("admin: binder %s created (from %s)", name, _peer(request))
        return web.json_response(spec.as_json(), status=201)

    async def _binder(name: str) -> dict[str, Any]:
        # The listing carries the document counts (a single get does not).
        for b in await store().binders.list():
            if b.name == name:
                return b.as_json()
        raise NotFound(f"no binder named {name!r}")

    async def get_binder(request: web.Request) -> web.Response:
        return web.json_response(await _binder(_name(request)))

    async def drop_binder(request: web.Request) -> web.Response:
        name = _name(request)
        await store().binders.drop(name)
        log.info("admin: binder %s dropped (from %s)", name, _peer(request))
        return web.Response(status=204)

    async def rebuild_binder(request: web.Request) -> web.Response:
        name = _name(request)
        await store().binders.rebuild(name)
        log.info("admin: binder %s rebuilding (from %s)", name, _peer(request))
        return web.json_response(await _binder(name), status=202)

    async def _subscription(name: str) -> dict[str, Any]:
        for s in await store().list_subscriptions():
            if s["name"] == name:
                return s
        raise NotFound(f"no subscription named {name!r}")

    async def list_subscriptions(request: web.Request) -> web.Response:
        return web.json_response(await store().list_subscriptions())

    async def get_subscription(request: web.Request) -> web.Response:
        return web.json_response(await _subscription(_name(request)))

    async def reset_subscription(request: web.Request) -> web.Response:
        name = _name(request)
        body = await _read_body(request, SUBSCRIPTION_RESET)
        sub_id = await store().subscription_id(name)
        if sub_id is None:
            raise NotFound(f"no subscription named {name!r}")
        if "time" in body:
            cursor = await store().seek(sub_id, FromTime(parse_date_time(body["time"])))
        else:
            cursor = await store().seek(sub_id, FromPosition(int(body["position"])))
        log.info("admin: subscription %s reset to resume after position %d (from %s)",
                 name, cursor, _peer(request))
        return web.json_response(await _subscription(name))

    async def delete_subscription(request: web.Request) -> web.Response:
        name = _name(request)
        if not await store().delete_subscription(name):
            raise NotFound(f"no subscription named {name!r}")
        log.info("admin: subscription %s deleted (from %s)", name, _peer(request))
        return web.Response(status=204)

    return [
        ("GET", "/users", list_users),
        ("POST", "/users", add_user),
        ("GET", "/users/{name}", get_user),
        ("DELETE", "/users/{name}", remove_user),
        ("PUT", "/users/{name}/password", set_password),
        ("PUT", "/users/{name}/contexts", set_contexts),
        ("GET", "/binders", list_binders),
        ("POST", "/binders", create_binder),
        ("GET", "/binders/{name}", get_binder),
        ("DELETE", "/binders/{name}", drop_binder),
        ("POST", "/binders/{name}/rebuild", rebuild_binder),
        ("GET", "/subscriptions", list_subscriptions),
        ("GET", "/subscriptions/{name}", get_subscription),
        ("DELETE", "/subscriptions/{name}", delete_subscription),
        ("POST", "/subscriptions/{name}/reset", reset_subscription),
    ]


def _authorized(request: web.Request, token: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def middleware(gw: Gateway) -> Middleware:
    """Guards and shapes everything under /admin (other paths pass through)."""

    @web.middleware
    async def admin(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            return await handler(request)
        token = gw.config.admin_token
        if not token:
            return _error(404, "the admin API is off: configure admin_token to turn it on",
                          "not_found")
        if path != OPENAPI_PATH and not _authorized(request, token):
            log.warning("admin API: auth failure from %s (%s %s)", _peer(request),
                        request.method, path)
            return _error(401, "missing or wrong admin token", "unauthenticated",
                          **{"WWW-Authenticate": 'Bearer realm="polyport-admin"'})
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k in ("Allow",)}
            return _error(exc.status, exc.reason, "not_found" if exc.status == 404 else
                          "malformed", **headers)
        except Malformed as exc:
            return _error(400, exc.message, exc.code)
        except NotFound as exc:
            return _error(404, exc.message, exc.code)
        except StorageUnavailable as exc:
            return _error(503, exc.message, exc.code)
        except PolyportError as exc:
            log.error("admin API: %s %s failed: %s", request.method, path, exc.message)
            return _error(500, exc.message, exc.code)
        except (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError) as exc:
            return _error(503, f"database unavailable: {exc}", "storage_unavailable")

    return admin


def setup(app: web.Application, gw: Gateway) -> None:
    document = openapi()

    async def spec(request: web.Request) -> web.Response:
        return web.json_response(document)

    app.router.add_route("GET", OPENAPI_PATH, spec)
    for method, path, handler in routes(gw):
        app.router.add_route(method, PREFIX + path, handler)
