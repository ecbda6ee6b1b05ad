"""The admin API's route table: one :class:`Route` per operation, from which both
the aiohttp routes and the ``paths`` of ``/admin/openapi.json`` are made, so an
operation cannot be served without being documented or documented without being
served.  The handlers and the table itself are in :mod:`gateway.http.admin`.

Before a handler runs, its path parameters and JSON body have been checked
against the schemas the document publishes (:mod:`gateway.http.admin_schema`); it
gets them in a :class:`Call`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from polyport.core.events import DEFAULT_CONTEXT
from polyport.gateway.http.admin_schema import COMPONENTS, NAME, TEXT, parse_body, validate
from polyport.gateway.http.telemetry import polyport_version

if TYPE_CHECKING:
    from polyport.core.store import EventStore
    from polyport.gateway.app import Gateway

PREFIX = "/admin"
OPENAPI_PATH = "/admin/openapi.json"
METHODS = ("GET", "POST", "PUT", "DELETE")

# The schema of each path parameter an admin path may hold, by its name.
PATH_PARAMETERS: Mapping[str, Mapping[str, Any]] = {
    "name": NAME,
    # A connection id (decimal; path segments are text).
    "id": {"type": "string", "pattern": "^[0-9]{1,18}$", "example": "1"},
}
# Optional query parameters an operation may take: (schema, description).
# Durable subscription names are scoped by context, so the operations on one
# subscription name its context; not naming one means "default".
QUERY_PARAMETERS: Mapping[str, tuple[Mapping[str, Any], str]] = {
    "context": ({**NAME, "default": DEFAULT_CONTEXT}, "the context the name belongs to"),
    "protocol": (NAME, "only this protocol's"),
    "user": (NAME, "only this user's"),
    "address": (TEXT, "only those whose peer address contains this"),
}

# What each error status means, as the document describes it.
ERROR_DESCRIPTIONS: Mapping[int, str] = {
    400: "invalid request", 401: "missing or wrong admin token", 404: "not found",
    409: "already exists", 422: "the values contradict each other (see the message)",
}

_PARAMETER = re.compile(r"\{([^}]*)\}")


def peer(request: web.Request) -> str:
    """The client's address, for the log."""
    return request.remote or "?"


@dataclass(frozen=True)
class Call:
    """One request to an admin operation, its path parameters and body validated."""

    gw: Gateway
    request: web.Request
    params: Mapping[str, str]
    body: Mapping[str, Any]  # empty for operations that take no body

    @property
    def name(self) -> str:
        """The ``{name}`` path parameter."""
        return self.params["name"]

    @property
    def context(self) -> str:
        """The ``context`` query parameter, ``default`` when not given."""
        return self.params.get("context", DEFAULT_CONTEXT)

    @property
    def store(self) -> EventStore:
        return self.gw.store

    @property
    def peer(self) -> str:
        return peer(self.request)


Handler = Callable[[Call], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Reply:
    """The success response of an operation."""

    status: int
    description: str
    schema: str | None = None  # a key of COMPONENTS; None: no body
    many: bool = False  # a JSON array of ``schema``


@dataclass(frozen=True)
class Route:
    """One operation of the admin API."""

    method: str
    path: str  # below PREFIX, e.g. "/users/{name}"
    handler: Handler
    operation_id: str
    summary: str
    reply: Reply
    body: str | None = None  # the JSON body's schema, a key of COMPONENTS
    conflict: bool = False  # it creates something that may already exist (409)
    # Its body's values may contradict each other in ways a schema cannot say
    # (a default context that is not among the contexts): 422.
    unprocessable: bool = False
    query: tuple[str, ...] = ()  # optional query parameters, keys of QUERY_PARAMETERS

    def __post_init__(self) -> None:
        # A typo here would otherwise surface as a KeyError on the first request.
        if self.method not in METHODS:
            raise ValueError(f"{self.operation_id}: method {self.method!r} not in {METHODS}")
        unknown = set(self.parameters) - set(PATH_PARAMETERS)
        if unknown:
            raise ValueError(f"{self.operation_id}: no schema for path parameters {unknown}")
        unknown = set(self.query) - set(QUERY_PARAMETERS)
        if unknown:
            raise ValueError(f"{self.operation_id}: no schema for query parameters {unknown}")
        for schema in (self.body, self.reply.schema):
            if schema is not None and schema not in COMPONENTS:
                raise ValueError(f"{self.operation_id}: no component schema {schema!r}")

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(_PARAMETER.findall(self.path))

    @property
    def errors(self) -> tuple[int, ...]:
        """The error statuses the document lists for it."""
        named = bool(self.parameters)  # a name that may be invalid or name nothing
        codes = [400] if named or self.body is not None or self.query else []
        codes.append(401)
        if named:
            codes.append(404)
        if self.conflict:
            codes.append(409)
        if self.unprocessable:
            codes.append(422)
        return tuple(codes)


# --- the OpenAPI document ----------------------------------------------------------------


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _response(reply: Reply) -> dict[str, Any]:
    if reply.schema is None:
        return {"description": reply.description}
    schema = _ref(reply.schema)
    return _json({"type": "array", "items": schema} if reply.many else schema,
                 reply.description)


def _operation(route: Route) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": route.operation_id, "summary": route.summary}
    if route.query:
        operation["parameters"] = [
            {"name": name, "in": "query", "required": False,
             "description": QUERY_PARAMETERS[name][1], "schema": QUERY_PARAMETERS[name][0]}
            for name in route.query
        ]
    if route.body is not None:
        operation["requestBody"] = {
            "required": True, "content": {"application/json": {"schema": _ref(route.body)}},
        }
    operation["responses"] = {
        str(route.reply.status): _response(route.reply),
        **{str(code): _json(_ref("Error"), ERROR_DESCRIPTIONS[code]) for code in route.errors},
    }
    return operation


def _path_parameters(path: str, names: Iterable[str]) -> list[dict[str, Any]]:
    # Paths are "/<things>/{name}...": the parameter is described as "<thing> name".
    thing = path.split("/")[1].removesuffix("s")
    return [{"name": name, "in": "path", "required": True, "description": f"{thing} {name}",
             "schema": PATH_PARAMETERS[name]} for name in names]


def openapi(routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI 3.0 document of ``routes``."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        item = paths.get(route.path)
        if item is None:
            item = paths[route.path] = {}
            if route.parameters:
                item["parameters"] = _path_parameters(route.path, route.parameters)
        item[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "polyport admin API",
            "version": polyport_version(),
            "description": "Users, binders and durable subscriptions of a polyport gateway. "
            "Send `Authorization: Bearer <admin_token>`.",
        },
        "servers": [{"url": PREFIX}],
        "security": [{"adminToken": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
            "schemas": dict(COMPONENTS),
        },
    }


# --- serving -------------------------------------------------------------------------------


def _bind(route: Route, gw: Gateway) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        params = {}
        for key in route.parameters:
            params[key] = request.match_info[key]
            validate(params[key], PATH_PARAMETERS[key], key)
        for key in route.query:
            if key in request.query:
                params[key] = request.query[key]
                validate(params[key], QUERY_PARAMETERS[key][0], key)
        # Operations without a body ignore whatever was sent, unread.
        body = {} if route.body is None else parse_body(await request.read(),
                                                        COMPONENTS[route.body])
        return await route.handler(Call(gw, request, params, body))

    return handle


def add_routes(app: web.Application, gw: Gateway, routes: Iterable[Route]) -> None:
    """Serve ``routes`` under PREFIX, and their document at OPENAPI_PATH."""
    routes = tuple(routes)
    document = openapi(routes)

    async def spec(request: web.Request) -> web.Response:
        return web.json_response(document)

    app.router.add_route("GET", OPENAPI_PATH, spec)
    for route in routes:
        app.router.add_route(route.method, PREFIX + route.path, _bind(route, gw))
