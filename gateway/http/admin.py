"""The admin API under ``/admin/``: users, binders, durable subscriptions.

Guarded by ``Authorization: Bearer <admin_token>``; with no ``admin_token``
configured the API is off (every ``/admin/`` path answers 404).  Here are the
handlers and :data:`ROUTES`, the table that both serves them and documents them
at ``/admin/openapi.json`` (:mod:`gateway.http.admin_routes`); the schemas and the
validation of request bodies are in :mod:`gateway.http.admin_schema`.
Every error answers JSON ``{"error": message, "code": canonical code}``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from polyport.core.commands import FromPosition, FromTime, Selector
from polyport.core.errors import (
    Busy,
    Malformed,
    NotFound,
    PolyportError,
    StorageUnavailable,
    Unprocessable,
)
from polyport.core.parking import SubscriptionSettings
from polyport.gateway.http.admin_routes import (
    OPENAPI_PATH,
    PREFIX,
    Call,
    Reply,
    Route,
    add_routes,
    peer,
)
from polyport.gateway.http.admin_schema import parse_date_time
from polyport.gateway.http.admin_token import bearer_matches
from polyport.gateway.process.workers import (
    WorkerUnreachable,
    close_local_connection,
    local_connections,
)

if TYPE_CHECKING:
    from polyport.core.store import EventStore
    from polyport.gateway.app import Gateway

log = logging.getLogger("polyport.admin")


def _error(status: int, message: str, code: str, **headers: str) -> web.Response:
    return web.json_response({"error": message, "code": code}, status=status, headers=headers)


# --- users ---------------------------------------------------------------------------------


async def _user(store: EventStore, name: str) -> dict[str, Any]:
    for u in await store.users.list():
        if u.name == name:
            return u.as_json()
    raise NotFound(f"no user {name!r}")


async def list_users(call: Call) -> web.Response:
    return web.json_response([u.as_json() for u in await call.store.users.list()])


async def add_user(call: Call) -> web.Response:
    body = call.body
    name = body["name"]
    if any(u.name == name for u in await call.store.users.list()):
        return _error(409, f"user {name!r} already exists", "conflict")
    await call.store.users.add(
        name, body["password"], default_context=body.get("default_context"),
        contexts=body.get("contexts"),
    )
    log.info("admin: user %s added (from %s)", name, call.peer)
    return web.json_response(await _user(call.store, name), status=201)


async def get_user(call: Call) -> web.Response:
    return web.json_response(await _user(call.store, call.name))


async def remove_user(call: Call) -> web.Response:
    await call.store.users.remove(call.name)
    log.info("admin: user %s removed (from %s)", call.name, call.peer)
    return web.Response(status=204)


async def set_password(call: Call) -> web.Response:
    await call.store.users.set_password(call.name, call.body["password"])
    log.info("admin: password of %s changed (from %s)", call.name, call.peer)
    return web.Response(status=204)


async def set_contexts(call: Call) -> web.Response:
    contexts = call.body["contexts"]
    await call.store.users.set_contexts(call.name, contexts, call.body.get("default_context"))
    log.info("admin: contexts of %s set to %s (from %s)", call.name, contexts, call.peer)
    return web.json_response(await _user(call.store, call.name))


# --- binders -------------------------------------------------------------------------------


async def _binder(store: EventStore, name: str) -> dict[str, Any]:
    # The listing carries the document counts (a single get does not).
    for b in await store.binders.list():
        if b.name == name:
            return b.as_json()
    raise NotFound(f"no binder named {name!r}")


async def list_binders(call: Call) -> web.Response:
    return web.json_response([b.as_json() for b in await call.store.binders.list()])


async def create_binder(call: Call) -> web.Response:
    body = call.body
    name = body["name"]
    try:
        await call.store.binders.get(name)
    except NotFound:
        pass
    else:
        return _error(409, f"binder {name!r} already exists", "conflict")
    spec = await call.store.binders.create(
        name,
        context=body.get("context", "default"),
        stream_prefix=body.get("stream_prefix", ""),
        types=body.get("types"),
        fold=body.get("fold", "merge"),
    )
    log.info("admin: binder %s created (from %s)", name, call.peer)
    return web.json_response(spec.as_json(), status=201)


async def get_binder(call: Call) -> web.Response:
    return web.json_response(await _binder(call.store, call.name))


async def drop_binder(call: Call) -> web.Response:
    await call.store.binders.drop(call.name)
    log.info("admin: binder %s dropped (from %s)", call.name, call.peer)
    return web.Response(status=204)


async def rebuild_binder(call: Call) -> web.Response:
    await call.store.binders.rebuild(call.name)
    log.info("admin: binder %s rebuilding (from %s)", call.name, call.peer)
    return web.json_response(await _binder(call.store, call.name), status=202)


# --- subscriptions -------------------------------------------------------------------------


def _no_subscription(context: str, name: str) -> NotFound:
    return NotFound(f"no subscription named {name!r} in context {context!r}")


async def _subscription(store: EventStore, context: str, name: str) -> dict[str, Any]:
    for s in await store.list_subscriptions():
        if s["context"] == context and s["name"] == name:
            return s
    raise _no_subscription(context, name)


async def list_subscriptions(call: Call) -> web.Response:
    return web.json_response(await call.store.list_subscriptions())


async def get_subscription(call: Call) -> web.Response:
    return web.json_response(await _subscription(call.store, call.context, call.name))


async def reset_subscription(call: Call) -> web.Response:
    store, context, name, body = call.store, call.context, call.name, call.body
    sub_id = await store.subscription_id(context, name)
    if sub_id is None:
        raise _no_subscription(context, name)
    if "time" in body:
        cursor = await store.seek(sub_id, FromTime(parse_date_time(body["time"])))
    else:
        cursor = await store.seek(sub_id, FromPosition(int(body["position"])))
    log.info("admin: subscription %s in %s reset to resume after position %d (from %s)",
             name, context, cursor, call.peer)
    return web.json_response(await _subscription(store, context, name))


async def delete_subscription(call: Call) -> web.Response:
    if not await call.store.delete_subscription(call.context, call.name):
        raise _no_subscription(call.context, call.name)
    log.info("admin: subscription %s in %s deleted (from %s)", call.name, call.context,
             call.peer)
    return web.Response(status=204)


# --- persistent subscriptions ---------------------------------------------------------------


def _start_json(start: Any) -> Any:
    """A validated ``start``, with a time normalised to what the core parses."""
    if isinstance(start, dict) and "time" in start:
        return {"time": parse_date_time(start["time"]).isoformat()}
    return start


SETTING_KEYS = ("start", "max_in_flight", "max_retries", "message_timeout")


def settings_changes(body: Any) -> dict[str, Any]:
    return {k: _start_json(body[k]) if k == "start" else body[k]
            for k in SETTING_KEYS if k in body}


async def create_subscription(call: Call) -> web.Response:
    body = call.body
    name = body["name"]
    selector = Selector(
        context=body["context"], stream=body.get("stream"),
        prefix=body.get("prefix") if "stream" not in body else None,
        types=frozenset(body.get("types") or ()),
    )
    settings = SubscriptionSettings().merged(settings_changes(body))
    if not await call.store.create_subscription(name, selector, settings):
        return _error(409, f"subscription {name!r} already exists", "conflict")
    log.info("admin: subscription %s created (from %s)", name, call.peer)
    return web.json_response(await _subscription(call.store, body["context"], name), status=201)


async def update_subscription(call: Call) -> web.Response:
    await call.store.update_subscription(call.context, call.name, settings_changes(call.body))
    log.info("admin: settings of subscription %s changed (from %s)", call.name, call.peer)
    return web.json_response(await _subscription(call.store, call.context, call.name))


async def list_parked(call: Call) -> web.Response:
    return web.json_response(
        [p.as_json() for p in await call.store.parked_events(call.context, call.name)]
    )


async def replay_parked(call: Call) -> web.Response:
    count = await call.store.replay_parked(call.context, call.name)
    log.info("admin: replaying %d parked events of %s (from %s)", count, call.name, call.peer)
    return web.json_response({"replaying": count}, status=202)


# --- connections ---------------------------------------------------------------------------


# With --workers, the first worker (which serves HTTP) asks every worker: a
# connection id names the worker that holds it (protocols/connections.py).


async def list_connections(call: Call) -> web.Response:
    filters = {k: call.params[k] for k in ("protocol", "user", "address")
               if call.params.get(k) is not None}
    if call.gw.aggregator is not None:
        return web.json_response(await call.gw.aggregator.connections(filters))
    return web.json_response(local_connections(call.gw, filters))


async def close_connection(call: Call) -> web.Response:
    conn_id = int(call.params["id"])
    if call.gw.aggregator is not None:
        try:
            closed = await call.gw.aggregator.close_connection(conn_id, call.peer)
        except WorkerUnreachable as exc:
            raise StorageUnavailable(str(exc)) from None
    else:
        closed = close_local_connection(call.gw, conn_id, call.peer)
    if closed is None:
        raise NotFound(f"no open connection {conn_id}")
    return web.Response(status=204)


# --- the table -----------------------------------------------------------------------------

ROUTES: tuple[Route, ...] = (
    Route("GET", "/users", list_users, "listUsers", "List users",
          Reply(200, "users", "User", many=True)),
    Route("POST", "/users", add_user, "addUser", "Add a user",
          Reply(201, "added", "User"), body="UserCreate", conflict=True, unprocessable=True),
    Route("GET", "/users/{name}", get_user, "getUser", "One user",
          Reply(200, "the user", "User")),
    Route("DELETE", "/users/{name}", remove_user, "removeUser", "Remove a user",
          Reply(204, "removed")),
    Route("PUT", "/users/{name}/password", set_password, "setPassword",
          "Set a user's password", Reply(204, "changed"), body="UserPassword"),
    Route("PUT", "/users/{name}/contexts", set_contexts, "setContexts",
          "Set the contexts a user may use (and the default one)",
          Reply(200, "changed", "User"), body="UserContexts", unprocessable=True),
    Route("GET", "/binders", list_binders, "listBinders", "List binders",
          Reply(200, "binders", "Binder", many=True)),
    Route("POST", "/binders", create_binder, "createBinder", "Create a binder",
          Reply(201, "created", "Binder"), body="BinderCreate", conflict=True),
    Route("GET", "/binders/{name}", get_binder, "getBinder", "One binder",
          Reply(200, "the binder", "Binder")),
    Route("DELETE", "/binders/{name}", drop_binder, "dropBinder", "Drop a binder",
          Reply(204, "dropped")),
    Route("POST", "/binders/{name}/rebuild", rebuild_binder, "rebuildBinder",
          "Empty a binder; the gateways refill it from the log",
          Reply(202, "rebuilding", "Binder")),
    Route("GET", "/subscriptions", list_subscriptions, "listSubscriptions",
          "List durable subscriptions and consumer groups",
          Reply(200, "subscriptions", "Subscription", many=True)),
    Route("GET", "/subscriptions/{name}", get_subscription, "getSubscription",
          "One subscription", Reply(200, "the subscription", "Subscription"),
          query=("context",)),
    Route("DELETE", "/subscriptions/{name}", delete_subscription, "deleteSubscription",
          "Delete a subscription and its checkpoint", Reply(204, "deleted"),
          query=("context",)),
    Route("POST", "/subscriptions/{name}/reset", reset_subscription, "resetSubscription",
          "Move the checkpoint to a position or a time "
          "(takes effect when its consumers next start)",
          Reply(200, "moved", "Subscription"), body="SubscriptionReset",
          query=("context",)),
    Route("POST", "/subscriptions", create_subscription, "createSubscription",
          "Create a persistent subscription with its settings",
          Reply(201, "created", "Subscription"), body="SubscriptionCreate", conflict=True),
    Route("PUT", "/subscriptions/{name}/settings", update_subscription, "updateSubscription",
          "Change a subscription's settings (absent keys stay, null clears a limit)",
          Reply(200, "changed", "Subscription"), body="SubscriptionSettings",
          query=("context",)),
    Route("GET", "/subscriptions/{name}/parked", list_parked, "listParked",
          "Events parked after too many retries (the first 1000)",
          Reply(200, "parked events", "ParkedEvent", many=True), query=("context",)),
    Route("POST", "/subscriptions/{name}/replay-parked", replay_parked, "replayParked",
          "Hand the parked events out again (each leaves the list once acknowledged)",
          Reply(202, "replaying", "ReplayParked"), query=("context",)),
    Route("GET", "/connections", list_connections, "listConnections",
          "Open connections of every protocol",
          Reply(200, "connections", "Connection", many=True),
          query=("protocol", "user", "address")),
    Route("DELETE", "/connections/{id}", close_connection, "closeConnection",
          "Close a connection (Res01: disconnect the peer)", Reply(204, "closed")),
)

# --- guard ---------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _check_token(gw: Gateway, request: web.Request,
                       token: str) -> web.StreamResponse | None:
    """None when the request carries the admin token; else the refusal.
    Wrong tokens count in the same per-address throttle as failed logins:
    after a few, each try from that address waits longer before it is
    checked, and only a few are checked at once."""
    throttle = gw.store.users.throttle
    host = request.remote or None
    try:
        async with throttle.attempt(host):
            await throttle.wait_turn(host)
            if bearer_matches(request, token):
                return None
            throttle.failed(host)
    except Busy as exc:
        return _error(503, exc.message, "busy")
    log.warning("admin API: auth failure from %s (%s %s)", peer(request),
                request.method, request.path)
    return _error(401, "missing or wrong admin token", "unauthenticated",
                  **{"WWW-Authenticate": 'Bearer realm="polyport-admin"'})


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
        if path != OPENAPI_PATH:
            refused = await _check_token(gw, request, token)
            if refused is not None:
                return refused
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k in ("Allow",)}
            return _error(exc.status, exc.reason, "not_found" if exc.status == 404 else
                          "malformed", **headers)
        except Unprocessable as exc:
            return _error(422, exc.message, exc.code)
        except Malformed as exc:
            return _error(400, exc.message, exc.code)
        except NotFound as exc:
            return _error(404, exc.message, exc.code)
        except StorageUnavailable as exc:
            return _error(503, exc.message, exc.code)
        except PolyportError as exc:
            log.error("admin API: %s %s failed: %s", request.method, path, exc.message)
            return _error(500, exc.message, exc.code)
        except OSError as exc:  # the store's own errors arrive as StorageUnavailable
            return _error(503, f"database unavailable: {exc}", "storage_unavailable")

    return admin


def setup(app: web.Application, gw: Gateway) -> None:
    add_routes(app, gw, ROUTES)
