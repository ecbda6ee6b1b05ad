"""The body matrix: every writer protocol × every reader protocol.

Design brief, "Bodies across protocols": "The full table is in docs/ and a test
covers every pair of protocols."  The table is ``docs/bodies.md``; this module
is that test.  One gateway serves the whole module.  Each reader test gives
every writer its own stream (``to-<reader>.from-<writer>``), has each writer
append two events in its native body form, and checks exactly what the
reader's own client gets, both live (subscribed before the writes) and on a
catch-up read.

Writers: Res01 (JSON text and plain text), BSON (documents), ReactiveSocket
over TCP and over WebSocket (a MessagePack map and opaque octets, with content
types and headers), RSocket 1.0 (JSON and opaque octets, with headers),
MicroMsg2 (a payload with ``json`` and one without), Segment wire (raw bytes).
The expected views in ``EXPECTED`` are literals, written from the brief's
rules, not computed by the code under test.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from ssl import SSLContext
from typing import Any

import bson
import msgpack
import pytest
from bson import DatetimeMS
from bson.binary import Binary
from bson.int64 import Int64
from bson.objectid import ObjectId

from polyport.core.commands import ReadStream
from polyport.core.events import RecordedEvent
from polyport.gateway.app import Gateway
from polyport.gateway.config import DEFAULT_PORTS, GatewayConfig, TlsOptions
from polyport.gateway.transports.curve import new_key_pair
from polyport.protocols.bson.client import BsonClient, ClientSubscription
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient
from polyport.protocols.reactivesocket.payloads import EventMap, StartAt
from polyport.protocols.res01.client import CurveClientKeys, Res01Client, new_event
from polyport.protocols.res01.frames import FetchedEvent
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import SegmentAppender, SegmentReader, SegmentWriter
from tests.conftest import create_database
from tests.tlspki import Pki

pytestmark = pytest.mark.timeout(60)

CTX = "matrix"
USER, PASSWORD = "mx", "pw"
WHEN = datetime(2014, 10, 13, 11, 0, tzinfo=UTC)
OID = ObjectId("64b7f0c2a1b2c3d4e5f60718")
T0 = datetime(2000, 1, 1, tzinfo=UTC)

WRITERS = ("res01", "bson", "rs-tcp", "rs-ws", "rsocket", "micromsg2", "segment")
ORIGIN = {
    "res01": "res01",
    "bson": "bson",
    "rs-tcp": "reactivesocket",
    "rs-ws": "reactivesocket",
    "rsocket": "rsocket",
    "micromsg2": "micromsg2",
    "segment": "segment",
}


def b64(data: bytes) -> dict[str, Any]:
    return {"$binary": {"base64": base64.b64encode(data).decode(), "subType": "00"}}


@dataclass(frozen=True)
class Expect:
    """What each kind of reader gets for one written event."""

    type: str
    content_type: str
    body: bytes  # stored bytes: ReactiveSocket, segment reads, MicroMsg2 without json
    headers: dict[str, str]  # canonical headers: ReactiveSocket
    document: dict[str, Any]  # BSON RECEV `event`
    text: str | None  # text consumers, exactly (JSON as written, text as is) ...
    text_json: Any = None  # ... or, when text is None, this JSON value (Extended JSON)
    res01_headers: str | dict[str, str] = "{}"  # exact text, or a JSON object (key order free)
    properties: dict[str, Any] = field(default_factory=dict)  # MicroMsg2 (with `type`)


BSON_DOC_0: dict[str, Any] = {
    "sku": "B2",
    "qty": 3,
    "when": datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=UTC),
    "oid": OID,
    "tags": ["a", "b"],
    "nested": {"ok": True, "none": None},
}
# A date before year 1: BSON holds it, Python's datetime cannot.
ANCIENT = DatetimeMS(-62135596800001)
BSON_DOC_1: dict[str, Any] = {
    "big": Int64(1 << 40),
    "bin": Binary(b"\x00\xff"),
    "pi": 3.5,
    "ancient": ANCIENT,
}
RS_PACK = msgpack.packb({"sku": "C3", "qty": 4, "raw": b"\x00\x01"}, use_bin_type=True)
RS_OCTETS = b"\x00\xff\xfe rs octets"
SEG_BYTES = b"seg \x00\xff bytes"
RSO_JSON = b'{"sku":"E5","qty":6}'
RSO_OCTETS = b"\x01\xfe rso octets"


def _rs_expect(label: str) -> list[Expect]:
    return [
        Expect(
            f"RsPack-{label}",
            "application/msgpack",
            RS_PACK,
            {"trace-id": "rs-1", "count": "5"},
            {"sku": "C3", "qty": 4, "raw": b"\x00\x01"},
            None,
            {"sku": "C3", "qty": 4, "raw": b64(b"\x00\x01")},
            {"trace-id": "rs-1", "count": "5"},
            {"trace-id": "rs-1", "count": 5, "type": f"RsPack-{label}"},
        ),
        Expect(
            f"RsOctets-{label}",
            "application/octet-stream",
            RS_OCTETS,
            {"trace-id": "rs-2"},
            {"data": RS_OCTETS},
            None,
            {"data": b64(RS_OCTETS)},
            {"trace-id": "rs-2"},
            {"trace-id": "rs-2", "type": f"RsOctets-{label}"},
        ),
    ]


# The table of docs/bodies.md, one row per written event.
EXPECTED: dict[str, list[Expect]] = {
    "res01": [
        Expect(
            "ResJson",
            "application/json",
            '{"sku": "A1",  "qty": 2, "ü": true}'.encode(),
            {"user": "ann", "n": "7"},
            {"sku": "A1", "qty": 2, "ü": True},
            '{"sku": "A1",  "qty": 2, "ü": true}',
            res01_headers={"user": "ann", "n": "7"},
            properties={"user": "ann", "n": 7, "type": "ResJson"},
        ),
        Expect(
            "ResText",
            "text/plain",
            "hello, not JSON: ü".encode(),
            {"res01.headers": "plain header text"},
            {"data": "hello, not JSON: ü"},
            "hello, not JSON: ü",
            res01_headers="plain header text",
            properties={"res01.headers": "plain header text", "type": "ResText"},
        ),
    ],
    "bson": [
        Expect(
            "BsonDoc",
            "application/bson",
            bson.encode(BSON_DOC_0),
            {},
            BSON_DOC_0,
            None,
            {
                "sku": "B2",
                "qty": 3,
                "when": {"$date": "2024-05-01T12:30:15.123Z"},
                "oid": {"$oid": str(OID)},
                "tags": ["a", "b"],
                "nested": {"ok": True, "none": None},
            },
            properties={"type": "BsonDoc"},
        ),
        Expect(
            "BsonTypes",
            "application/bson",
            bson.encode(BSON_DOC_1),
            {},
            {"big": 1 << 40, "bin": b"\x00\xff", "pi": 3.5, "ancient": ANCIENT},
            None,
            {
                "big": 1 << 40,
                "bin": b64(b"\x00\xff"),
                "pi": 3.5,
                "ancient": {"$date": {"$numberLong": "-62135596800001"}},
            },
            properties={"type": "BsonTypes"},
        ),
    ],
    "rs-tcp": _rs_expect("tcp"),
    "rs-ws": _rs_expect("ws"),
    "rsocket": [
        Expect(
            "RsoJson",
            "application/json",
            RSO_JSON,
            {"trace-id": "rso-1"},
            {"sku": "E5", "qty": 6},
            '{"sku":"E5","qty":6}',
            res01_headers={"trace-id": "rso-1"},
            properties={"trace-id": "rso-1", "type": "RsoJson"},
        ),
        Expect(
            "RsoOctets",
            "application/octet-stream",
            RSO_OCTETS,
            {"n": "3"},
            {"data": RSO_OCTETS},
            None,
            {"data": b64(RSO_OCTETS)},
            res01_headers={"n": "3"},
            properties={"n": 3, "type": "RsoOctets"},
        ),
    ],
    "micromsg2": [
        Expect(
            "MmJson",
            "application/json",
            b'{"sku": "D4", "qty": 5}',
            {"amount": "42", "at": "2014-10-13T11:00:00Z", "note": "007"},
            {"sku": "D4", "qty": 5},
            '{"sku": "D4", "qty": 5}',
            res01_headers={"amount": "42", "at": "2014-10-13T11:00:00Z", "note": "007"},
            properties={"amount": 42, "at": WHEN, "note": "007", "type": "MmJson"},
        ),
        # Without the json extension a payload is opaque, even when it parses.
        Expect(
            "MmRaw",
            "application/octet-stream",
            b'{"sku": "D5"}',
            {"k": "v"},
            {"data": '{"sku": "D5"}'},
            '{"sku": "D5"}',
            res01_headers={"k": "v"},
            properties={"k": "v", "type": "MmRaw"},
        ),
    ],
    "segment": [
        Expect(
            "segment-event",
            "application/octet-stream",
            SEG_BYTES,
            {},
            {"data": SEG_BYTES},
            None,
            {"data": b64(SEG_BYTES)},
            properties={"type": "segment-event"},
        ),
        Expect(
            "segment-event",
            "application/octet-stream",
            "сегмент text".encode(),
            {},
            {"data": "сегмент text"},
            "сегмент text",
            properties={"type": "segment-event"},
        ),
    ],
}


def framed(body: bytes) -> bytes:
    return struct.pack(">iI", 0, len(body)) + body


def stream_name(reader: str, writer: str) -> str:
    return f"to-{reader}.from-{writer}"


@dataclass(frozen=True)
class Transport:
    """How the clients connect: plain, or TLS (``ssl``) and CURVE (Res01)."""

    ssl: SSLContext | None = None
    curve: CurveClientKeys | None = None

    @property
    def ws(self) -> str:
        return "wss" if self.ssl is not None else "ws"


# --- the writers ------------------------------------------------------------------------


class Writers:
    """One client per writer protocol, shared by the module's tests."""

    def __init__(self, gw: Gateway, t: Transport) -> None:
        self.gw = gw
        self.t = t
        self.sent_ids: dict[str, list[uuid.UUID]] = {}
        self._versions: dict[str, int] = {}
        self._appenders: dict[str, SegmentAppender] = {}

    async def open(self) -> None:
        gw, t = self.gw, self.t
        self.res01 = await res01_client(gw, t)
        self.bson = await BsonClient.connect(
            *gw.listeners["bson"].address, username=USER, password=PASSWORD, ssl=t.ssl
        )
        host, port = gw.listeners["reactivesocket"].address
        self.rs_tcp = await ReactiveSocketClient.connect(
            host, port, user=USER, password=PASSWORD, context=CTX, ssl=t.ssl
        )
        assert gw.http_address is not None
        h, p = gw.http_address
        self.rs_ws = await ReactiveSocketClient.connect_websocket(
            f"{t.ws}://{h}:{p}/reactivesocket", user=USER, password=PASSWORD, context=CTX,
            ssl=t.ssl,
        )
        mm_host, mm_port = gw.listeners["micromsg2"].address
        self.mm_json = await MicroMsg2Client.connect(
            mm_host, mm_port, user=USER, password=PASSWORD, required=["json", "ack"], ssl=t.ssl
        )
        self.mm_raw = await MicroMsg2Client.connect(
            mm_host, mm_port, user=USER, password=PASSWORD, required=["ack"], ssl=t.ssl
        )
        assert self.mm_json.negotiated.has("json") and not self.mm_raw.negotiated.has("json")
        self.segment = await SegmentWriter.connect(
            *gw.listeners["segment"].address, ssl=t.ssl, credentials=f"{USER}:{PASSWORD}"
        )
        self.rso = await RSocketClient.connect(
            *gw.listeners["rsocket"].address, user=USER, password=PASSWORD, data_format="json",
            ssl=t.ssl,
        )

    async def close(self) -> None:
        for name in ("res01", "bson", "rs_tcp", "rs_ws", "rso", "mm_json", "mm_raw", "segment"):
            client = getattr(self, name, None)  # open() may have stopped half-way
            if client is not None:
                await client.close()

    async def write(self, writer: str, stream: str, which: slice = slice(None)) -> None:
        """Append events ``which`` of the writer's two, in its native form, and
        return once they are committed."""
        for i in range(2)[which]:
            await self._write_one(writer, stream, i)

    async def _write_one(self, writer: str, stream: str, i: int) -> None:
        version = self._versions.get(stream, 0)
        ids = self.sent_ids.setdefault(stream, [])
        if writer == "res01":
            ev = [
                new_event("ResJson", '{"sku": "A1",  "qty": 2, "ü": true}',
                          '{"user": "ann", "n": 7}'),
                new_event("ResText", "hello, not JSON: ü", "plain header text"),
            ][i]
            # ExpectedVersion: the version the event gets (1 = a new stream).
            await self.res01.commit(CTX, stream, version + 1, [ev])
            ids.append(ev.event_id)
        elif writer == "bson":
            await self.bson.emit(stream, ["BsonDoc", "BsonTypes"][i], [BSON_DOC_0, BSON_DOC_1][i])
        elif writer in ("rs-tcp", "rs-ws"):
            client = self.rs_tcp if writer == "rs-tcp" else self.rs_ws
            label = writer[3:]
            event_id = uuid.uuid4()
            rs_ev = [
                NewEvent(f"RsPack-{label}", RS_PACK, {"trace-id": "rs-1", "count": "5"},
                         "application/msgpack", event_id),
                NewEvent(f"RsOctets-{label}", RS_OCTETS, {"trace-id": "rs-2"},
                         "application/octet-stream", event_id),
            ][i]
            result = await client.append(stream, [rs_ev], expected_version=version)
            assert (result.first_version, result.last_version) == (version + 1, version + 1)
            ids.append(event_id)
        elif writer == "rsocket":
            event_id = uuid.uuid4()
            rso_ev = [
                NewEvent("RsoJson", RSO_JSON, {"trace-id": "rso-1"}, "application/json", event_id),
                NewEvent("RsoOctets", RSO_OCTETS, {"n": "3"}, "application/octet-stream",
                         event_id),
            ][i]
            got = await self.rso.append(stream, [rso_ev], expected_version=version)
            assert (got.first_version, got.last_version) == (version + 1, version + 1)
            ids.append(event_id)
        elif writer == "micromsg2":
            if i == 0:
                await self.mm_json.publish(
                    f"topic/{stream}",
                    '{"sku": "D4", "qty": 5}',
                    {"type": "MmJson", "amount": 42, "at": WHEN, "note": "007"},
                )
                await self.mm_json.flush(timeout=10)
            else:
                await self.mm_raw.publish(f"queue/{stream}", b'{"sku": "D5"}',
                                          {"type": "MmRaw", "k": "v"})
                await self.mm_raw.flush(timeout=10)
        elif writer == "segment":
            appender = self._appenders.get(stream)
            if appender is None:
                appender = await self.segment.open_segment(f"{CTX}/{stream}")
                self._appenders[stream] = appender
            await appender.append([[SEG_BYTES, "сегмент text".encode()][i]])
            await appender.flush(10)
        else:  # pragma: no cover
            raise AssertionError(writer)
        self._versions[stream] = version + 1


async def res01_client(gw: Gateway, t: Any) -> Res01Client:
    """Res01 logs in: with CURVE (the TLS run) on the main port by its key,
    else with PLAIN on the login port (the main port is anonymous)."""
    if t.curve is not None:
        return await Res01Client.connect(gw.listeners["res01"].address, timeout=10,
                                         curve=t.curve)
    listener = gw.listeners["res01"]
    return await Res01Client.connect(listener.login_address,  # type: ignore[attr-defined]
                                     timeout=10, plain_username=USER, plain_password=PASSWORD)


@dataclass
class World:
    gw: Gateway
    writers: Writers
    t: Transport

    async def write_all(self, reader: str, which: slice = slice(None)) -> None:
        for writer in WRITERS:
            await self.writers.write(writer, stream_name(reader, writer), which)

    async def stored(self, reader: str, writer: str) -> list[RecordedEvent]:
        """The events of a pair's stream as the core holds them, checked against
        what was sent; the reference for server-assigned fields (ids, positions,
        times)."""
        stream = stream_name(reader, writer)
        events = await self.gw.store.read_stream(ReadStream(CTX, stream))
        expected = EXPECTED[writer]
        assert [(e.type, e.content_type, e.body, dict(e.headers)) for e in events] == [
            (x.type, x.content_type, x.body, x.headers) for x in expected
        ], (reader, writer)
        assert [e.version for e in events] == [1, 2]
        assert all(e.origin == ORIGIN[writer] and e.context == CTX for e in events)
        if writer in self.writers.sent_ids and self.writers.sent_ids[stream]:
            assert [e.event_id for e in events] == self.writers.sent_ids[stream]
        return events

    async def wait_open_subscriptions(self, count: int) -> None:
        for _ in range(500):
            if len(self.gw.store.open_subscriptions()) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} subscriptions not in place")


@pytest.fixture(scope="module", params=["plain", "tls"])
async def world(
    request: pytest.FixtureRequest,
    admin_url: str,
    template_url: str,
    pki: Pki,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[World]:
    """The whole matrix twice: plain, then every listener on TLS (HTTP too:
    wss://) and Res01 on CURVE, with the same clients."""
    db_url = await create_database(admin_url)
    tls = request.param == "tls"
    base = GatewayConfig(
        database_url=db_url,
        http_port=0,
        poll_interval=0.2,
        data_dir=str(tmp_path_factory.mktemp("matrix")),
        tls=TlsOptions(str(pki.cert), str(pki.key), str(pki.ca_file)) if tls else TlsOptions(),
        res01_curve=tls,
        **{f"{n}_port": 0 for n in DEFAULT_PORTS},  # type: ignore[arg-type]
        res01_login_port=0,
    )
    gw = Gateway(replace(base, extra={**base.extra, "segment_read_wait": 10}))
    await gw.start()
    t = Transport()
    try:
        await gw.store.users.add(USER, PASSWORD, default_context=CTX)
        if tls:
            keys = new_key_pair()
            await gw.store.users.add_curve_key(USER, keys.public)
            server = gw.listeners["res01"].curve.public_key  # type: ignore[attr-defined]
            # The client certificate names USER too: segment wire logs in with it.
            t = Transport(pki.client(USER), CurveClientKeys(server, keys.public, keys.secret))
    except BaseException:
        await gw.stop()
        raise
    writers = Writers(gw, t)
    try:
        await writers.open()
        yield World(gw, writers, t)
    finally:
        try:
            await writers.close()
        finally:
            await gw.stop()


# --- the readers ------------------------------------------------------------------------


def check_text(got: str, x: Expect, where: Any) -> None:
    if x.text is not None:
        assert got == x.text, where
    else:
        assert json.loads(got) == x.text_json, where


def check_res01_event(
    got: FetchedEvent, x: Expect, stored: RecordedEvent, stream: str, where: Any
) -> None:
    assert (got.event_id, got.stream, got.context, got.sequence, got.type) == (
        stored.event_id,
        stream,
        CTX,
        stored.version,
        x.type,
    ), where
    assert got.timestamp == stored.recorded_at, where
    check_text(got.body, x, where)
    if isinstance(x.res01_headers, str):
        assert got.headers == x.res01_headers, where
    else:
        assert json.loads(got.headers) == x.res01_headers, where


async def test_res01_reads_every_writer(world: World) -> None:
    async with await res01_client(world.gw, world.t) as c:
        # Live: RS registered (prefix filter) before anything is written.
        start = datetime.now(UTC) - timedelta(seconds=1)
        [live] = await c.subscribe("matrix-live", [(CTX, "to-res01.", start)])
        [empty] = await c.fetch([(live, 100)])
        assert empty.events == ()
        await world.write_all("res01")

        async def fetch_all(sub: int) -> list[FetchedEvent]:
            got: list[FetchedEvent] = []
            while True:
                [batch] = await c.fetch([(sub, 5)])
                if not batch.events:
                    return got
                got.extend(batch.events)
                await c.progress([(sub, batch.events[-1].timestamp)])

        live_events = await fetch_all(live)
        [catch_up] = await c.subscribe("matrix-catch-up", [(CTX, "to-res01.", T0)])
        caught_up = await fetch_all(catch_up)

    for got in (live_events, caught_up):
        assert len(got) == 2 * len(WRITERS)
        for w, writer in enumerate(WRITERS):
            stream = stream_name("res01", writer)
            stored = await world.stored("res01", writer)
            for i, x in enumerate(EXPECTED[writer]):
                check_res01_event(got[2 * w + i], x, stored[i], stream, (writer, i))


async def test_bson_reads_every_writer(world: World) -> None:
    async with await BsonClient.connect(
        *world.gw.listeners["bson"].address, username=USER, password=PASSWORD, ssl=world.t.ssl
    ) as c:
        live = {w: await c.subscribe(stream_name("bson", w)) for w in WRITERS}
        await world.write_all("bson")
        catch_up = {w: await c.subscribe(stream_name("bson", w), start_seq=0) for w in WRITERS}
        for subs in (live, catch_up):
            for writer, sub in subs.items():
                await check_bson(world, sub, writer)
        for sub in live.values():
            assert await sub.next(0.05) is None


async def check_bson(world: World, sub: ClientSubscription, writer: str) -> None:
    stored = await world.stored("bson", writer)
    for i, x in enumerate(EXPECTED[writer]):
        got = await sub.next(5)
        assert got is not None, (writer, i)
        assert (got.stream_name, got.event_type, got.seq_no) == (
            stream_name("bson", writer),
            x.type,
            i,
        ), (writer, i)
        assert got.timestamp == stored[i].recorded_at_ms, (writer, i)
        assert got.event == x.document, (writer, i)
        # Documents come with their own types, not stringified.
        for key, value in x.document.items():
            assert type(got.event[key]) is type(value) or isinstance(value, int), (writer, key)


@pytest.mark.parametrize("transport", ["tcp", "websocket"])
async def test_reactivesocket_reads_every_writer(world: World, transport: str) -> None:
    reader = f"rs-{transport}"
    gw = world.gw
    if transport == "tcp":
        c = await ReactiveSocketClient.connect(
            *gw.listeners["reactivesocket"].address, user=USER, password=PASSWORD, context=CTX,
            ssl=world.t.ssl,
        )
    else:
        assert gw.http_address is not None
        h, p = gw.http_address
        c = await ReactiveSocketClient.connect_websocket(
            f"{world.t.ws}://{h}:{p}/reactivesocket", user=USER, password=PASSWORD, context=CTX,
            ssl=world.t.ssl,
        )
    try:
        # Live: one REQUEST_SUB over every writer's stream, in place before the writes.
        before = len(gw.store.open_subscriptions())
        live = await c.subscribe(prefix=f"to-{reader}.", start="end", initial_n=100)
        await world.wait_open_subscriptions(before + 1)
        await world.write_all(reader)
        live_events = [await live.next(5) for _ in range(2 * len(WRITERS))]
        assert await live.next(0.05) is None
        await live.cancel()
        # Catch-up: REQUEST_SUB from a position, read and REQUEST_STREAM per stream.
        first = (await world.stored(reader, WRITERS[0]))[0].position
        again = await c.subscribe(prefix=f"to-{reader}.", start=StartAt("position", first - 1))
        from_position = [await again.next(5) for _ in range(2 * len(WRITERS))]
        await again.cancel()
        reads = {w: await c.read(stream_name(reader, w)) for w in WRITERS}
        streams = {
            w: [e async for e in await c.read_stream(stream_name(reader, w))] for w in WRITERS
        }
    finally:
        await c.close()

    positions = [e.position for e in live_events if e is not None]
    assert positions == sorted(positions)
    for w, writer in enumerate(WRITERS):
        stored = await world.stored(reader, writer)
        for got in (
            live_events[2 * w : 2 * w + 2],
            from_position[2 * w : 2 * w + 2],
            reads[writer],
            streams[writer],
        ):
            assert len(got) == 2, writer
            for i, (x, e, s) in enumerate(zip(EXPECTED[writer], got, stored, strict=True)):
                assert e is not None
                check_rs_event(e, x, s, stream_name(reader, writer), (writer, i))


def check_rs_event(e: EventMap, x: Expect, s: RecordedEvent, stream: str, where: Any) -> None:
    assert (e.context, e.stream, e.type, e.content_type, e.body, dict(e.headers)) == (
        CTX,
        stream,
        x.type,
        x.content_type,
        x.body,
        x.headers,
    ), where
    assert (e.id, e.version, e.position, e.recorded_at) == (
        s.event_id,
        s.version,
        s.position,
        s.recorded_at_ms,
    ), where


@pytest.mark.parametrize(("transport", "fmt"), [("tcp", "msgpack"), ("websocket", "json")])
async def test_rsocket_reads_every_writer(world: World, transport: str, fmt: str) -> None:
    """RSocket 1.0 is a byte consumer like the draft: MessagePack event maps
    carry the stored bytes; JSON ones carry JSON bodies as JSON values and
    every other body as base64 (``body_encoding`` says which)."""
    reader = f"rsocket-{transport}"
    gw = world.gw
    if transport == "tcp":
        c = await RSocketClient.connect(
            *gw.listeners["rsocket"].address, user=USER, password=PASSWORD, data_format=fmt,
            ssl=world.t.ssl,
        )
    else:
        assert gw.http_address is not None
        h, p = gw.http_address
        c = await RSocketClient.connect_websocket(
            f"{world.t.ws}://{h}:{p}/rsocket", user=USER, password=PASSWORD, data_format=fmt,
            ssl=world.t.ssl,
        )
    try:
        before = len(gw.store.open_subscriptions())
        live = await c.subscribe(prefix=f"to-{reader}.", start="end", initial_n=100)
        await world.wait_open_subscriptions(before + 1)
        await world.write_all(reader)
        live_events = [await live.next(5) for _ in range(2 * len(WRITERS))]
        assert await live.next(0.05) is None
        await live.cancel()
        first = (await world.stored(reader, WRITERS[0]))[0].position
        again = await c.subscribe(prefix=f"to-{reader}.", start=StartAt("position", first - 1))
        from_position = [await again.next(5) for _ in range(2 * len(WRITERS))]
        await again.cancel()
        reads = {w: await c.read(stream_name(reader, w)) for w in WRITERS}
        streams = {
            w: [e async for e in await c.read_stream(stream_name(reader, w))] for w in WRITERS
        }
        # The JSON view as it travels (the client turns it back into bytes).
        raw = json.loads(await c.request_response(
            "events.read",
            json.dumps({"stream": stream_name(reader, "res01")}).encode(),
        )) if fmt == "json" else None
    finally:
        await c.close()

    positions = [e.position for e in live_events if e is not None]
    assert positions == sorted(positions)
    for w, writer in enumerate(WRITERS):
        stored = await world.stored(reader, writer)
        for got in (
            live_events[2 * w : 2 * w + 2],
            from_position[2 * w : 2 * w + 2],
            reads[writer],
            streams[writer],
        ):
            assert len(got) == 2, writer
            for i, (x, e, s) in enumerate(zip(EXPECTED[writer], got, stored, strict=True)):
                assert e is not None
                compared = e
                if fmt == "json" and e.content_type == "application/json":
                    # Sent as a JSON value: the same value, not the same spacing.
                    assert json.loads(e.body) == json.loads(x.body), (writer, i)
                    compared = replace(e, body=x.body)
                check_rs_event(compared, x, s, stream_name(reader, writer), (writer, i))
    if raw is not None:
        assert [ev["body_encoding"] for ev in raw["events"]] == ["json", "base64"]
        assert raw["events"][0]["body"] == {"sku": "A1", "qty": 2, "ü": True}
        assert base64.b64decode(raw["events"][1]["body"]) == "hello, not JSON: ü".encode()


async def test_micromsg2_reads_every_writer(world: World) -> None:
    gw = world.gw
    host, port = gw.listeners["micromsg2"].address
    text = await MicroMsg2Client.connect(
        host, port, user=USER, password=PASSWORD, required=["pubsub", "json", "batch-ack"],
        ssl=world.t.ssl,
    )
    raw = await MicroMsg2Client.connect(host, port, user=USER, password=PASSWORD,
                                        required=["pubsub"], ssl=world.t.ssl)
    try:
        assert text.negotiated.has("json")
        assert not raw.negotiated.has("json")
        before = len(gw.store.open_subscriptions())
        for writer in WRITERS:
            await text.subscribe(f"topic/{stream_name('micromsg2', writer)}")
            await raw.subscribe(f"topic/{stream_name('micromsg2', writer)}")
        await world.wait_open_subscriptions(before + 2 * len(WRITERS))
        await world.write_all("micromsg2")
        as_text = []
        for _ in range(2 * len(WRITERS)):  # batch-ack: a window of 10 unacknowledged
            as_text.append(await text.receive(timeout=5))
            await text.ack()
        as_bytes = [await raw.receive(timeout=5) for _ in range(2 * len(WRITERS))]
        with pytest.raises(TimeoutError):
            await raw.receive(timeout=0.05)
    finally:
        await text.close()
        await raw.close()

    def by_destination(msgs: list[Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for m in msgs:
            out.setdefault(m.destination, []).append(m)
        return out

    text_by, bytes_by = by_destination(as_text), by_destination(as_bytes)
    for writer in WRITERS:
        dest = f"topic/{stream_name('micromsg2', writer)}"
        await world.stored("micromsg2", writer)
        assert len(text_by[dest]) == len(bytes_by[dest]) == 2, writer
        for i, x in enumerate(EXPECTED[writer]):
            t, b = text_by[dest][i], bytes_by[dest][i]
            check_text(t.payload.decode("utf-8"), x, (writer, i))
            assert b.payload == x.body, (writer, i)
            assert dict(t.properties) == dict(b.properties) == x.properties, (writer, i)


async def test_segment_reads_every_writer(world: World) -> None:
    reader = await SegmentReader.connect(
        *world.gw.listeners["segment"].address, ssl=world.t.ssl,
        credentials=f"{USER}:{PASSWORD}",
    )
    try:
        # The first event of each writer, then a ReadSegment waiting at the
        # tail while the writer appends the second (live), then a full read.
        await world.write_all("segment", slice(0, 1))
        for writer in WRITERS:
            segment = f"{CTX}/{stream_name('segment', writer)}"
            first, second = EXPECTED[writer]
            assert await reader.read_to_tail(segment) == framed(first.body), writer
            tail = asyncio.ensure_future(reader.read(segment, len(framed(first.body))))
            await asyncio.sleep(0.05)
            assert not tail.done(), writer  # waiting at the tail
            await world.writers.write(writer, stream_name("segment", writer), slice(1, 2))
            got = await tail
            assert (got.offset, got.data, got.at_tail) == (
                len(framed(first.body)),
                framed(second.body),
                True,
            ), writer
            whole = await reader.read_to_tail(segment)
            assert whole == framed(first.body) + framed(second.body), writer
            stored = await world.stored("segment", writer)
            assert [e.segment_offset for e in stored] == [0, len(framed(first.body))]
    finally:
        await reader.close()
