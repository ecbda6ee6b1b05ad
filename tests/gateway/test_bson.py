"""BSON frames end to end: real gateway, real sockets, real PostgreSQL (issue 4)."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from pathlib import Path
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.int64 import Int64

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.protocols.bson.client import BsonClient, BsonError, ClientSubscription
from polyport.protocols.bson.frames import DEFAULT_FLOW_PAUSE_BYTES, DEFAULT_FLOW_RESUME_BYTES

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def addr(gw: Any) -> tuple[str, int]:
    host, port = gw.listeners["bson"].address
    return host, port


async def connect(gw: Any, **kw: Any) -> BsonClient:
    return await BsonClient.connect(*addr(gw), **kw)


async def take(sub: ClientSubscription, n: int, timeout: float = 10.0) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        ev = await sub.next(timeout)
        assert ev is not None, f"only {len(out)} of {n} events arrived"
        out.append(ev)
    return out


async def nothing_more(sub: ClientSubscription, wait: float = 0.4) -> None:
    assert await sub.next(wait) is None


async def read(gw: Any, stream: str, context: str = "default") -> list[Any]:
    return await gw.store.read_stream(ReadStream(context, stream))


def frame(type_: str, body: dict[str, Any] | None = None) -> bytes:
    return bson.encode({"type": type_, "frame": body if body is not None else {}})


CONNECT = frame("CONNECT", {"version": "1.0"})


async def raw_exchange(gw: Any, data: bytes, timeout: float = 5.0) -> tuple[list[dict], bool]:
    """Send raw bytes; read until the server closes.  Returns the decoded
    frames and whether the connection was closed by the server."""
    reader, writer = await asyncio.open_connection(*addr(gw))
    try:
        writer.write(data)
        await writer.drain()
        buf = b""
        closed = False
        try:
            while True:
                chunk = await asyncio.wait_for(reader.read(65536), timeout)
                if not chunk:
                    closed = True
                    break
                buf += chunk
        except TimeoutError:
            pass
        frames = []
        while len(buf) >= 4:
            (n,) = struct.unpack_from("<i", buf)
            frames.append(bson.decode(buf[:n]))
            buf = buf[n:]
        return frames, closed
    finally:
        writer.close()


# --- CONNECT ----------------------------------------------------------------------------


async def test_connect_good_and_bad_credentials(gateway_factory) -> None:
    gw = await gateway_factory()
    await gw.store.users.add("tim", "1234", default_context="shop")

    async with await connect(gw, username="tim", password="1234") as c:
        await c.ping()
        await c.emit("orders", "add_item", {"sku": "A1"})
    # The event went to the user's default context.
    assert [e.type for e in await read(gw, "orders", "shop")] == ["add_item"]
    assert await read(gw, "orders") == []

    with pytest.raises(BsonError) as bad:
        await connect(gw, username="tim", password="wrong")
    assert bad.value.err_code == "unauthenticated"
    with pytest.raises(BsonError) as unknown:
        await connect(gw, username="nobody", password="x")
    assert unknown.value.err_code == "unauthenticated"

    # On the wire: RESPONSE ok=false with errCode, then the server closes,
    # and requests pipelined behind the refused CONNECT are never answered.
    bad_connect = frame("CONNECT", {"version": "0.1", "username": "tim", "password": "nope"})
    frames, closed = await raw_exchange(gw, bad_connect + frame("PING"))
    assert closed
    assert [f["frame"]["ok"] for f in frames] == [False]
    assert frames[0]["frame"]["errCode"] == "unauthenticated"

    frames, closed = await raw_exchange(gw, frame("CONNECT", {"version": "2.0"}))
    assert closed and frames[0]["frame"]["errCode"] == "unsupported"
    assert "2.0" in frames[0]["frame"]["errMsg"]

    # Anonymous access (allowed by default) uses the context "default"; a
    # pipelined request behind a good CONNECT is answered after it.
    frames, closed = await raw_exchange(gw, CONNECT + frame("PING"), timeout=0.5)
    assert not closed
    assert [f["frame"]["ok"] for f in frames] == [True, True]


async def test_anonymous_refused_when_disabled(gateway_factory) -> None:
    gw = await gateway_factory(allow_anonymous=False)
    with pytest.raises(BsonError) as exc:
        await connect(gw)
    assert exc.value.err_code == "unauthenticated"


# --- EMIT -------------------------------------------------------------------------------


async def test_emit_is_stored_before_the_response(gateway_factory) -> None:
    gw = await gateway_factory()
    async with await connect(gw) as c:
        event = {"sku": "A1", "qty": 2, "big": Int64(1 << 40), "raw": Binary(b"\x00\x01")}
        await c.emit("orders", "add_item", event)
        # The RESPONSE came after the commit: the core sees it right away.
        [stored] = await read(gw, "orders")
        assert stored.type == "add_item"
        assert stored.content_type == "application/bson"
        assert stored.origin == "bson"
        assert stored.body == bson.encode({"sku": "A1", "qty": 2, "big": Int64(1 << 40),
                                           "raw": Binary(b"\x00\x01")})

        # Pipelined: 300 EMITs written before any reply; all confirmed, in order.
        futures = [c.send_emit("pipe", "n", {"n": i}) for i in range(300)]
        await c.drain()
        replies = await asyncio.gather(*futures)
        assert all(r.ok for r in replies)
        events = await read(gw, "pipe")
        assert [bson.decode(e.body)["n"] for e in events] == list(range(300))
        assert [e.version for e in events] == list(range(1, 301))

        # Empty stream names are refused, the connection carries on.
        with pytest.raises(BsonError) as exc:
            await c.emit("", "x", {})
        assert exc.value.err_code == "malformed"
        await c.ping()


async def test_replies_that_wait_for_the_socket_still_go_out_in_order(
    gateway_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replies go out from the outcomes' callbacks; past the write buffer's
    high-water mark a task sends what must wait for the socket and hands
    back.  With the mark at 64 bytes every commit's replies take that path:
    stored and refused EMITs still answer in request order, and the
    connection answers again afterwards."""
    from polyport.gateway.transports import tcp
    from polyport.protocols.bson.adapter import BsonSession

    monkeypatch.setattr(tcp, "WRITE_HIGH_WATER", 64)
    handed_over = 0
    write_replies = BsonSession._write_replies

    def counted(self: BsonSession, *args: Any) -> Any:
        nonlocal handed_over
        handed_over += 1
        return write_replies(self, *args)

    monkeypatch.setattr(BsonSession, "_write_replies", counted)
    gw = await gateway_factory()
    emits = [frame("EMIT", {"streamName": "" if i % 3 == 2 else "waits", "eventType": "n",
                            "event": {"n": i}}) for i in range(60)]
    reader, writer = await asyncio.open_connection(*addr(gw))
    try:
        writer.write(CONNECT + b"".join(emits))
        await writer.drain()
        got = await _frames(reader, 61)
        assert got[0]["frame"]["ok"] is True  # CONNECT
        assert [f["frame"]["ok"] for f in got[1:]] == [i % 3 != 2 for i in range(60)]
        assert handed_over >= 1
        writer.write(frame("PING"))
        [pong] = await _frames(reader, 1)
        assert pong["type"] == "RESPONSE" and pong["frame"]["ok"] is True
    finally:
        writer.close()
    events = await read(gw, "waits")
    assert [bson.decode(e.body)["n"] for e in events] == [i for i in range(60) if i % 3 != 2]


async def _frames(reader: asyncio.StreamReader, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while len(out) < count:
            (size,) = struct.unpack("<i", await reader.readexactly(4))
            out.append(bson.decode(struct.pack("<i", size) + await reader.readexactly(size - 4)))
    return out


async def test_event_size_limit(gateway_factory) -> None:
    gw = await gateway_factory()  # default max_event_bytes: 1 MiB
    async with await connect(gw) as c:
        at_limit = {"blob": Binary(b"x" * (MIB - 100))}
        assert len(bson.encode(at_limit)) <= MIB
        await c.emit("sizes", "ok", at_limit)
        with pytest.raises(BsonError) as exc:
            await c.emit("sizes", "too-big", {"blob": Binary(b"x" * MIB)})
        assert exc.value.err_code == "too_large"
        assert "1048576" in exc.value.err_msg
        await c.emit("sizes", "small", {"n": 1})  # the connection is still fine
    assert [e.type for e in await read(gw, "sizes")] == ["ok", "small"]

    # Configurable; and with at most 2 requests in flight per connection, a
    # deep pipeline still completes, in order (the server just reads slower).
    small = await gateway_factory(max_event_bytes=1000,
                                  extra={"bson_max_inflight_requests": 2})
    async with await connect(small) as c:
        with pytest.raises(BsonError) as exc:
            await c.emit("sizes2", "x", {"blob": Binary(b"x" * 1000)})
        assert exc.value.err_code == "too_large"
        futures = [c.send_emit("sizes2", "n", {"n": i}) for i in range(100)]
        await c.drain()
        assert all(r.ok for r in await asyncio.gather(*futures))
    assert [bson.decode(e.body)["n"] for e in await read(small, "sizes2")] == list(range(100))


# --- transactions -----------------------------------------------------------------------


async def test_transaction_invisible_until_commit_then_all(gateway_factory) -> None:
    gw = await gateway_factory()
    async with await connect(gw) as watcher, await connect(gw) as c:
        sub_a = await watcher.subscribe("tx-a")
        sub_b = await watcher.subscribe("tx-b")

        await c.start_tx(7)
        await c.emit("tx-a", "one", {"n": 1}, sess_id=7)
        await c.emit("tx-b", "two", {"n": 2}, sess_id=7)
        await c.emit("tx-a", "three", {"n": 3}, sess_id=7)
        # Each EMIT was answered (accepted into the transaction), yet nothing
        # is visible: not to live subscribers, not in the store.
        await nothing_more(sub_a)
        await nothing_more(sub_b, 0.1)
        assert await read(gw, "tx-a") == [] and await read(gw, "tx-b") == []

        await c.commit_tx(7)
        got_a = await take(sub_a, 2)
        got_b = await take(sub_b, 1)
        assert [(e.event_type, e.seq_no, e.event) for e in got_a] == [
            ("one", 0, {"n": 1}),
            ("three", 1, {"n": 3}),
        ]
        assert [(e.event_type, e.seq_no) for e in got_b] == [("two", 0)]
        # All at once: one commit, consecutive positions.
        stored = await read(gw, "tx-a") + await read(gw, "tx-b")
        positions = sorted(e.position for e in stored)
        assert positions == list(range(positions[0], positions[0] + 3))

        # ABORTTX leaves nothing.
        await c.start_tx(8)
        await c.emit("tx-a", "gone", {"n": 4}, sess_id=8)
        await c.emit("tx-b", "gone", {"n": 5}, sess_id=8)
        await c.abort_tx(8)
        await nothing_more(sub_a)
        await nothing_more(sub_b, 0.1)
        assert len(await read(gw, "tx-a")) == 2 and len(await read(gw, "tx-b")) == 1

        # The spec's failure rules.
        await c.start_tx(9)
        with pytest.raises(BsonError) as exc:
            await c.start_tx(9)
        assert exc.value.err_code == "malformed"
        await c.abort_tx(9)
        for op in (c.commit_tx, c.abort_tx):
            with pytest.raises(BsonError) as exc:
                await op(9)
            assert exc.value.err_code == "not_found"

        # A rejected EMIT dooms its transaction: COMMITTX fails, nothing stored.
        with pytest.raises(BsonError) as exc:
            async with c.transaction(10) as tx:
                tx.emit("tx-a", "kept?", {"n": 6})
                tx.emit("tx-a", "huge", {"blob": Binary(b"x" * MIB)})
        assert exc.value.err_code == "too_large"
        assert len(await read(gw, "tx-a")) == 2

        # Plain EMITs (no sessID, or a sessID without a transaction) go through.
        async with c.transaction(11) as tx:
            tx.emit("tx-b", "ctx", {"n": 7})
        await c.emit("tx-b", "plain", {"n": 8}, sess_id=12345)
        assert [e.event_type for e in await take(sub_b, 2)] == ["ctx", "plain"]


# --- durable subscriptions ------------------------------------------------------------


async def test_durable_subscription_resumes_after_gateway_restart(gateway_factory) -> None:
    gw1 = await gateway_factory()
    producer = await connect(gw1)
    for i in range(10):
        await producer.emit("dur", "n", {"n": i})
    await producer.close()

    c1 = await connect(gw1)
    sub = await c1.subscribe("dur", durable_id="d1", start_seq=0, auto_ack=False)
    got = await take(sub, 10)
    assert [e.seq_no for e in got] == list(range(10))
    # Acknowledge the first 6 only: ACKEV with the bytes of the RECEVs taken
    # so far (the client took all 10, so count them from the frames).
    sizes = [len(bson.encode({"type": "RECEV", "frame": {
        "subID": sub.sub_id, "streamName": e.stream_name, "eventType": e.event_type,
        "timestamp": Int64(e.timestamp), "seqNo": Int64(e.seq_no), "event": e.event}}))
        for e in got]
    assert sum(sizes) == sub.received_bytes
    sub._consumed_bytes = sum(sizes[:6])
    sub.ack()
    await c1.ping()  # the ACKEV was handled before this reply
    await gw1.stop()
    await asyncio.wait_for(c1.closed.wait(), 5)

    gw2 = await gateway_factory()
    c2 = await connect(gw2)
    sub2 = await c2.subscribe("dur", durable_id="d1", start_seq=0, auto_ack=False)
    resumed = await take(sub2, 4)
    assert [e.seq_no for e in resumed] == [6, 7, 8, 9]  # no loss, no redelivery of 0..5
    await nothing_more(sub2)
    sub2.ack(with_bytes=False)  # everything delivered
    await c2.ping()

    producer = await connect(gw2)
    await producer.emit("dur", "n", {"n": 10})
    assert [e.seq_no for e in await take(sub2, 1)] == [10]
    sub2.ack()
    await c2.ping()
    await c2.close()

    # Reconnect (same gateway): only what came after the last ACKEV.
    await producer.emit("dur", "n", {"n": 11})
    c3 = await connect(gw2)
    sub3 = await c3.subscribe("dur", durable_id="d1")
    assert [e.seq_no for e in await take(sub3, 1)] == [11]
    await nothing_more(sub3)
    await c3.close()
    await producer.close()


# --- flow control -------------------------------------------------------------------------


async def test_subscriber_that_stops_acking_pauses_others_keep_receiving(gateway_factory) -> None:
    gw = await gateway_factory()
    count = 80
    payload = {"blob": Binary(b"p" * 100_000)}
    async with await connect(gw) as slow_c, await connect(gw) as fast_c, \
            await connect(gw) as producer:
        slow = await slow_c.subscribe("flow", auto_ack=False)
        fast = await fast_c.subscribe("flow")  # acks as it consumes
        futures = [producer.send_emit("flow", "big", {**payload, "n": i}) for i in range(count)]
        await producer.drain()
        assert all(r.ok for r in await asyncio.gather(*futures))

        got = await take(fast, count, timeout=20)
        assert [e.event["n"] for e in got] == list(range(count))

        # The slow one got just past 4 MiB of RECEVs and then nothing more.
        await asyncio.sleep(0.5)
        received = slow.received
        assert DEFAULT_FLOW_PAUSE_BYTES < slow.received_bytes < DEFAULT_FLOW_PAUSE_BYTES + 200_000
        assert received < count
        size = slow.received_bytes // received  # equal-sized frames (n < 100 is int32)
        await asyncio.sleep(0.3)
        assert slow.received == received

        # Acknowledge down to just above 2 MiB: still paused.
        still = DEFAULT_FLOW_RESUME_BYTES // size + 1  # frames left unacked, > 2 MiB
        for _ in range(received - still):
            assert await slow.next(1) is not None
        slow.ack()
        await slow_c.ping()
        await asyncio.sleep(0.3)
        assert slow.received == received
        # One more below 2 MiB: delivery resumes, and the rest arrives in order.
        assert await slow.next(1) is not None
        slow.ack()
        slow.auto_ack = True  # keep acknowledging, or it pauses again at 4 MiB
        rest = [e.event["n"] for e in await take(slow, count - (received - still + 1), 20)]
        assert rest == list(range(received - still + 1, count))


# --- QUERY and binders ---------------------------------------------------------------------


async def _cli(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", *args, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_query_binder_fed_by_another_protocol(gateway_factory, db_url: str) -> None:
    gw = await gateway_factory(bson_query_window=3)
    created = await _cli("binders", "--database-url", db_url, "create", "baskets",
                         "--context", "default", "--stream-prefix", "basket-", "--fold", "merge")
    assert json.loads(created)["name"] == "baskets"

    # Appended through the core as another protocol would (JSON bodies).
    def js(stream: str, body: dict[str, Any]) -> Append:
        return Append("default", stream, (EventData("changed", json.dumps(body).encode(),
                                                    content_type="application/json"),),
                      origin="res01")

    await gw.store.append(js("basket-1", {"owner": "ann", "total": 5}))
    await gw.store.append(js("basket-1", {"total": 12}))
    await gw.store.append(js("basket-2", {"owner": "bob", "total": 30}))
    for i in range(3, 11):
        await gw.store.append(js(f"basket-{i}", {"owner": "x", "total": i}))
    last = await gw.store.append(js("other-1", {"total": 99}))
    await gw.store.binders.wait_caught_up("baskets", last.last_position)

    async with await connect(gw) as c:
        docs = await c.query_all("baskets", {"total": {"$gt": 10}})
        assert sorted(docs, key=lambda d: d["_id"]) == [
            {"_id": "basket-1", "owner": "ann", "total": 12},
            {"_id": "basket-2", "owner": "bob", "total": 30},
        ]
        assert await c.query_all("baskets", {"owner": "nobody"}) == []

        # QUERYACK flow control: at most bson_query_window (3) unacknowledged.
        q = await c.query("baskets", {}, auto_ack=False)
        assert q.num_results == 10
        await asyncio.sleep(0.4)
        assert q.buffered == 3
        q.ack()  # one QUERYACK releases exactly one more
        await asyncio.sleep(0.3)
        assert q.buffered == 4
        ids = []
        while (doc := await q.next(5)) is not None:
            ids.append(doc["_id"])
            q.ack()
        assert len(ids) == 10 and len(set(ids)) == 10

        # Two queries interleaved on one connection, each with its own window.
        q1 = await c.query("baskets", {}, auto_ack=False)
        q2 = await c.query("baskets", {"total": {"$lte": 6}}, auto_ack=False)
        await asyncio.sleep(0.3)
        assert (q1.buffered, q2.buffered) == (3, 3)
        assert len([d async for d in _acking(q2)]) == q2.num_results == 4
        assert len([d async for d in _acking(q1)]) == 10

        bad: list[tuple[str, dict[str, Any], str]] = [
            ("nope", {}, "not_found"),
            ("baskets", {"$where": "1"}, "malformed"),
            ("baskets", {"total": {"$regex": "x"}}, "malformed"),
        ]
        for binder, matcher, code in bad:
            with pytest.raises(BsonError) as exc:
                await c.query(binder, matcher)
            assert exc.value.err_code == code
        await c.ping()


async def _acking(q: Any):  # type: ignore[no-untyped-def]
    q.auto_ack = True
    async for doc in q:
        yield doc


# --- bad input ---------------------------------------------------------------------------------


def _doc_with_bad_element() -> bytes:
    # {"type": <element type 0x99>}: not BSON.
    body = b"\x99type\x00\x01"
    return struct.pack("<i", 4 + len(body) + 1) + body + b"\x00"


MALFORMED_CASES: list[tuple[str, bytes, str]] = [
    ("frame before CONNECT", frame("PING"), "unauthenticated"),
    ("EMIT before CONNECT", frame("EMIT", {"streamName": "s", "eventType": "t", "event": {}}),
     "unauthenticated"),
    ("invalid BSON", CONNECT + _doc_with_bad_element(), "malformed"),
    ("length prefix below 5", CONNECT + b"\x02\x00\x00\x00", "malformed"),
    ("negative length prefix", CONNECT + b"\xff\xff\xff\xff", "malformed"),
    ("oversized length prefix", CONNECT + b"\xff\xff\xff\x7f", "too_large"),
    ("unknown frame type", CONNECT + frame("FLY", {}), "unsupported"),
    ("type not a string", CONNECT + bson.encode({"type": 5, "frame": {}}), "malformed"),
    ("missing frame body", CONNECT + bson.encode({"type": "PING"}), "malformed"),
    ("frame body not a document", CONNECT + bson.encode({"type": "PING", "frame": [1]}),
     "malformed"),
    ("missing mandatory field",
     CONNECT + frame("EMIT", {"streamName": "s", "eventType": "t"}), "malformed"),
    ("wrong field type",
     CONNECT + frame("EMIT", {"streamName": 5, "eventType": "t", "event": {}}), "malformed"),
    ("int64 where int32 is required", CONNECT + frame("STARTTX", {"sessID": Int64(1)}),
     "malformed"),
    ("negative ACKEV bytes", CONNECT + frame("ACKEV", {"subID": 1, "bytes": -1}), "malformed"),
    ("CONNECT twice", CONNECT + CONNECT, "malformed"),
    ("server frame from the client", CONNECT + frame("RESPONSE", {"ok": True}), "malformed"),
    ("CONNECT without version", frame("CONNECT", {"username": "tim"}), "malformed"),
]


async def test_every_malformed_frame_gets_error_then_close(gateway_factory) -> None:
    gw = await gateway_factory()
    async with await connect(gw) as live, await connect(gw) as producer:
        sub = await live.subscribe("alive")
        for name, data, code in MALFORMED_CASES:
            frames, closed = await raw_exchange(gw, data)
            assert closed, name
            last = frames[-1]
            assert last["type"] == "RESPONSE", name
            assert last["frame"]["ok"] is False, name
            assert last["frame"]["errCode"] == code, (name, last)
            assert last["frame"]["errMsg"], name
            # A good CONNECT before the bad bytes was answered first.
            if data.startswith(CONNECT):
                assert [f["frame"]["ok"] for f in frames] == [True, False], name
            else:
                assert len(frames) == 1, name
            # Other connections are unaffected.
            await producer.emit("alive", "still", {"case": name})
            ev = await sub.next(5)
            assert ev is not None and ev.event == {"case": name}

        # Requests in flight before the bad bytes are answered, then the error.
        emit = frame("EMIT", {"streamName": "alive", "eventType": "x", "event": {"n": 1}})
        frames, closed = await raw_exchange(gw, CONNECT + emit + frame("PING") + b"\x02\0\0\0")
        assert closed
        assert [f["frame"]["ok"] for f in frames] == [True, True, True, False]
        assert (await sub.next(5)).event == {"n": 1}  # type: ignore[union-attr]

        # Not fatal: request-level errors keep the connection.
        with pytest.raises(BsonError):
            await live.subscribe("alive", matcher={"$bogus": 1})
        with pytest.raises(BsonError) as exc:
            await live.subscribe("alive", start_seq=-1)
        assert exc.value.err_code == "malformed"
        await live.ping()
    assert gw.listeners["bson"].stats.errors["malformed"] >= 10


# --- subscriptions: starts, filters, unsubscribe -------------------------------------------


async def test_subscribe_starts_filters_and_unsubscribe(gateway_factory) -> None:
    gw = await gateway_factory()
    async with await connect(gw) as c:
        for i in range(5):
            await c.emit("st", "even" if i % 2 == 0 else "odd", {"n": i, "tag": {"k": i}})
            # A start timestamp has millisecond precision: each event in a
            # millisecond of its own, so that the third's starts at the third.
            await asyncio.sleep(0.002)
        [third] = (await read(gw, "st"))[2:3]

        from_seq = await c.subscribe("st", start_seq=3)
        assert [e.seq_no for e in await take(from_seq, 2)] == [3, 4]
        typed = await c.subscribe("st", start_seq=0, event_type="even")
        assert [e.event["n"] for e in await take(typed, 3)] == [0, 2, 4]
        matched = await c.subscribe("st", start_seq=0, matcher={"tag.k": {"$gte": 3}})
        assert [e.event["n"] for e in await take(matched, 2)] == [3, 4]
        timed = await c.subscribe("st", start_timestamp=int(third.recorded_at_ms))
        assert [e.seq_no for e in await take(timed, 3)] == [2, 3, 4]
        live = await c.subscribe("st")  # neither: only new events
        await nothing_more(live, 0.2)

        await c.emit("st", "even", {"n": 6, "tag": {"k": 6}})
        for s in (from_seq, typed, matched, timed, live):
            ev = await s.next(5)
            assert ev is not None and ev.event["n"] == 6 and ev.seq_no == 5

        await live.unsubscribe()
        with pytest.raises(BsonError) as exc:
            await live.unsubscribe()
        assert exc.value.err_code == "not_found"
        await c.emit("st", "odd", {"n": 7, "tag": {"k": 7}})
        assert (await from_seq.next(5)).seq_no == 6  # type: ignore[union-attr]
        assert live.received == 1


async def test_connection_lost_releases_subscriptions_and_transactions(gateway_factory) -> None:
    gw = await gateway_factory()
    tailer = gw.store.tailer
    c = await connect(gw)
    for _ in range(3):
        await c.subscribe("gone", start_seq=0)
    await c.subscribe("gone", durable_id="gone-d")
    await c.start_tx(1)
    await c.emit("gone", "never", {"n": 1}, sess_id=1)
    await c.emit("gone", "kept", {"n": 0})
    await asyncio.sleep(0.2)
    assert tailer.live_count >= 3
    await c.close()
    for _ in range(50):
        if tailer.live_count == 0 and not gw.store._groups:
            break
        await asyncio.sleep(0.05)
    assert tailer.live_count == 0 and not gw.store._groups
    # The open transaction died with the connection.
    assert [e.type for e in await read(gw, "gone")] == ["kept"]
