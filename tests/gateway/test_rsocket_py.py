"""RSocket 1.0 end to end with rsocket-py (the ``rsocket`` package from
PyPI), unchanged, against a real gateway over TCP and WebSocket: it connects
with routing and simple-authentication composite metadata, appends, reads by
request-response and request-stream, subscribes with request-N 5 and then 5
more, cancels; every answer is checked against the store.  Then what its
users rely on: refused credentials, unknown routes, per-request
authentication and contexts, LEASE, fragmentation both ways, ERROR texts.
Only this module needs rsocket-py; tests/gateway/test_rsocket.py does not.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgpack
import pytest

from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.protocols.rsocket import frames as F
from polyport.protocols.rsocket.client import RSocketClient, RSocketError
from tests.gateway.test_rsocket import (
    CTX,
    PASSWORD,
    QUIET,
    TRANSPORTS,
    USER,
    GatewayFactory,
    gw,
    stored,
    unique,
)

rsocket = pytest.importorskip("rsocket", reason="rsocket-py is in the test extras")

from reactivestreams.subscriber import DefaultSubscriber  # noqa: E402
from rsocket.error_codes import ErrorCode  # noqa: E402
from rsocket.exceptions import RSocketProtocolError  # noqa: E402
from rsocket.extensions.helpers import authenticate_simple, composite, route  # noqa: E402
from rsocket.extensions.mimetypes import WellKnownMimeTypes  # noqa: E402
from rsocket.helpers import single_transport_provider  # noqa: E402
from rsocket.payload import Payload  # noqa: E402
from rsocket.request_handler import BaseRequestHandler  # noqa: E402
from rsocket.rsocket_client import RSocketClient as PyClient  # noqa: E402
from rsocket.transports.aiohttp_websocket import TransportAioHttpClient  # noqa: E402
from rsocket.transports.tcp import TransportTCP  # noqa: E402

__all__ = ["gw"]  # the fixture, shared


class ErrorRecorder(BaseRequestHandler):
    """rsocket-py hands ERROR frames on stream 0 to the handler."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[tuple[ErrorCode, bytes]] = []

    async def on_error(self, error_code: ErrorCode, payload: Payload) -> None:
        self.errors.append((error_code, payload.data or b""))


@asynccontextmanager
async def py_client(
    gateway: Any,
    transport: str,
    *,
    user: str | None = USER,
    password: str = PASSWORD,
    data_mime: Any = WellKnownMimeTypes.APPLICATION_JSON,
    handler: ErrorRecorder | None = None,
    **kw: Any,
) -> AsyncIterator[PyClient]:
    """An rsocket-py client, configured as its documentation shows."""
    if transport == "tcp":
        host, port = gateway.listeners["rsocket"].address
        reader, writer = await asyncio.open_connection(host, port)
        tr: Any = TransportTCP(reader, writer)
    else:
        host, port = gateway.http_address
        tr = TransportAioHttpClient(url=f"ws://{host}:{port}/rsocket")
    setup = Payload(metadata=composite(authenticate_simple(user, password))) if user else None
    client = PyClient(
        single_transport_provider(tr),
        metadata_encoding=WellKnownMimeTypes.MESSAGE_RSOCKET_COMPOSITE_METADATA,
        data_encoding=data_mime,
        setup_payload=setup,
        handler_factory=(lambda: handler) if handler is not None else BaseRequestHandler,
        **kw,
    )
    async with client as connected:
        yield connected


def req(route_name: str, obj: Any, *, auth: tuple[str, str] | None = None) -> Payload:
    items = [route(route_name)]
    if auth is not None:
        items.append(authenticate_simple(*auth))
    return Payload(json.dumps(obj).encode(), composite(*items))


class Collector(DefaultSubscriber):
    """A request-stream subscriber that keeps what arrives, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self.done = asyncio.Event()
        self.error: Exception | None = None

    def on_next(self, value: Payload, is_complete: bool = False) -> None:
        self.items.put_nowait(json.loads(value.data))
        if is_complete:
            self.done.set()

    def on_error(self, exception: Exception) -> None:
        self.error = exception
        self.done.set()

    def on_complete(self) -> None:
        self.done.set()

    async def take(self, n: int) -> list[Any]:
        return [await asyncio.wait_for(self.items.get(), 5) for _ in range(n)]

    async def quiet(self) -> bool:
        await asyncio.sleep(QUIET)
        return self.items.empty()



def check_json_event(got: dict[str, Any], ev: Any) -> None:
    assert got["id"] == str(ev.event_id)
    assert (got["context"], got["stream"], got["version"], got["position"]) == (
        ev.context, ev.stream, ev.version, ev.position,
    )
    assert (got["type"], got["headers"], got["content_type"], got["recorded_at"]) == (
        ev.type, ev.headers, ev.content_type, ev.recorded_at_ms,
    )
    if got["body_encoding"] == "json":
        assert got["body"] == json.loads(ev.body)
    else:
        assert base64.b64decode(got["body"]) == ev.body


# --- the acceptance path -----------------------------------------------------------------



@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_rsocket_py_appends_reads_subscribes_and_cancels(gw: Any, transport: str) -> None:
    stream = unique("orders")
    async with py_client(gw, transport) as client:
        # Append: a JSON body and an opaque one (base64), with headers.
        answer = await client.request_response(req("events.append", {
            "stream": stream,
            "expected_version": 0,
            "events": [
                {"type": "Created", "body": {"sku": "A1", "qty": 2}, "headers": {"k": "v"}},
                {"type": "Blob", "body": base64.b64encode(b"\x00\xff").decode(),
                 "content_type": "application/octet-stream"},
            ],
        }))
        result = json.loads(answer.data)
        events = await stored(gw, stream)
        assert [e.version for e in events] == [1, 2]
        assert result == {"first_version": 1, "last_version": 2,
                          "position": events[-1].position}
        assert (events[0].body, events[0].content_type, events[0].headers) == (
            b'{"sku":"A1","qty":2}', "application/json", {"k": "v"})
        assert (events[1].body, events[1].content_type) == (b"\x00\xff",
                                                             "application/octet-stream")
        assert all(e.origin == "rsocket" and e.context == CTX for e in events)

        # Read: request-response ...
        answer = await client.request_response(req("events.read", {"stream": stream}))
        got = json.loads(answer.data)["events"]
        assert [g["body_encoding"] for g in got] == ["json", "base64"]
        for g, e in zip(got, events, strict=True):
            check_json_event(g, e)
        # ... and request-stream (events.read and events.stream alike).
        for route_name in ("events.read", "events.stream"):
            sub = Collector()
            client.request_stream(req(route_name, {"stream": stream})).subscribe(sub)
            items = await sub.take(2)
            await asyncio.wait_for(sub.done.wait(), 5)
            for g, e in zip(items, events, strict=True):
                check_json_event(g, e)

        # Subscribe from the beginning with request-N 5, then 5 more, then cancel.
        for i in range(3, 13):
            await gw.store.append(Append(CTX, stream, (EventData(f"T{i}", b"{}"),)))
        sub = Collector()
        client.request_stream(
            req("events.subscribe", {"stream": stream, "from": "beginning"})
        ).initial_request_n(5).subscribe(sub)
        first = await sub.take(5)
        assert await sub.quiet(), "a subscriber granted 5 got more than 5"
        sub.subscription.request(5)
        second = await sub.take(5)
        assert await sub.quiet(), "a subscriber granted 10 got more than 10"
        everything = await stored(gw, stream)
        assert [g["version"] for g in first + second] == list(range(1, 11))
        for g, e in zip(first + second, everything, strict=False):
            check_json_event(g, e)
        sub.subscription.cancel()
        await asyncio.sleep(0.1)
        for _ in range(100):
            if not gw.store.open_subscriptions():
                break
            await asyncio.sleep(0.02)
        assert gw.store.open_subscriptions() == []
        assert await sub.quiet()


async def test_subscribe_without_from_starts_at_the_end(gw: Any) -> None:
    stream = unique("live")
    await gw.store.append(Append(CTX, stream, (EventData("Old", b"1"),)))
    async with py_client(gw, "tcp") as client:
        sub = Collector()
        client.request_stream(req("events.subscribe", {"stream": stream})).subscribe(sub)
        for _ in range(200):
            if gw.store.open_subscriptions():
                break
            await asyncio.sleep(0.01)
        await gw.store.append(Append(CTX, stream, (EventData("New", b"2"),)))
        [got] = await sub.take(1)
        assert (got["type"], got["version"]) == ("New", 2)
        sub.subscription.cancel()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_msgpack_data(gw: Any, transport: str) -> None:
    stream = unique("mp")
    async with py_client(gw, transport, data_mime=b"application/x-msgpack") as client:
        data = msgpack.packb({"stream": stream, "events": [
            {"type": "Packed", "body": b"\x01\x02", "content_type": "application/x-thing",
             "id": uuid.UUID(int=7).bytes}]}, use_bin_type=True)
        answer = await client.request_response(
            Payload(data, composite(route("events.append"))))
        assert msgpack.unpackb(answer.data)["last_version"] == 1
        answer = await client.request_response(
            Payload(msgpack.packb({"stream": stream}), composite(route("events.read"))))
        [got] = msgpack.unpackb(answer.data, raw=False)["events"]
        [ev] = await stored(gw, stream)
        assert (got["id"], got["body"], got["content_type"], got["position"]) == (
            uuid.UUID(int=7).bytes, b"\x01\x02", "application/x-thing", ev.position)
        assert ev.event_id == uuid.UUID(int=7)


# --- refusals and errors -------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_wrong_credentials_get_rejected_setup_and_close(gw: Any, transport: str) -> None:
    handler = ErrorRecorder()
    async with py_client(gw, transport, password="wrong", handler=handler) as client:
        with pytest.raises((RSocketProtocolError, Exception)):
            await asyncio.wait_for(client.request_response(req("events.read", {"stream": "x"})), 5)
        # The server closed its end (rsocket-py's WebSocket transport does
        # not report that, so it is read from the listener).
        stats = gw.listeners["rsocket"].stats
        for _ in range(250):
            if stats.connections_open == 0 and handler.errors:
                break
            await asyncio.sleep(0.02)
        assert stats.connections_open == 0
    [(code, text)] = handler.errors
    assert code == ErrorCode.REJECTED_SETUP
    assert text.decode().startswith("unauthenticated: ")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unknown_route_gets_an_error_never_silence(gw: Any, transport: str) -> None:
    async with py_client(gw, transport) as client:
        with pytest.raises(RSocketProtocolError) as err:
            await asyncio.wait_for(client.request_response(req("events.nope", {})), 5)
        assert err.value.error_code == ErrorCode.INVALID
        assert err.value.data.startswith("unsupported: unknown route 'events.nope'")
        # No route at all, and a route served as another interaction.
        with pytest.raises(RSocketProtocolError) as err:
            await asyncio.wait_for(client.request_response(Payload(b"{}", b"")), 5)
        assert err.value.data.startswith("unsupported: no route")
        with pytest.raises(RSocketProtocolError) as err:
            await asyncio.wait_for(
                client.request_response(req("events.subscribe", {"stream": "x"})), 5)
        assert "request-stream" in err.value.data
        # The connection carries on.
        answer = await client.request_response(req("events.read", {"stream": unique()}))
        assert json.loads(answer.data) == {"events": []}


async def test_store_errors_travel_as_text_with_the_canonical_code(gw: Any) -> None:
    stream = unique()
    async with py_client(gw, "tcp") as client:
        body = {"stream": stream, "expected_version": 3, "events": [{"type": "T", "body": 1}]}
        with pytest.raises(RuntimeError) as err:  # APPLICATION_ERROR: rsocket-py's RuntimeError
            await asyncio.wait_for(client.request_response(req("events.append", body)), 5)
        assert str(err.value).startswith("wrong_expected_version: ")
        with pytest.raises(RSocketProtocolError) as bad:
            await asyncio.wait_for(
                client.request_response(req("events.append", {"stream": stream})), 5)
        assert bad.value.error_code == ErrorCode.INVALID
        assert bad.value.data.startswith("malformed: ")


async def test_per_request_authentication_and_context(gw: Any) -> None:
    stream = unique()
    # An anonymous connection acts in `default` ...
    async with py_client(gw, "tcp", user=None) as client:
        await client.request_response(req("events.append", {
            "stream": stream, "events": [{"type": "Anon", "body": 1}]}))
        # ... a request with its own authentication entry acts as that user,
        await client.request_response(req("events.append", {
            "stream": stream, "events": [{"type": "Auth", "body": 2}]}, auth=(USER, PASSWORD)))
        # and may name another context it is allowed.
        await client.request_response(req("events.append", {
            "stream": stream, "context": "shared", "events": [{"type": "Shared", "body": 3}]},
            auth=(USER, PASSWORD)))
        with pytest.raises(RuntimeError) as err:
            await asyncio.wait_for(client.request_response(req("events.append", {
                "stream": stream, "context": "elsewhere", "events": [{"type": "No", "body": 4}]},
                auth=(USER, PASSWORD))), 5)
        assert str(err.value).startswith("forbidden: ")
        with pytest.raises(RuntimeError) as err:
            await asyncio.wait_for(client.request_response(req(
                "events.read", {"stream": stream}, auth=(USER, "wrong"))), 5)
        assert str(err.value).startswith("unauthenticated: ")
    assert [e.type for e in await stored(gw, stream, "default")] == ["Anon"]
    assert [e.type for e in await stored(gw, stream, CTX)] == ["Auth"]
    assert [e.type for e in await stored(gw, stream, "shared")] == ["Shared"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fragmentation_both_ways(gateway_factory: GatewayFactory, transport: str) -> None:
    gateway = await gateway_factory(extra={"rsocket_max_fragment": 200})
    stream = unique("big")
    text = "x" * 3000
    # rsocket-py fragments its request (64-byte fragments); we fragment the answer.
    async with py_client(gateway, transport, user=None, fragment_size_bytes=64) as client:
        await client.request_response(req("events.append", {
            "stream": stream, "events": [{"type": "Big", "body": {"text": text}}]}))
        answer = await client.request_response(req("events.read", {"stream": stream}))
    [got] = json.loads(answer.data)["events"]
    assert got["body"] == {"text": text}
    [ev] = await stored(gateway, stream, "default")
    assert json.loads(ev.body) == {"text": text}


async def test_lease_for_clients_that_ask(gateway_factory: GatewayFactory) -> None:
    gateway = await gateway_factory(extra={"rsocket_lease_requests": 2})
    # rsocket-py waits for the LEASE before its first request.
    async with py_client(gateway, "tcp", user=None, honor_lease=True) as client:
        answer = await asyncio.wait_for(
            client.request_response(req("events.read", {"stream": "leased"})), 5)
        assert json.loads(answer.data) == {"events": []}
    # Our client: beyond the lease's two requests the server answers REJECTED.
    host, port = gateway.listeners["rsocket"].address
    client2 = await RSocketClient.connect(host, port, lease=True, data_format="json")
    try:
        await client2.read("leased")
        assert client2.lease is not None and client2.lease.requests == 2
        await client2.read("leased")
        with pytest.raises(RSocketError) as err:
            await client2.read("leased")
        assert (err.value.error_code, err.value.code) == (F.REJECTED, "busy")
    finally:
        await client2.close()


