"""Res01 end to end: real ZeroMQ sockets against a real gateway on PostgreSQL.

Slow storage is produced honestly: a test connection holds a row lock the
gateway needs (the log head for commits, a subscription row for fetches), so
the gateway's own queries wait in PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import zmq
import zmq.asyncio

from polyport.core.commands import ReadStream
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig
from polyport.protocols.res01 import (
    AppendCommit,
    CommitResult,
    Error,
    ErrorCode,
    EventsFetched,
    FetchEntry,
    FetchEvents,
    decode_response,
    encode_request,
)
from polyport.protocols.res01.adapter import subscription_name
from polyport.protocols.res01.client import Res01Client, Res01ServerError, new_event
from polyport.protocols.res01.limits import Limits
from polyport.protocols.res01.values import encode_datetime
from tests.pg import HEAD_LOCK, SUBSCRIPTION_LOCK, row_locked

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2000, 1, 1, tzinfo=UTC)
ONLY_RES01: dict[str, Any] = {
    **{f"{n}_port": None for n in DEFAULT_PORTS if n != "res01"},
    "http_port": None,
}

GatewayFactory = Callable[..., Awaitable[Any]]


# Most tests act in contexts of their own, which anonymous may not use: they
# log in (ZAP PLAIN) as a user who may use every context.
USER, PASSWORD = "res01-tester", "res01-pw"


async def start_gateway(factory: GatewayFactory, **overrides: Any) -> Any:
    gw = await factory(**{**ONLY_RES01, "allow_anonymous": False, **overrides})
    await gw.store.users.add(USER, PASSWORD)
    return gw


def _login(gw: Any) -> dict[str, str]:
    """PLAIN credentials for the main port, unless it is anonymous NULL."""
    if gw.config.allow_anonymous:
        return {}
    return {"plain_username": USER, "plain_password": PASSWORD}


async def connect(gw: Any, **kw: Any) -> Res01Client:
    return await Res01Client.connect(
        gw.listeners["res01"].address, timeout=10, **{**_login(gw), **kw}
    )


@contextlib.asynccontextmanager
async def raw_dealer(
    gw: Any, address: tuple[str, int] | None = None, *, user: str | None = None,
    password: str = "",
) -> AsyncIterator[zmq.asyncio.Socket]:
    """A bare DEALER for messages the client would never build; logged in
    like :func:`connect` unless ``user`` names someone else."""
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    login = _login(gw)
    if user is not None:
        login = {"plain_username": user, "plain_password": password}
    if login:
        sock.plain_username = login["plain_username"].encode()
        sock.plain_password = login["plain_password"].encode()
    host, port = address or gw.listeners["res01"].address
    sock.connect(f"tcp://{host}:{port}")
    try:
        yield sock
    finally:
        sock.close(linger=0)


async def exchange(sock: zmq.asyncio.Socket, frames: list[bytes]) -> list[bytes]:
    await sock.send_multipart(frames)
    return list(await asyncio.wait_for(sock.recv_multipart(), 10))




def stream_name(prefix: str = "orders-") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


# --- acceptance 2: commit → subscribe → fetch → progress → fetch next, across a restart ---


async def test_commit_subscribe_fetch_progress_across_restart(gateway_factory) -> None:
    gw1 = await start_gateway(gateway_factory)
    client = await connect(gw1)
    ctx = f"ctx-{uuid.uuid4().hex[:6]}"
    stream = stream_name()
    events = [
        new_event("Placed", '{"n": 1}', '{"user": "ann", "n": 7}'),
        new_event("Paid", '{"n": 2}'),
        new_event("Note", "plain text, not JSON", "free-form header text"),
    ]
    first = await client.commit(ctx, stream, 1, events)
    more = [new_event("Shipped", '{"n": 4}'), new_event("Closed", '{"n": 5}', "")]
    second = await client.commit(ctx, stream, 4, more)
    assert isinstance(first, uuid.UUID) and isinstance(second, uuid.UUID) and first != second
    # Re-sending the same event ids is an idempotent success, nothing written twice.
    await client.commit(ctx, stream, -1, more)
    # An event in another context or outside the filter is not delivered.
    await client.commit("other-ctx", stream, -1, [new_event("X", "{}")])
    await client.commit(ctx, "invoices-1", -1, [new_event("X", "{}")])

    [sub_id] = await client.subscribe("sub-A", [(ctx, "orders-", T0)])
    assert await client.subscribe("sub-A", [(ctx, "orders-", T0)]) == [sub_id]  # idempotent
    other_ids = await client.subscribe("sub-B", [(ctx, "orders-", T0), (ctx, "*", T0)])
    assert len(set(other_ids) | {sub_id}) == 3

    [batch] = await client.fetch([(sub_id, 2)])
    assert batch.subscription_id == sub_id
    assert [e.type for e in batch.events] == ["Placed", "Paid"]
    e1 = batch.events[0]
    assert (e1.event_id, e1.stream, e1.context, e1.sequence) == (
        events[0].event_id, stream, ctx, 1
    )
    assert e1.body == '{"n": 1}'
    # Non-string header values become their JSON text; key order is not kept.
    assert json.loads(e1.headers) == {"user": "ann", "n": "7"}
    assert e1.timestamp.tzinfo is not None and e1.timestamp < batch.events[1].timestamp
    # FE again without PS: the same batch.
    [again] = await client.fetch([(sub_id, 2)])
    assert again.events == batch.events

    # PS with a time that is not the batch's: nothing moves, still echoed.
    assert await client.progress([(sub_id, T0)]) == [sub_id]
    [again] = await client.fetch([(sub_id, 2)])
    assert again.events == batch.events
    last = batch.events[-1].timestamp
    assert await client.progress([(sub_id, last)]) == [sub_id]
    assert await client.progress([(sub_id, last)]) == [sub_id]  # idempotent

    [batch2] = await client.fetch([(sub_id, 2)])
    assert [e.type for e in batch2.events] == ["Note", "Shipped"]
    assert batch2.events[0].headers == "free-form header text"
    assert batch2.events[0].body == "plain text, not JSON"
    assert await client.progress([(sub_id, batch2.events[-1].timestamp)]) == [sub_id]
    [batch3] = await client.fetch([(sub_id, 10)])
    assert [e.type for e in batch3.events] == ["Closed"]  # fetched, not progressed
    assert batch3.events[0].headers == "{}"
    await client.close()
    await gw1.stop()

    # A new gateway on the same database: the subscription and bookmark survive.
    gw2 = await start_gateway(gateway_factory)
    client = await connect(gw2)
    assert await client.subscribe("sub-A", [(ctx, "orders-", T0)]) == [sub_id]
    [after] = await client.fetch([(sub_id, 10)])
    assert after.events == batch3.events
    assert await client.progress([(sub_id, after.events[-1].timestamp)]) == [sub_id]
    [empty] = await client.fetch([(sub_id, 10)])
    assert empty.events == ()
    await client.commit(ctx, stream, 6, [new_event("Reopened", '{"n": 6}')])
    [tail] = await client.fetch([(sub_id, 10)])
    assert [(e.type, e.sequence) for e in tail.events] == [("Reopened", 6)]

    # FE for several subscriptions: one EF each, in request order.
    b1, b2 = await client.fetch([(other_ids[1], 100), (other_ids[0], 1)])
    assert (b1.subscription_id, b2.subscription_id) == (other_ids[1], other_ids[0])
    assert [e.type for e in b1.events] == [
        "Placed", "Paid", "Note", "Shipped", "Closed", "X", "Reopened"
    ]
    assert [e.type for e in b2.events] == ["Placed"]

    # SS moves a subscription back in time; "" and "*" are the same filter.
    results = await client.set_subscription(
        [("sub-A", ctx, "orders-", T0), ("sub-B", ctx, "", T0), ("nobody", ctx, "x", T0)]
    )
    assert results[:2] == ["", ""]
    assert "no subscription" in results[2]
    [rewound] = await client.fetch([(sub_id, 1)])
    assert [e.type for e in rewound.events] == ["Placed"]
    # SetTo a time after everything: nothing left.
    later = datetime.now(UTC) + timedelta(minutes=1)
    assert await client.set_subscription([("sub-A", ctx, "orders-", later)]) == [""]
    [none] = await client.fetch([(sub_id, 1)])
    assert none.events == ()
    await client.close()


async def test_rc01_protocol_and_brokered_routing_are_echoed(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    req = AppendCommit(b"rid-\x00\xff", "ctx", stream_name(), -1, (new_event("T", "{}"),), "RC0.1")
    async with raw_dealer(gw) as sock:
        # A broker hop in front: the reply must carry it back.
        reply = await exchange(sock, [b"broker-7", *encode_request(req)])
        assert reply[:5] == [b"broker-7", b"", b"RC0.1", b"rid-\x00\xff", b"CR"]
        assert len(reply[5]) == 16
        response = decode_response(reply)
        assert isinstance(response, CommitResult) and response.protocol == "RC0.1"


# --- acceptance 3: bad input gets ER with the right code; others keep being served ---


def _ac_frames(rid: bytes, expected: bytes = b"-1", guid: bytes | None = None) -> list[bytes]:
    return [
        b"", b"Res01", b"AC", rid, b"ctx", b"bad-input", expected, b"1",
        guid if guid is not None else uuid.uuid4().bytes_le,
        encode_datetime(T0), b"T", b"{}", b"{}",
    ]


BAD_MESSAGES: list[tuple[str, list[bytes], int, bytes]] = [
    ("wrong frame count", [b"", b"Res01", b"FE", b"r1", b"2", b"1", b"10"], 1, b"r1"),
    ("trailing frame", [*_ac_frames(b"r2"), b"extra"], 1, b"r2"),
    ("non-numeric version", _ac_frames(b"r3", expected=b"abc"), 1, b"r3"),
    ("non-numeric count", [b"", b"Res01", b"FE", b"r4", b"one"], 1, b"r4"),
    ("number with plus sign", [b"", b"Res01", b"FE", b"r5", b"+1", b"1", b"1"], 1, b"r5"),
    ("bad GUID length", _ac_frames(b"r6", guid=b"\x01" * 15), 1, b"r6"),
    ("bad datetime", [b"", b"Res01", b"PS", b"r7", b"1", b"1", b"soon"], 1, b"r7"),
    ("unknown command", [b"", b"Res01", b"XX", b"r8", b"1"], 3, b"r8"),
    ("response command as request", [b"", b"Res01", b"CR", b"r9"], 3, b"r9"),
    ("unknown protocol", [b"", b"Res02", b"AC", b"r10"], 2, b"r10"),
    ("no request id", [b"", b"Res01", b"AC"], 1, b""),
    ("no delimiter", [b"Res01", b"AC", b"r11"], 1, b""),
    ("expected version 0", _ac_frames(b"r12", expected=b"0"), 1, b"r12"),
    ("NUL in stream", [*_ac_frames(b"r13")[:5], b"bad\x00stream", *_ac_frames(b"r13")[6:]],
     1, b"r13"),
    ("no events", [b"", b"Res01", b"AC", b"r14", b"ctx", b"s", b"-1", b"0"], 1, b"r14"),
    ("invalid UTF-8", [b"", b"Res01", b"RS", b"r15", b"\xff", b"0"], 1, b"r15"),
    ("unknown subscription", [b"", b"Res01", b"FE", b"r16", b"1", b"999999", b"5"], 8, b"r16"),
    ("unknown subscription PS", [b"", b"Res01", b"PS", b"r17", b"1", b"999999",
                                 encode_datetime(T0)], 8, b"r17"),
    ("suggested count 0", [b"", b"Res01", b"FE", b"r18", b"1", b"1", b"0"], 1, b"r18"),
    ("empty context", [b"", b"Res01", b"RS", b"r19", b"me", b"1", b"", b"*",
                       encode_datetime(T0)], 1, b"r19"),
]


async def test_bad_input_gets_er_while_another_client_is_served(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    good = await connect(gw)
    stream = stream_name()
    [sub_id] = await good.subscribe("good", [("ctx", stream, T0)])
    stop = asyncio.Event()
    served = 0

    async def keep_serving() -> None:
        # The well-behaved client commits and fetches the whole time.
        nonlocal served
        while not stop.is_set():
            served += 1
            await good.commit("ctx", stream, served, [new_event("Good", f'{{"n": {served}}}')])
            [batch] = await good.fetch([(sub_id, 1000)])
            assert len(batch.events) == served

    worker = asyncio.create_task(keep_serving())
    async with raw_dealer(gw) as bad:
        for label, frames, code, rid in BAD_MESSAGES:
            before = served
            reply = await exchange(bad, frames)
            response = decode_response(reply)
            assert isinstance(response, Error), label
            assert (response.code, response.request_id) == (code, rid), (label, response)
            assert response.message, label
            # The good client completes another round after every bad message.
            async with asyncio.timeout(10):
                while served <= before + 1:
                    assert not worker.done(), worker.exception()
                    await asyncio.sleep(0.005)
    # The concurrency error (6) on a good message.
    with pytest.raises(Res01ServerError) as info:
        await good.commit("ctx", stream, 1, [new_event("Late", "{}")])
    assert info.value.code == ErrorCode.CONCURRENCY
    stop.set()
    await asyncio.wait_for(worker, 10)
    assert served > len(BAD_MESSAGES)
    stats = gw.listeners["res01"].stats
    assert stats.errors["malformed"] >= 10 and stats.errors["unsupported"] >= 3
    await good.close()


# --- storage slow or saturated: codes 4, 5, 9, 10 ---------------------------------


async def test_replies_sent_while_the_receiver_waits_strand_no_request(gateway_factory) -> None:
    # Replies go out from commit callbacks straight through the socket, which
    # may take the descriptor's signal of a request that just arrived
    # (ZeroMQ's descriptor is edge-triggered; tests/gateway/test_zmq_readable.py
    # makes that happen on purpose).  Closed-loop clients would then wait
    # for a reply to a request the receive loop never woke up for.
    gw = await start_gateway(gateway_factory)
    clients = [await connect(gw) for _ in range(8)]
    stream = stream_name("closed-loop-")

    async def run(client: Res01Client, i: int) -> None:
        for _ in range(60):
            await client.commit("ctx", f"{stream}-{i}", -1, [new_event("T", "{}")])

    await asyncio.wait_for(asyncio.gather(*(run(c, i) for i, c in enumerate(clients))), 45)
    for client in clients:
        await client.close()


async def test_slow_commit_does_not_hold_up_a_fetch(gateway_factory, db_url: str) -> None:
    gw = await start_gateway(gateway_factory)
    writer, reader = await connect(gw), await connect(gw)
    stream = stream_name()
    await writer.commit("ctx", stream, 1, [new_event("First", "{}")])
    [sub_id] = await reader.subscribe("reader", [("ctx", stream, T0)])
    async with row_locked(db_url, HEAD_LOCK):
        commit = asyncio.create_task(writer.commit("ctx", stream, 2, [new_event("Second", "{}")]))
        await asyncio.sleep(0.3)
        assert not commit.done()  # waiting on the head lock
        [batch] = await asyncio.wait_for(reader.fetch([(sub_id, 10)]), 3)
        assert [e.type for e in batch.events] == ["First"]
    await asyncio.wait_for(commit, 10)  # lock released: the commit completes
    [batch] = await reader.fetch([(sub_id, 10)])
    assert [e.type for e in batch.events] == ["First", "Second"]
    await writer.close()
    await reader.close()


async def test_writer_busy_and_timeout(gateway_factory, db_url: str) -> None:
    # max_pending_events=1: the store's writer queue refuses a second waiting append;
    # commit_timeout: the core gives up waiting for the (blocked) commit.
    gw = await start_gateway(gateway_factory, max_pending_events=1, commit_timeout=1.0)
    client = await connect(gw)
    stream = stream_name()
    e1, e2 = new_event("One", "{}"), new_event("Two", "{}")
    async with row_locked(db_url, HEAD_LOCK):
        first = asyncio.create_task(client.commit("ctx", stream, 1, [e1]))
        await asyncio.sleep(0.2)  # the writer took it and waits on the lock
        second = asyncio.create_task(client.commit("ctx", stream, -1, [e2]))
        await asyncio.sleep(0.2)  # queued behind it
        with pytest.raises(Res01ServerError) as busy:
            await client.commit("ctx", stream, -1, [new_event("Three", "{}")])
        assert busy.value.code == ErrorCode.STORAGE_WRITER_BUSY
        for task in (first, second):
            with pytest.raises(Res01ServerError) as timeout:
                await task
            assert timeout.value.code == ErrorCode.STORAGE_WRITER_TIMEOUT
    # The outcome was unknown to the client; re-sending the same ids is safe.
    await asyncio.sleep(0.5)
    await client.commit("ctx", stream, -1, [e1])
    await client.commit("ctx", stream, -1, [e2])
    [sub_id] = await client.subscribe("check", [("ctx", stream, T0)])
    [batch] = await client.fetch([(sub_id, 10)])
    assert [e.type for e in batch.events] == ["One", "Two"]
    await client.close()


async def test_in_flight_limits_answer_busy(gateway_factory, db_url: str) -> None:
    gw = await start_gateway(
        gateway_factory, res01_max_in_flight_writes=1, res01_max_in_flight_reads=1
    )
    client = await connect(gw)
    stream = stream_name()
    await client.commit("ctx", stream, 1, [new_event("First", "{}")])
    [sub_id] = await client.subscribe("busy", [("ctx", stream, T0)])
    async with row_locked(db_url, HEAD_LOCK):
        slow = asyncio.create_task(client.commit("ctx", stream, 2, [new_event("Slow", "{}")]))
        await asyncio.sleep(0.2)
        with pytest.raises(Res01ServerError) as busy:
            await client.commit("ctx", stream, -1, [new_event("Refused", "{}")])
        assert busy.value.code == ErrorCode.STORAGE_WRITER_BUSY
        # Reads have their own budget: a fetch still goes through.
        [batch] = await client.fetch([(sub_id, 10)])
        assert [e.type for e in batch.events] == ["First"]
    await slow
    async with row_locked(db_url, SUBSCRIPTION_LOCK, sub_id):
        # The fetch blocks recording its batch on the locked subscription row.
        fetch = asyncio.create_task(client.fetch([(sub_id, 10)]))
        await asyncio.sleep(0.2)
        with pytest.raises(Res01ServerError) as busy:
            await client.fetch([(sub_id, 10)])
        assert busy.value.code == ErrorCode.STORAGE_READER_BUSY
        assert gw.listeners["res01"].in_flight == (0, 1)
    [batch] = await fetch
    assert [e.type for e in batch.events] == ["First", "Slow"]
    assert gw.listeners["res01"].stats.errors["busy"] == 2
    await client.close()


async def test_reader_timeout(gateway_factory, db_url: str) -> None:
    gw = await start_gateway(gateway_factory, read_timeout=0.5)
    client = await connect(gw)
    stream = stream_name()
    await client.commit("ctx", stream, 1, [new_event("First", "{}")])
    [sub_id] = await client.subscribe("slow", [("ctx", stream, T0)])
    async with row_locked(db_url, SUBSCRIPTION_LOCK, sub_id):
        with pytest.raises(Res01ServerError) as timeout:
            await client.fetch([(sub_id, 10)])
        assert timeout.value.code == ErrorCode.STORAGE_READER_TIMEOUT
    [batch] = await client.fetch([(sub_id, 10)])
    assert [e.type for e in batch.events] == ["First"]
    await client.close()


async def test_oversized_message_and_body(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory, max_event_bytes=1000)
    client = await connect(gw)
    with pytest.raises(Res01ServerError) as too_large:
        await client.commit("ctx", stream_name(), -1, [new_event("Big", "x" * 1500)])
    assert too_large.value.code == ErrorCode.MALFORMED
    # Many frames, each under the frame limit, adding up past the message limit.
    limit = gw.listeners["res01"].limits.max_request_bytes
    n = limit // 900 + 1
    events = [new_event("T", "y" * 900) for _ in range(n)]
    with pytest.raises(Res01ServerError) as too_large:
        await client.commit("ctx", stream_name(), -1, events)
    assert too_large.value.code == ErrorCode.MALFORMED
    assert "exceeds the limit" in too_large.value.message
    # Still serving.
    await client.commit("ctx", stream_name(), -1, [new_event("Small", "{}")])
    await client.close()


async def test_message_of_too_many_parts_is_refused_as_it_arrives(gateway_factory) -> None:
    # Every part is small (libzmq's MAXMSGSIZE is per part) and the whole is
    # under max_request_bytes: only the number of parts gives it away.
    gw = await start_gateway(gateway_factory, extra={"res01_max_message_parts": 100})
    stream = stream_name()
    events = tuple(new_event("T", "{}") for _ in range(1000))  # 5,000+ parts
    request = AppendCommit(b"many", "ctx", stream, -1, events)
    async with raw_dealer(gw) as raw:
        response = decode_response(await exchange(raw, encode_request(request)))
    assert isinstance(response, Error)
    assert (response.code, response.request_id) == (ErrorCode.MALFORMED, b"many")
    assert "parts exceeds the limit of 100 parts" in response.message
    assert gw.listeners["res01"].stats.errors["too_large"] == 1
    client = await connect(gw)
    # Expected version 1 (a new stream): the refused commit stored nothing.
    await client.commit("ctx", stream, 1, [new_event("Small", "{}")])
    await client.close()


async def test_fetch_entries_share_one_request_id(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    client = await connect(gw)
    ctx = f"c-{uuid.uuid4().hex[:6]}"
    await client.commit(ctx, "a", -1, [new_event("A", "{}")])
    ids = await client.subscribe("multi", [(ctx, "a", T0), (ctx, "*", T0)])
    async with raw_dealer(gw) as sock:
        req = FetchEvents(b"fe-1", tuple(FetchEntry(i, 5) for i in ids))
        await sock.send_multipart(encode_request(req))
        replies = [decode_response(await asyncio.wait_for(sock.recv_multipart(), 5))
                   for _ in ids]
    assert all(isinstance(r, EventsFetched) and r.request_id == b"fe-1" for r in replies)
    assert [r.subscription_id for r in replies if isinstance(r, EventsFetched)] == ids
    await client.close()


async def test_duplicate_event_ids_in_one_commit_are_refused(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    client = await connect(gw)
    stream = stream_name()
    twice = new_event("Twice", "{}")
    with pytest.raises(Res01ServerError) as info:
        await client.commit("ctx", stream, 1, [twice, twice])
    assert info.value.code == ErrorCode.MALFORMED
    await client.commit("ctx", stream, 1, [twice])
    await client.close()


async def test_fetch_batches_are_bounded_in_bytes(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory, extra={"res01_max_fetch_bytes": 2500})
    client = await connect(gw)
    stream = stream_name()
    await client.commit("ctx", stream, 1, [new_event(f"E{i}", "x" * 1000) for i in range(5)])
    [sub_id] = await client.subscribe("bounded", [("ctx", stream, T0)])
    seen: list[str] = []
    for _ in range(2):
        [batch] = await client.fetch([(sub_id, 100)])
        assert len(batch.events) == 2  # a third body of 1000 bytes would not fit 2500
        seen += [e.type for e in batch.events]
        assert await client.progress([(sub_id, batch.events[-1].timestamp)]) == [sub_id]
    [last] = await client.fetch([(sub_id, 100)])
    assert seen + [e.type for e in last.events] == ["E0", "E1", "E2", "E3", "E4"]
    await client.close()


async def test_client_gone_before_its_reply(gateway_factory, db_url: str) -> None:
    gw = await start_gateway(gateway_factory)
    stream = stream_name()
    listener = gw.listeners["res01"]
    async with row_locked(db_url, HEAD_LOCK), raw_dealer(gw) as sock:
        req = AppendCommit(b"gone", "ctx", stream, 1, (new_event("Orphan", "{}"),))
        await sock.send_multipart(encode_request(req))
        # The login and the request reached the server (a PLAIN
        # handshake may take a while on a busy machine).
        for _ in range(1000):
            if listener.in_flight == (1, 0):
                break
            await asyncio.sleep(0.01)
        assert listener.in_flight == (1, 0)
        # The socket is closed; the commit completes after the lock and its
        # reply has nowhere to go.
    for _ in range(500):  # the task finishes once the reply found no peer
        if listener.in_flight == (0, 0):
            break
        await asyncio.sleep(0.02)
    assert listener.in_flight == (0, 0)
    assert listener.conn.in_flight() == 0 and listener.conn.peers == frozenset()
    client = await connect(gw)
    await client.commit("ctx", stream, 2, [new_event("Next", "{}")])  # the orphan was stored
    assert listener.stats.frames_in >= 2
    await client.close()


# --- authentication: ZAP PLAIN, the login port, contexts ------------------------

HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


@contextlib.asynccontextmanager
async def watched_dealer(
    address: tuple[str, int], user: str | None = None, password: str = ""
) -> AsyncIterator[tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]]:
    """A DEALER (PLAIN when ``user`` is given, else NULL) and its monitor,
    watching from before it connects."""
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if user is not None:
        sock.plain_username = user.encode()
        sock.plain_password = password.encode()
    monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
    sock.connect(f"tcp://{address[0]}:{address[1]}")
    try:
        yield sock, monitor
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


async def handshake(monitor: zmq.asyncio.Socket) -> dict[str, Any]:
    """The first handshake outcome the client saw."""
    from zmq.utils.monitor import parse_monitor_message

    return parse_monitor_message(await asyncio.wait_for(monitor.recv_multipart(), 10))


async def nothing_through(sock: zmq.asyncio.Socket, frames: list[bytes]) -> bool:
    """Send ``frames`` and see that no reply comes.  A DEALER whose handshake
    failed has no peer, so its send may not even complete."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(sock.send_multipart(frames), 0.5)
    try:
        await asyncio.wait_for(sock.recv_multipart(), 0.5)
    except TimeoutError:
        return True
    return False


def _commit_frames(ctx: str, rid: bytes = b"auth-1") -> list[bytes]:
    return encode_request(
        AppendCommit(rid, ctx, stream_name(), -1, (new_event("T", "{}"),))
    )


async def test_null_client_gets_nothing_through_when_anonymous_is_off(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)  # allow_anonymous=False: the port is PLAIN
    stats = gw.listeners["res01"].stats
    assert gw.listeners["res01"].mechanisms == ("PLAIN",)
    async with watched_dealer(gw.listeners["res01"].address) as (sock, monitor):
        outcome = await handshake(monitor)
        assert outcome["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert await nothing_through(sock, _commit_frames("default"))
    assert stats.frames_in == 0


async def test_plain_login_acts_in_the_users_contexts(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    await gw.store.users.add("ann", "ann-pw", default_context="ann-a", contexts=["ann-a", "ann-b"])
    client = await connect(gw, plain_username="ann", plain_password="ann-pw")
    stream = stream_name()
    await client.commit("ann-b", stream, 1, [new_event("Mine", "{}")])
    stored = await gw.store.read_stream(ReadStream("ann-b", stream))
    assert [e.type for e in stored] == ["Mine"]
    with pytest.raises(Res01ServerError) as info:
        await client.commit("someone-else", stream, -1, [new_event("Not mine", "{}")])
    assert info.value.code == ErrorCode.FORBIDDEN == 12
    assert "may not use context 'someone-else'" in info.value.message
    with pytest.raises(Res01ServerError) as info:
        await client.subscribe("ann-sub", [("ann-a", "*", T0), ("someone-else", "*", T0)])
    assert info.value.code == ErrorCode.FORBIDDEN
    # Refused as a whole: the allowed definition was not created either.
    name = subscription_name("ann-sub", "ann-a", "*")
    assert await gw.store.subscription_id("ann-a", name) is None
    await client.close()
    assert gw.listeners["res01"].stats.errors["forbidden"] == 2


async def test_wrong_password_is_refused_at_the_handshake(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    stats = gw.listeners["res01"].stats
    # (libzmq itself refuses an empty PLAIN user name on the client.)
    for user, password in ((USER, "wrong"), ("nobody", PASSWORD)):
        async with watched_dealer(gw.listeners["res01"].address, user, password) as (sock, mon):
            outcome = await handshake(mon)
            assert outcome["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH, (user, outcome)
            assert outcome["value"] == 400  # the ZAP status code
            assert await nothing_through(sock, _commit_frames("default"))
    assert stats.frames_in == 0
    assert stats.errors["unauthenticated"] == 2
    # The right password on the same port works.
    async with watched_dealer(gw.listeners["res01"].address, USER, PASSWORD) as (sock, mon):
        assert (await handshake(mon))["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
        reply = await exchange(sock, _commit_frames("anywhere"))
        assert isinstance(decode_response(reply), CommitResult)


async def test_login_port_serves_plain_beside_anonymous_null(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory, allow_anonymous=True, res01_login_port=0)
    listener = gw.listeners["res01"]
    assert listener.mechanisms == ("NULL", "PLAIN")
    assert listener.login_address is not None and listener.login_address != listener.address
    await gw.store.users.add("bob", "bob-pw", default_context="bob", contexts=["bob"])
    # Anonymous on the main port: only the anonymous contexts ("default").
    anon = await connect(gw)
    await anon.commit("default", stream_name(), -1, [new_event("Anon", "{}")])
    with pytest.raises(Res01ServerError) as info:
        await anon.commit("bob", stream_name(), -1, [new_event("Anon", "{}")])
    assert info.value.code == ErrorCode.FORBIDDEN
    assert "anonymous may not use context 'bob'" in info.value.message
    # Bob on the login port: his context, not anonymous's.
    bob = await Res01Client.connect(
        listener.login_address, timeout=10, plain_username="bob", plain_password="bob-pw"
    )
    await bob.commit("bob", stream_name(), -1, [new_event("Bob", "{}")])
    with pytest.raises(Res01ServerError) as info:
        await bob.commit("default", stream_name(), -1, [new_event("Bob", "{}")])
    assert info.value.code == ErrorCode.FORBIDDEN
    # NULL on the login port, PLAIN on the NULL port: no handshake either way.
    async with watched_dealer(listener.login_address) as (sock, mon):
        assert (await handshake(mon))["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert await nothing_through(sock, _commit_frames("default"))
    async with watched_dealer(listener.address, "bob", "bob-pw") as (sock, mon):
        assert (await handshake(mon))["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
    await anon.close()
    await bob.close()


async def test_another_tenants_subscription_ids_are_forbidden(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    users = gw.store.users
    await users.add("carol", "c-pw", default_context="carol", contexts=["carol"])
    await users.add("dave", "d-pw", default_context="dave", contexts=["dave"])
    carol = await connect(gw, plain_username="carol", plain_password="c-pw")
    dave = await connect(gw, plain_username="dave", plain_password="d-pw")
    await carol.commit("carol", "secret-1", 1, [new_event("Secret", '{"pin": 1234}')])
    [carol_sub] = await carol.subscribe("shared-name", [("carol", "*", T0)])
    [dave_sub] = await dave.subscribe("shared-name", [("dave", "*", T0)])
    assert carol_sub != dave_sub
    # Dave names Carol's context or her subscription id: forbidden, code 12.
    attempts: list[Callable[[], Awaitable[Any]]] = [
        lambda: dave.subscribe("shared-name", [("carol", "*", T0)]),
        lambda: dave.fetch([(carol_sub, 10)]),
        lambda: dave.fetch([(dave_sub, 10), (carol_sub, 10)]),
        lambda: dave.progress([(carol_sub, T0)]),
    ]
    for attempt in attempts:
        with pytest.raises(Res01ServerError) as info:
            await attempt()
        assert info.value.code == ErrorCode.FORBIDDEN
    # SS is answered per entry (ST): the refusal is that entry's text.
    [result] = await dave.set_subscription([("shared-name", "carol", "*", T0)])
    assert "may not use context 'carol'" in result
    # Carol's subscription did not move, and is hers to read.
    [batch] = await carol.fetch([(carol_sub, 10)])
    assert [e.type for e in batch.events] == ["Secret"]
    await carol.close()
    await dave.close()


async def test_a_removed_user_is_unauthenticated(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    await gw.store.users.add("erin", "e-pw")
    async with watched_dealer(gw.listeners["res01"].address, "erin", "e-pw") as (sock, mon):
        assert (await handshake(mon))["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
        await gw.store.users.remove("erin")
        # The connection was logged in, but the user is gone: ER 11.
        response = decode_response(await exchange(sock, _commit_frames("default")))
        assert isinstance(response, Error)
        assert response.code == ErrorCode.UNAUTHENTICATED == 11


async def test_eleventh_rapid_failure_is_delayed(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    throttle = gw.store.users.throttle
    address = gw.listeners["res01"].address
    elapsed: list[float] = []
    for _ in range(throttle.free_failures + 1):
        started = asyncio.get_running_loop().time()
        async with watched_dealer(address, USER, "guess") as (_sock, mon):
            assert (await handshake(mon))["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        elapsed.append(asyncio.get_running_loop().time() - started)
    assert throttle.delayed_total == 1
    assert elapsed[-1] >= throttle.base_delay
    assert max(elapsed[:-1]) < throttle.base_delay


async def test_peers_are_bounded_and_a_forgotten_one_is_served_again(gateway_factory) -> None:
    # res01_max_peers 2: a third routing id pushes out the least recently
    # seen peer's state (its login), which is looked up again on its next
    # request rather than refused.
    gw = await start_gateway(gateway_factory, extra={"res01_max_peers": 2})
    listener = gw.listeners["res01"]
    clients = [await connect(gw) for _ in range(3)]
    try:
        stream = stream_name()
        for i, client in enumerate(clients):
            await client.commit("ctx", stream, i + 1, [new_event("T", "{}")])
        assert len(listener.peers) == 2 and listener.peers.forgotten >= 1
        await clients[0].commit("ctx", stream, 4, [new_event("T", "{}")])
    finally:
        for client in clients:
            await client.close()
    assert len(listener.peers) == 2


def test_the_gateways_defaults_are_the_listeners() -> None:
    # The gateway passes every key explicitly, so a default changed on one
    # side only (as Res01's in-flight writes once were) would be overridden.
    assert Limits.from_settings(Gateway(GatewayConfig()).settings) == Limits()


async def test_an_empty_fetch_is_held_until_a_commit(gateway_factory) -> None:
    """A one-subscription FE that finds nothing waits (res01_fetch_wait) and
    is answered as soon as a commit brings an event; an FE of several
    subscriptions, or with the wait used up, answers empty."""
    gw = await start_gateway(gateway_factory, res01_fetch_wait=5)
    assert gw.listeners["res01"].limits.fetch_wait == 5
    reader, writer = await connect(gw), await connect(gw)
    stream = stream_name()
    await writer.commit("ctx", stream, 1, [new_event("First", "{}")])
    [sub_id, other_id] = await reader.subscribe(
        "held", [("ctx", stream, T0), ("ctx", stream_name(), T0)]
    )
    [batch] = await reader.fetch([(sub_id, 10)])
    assert [e.type for e in batch.events] == ["First"]
    await reader.progress([(sub_id, batch.events[-1].timestamp)])
    loop = asyncio.get_running_loop()
    started = loop.time()
    held = asyncio.create_task(reader.fetch([(sub_id, 10)]))
    await asyncio.sleep(0.3)
    assert not held.done()
    await writer.commit("ctx", stream, 2, [new_event("Second", "{}")])
    [batch] = await asyncio.wait_for(held, 3)
    assert [e.type for e in batch.events] == ["Second"]
    assert loop.time() - started < 3
    # Two subscriptions in one FE: not held, both answered empty at once.
    await reader.progress([(sub_id, batch.events[-1].timestamp)])
    started = loop.time()
    a, b = await reader.fetch([(sub_id, 10), (other_id, 10)])
    assert (a.events, b.events) == ((), ())
    assert loop.time() - started < 2
    await reader.close()
    await writer.close()


async def test_fetch_wait_is_bounded_by_the_read_timeout() -> None:
    assert Limits.from_settings({"res01_fetch_wait": 100, "read_timeout": 4}).fetch_wait == 2
    assert Limits.from_settings({"res01_fetch_wait": -1}).fetch_wait == 0
    assert Limits.from_settings({}).fetch_wait == 0.5
