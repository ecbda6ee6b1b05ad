"""ReactiveSocket end to end: a real gateway, real sockets, TCP and WebSocket.

Issue 5, acceptance 2 and 3: append, read, query, fire-and-forget,
REQUEST_STREAM, a subscription paced by credits 1, 2, then 1000, CANCEL, a
5 MiB fragmented response; bad input (wrong version, unknown type without I,
length past the limit, REQUEST_N on a closed stream, rejected SETUP, reused
stream id) answered as the spec says while another connection carries on.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.protocols.reactivesocket import payloads
from polyport.protocols.reactivesocket.client import (
    NewEvent,
    ReactiveSocketClient,
    RemoteError,
    append_request,
)
from polyport.protocols.reactivesocket.frames import (
    Cancel,
    ErrorFrame,
    Frame,
    RequestN,
    RequestResponse,
    RequestSub,
    Response,
    Setup,
)
from polyport.protocols.reactivesocket.wire import decode_frame, encode_frame, split_tcp_frames
from tests.pg import HEAD_LOCK, row_locked

TRANSPORTS = ["tcp", "websocket"]
QUIET = 0.3  # how long "nothing more arrives" is watched


def unique(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def connect(gw: Any, transport: str, **kw: Any) -> ReactiveSocketClient:
    if transport == "tcp":
        host, port = gw.listeners["reactivesocket"].address
        return await ReactiveSocketClient.connect(host, port, **kw)
    host, port = gw.http_address
    return await ReactiveSocketClient.connect_websocket(f"ws://{host}:{port}/reactivesocket", **kw)


class RawConnection:
    """Bytes on the wire, for frames a well-behaved client never sends."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self._buf = bytearray()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    @classmethod
    async def open(cls, gw: Any, transport: str, setup: bytes = b"") -> RawConnection:
        raw = cls(transport)
        if transport == "tcp":
            host, port = gw.listeners["reactivesocket"].address
            raw._reader, raw._writer = await asyncio.open_connection(host, port)
        else:
            host, port = gw.http_address
            raw._http = aiohttp.ClientSession()
            raw._ws = await raw._http.ws_connect(
                f"ws://{host}:{port}/reactivesocket", max_msg_size=64 << 20
            )
        await raw.send_frame(Setup(setup))
        return raw

    async def send_message(self, message: bytes) -> None:
        """One frame without its TCP length (added here for TCP)."""
        if self.transport == "tcp":
            await self.send_bytes((len(message) + 4).to_bytes(4, "big") + message)
        else:
            assert self._ws is not None
            await self._ws.send_bytes(message)

    async def send_frame(self, frame: Frame) -> None:
        await self.send_message(encode_frame(frame))

    async def send_bytes(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)
        await self._writer.drain()

    async def next_frame(self, timeout: float = 5.0) -> Frame | None:
        """The next frame, or None once the server closed the connection."""
        async with asyncio.timeout(timeout):
            if self.transport == "tcp":
                assert self._reader is not None
                while True:
                    messages = split_tcp_frames(self._buf, 64 << 20)
                    if messages:
                        # Put back all but the first (re-framed) and return it.
                        rest = b"".join((len(m) + 4).to_bytes(4, "big") + m for m in messages[1:])
                        self._buf[:0] = rest
                        return decode_frame(messages[0])
                    data = await self._reader.read(65536)
                    if not data:
                        return None
                    self._buf += data
            assert self._ws is not None
            msg = await self._ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                return decode_frame(msg.data)
            return None

    async def expect_closed_after_error(self, code: str) -> payloads.ErrorData:
        frame = await self.next_frame()
        assert isinstance(frame, ErrorFrame), frame
        assert frame.stream_id == 0
        err = payloads.decode_error_data(frame.data)
        assert err.code == code, err
        assert await self.next_frame() is None  # then the server closes
        return err

    async def quiet(self, seconds: float = QUIET) -> bool:
        """True when nothing arrives (and the connection stays open)."""
        try:
            frame = await self.next_frame(seconds)
        except TimeoutError:
            return True
        raise AssertionError(f"unexpected {frame!r}")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()


@pytest.fixture
async def gw(gateway_factory: Callable[..., Awaitable[Any]]) -> Any:
    return await gateway_factory()


@pytest.fixture
async def clients() -> AsyncIterator[list[ReactiveSocketClient]]:
    opened: list[ReactiveSocketClient] = []
    yield opened
    for c in opened:
        await c.close()


async def collect(stream: Any, count: int, timeout: float = 5.0) -> list[Any]:
    out: list[Any] = []
    for _ in range(count):
        ev = await stream.next(timeout)
        assert ev is not None, f"got {len(out)} of {count}"
        out.append(ev)
    return out


async def _value(v: Any) -> Any:
    return v


async def eventually(
    probe: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool], timeout: float = 5.0
) -> Any:
    """Poll ``probe`` until ``ok`` holds; fails after ``timeout``."""
    value = None
    for _ in range(int(timeout / 0.02)):
        value = await probe()
        if ok(value):
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout}s; last value {value!r}")


def body(n: int) -> bytes:
    return json.dumps({"n": n}).encode()


# --- requests ---------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_append_read_query(gw: Any, clients: list, transport: str) -> None:
    c = await connect(gw, transport)
    clients.append(c)
    stream = unique("order")

    first = await c.append(
        stream,
        [
            NewEvent("created", body(1), {"k": "v"}, "application/json"),
            NewEvent("paid", b"\x00\x01raw"),
        ],
        expected_version=0,
    )
    assert (first.first_version, first.last_version) == (1, 2)
    assert first.position >= 2
    second = await c.append(stream, [NewEvent("shipped", b"s")], expected_version=2)
    assert (second.first_version, second.last_version) == (3, 3)
    assert second.position > first.position

    # expected_version is the stream's current last version; 0 = must not exist.
    with pytest.raises(RemoteError) as wrong:
        await c.append(stream, [NewEvent("late", b"x")], expected_version=2)
    assert wrong.value.code == "wrong_expected_version"
    with pytest.raises(RemoteError) as exists:
        await c.append(stream, [NewEvent("late", b"x")], expected_version=0)
    assert exists.value.code == "wrong_expected_version"

    events = await c.read(stream)
    assert [(e.version, e.type, e.body) for e in events] == [
        (1, "created", body(1)),
        (2, "paid", b"\x00\x01raw"),
        (3, "shipped", b"s"),
    ]
    assert events[0].headers == {"k": "v"}
    assert events[0].content_type == "application/json"
    assert events[1].content_type == "application/octet-stream"
    assert events[0].context == "default" and events[0].stream == stream
    assert [e.position for e in events] == sorted(e.position for e in events)
    assert [e.version for e in await c.read(stream, from_version=2, max=1)] == [2]
    assert await c.read(unique("missing")) == []

    # Idempotent: the same event id again succeeds without writing.
    eid = uuid.uuid4()
    a = await c.append(stream, [NewEvent("once", b"1", id=eid)])
    b = await c.append(stream, [NewEvent("once", b"1", id=eid)])
    assert a.last_version == b.last_version == 4
    assert len(await c.read(stream)) == 4

    # Query a binder kept current from the log.
    prefix = unique("acct") + "-"
    await gw.store.binders.create(f"b-{prefix}", context="default", stream_prefix=prefix)
    await c.append(prefix + "1", [NewEvent("opened", body(10), None, "application/json")])
    await c.append(prefix + "2", [NewEvent("opened", body(3), None, "application/json")])
    last = await c.append(
        prefix + "1", [NewEvent("renamed", b'{"name": "x"}', None, "application/json")]
    )
    await gw.store.binders.wait_caught_up(f"b-{prefix}", last.position)
    docs = await c.query(f"b-{prefix}", {"n": {"$gt": 5}})
    assert docs == [{"_id": prefix + "1", "n": 10, "name": "x"}]
    assert len(await c.query(f"b-{prefix}", {})) == 2
    with pytest.raises(RemoteError) as missing:
        await c.query("no-such-binder", {})
    assert missing.value.code == "not_found"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_request_errors_keep_the_connection(gw: Any, clients: list, transport: str) -> None:
    c = await connect(gw, transport)
    clients.append(c)
    with pytest.raises(RemoteError) as unknown:
        await c.request_response(payloads.pack({"op": "delete", "stream": "x"}))
    assert unknown.value.code == "unsupported"
    with pytest.raises(RemoteError) as bad:
        await c.request_response(b"\xc1 not msgpack")
    assert bad.value.code == "malformed"
    with pytest.raises(RemoteError) as no_events:
        await c.request_response(payloads.pack({"op": "append", "stream": "x", "events": []}))
    assert no_events.value.code == "malformed"
    with pytest.raises(RemoteError) as too_big:  # gateway max_event_bytes (1 MiB)
        await c.append("big", [NewEvent("big", b"x" * ((1 << 20) + 1))])
    assert too_big.value.code == "too_large"
    with pytest.raises(RemoteError) as stream_op:
        stream = await c.request_stream(payloads.pack({"op": "query", "binder": "b"}), 10)
        await stream.next(5)
    assert stream_op.value.code == "unsupported"
    # Still serving.
    assert (await c.append(unique(), [NewEvent("ok", b"1")])).first_version == 1
    stats = gw.listeners["reactivesocket"].stats
    assert stats.errors["unsupported"] >= 2 and stats.errors["malformed"] >= 2


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fire_and_forget(gw: Any, clients: list, transport: str) -> None:
    c = await connect(gw, transport)
    clients.append(c)
    stream = unique("fnf")
    await c.append_fire_and_forget(stream, [NewEvent("a", b"1")])
    await c.append_fire_and_forget(stream, [NewEvent("b", b"2")], expected_version=0)  # fails
    await c.fire_and_forget(payloads.pack({"op": "read", "stream": stream}))  # not an append
    await c.append_fire_and_forget(stream, [NewEvent("c", b"3")])
    await eventually(lambda: c.read(stream), lambda events: len(events) >= 2)
    await asyncio.sleep(0.1)
    events = await c.read(stream)
    assert [e.type for e in await c.read(stream)] == ["a", "c"]
    # No reply ever came for the failures; the connection serves on.
    assert len(events) == 2 and not c.closed


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_request_stream_paced_then_complete(gw: Any, clients: list, transport: str) -> None:
    c = await connect(gw, transport)
    clients.append(c)
    stream = unique("rs")
    await c.append(stream, [NewEvent("e", body(i)) for i in range(1, 6)])
    s = await c.read_stream(stream, initial_n=2)
    assert [e.version for e in await collect(s, 2)] == [1, 2]
    assert await s.next(QUIET) is None and not s.raw.done  # out of credits
    # Appended after the request: beyond "the current end", not delivered.
    await c.append(stream, [NewEvent("later", b"x")])
    await s.request(10)
    got = [e.version async for e in s]
    assert got == [3, 4, 5]
    assert s.raw.done  # COMPLETE arrived
    s2 = await c.read_stream(stream, from_version=5, max=1)
    assert [e.version async for e in s2] == [5]
    s3 = await c.read_stream(unique("none"))
    assert [e async for e in s3] == []


# --- subscriptions ------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_subscription_credits_and_cancel(gw: Any, clients: list, transport: str) -> None:
    c = await connect(gw, transport)
    producer = await connect(gw, "tcp")
    clients.extend([c, producer])
    stream = unique("sub")
    await producer.append(stream, [NewEvent("e", body(i)) for i in range(1, 11)])

    sub = await c.subscribe(stream=stream, start="beginning", initial_n=1)
    assert [e.version for e in await collect(sub, 1)] == [1]
    assert await sub.next(QUIET) is None  # exactly one granted

    await sub.request(2)
    assert [e.version for e in await collect(sub, 2)] == [2, 3]
    assert await sub.next(QUIET) is None  # exactly two more

    await sub.request(1000)
    assert [e.version for e in await collect(sub, 7)] == list(range(4, 11))
    # Live after the catch-up.
    await producer.append(stream, [NewEvent("live", b"x"), NewEvent("live", b"y")])
    live = await collect(sub, 2)
    assert [(e.version, e.type) for e in live] == [(11, "live"), (12, "live")]
    assert live[0].position < live[1].position

    tailer = gw.store.tailer
    assert tailer.live_count >= 1
    await sub.cancel()
    # CANCEL frees the stream at once: the subscription leaves the tailer.
    await eventually(lambda: _value(tailer.live_count), lambda n: n == 0, timeout=2)
    await producer.append(stream, [NewEvent("after-cancel", b"z")])
    assert await sub.next(QUIET) is None
    # Other filters: prefix + types, start at a position.
    sub2 = await c.subscribe(prefix=stream[:8], types=["live"], start="beginning", initial_n=10)
    assert [e.body for e in await collect(sub2, 2)] == [b"x", b"y"]
    sub3 = await c.subscribe(stream=stream, start=payloads.StartAt("version", 12), initial_n=10)
    assert [e.version for e in await collect(sub3, 2)] == [12, 13]
    await sub2.cancel()
    await sub3.cancel()


async def test_consumer_group_shares_events(gw: Any, clients: list) -> None:
    a = await connect(gw, "tcp")
    b = await connect(gw, "websocket")
    clients.extend([a, b])
    stream = unique("grp")
    sa = await a.subscribe(stream=stream, group="workers", start="beginning", initial_n=100)
    sb = await b.subscribe(stream=stream, group="workers", start="beginning", initial_n=100)
    await asyncio.sleep(0.2)
    await a.append(stream, [NewEvent("job", body(i)) for i in range(20)])
    seen: list[int] = []
    deadline = time.monotonic() + 5
    while len(seen) < 20 and time.monotonic() < deadline:
        for s in (sa, sb):
            ev = await s.next(0.05)
            if ev is not None:
                seen.append(ev.version)
    assert sorted(seen) == list(range(1, 21))  # each event to exactly one member

    # Delivered events are acknowledged: the durable checkpoint moves on.
    async def lag() -> Any:
        # Group names are scoped by context: the client's name, as it spelled it.
        subs = {(s["context"], s["name"]): s for s in await gw.store.list_subscriptions()}
        return subs.get(("default", "workers"), {}).get("lag_events")

    await eventually(lag, lambda n: n == 0, timeout=3)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_many_concurrent_streams_bounded(
    gateway_factory: Any, clients: list, transport: str
) -> None:
    gw = await gateway_factory(extra={"reactivesocket_max_streams": 4})
    c = await connect(gw, transport)
    clients.append(c)
    stream = unique("many")
    # Up to max_streams requests in flight together are all served...
    results = await asyncio.gather(*(c.append(stream, [NewEvent("e", body(i))]) for i in range(4)))
    assert sorted(r.last_version for r in results) == [1, 2, 3, 4]
    # ... beyond that the extra ones get ERROR busy (bounded), the rest succeed.
    outcomes = await asyncio.gather(
        *(c.append(stream, [NewEvent("e", body(i))]) for i in range(40)), return_exceptions=True
    )
    refused = [o for o in outcomes if isinstance(o, RemoteError)]
    stored = [o for o in outcomes if not isinstance(o, BaseException)]
    assert refused and all(o.code == "busy" for o in refused)
    assert len(refused) + len(stored) == 40
    assert len(await c.read(stream)) == 4 + len(stored)
    subs = [await c.subscribe(stream=stream, start="beginning", initial_n=1) for _ in range(4)]
    for s in subs:
        assert (await collect(s, 1))[0].version == 1
    # A fifth live stream is refused with busy; the others carry on.
    with pytest.raises(RemoteError) as busy:
        await c.read(stream)
    assert busy.value.code == "busy"
    await subs[0].cancel()  # frees its stream at once: the next request fits
    assert len(await c.read(stream, max=1)) == 1
    await subs[1].request(1)
    assert (await collect(subs[1], 1))[0].version == 2
    await subs[1].cancel()
    assert len(await c.read(stream)) == 4 + len(stored)


# --- fragmentation ------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_five_mib_response_fragmented(gw: Any, clients: list, transport: str) -> None:
    c = await connect(gw, transport)
    clients.append(c)
    stream = unique("big")
    size = 900 * 1024
    bodies = [bytes([i]) * size for i in range(6)]  # 5.3 MiB in all
    # Each append request is itself ~900 KiB: sent in 64 KiB fragments.
    for i, b in enumerate(bodies):
        await c.append(stream, [NewEvent(f"blob-{i}", b)])
    stats = gw.listeners["reactivesocket"].stats
    before = stats.frames_out
    events = await c.read(stream)
    assert [e.body for e in events] == bodies
    assert sum(len(e.body) for e in events) > 5 * 1024 * 1024
    # One RESPONSE, in at least 5 MiB / 64 KiB fragments.
    assert stats.frames_out - before >= 80


# --- bad input ------------------------------------------------------------------------


async def _still_serving(bystander: tuple[ReactiveSocketClient, Any, str], n: int) -> None:
    """The other connection: its subscription and its requests carry on."""
    client, sub, stream = bystander
    await client.append(stream, [NewEvent("alive", body(n))])
    ev = await sub.next(5)
    assert ev is not None and ev.body == body(n)


@pytest.fixture
async def bystander(gw: Any, clients: list) -> tuple[ReactiveSocketClient, Any, str]:
    c = await connect(gw, "tcp")
    clients.append(c)
    stream = unique("bystander")
    sub = await c.subscribe(stream=stream, start="beginning", initial_n=1000)
    return c, sub, stream


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_wrong_version(gw: Any, bystander: Any, transport: str) -> None:
    raw = await RawConnection.open(gw, transport)
    message = bytearray(encode_frame(RequestResponse(1, payloads.pack({"op": "read"}))))
    message[0] = 1  # version 1
    await raw.send_message(bytes(message))
    err = await raw.expect_closed_after_error("unsupported")
    assert "version" in err.message
    await raw.close()
    await _still_serving(bystander, 1)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unknown_type_with_and_without_ignore(
    gw: Any, bystander: Any, transport: str
) -> None:
    raw = await RawConnection.open(gw, transport)
    # With I: ignored, the connection goes on.
    await raw.send_message(bytes.fromhex("00 80 0077 0000000000000003") + b"zz")
    await raw.send_frame(RequestResponse(1, payloads.pack({"op": "read", "stream": "x"})))
    answer = await raw.next_frame()
    assert isinstance(answer, Response) and answer.stream_id == 1 and answer.complete
    # Without I: ERROR on stream 0, then close.
    await raw.send_message(bytes.fromhex("00 00 0077 0000000000000005"))
    err = await raw.expect_closed_after_error("unsupported")
    assert "0x0077" in err.message
    await raw.close()
    await _still_serving(bystander, 2)


async def test_tcp_length_past_the_limit(gw: Any, bystander: Any) -> None:
    raw = await RawConnection.open(gw, "tcp")
    # 2 GiB - 1 announced: refused as soon as the 4 length bytes are in.
    await raw.send_bytes(b"\x7f\xff\xff\xff")
    err = await raw.expect_closed_after_error("too_large")
    assert "exceeds" in err.message
    await raw.close()
    raw2 = await RawConnection.open(gw, "tcp")
    await raw2.send_bytes(b"\x80\x00\x00\x20" + bytes(28))  # reserved top bit
    await raw2.expect_closed_after_error("malformed")
    await raw2.close()
    await _still_serving(bystander, 3)


async def test_websocket_message_past_the_limit(gateway_factory: Any, clients: list) -> None:
    limit = 256 * 1024
    gw = await gateway_factory(extra={"reactivesocket_max_frame_size": limit})
    c = await connect(gw, "tcp")
    clients.append(c)
    stream = unique("bystander")
    sub = await c.subscribe(stream=stream, start="beginning", initial_n=100)
    raw = await RawConnection.open(gw, "websocket")
    frame = RequestResponse(1, b"\x00" * limit)
    await raw.send_frame(frame)
    await raw.expect_closed_after_error("too_large")
    await raw.close()
    await _still_serving((c, sub, stream), 4)
    # Requests above the frame limit are fine when fragmented (the client does it).
    w = await connect(gw, "websocket")
    clients.append(w)
    big = b"y" * (limit * 2)
    await w.append(stream, [NewEvent("fragmented-request", big)])
    assert (await w.read(stream))[-1].body == big


async def test_websocket_message_past_the_buffer_gets_close_1009(gateway_factory: Any) -> None:
    # Past the codec's limit plus aiohttp's slack the message never reaches
    # the codec: the client must still learn why (close 1009, message too
    # big), not see the connection dropped without a close code.
    limit = 256 * 1024
    gw = await gateway_factory(extra={"reactivesocket_max_frame_size": limit})
    raw = await RawConnection.open(gw, "websocket")
    await raw.send_message(b"\x00" * (16 << 20))
    assert await raw.next_frame() is None
    assert raw._ws is not None
    assert raw._ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    await raw.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_request_n_on_closed_stream(gw: Any, bystander: Any, transport: str) -> None:
    raw = await RawConnection.open(gw, transport)
    await raw.send_frame(RequestResponse(1, payloads.pack({"op": "read", "stream": "x"})))
    answer = await raw.next_frame()
    assert isinstance(answer, Response) and answer.complete
    # Stream 1 is closed, 7 never existed: the frames are ignored (no ERROR).
    await raw.send_frame(RequestN(1, 5))
    await raw.send_frame(RequestN(7, 5))
    await raw.send_frame(Cancel(9))
    assert await raw.quiet()
    await raw.send_frame(RequestResponse(3, payloads.pack({"op": "read", "stream": "x"})))
    again = await raw.next_frame()
    assert isinstance(again, Response) and again.stream_id == 3
    # REQUEST_N of 0 on a live subscription is that stream's fault only.
    await raw.send_frame(RequestSub(5, 1, payloads.pack({"stream": "x"})))
    await raw.send_frame(RequestN(5, 0))
    err = await raw.next_frame()
    assert isinstance(err, ErrorFrame) and err.stream_id == 5
    assert payloads.decode_error_data(err.data).code == "malformed"
    await raw.close()
    await _still_serving(bystander, 5)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_appends_answered_as_their_commits_settle(
    gw: Any, db_url: str, transport: str
) -> None:
    # Appends are queued at once and answered from their commit's callback:
    # a CANCEL while the commit waits means no answer (what was queued is
    # still stored: a commit cannot be taken back), a refused append its
    # ERROR, and the others their RESPONSE, however many are in flight.
    raw = await RawConnection.open(gw, transport)
    stream = unique("settle")

    def append(expected: int | None) -> bytes:
        return payloads.encode_request(append_request(stream, [NewEvent("e", b"1")], expected))

    async with row_locked(db_url, HEAD_LOCK):
        await raw.send_frame(RequestResponse(1, append(0)))
        await raw.send_frame(RequestResponse(3, append(None)))
        await raw.send_frame(RequestResponse(5, append(7)))
        await raw.send_frame(Cancel(3))
        assert await raw.quiet()
    answers = {}
    for _ in range(2):
        frame = await raw.next_frame()
        assert frame is not None
        answers[frame.stream_id] = frame
    assert await raw.quiet()
    assert isinstance(answers[1], Response) and answers[1].complete
    assert payloads.decode_append_response(answers[1].data).last_version == 1
    assert isinstance(answers[5], ErrorFrame)
    assert payloads.decode_error_data(answers[5].data).code == "wrong_expected_version"
    await raw.send_frame(RequestResponse(7, payloads.pack({"op": "read", "stream": stream})))
    read = await raw.next_frame()
    assert isinstance(read, Response) and read.stream_id == 7
    assert len(payloads.decode_read_response(read.data).events) == 2
    await raw.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stream_id_reused_while_live(gw: Any, bystander: Any, transport: str) -> None:
    raw = await RawConnection.open(gw, transport)
    await raw.send_frame(RequestSub(1, 10, payloads.pack({"stream": "y"})))
    await raw.send_frame(RequestResponse(1, payloads.pack({"op": "read", "stream": "y"})))
    err = await raw.next_frame()
    assert isinstance(err, ErrorFrame) and err.stream_id == 1
    assert payloads.decode_error_data(err.data).code == "malformed"
    # The subscription on 1 has ended; the connection serves on.
    await gw.store.append(Append("default", "y", (EventData("t", b"1"),)))
    assert await raw.quiet()
    await raw.send_frame(RequestResponse(3, payloads.pack({"op": "read", "stream": "y"})))
    ok = await raw.next_frame()
    assert isinstance(ok, Response) and ok.stream_id == 3
    await raw.close()
    await _still_serving(bystander, 6)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_rejected_setup(gw: Any, bystander: Any, transport: str) -> None:
    await gw.store.users.add("alice", "s3cret", default_context="shop", contexts=["shop"])
    bad = await RawConnection.open(
        gw, transport, payloads.encode_setup_data(payloads.SetupData("alice", "wrong"))
    )
    await bad.send_frame(RequestResponse(1, payloads.pack({"op": "read", "stream": "x"})))
    await bad.expect_closed_after_error("unauthenticated")
    await bad.close()
    # Forbidden context; and the client API shows it on its first request.
    c = await connect(gw, transport, user="alice", password="s3cret", context="other")
    with pytest.raises(RemoteError) as refused:
        await c.read("x")
    assert refused.value.code == "forbidden" and refused.value.stream_id == 0
    await c.close()
    # Accepted: the user's default context is used.
    ok = await connect(gw, transport, user="alice", password="s3cret")
    await ok.append("cart", [NewEvent("added", b"1")])
    assert (await ok.read("cart"))[0].context == "shop"
    await ok.close()
    await _still_serving(bystander, 7)


async def test_idle_connection_closed_but_subscriber_kept(
    gateway_factory: Any, clients: list
) -> None:
    gw = await gateway_factory(idle_timeout=0.4)
    idle = await RawConnection.open(gw, "tcp")
    subscriber = await connect(gw, "websocket")
    clients.append(subscriber)
    sub = await subscriber.subscribe(stream="quiet", initial_n=10)
    assert await idle.next_frame(3) is None  # closed for idleness
    await idle.close()
    await asyncio.sleep(0.5)
    await gw.store.append(Append("default", "quiet", (EventData("t", b"still here"),)))
    ev = await sub.next(3)
    assert ev is not None and ev.body == b"still here"


async def test_gateway_stop_closes_websockets_promptly(gateway_factory: Any) -> None:
    gw = await gateway_factory()
    c = await connect(gw, "websocket")
    sub = await c.subscribe(stream="x", initial_n=1)
    started = time.monotonic()
    await gw.stop()
    assert time.monotonic() - started < 8
    with pytest.raises(ConnectionError):
        await sub.next(3)
    await c.close()
