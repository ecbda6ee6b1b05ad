"""Res01 ⇄ the canonical core: bodies, content types and headers both ways
(design brief, "Bodies across protocols")."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import bson
import msgpack
import pytest

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.gateway.config import DEFAULT_PORTS
from polyport.protocols.res01.client import Res01Client, new_event

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2000, 1, 1, tzinfo=UTC)
ONLY_RES01: dict[str, Any] = {
    **{f"{n}_port": None for n in DEFAULT_PORTS if n != "res01"},
    "http_port": None,
}
# The context "interop" is not anonymous's: the clients log in (ZAP PLAIN) on
# the login port, beside the anonymous main port.
USER, PASSWORD = "interop-res01", "pw"


async def start_gateway(factory: Any) -> Any:
    gw = await factory(**ONLY_RES01, res01_login_port=0)
    await gw.store.users.add(USER, PASSWORD)
    return gw


async def connect(gw: Any) -> Res01Client:
    return await Res01Client.connect(
        gw.listeners["res01"].login_address, timeout=10,
        plain_username=USER, plain_password=PASSWORD,
    )


async def test_res01_commits_are_canonical_events(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    client = await connect(gw)
    ctx, stream = "interop", f"r-{uuid.uuid4().hex[:8]}"
    sent_at = datetime(2011, 1, 1, 4, 0, 15, 123456, tzinfo=UTC)
    events = [
        new_event("Json", '{"a": [1, 2], "ü": "x"}', '{"user": "ann", "n": 7, "o": {"k": 1}}',
                  timestamp=sent_at),
        new_event("Text", "hello, not json", "not a JSON object"),
        new_event("Scalar", "42", "[1, 2]"),
        new_event("Empty", "", ""),
    ]
    commit_id = await client.commit(ctx, stream, 1, events)
    stored = await gw.store.read_stream(ReadStream(ctx, stream))
    assert [e.event_id for e in stored] == [e.event_id for e in events]
    assert [e.version for e in stored] == [1, 2, 3, 4]
    assert all(e.origin == "res01" for e in stored)
    j, t, s, empty = stored
    assert (j.content_type, j.body) == ("application/json", '{"a": [1, 2], "ü": "x"}'.encode())
    assert dict(j.headers) == {"user": "ann", "n": "7", "o": '{"k":1}'}
    assert j.client_time == sent_at and j.type == "Json"
    assert (t.content_type, t.body) == ("text/plain", b"hello, not json")
    assert dict(t.headers) == {"res01.headers": "not a JSON object"}
    assert (s.content_type, dict(s.headers)) == ("application/json", {"res01.headers": "[1, 2]"})
    # An empty body is not JSON; empty headers text is no headers.
    assert (empty.content_type, empty.body, dict(empty.headers)) == ("text/plain", b"", {})
    assert isinstance(commit_id, uuid.UUID)

    # And back out over Res01: non-object headers text verbatim.
    [sub] = await client.subscribe("interop", [(ctx, stream, T0)])
    [batch] = await client.fetch([(sub, 10)])
    assert [e.headers for e in batch.events[1:]] == ["not a JSON object", "[1, 2]", "{}"]
    assert [e.body for e in batch.events] == [e.body for e in events]
    assert [e.timestamp for e in batch.events] == [e.recorded_at for e in stored]
    await client.close()


async def test_extreme_client_times(gateway_factory) -> None:
    # DateTime.MinValue / MaxValue must store, not fail the shared group commit.
    gw = await start_gateway(gateway_factory)
    client = await connect(gw)
    stream = f"t-{uuid.uuid4().hex[:8]}"
    lo = datetime(1, 1, 1, tzinfo=UTC)
    hi = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    await client.commit("interop", stream, 1, [new_event("Lo", "{}", timestamp=lo),
                                               new_event("Hi", "{}", timestamp=hi)])
    stored = await gw.store.read_stream(ReadStream("interop", stream))
    # asyncpg stores these two as -/+infinity and reads them back naive.
    assert [e.client_time and e.client_time.replace(tzinfo=UTC) for e in stored] == [lo, hi]
    await client.close()


async def test_core_events_of_every_content_type_come_out_as_text(gateway_factory) -> None:
    gw = await start_gateway(gateway_factory)
    ctx, stream = "interop", f"c-{uuid.uuid4().hex[:8]}"
    doc = {"name": "ann", "n": 7, "nested": {"ok": True}}
    oid = bson.ObjectId("64b7f0c2a1b2c3d4e5f60718")
    cases: list[tuple[str, bytes, str]] = [
        ("application/json", b'{"name": "ann",  "n": 7}', '{"name": "ann",  "n": 7}'),
        ("application/bson", bson.encode({**doc, "_id": oid}),
         json.dumps({**doc, "_id": {"$oid": str(oid)}})),
        ("application/msgpack", msgpack.packb(doc), json.dumps(doc)),
        ("text/plain", "plain ü text".encode(), "plain ü text"),
        ("application/octet-stream", b"\xff\x00\x01",
         json.dumps({"data": {"$binary": {"base64": "/wAB", "subType": "00"}}})),
    ]
    headers = {"source": "core", "trace-id": "abc"}
    await gw.store.append(
        Append(
            ctx,
            stream,
            tuple(EventData(ct, body, headers=headers, content_type=ct) for ct, body, _ in cases),
            origin="core",
        )
    )
    client = await connect(gw)
    [sub] = await client.subscribe("from-core", [(ctx, "*", T0)])
    [batch] = await client.fetch([(sub, 10)])
    assert [e.type for e in batch.events] == [ct for ct, _, _ in cases]
    for event, (ct, _, text) in zip(batch.events, cases, strict=True):
        assert json.loads(event.headers) == headers, ct
        if ct == "text/plain":
            assert event.body == text
        elif ct == "application/json":
            assert event.body == text  # JSON stays exactly as written
        else:
            assert json.loads(event.body) == json.loads(text), ct
        assert (event.stream, event.context) == (stream, ctx)
    assert [e.sequence for e in batch.events] == [1, 2, 3, 4, 5]
    await client.close()


async def test_an_fe_ps_loop_costs_one_statement_each(gateway_factory) -> None:
    """Through the Res01 port, once the gateway knows the subscription, each
    FE that finds events reads the row and records its batch in one
    statement, and each PS moves the checkpoint in one."""
    from polyport.core import sql

    gw = await start_gateway(gateway_factory)
    client = await connect(gw)
    ctx, stream = "interop", f"loop-{uuid.uuid4().hex[:8]}"
    [sub] = await client.subscribe("loop", [(ctx, stream, T0)])
    [first] = await client.fetch([(sub, 10)])
    assert first.events == ()
    names = {text: name for name, text in vars(sql).items()
             if name.isupper() and isinstance(text, str)}
    watched = {"FETCH_STATE", "FETCH_STATE_RECORDING", "RECORD_FETCH", "PROGRESS_FETCHED",
               "GET_SUBSCRIPTION_BY_ID"}
    sent: list[str] = []
    db = gw.store.db
    for method in ("fetch", "fetchrow", "fetchval", "execute"):
        real = getattr(db, method)

        async def counted(query, *args, _real=real):  # type: ignore[no-untyped-def]
            if names.get(query) in watched:
                sent.append(names[query])
            return await _real(query, *args)

        setattr(db, method, counted)
    for version in (1, 2, 3):
        await client.commit(ctx, stream, version, [new_event("T", "{}", "{}")])
        del sent[:]
        [batch] = await client.fetch([(sub, 10)])
        assert len(batch.events) == 1
        assert await client.progress([(sub, batch.events[-1].timestamp)]) == [sub]
        assert sent == ["FETCH_STATE_RECORDING", "PROGRESS_FETCHED"]
    stored = await gw.store.read_stream(ReadStream(ctx, stream))
    assert (await gw.store.get_fetch_subscription(sub)).checkpoint == stored[-1].position
    await client.close()
