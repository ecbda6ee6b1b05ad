"""The admin API (issue 8, acceptance 3 and 4): token guard, every operation,
validation, and Schemathesis against /admin/openapi.json."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from jsonschema import Draft4Validator

from polyport.core.commands import Append, FromBeginning, Selector
from polyport.core.errors import Malformed
from polyport.core.events import EventData
from polyport.gateway.http import admin
from polyport.gateway.http.admin_routes import OPENAPI_PATH, PREFIX, Reply, Route, openapi
from polyport.gateway.http.admin_schema import (
    COMPONENTS,
    SUBSCRIPTION_RESET,
    USER_CONTEXTS,
    USER_CREATE,
    parse_date_time,
    validate,
)
from polyport.protocols.bson.client import BsonClient

TOKEN = "s3cret-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPO = Path(__file__).resolve().parents[2]


def base(gw: Any) -> str:
    host, port = gw.http_address
    return f"http://{host}:{port}"


async def snapshot(gw: Any) -> dict[str, Any]:
    store = gw.store
    return {
        "users": [u.as_json() for u in await store.users.list()],
        "binders": [b.as_json() for b in await store.binders.list()],
        "subscriptions": await store.list_subscriptions(),
    }


async def test_without_or_with_a_wrong_token_401_and_nothing_changes(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    # Dozens of wrong tokens from one address: past the free ones the login
    # throttle would make each wait up to 10 s (tests/security tests that).
    gw.store.users.throttle.free_failures = 1000
    await gw.store.users.add("alice", "pw")
    await gw.store.binders.create("b1", context="default")
    await gw.store.register_fetch_subscription("sub1", Selector(context="default"),
                                               FromBeginning())
    before = await snapshot(gw)
    requests: list[tuple[str, str, Any]] = [
        ("GET", "/admin/users", None),
        ("POST", "/admin/users", {"name": "mallory", "password": "x"}),
        ("GET", "/admin/users/alice", None),
        ("DELETE", "/admin/users/alice", None),
        ("PUT", "/admin/users/alice/password", {"password": "owned"}),
        ("PUT", "/admin/users/alice/contexts", {"contexts": ["x"]}),
        ("GET", "/admin/binders", None),
        ("POST", "/admin/binders", {"name": "b2"}),
        ("DELETE", "/admin/binders/b1", None),
        ("POST", "/admin/binders/b1/rebuild", None),
        ("GET", "/admin/subscriptions", None),
        ("POST", "/admin/subscriptions/sub1/reset", {"position": 5}),
        ("DELETE", "/admin/subscriptions/sub1", None),
        ("GET", "/admin/nowhere", None),
    ]
    wrong = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer "},
    ]
    async with aiohttp.ClientSession() as http:
        for headers in wrong:
            for method, path, body in requests:
                async with http.request(method, base(gw) + path, json=body,
                                        headers=headers) as r:
                    assert r.status == 401, (method, path, headers)
                    assert (await r.json())["code"] == "unauthenticated"
                    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert await snapshot(gw) == before
    # The password did not change either.
    assert (await gw.store.authenticate("alice", "pw")).user == "alice"


async def test_admin_api_is_off_without_a_token(gateway_factory) -> None:
    gw = await gateway_factory()
    async with aiohttp.ClientSession() as http:
        for path in ("/admin/users", "/admin/openapi.json"):
            async with http.get(base(gw) + path, headers=AUTH) as r:
                assert r.status == 404
                assert "admin API is off" in (await r.json())["error"]


async def test_users_binders_subscriptions(gateway_factory) -> None:
    gw = await gateway_factory(admin_token=TOKEN)
    store = gw.store
    url = base(gw) + "/admin"
    async with aiohttp.ClientSession(headers=AUTH) as http:
        # Users: add, list, get, duplicate, set password, contexts, remove.
        async with http.post(url + "/users", json={
            "name": "bob", "password": "pw1", "default_context": "shop",
            "contexts": ["shop", "eu"],
        }) as r:
            assert r.status == 201
            user = await r.json()
        assert user["name"] == "bob" and user["contexts"] == ["shop", "eu"]
        async with http.post(url + "/users", json={"name": "bob", "password": "x"}) as r:
            assert r.status == 409
        async with http.get(url + "/users") as r:
            assert [u["name"] for u in await r.json()] == ["bob"]
        async with http.put(url + "/users/bob/password", json={"password": "pw2"}) as r:
            assert r.status == 204
        assert (await store.authenticate("bob", "pw2")).user == "bob"
        async with http.put(url + "/users/bob/contexts", json={"contexts": None}) as r:
            assert r.status == 200 and (await r.json())["contexts"] is None
        async with http.put(url + "/users/nobody/password", json={"password": "x"}) as r:
            assert r.status == 404 and (await r.json())["code"] == "not_found"
        async with http.delete(url + "/users/bob") as r:
            assert r.status == 204
        async with http.get(url + "/users/bob") as r:
            assert r.status == 404
        # Validation: wrong types, unknown fields, NUL, not JSON.
        for bad in ({"name": "x"}, {"name": "", "password": "x"},
                    {"name": "x", "password": "y", "admin": True},
                    {"name": "a\x00b", "password": "x"}, {"name": 5, "password": "x"}):
            async with http.post(url + "/users", json=bad) as r:
                assert r.status == 400, bad
                assert (await r.json())["code"] == "malformed"
        async with http.post(url + "/users", data=b"{not json") as r:
            assert r.status == 400
        assert await store.users.list() == []

        # Binders: create, duplicate, list, rebuild, drop.
        await store.append(Append("shop", "cart-1", (EventData(
            "Added", b'{"item": "tea"}', content_type="application/json"),)))
        async with http.post(url + "/binders", json={
            "name": "carts", "context": "shop", "stream_prefix": "cart-", "fold": "merge",
        }) as r:
            assert r.status == 201
            assert (await r.json())["stream_prefix"] == "cart-"
        async with http.post(url + "/binders", json={"name": "carts"}) as r:
            assert r.status == 409
        await store.binders.wait_caught_up("carts", 1)
        async with http.get(url + "/binders/carts") as r:
            assert (await r.json())["documents"] == 1
        async with http.post(url + "/binders/carts/rebuild") as r:
            assert r.status == 202
        await store.binders.wait_caught_up("carts", 1)
        async with http.delete(url + "/binders/carts") as r:
            assert r.status == 204
        async with http.get(url + "/binders") as r:
            assert await r.json() == []

        # Subscriptions: list, reset to a position and a time, delete.
        await store.register_fetch_subscription("reports", Selector(context="shop"),
                                                FromBeginning())
        async with http.get(url + "/subscriptions") as r:
            [sub] = await r.json()
        assert (sub["context"], sub["name"], sub["checkpoint"], sub["lag_events"]) == (
            "shop", "reports", 0, 1)
        # Names are scoped by context: without ?context= it is "default"'s.
        async with http.get(url + "/subscriptions/reports") as r:
            assert r.status == 404 and "'default'" in (await r.json())["error"]
        shop = "?context=shop"
        async with http.get(url + "/subscriptions/reports" + shop) as r:
            assert r.status == 200 and (await r.json())["id"] == sub["id"]
        async with http.post(url + "/subscriptions/reports/reset" + shop,
                             json={"position": 1}) as r:
            assert r.status == 200 and (await r.json())["checkpoint"] == 1
        async with http.post(url + "/subscriptions/reports/reset" + shop,
                             json={"time": "2000-01-01T00:00:00Z"}) as r:
            assert r.status == 200 and (await r.json())["checkpoint"] == 0
        async with http.post(url + "/subscriptions/reports/reset" + shop,
                             json={"position": 1, "time": "2000-01-01T00:00:00Z"}) as r:
            assert r.status == 400
        async with http.post(url + "/subscriptions/nope/reset", json={"position": 1}) as r:
            assert r.status == 404
        async with http.delete(url + "/subscriptions/reports?context=") as r:
            assert r.status == 400
        async with http.delete(url + "/subscriptions/reports") as r:
            assert r.status == 404
        async with http.delete(url + "/subscriptions/reports" + shop) as r:
            assert r.status == 204
        async with http.delete(url + "/subscriptions/reports" + shop) as r:
            assert r.status == 404
        # Unknown methods: 405 with Allow, as JSON.
        async with http.patch(url + "/users") as r:
            assert r.status == 405 and set(r.headers["Allow"].split(",")) == {"GET", "POST"}


def test_validator_and_date_times() -> None:
    validate({"name": "n", "password": "p", "contexts": None}, USER_CREATE)
    with pytest.raises(Malformed, match="unknown field"):
        validate({"name": "n", "password": "p", "x": 1}, USER_CREATE)
    validate({"position": 3.0}, SUBSCRIPTION_RESET)  # 3.0 is an integer in JSON Schema
    for bad in ({"position": True}, {"position": 1.5}, {"position": -1}, {},
                {"time": "yesterday"}, {"time": "2020-01-01T25:00:00Z"}):
        with pytest.raises(Malformed):
            validate(bad, SUBSCRIPTION_RESET)
    assert parse_date_time("2020-02-03T04:05:06.1234567+01:00") == datetime(
        2020, 2, 3, 3, 5, 6, 123456, tzinfo=UTC)
    assert parse_date_time("0000-01-01T00:00:00Z") == datetime.min.replace(tzinfo=UTC)
    assert parse_date_time("9999-12-31T23:59:60-23:59").year == 9999
    assert parse_date_time("1998-12-31t23:59:60z").second == 59


def test_invalid_bodies_say_which_field_and_what_is_wrong() -> None:
    cases: list[tuple[dict[str, Any], Any, str]] = [
        (USER_CREATE, {"name": "x"}, "body: 'password' is required"),
        (USER_CREATE, {"name": "", "password": "x"}, "body.name: must not be shorter than 1"),
        (USER_CREATE, {"name": "x", "password": "y", "contexts": ["a", 3]},
         "body.contexts[1]: must be of type string"),
        (USER_CREATE, {"name": None, "password": "y"}, "body.name: must not be null"),
        (USER_CREATE, {"name": "\ud800", "password": "y"},
         "body.name: not valid Unicode (unpaired surrogate)"),
        (USER_CONTEXTS, {"contexts": ["a"] * 101}, "body.contexts: at most 100 items"),
        (SUBSCRIPTION_RESET, {"position": -1},
         "body: must match exactly one of the allowed forms "
         "(body.position: must be at least 0; body: 'time' is required)"),
        (SUBSCRIPTION_RESET, {"time": "yesterday"},
         "body: must match exactly one of the allowed forms "
         "(body: 'position' is required; body.time: not an RFC 3339 date-time: 'yesterday')"),
    ]
    for schema, value, message in cases:
        with pytest.raises(Malformed) as caught:
            validate(value, schema)
        assert caught.value.message == message
    # The password itself is never repeated back.
    with pytest.raises(Malformed) as caught:
        validate({"name": "x", "password": "hunter2" * 200}, USER_CREATE)
    assert "hunter2" not in caught.value.message


def test_schemas_are_valid_json_schema() -> None:
    # OpenAPI 3.0 schemas are a draft 4 dialect; a misspelt keyword type shows here.
    for schema in COMPONENTS.values():
        Draft4Validator.check_schema(schema)


def test_served_and_documented_operations_are_the_same() -> None:
    app = web.Application()
    admin.setup(app, gw=None)  # type: ignore[arg-type]  # handlers are not called here
    served = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.resource.canonical != OPENAPI_PATH}
    document = openapi(admin.ROUTES)
    documented = {(method.upper(), PREFIX + path) for path, item in document["paths"].items()
                  for method in item if method != "parameters"}
    assert served == documented and len(served) == len(admin.ROUTES) == 21
    ids = [op["operationId"] for item in document["paths"].values()
           for key, op in item.items() if key != "parameters"]
    assert len(set(ids)) == len(ids)


def test_a_route_must_name_known_schemas_and_parameters() -> None:
    async def handler(call: Any) -> web.Response:
        return web.Response()

    with pytest.raises(ValueError, match="component"):
        Route("POST", "/users", handler, "x", "x", Reply(201, "x"), body="NoSuchSchema")
    with pytest.raises(ValueError, match="component"):
        Route("GET", "/users", handler, "x", "x", Reply(200, "x", "Usr"))
    with pytest.raises(ValueError, match="path parameters"):
        Route("GET", "/users/{uid}", handler, "x", "x", Reply(200, "x"))
    with pytest.raises(ValueError, match="query parameters"):
        Route("GET", "/users", handler, "x", "x", Reply(200, "x"), query=("colour",))
    with pytest.raises(ValueError, match="method"):
        Route("get", "/users", handler, "x", "x", Reply(200, "x"))


async def test_schemathesis_finds_no_server_error_or_schema_violation(
    gateway_factory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polyport.admin")
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which(
        "schemathesis")
    assert cli is not None, "schemathesis is in the test extra: pip install -e '.[test]'"
    gw = await gateway_factory(admin_token=TOKEN)
    # Its auth checks send requests without the token: not a guessing
    # attack to throttle here (tests/security tests the throttle).
    gw.store.users.throttle.free_failures = 1000
    await gw.store.users.add("existing", "pw")
    await gw.store.binders.create("existing", context="default")
    await gw.store.register_fetch_subscription("existing", Selector(context="default"),
                                               FromBeginning())
    # Connections for GET and DELETE /connections to find (the id example is 1).
    host, port = gw.listeners["bson"].address
    clients = [await BsonClient.connect(host, port) for _ in range(3)]
    report = tmp_path / "schemathesis"
    # A schema-valid body whose values contradict each other (a default
    # context that is not among the contexts) is answered 422, as the
    # document says; schemathesis's acceptance check allows it only when told.
    (tmp_path / "schemathesis.toml").write_text(
        '[checks.positive_data_acceptance]\n'
        'expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]\n')
    proc = await asyncio.create_subprocess_exec(
        cli, "run", base(gw) + "/admin/openapi.json",
        "--checks", "all",
        "--exclude-checks", "object_level_authorization",
        "-H", f"Authorization: Bearer {TOKEN}",
        "--max-examples", "15",
        "--seed", "1234",
        "--workers", "1",
        "--request-timeout", "10",
        "--report", "junit",
        "--report-dir", str(report),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,  # its cache directory lands there, not in the work tree
        env={**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"},
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    # It really ran: every operation, every phase that applies, no issue.
    for client in clients:
        await client.close()
    assert "Tested: 21" in text and "No issues found" in text, text[-3000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in text, text[-3000:]
    # With the token: requests got past the guard and changed things.
    changes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("admin: ")]
    for what in ("user", "binder", "subscription"):
        assert any(m.startswith(f"admin: {what} ") for m in changes), what
