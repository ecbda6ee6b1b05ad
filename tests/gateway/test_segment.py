"""Segment wire end to end: real sockets against real gateways (issue 7)."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from polyport.core.commands import Append, ReadStream
from polyport.core.events import EventData
from polyport.core.segments import segment_frame
from polyport.core.store import EventStore
from polyport.protocols.segment.client import (
    NoSuchSegmentError,
    SegmentError,
    SegmentReader,
    SegmentWriter,
    iter_events,
)
from polyport.protocols.segment.connection import FrameReader
from polyport.protocols.segment.frames import (
    MAX_WIRE_LENGTH,
    REPLY_TYPES,
    AppendSetup,
    AuthFailed,
    BeginAppendBlock,
    DataAppended,
    EndAppendBlock,
    ErrorMessage,
    Event,
    Frame,
    KeepAlive,
    NoSuchSegment,
    ReadSegment,
    SetupAppend,
)
from polyport.protocols.segment.wire import encode_frame
from tests.listeners import port_flags

ROOT = Path(__file__).resolve().parents[2]
FAST_READS = {"segment_read_wait": 0.5}
# These tests exercise the wire, not logins (tests/interop/test_isolation.py
# does): anonymous may use the contexts they write.
ANONYMOUS_CONTEXTS = ("default", "a", "bad", "c", "e2e", "f", "mix", "none", "p", "shop", "t")


@pytest.fixture
def gateway_factory(gateway_factory):  # type: ignore[no-untyped-def]
    async def start(**overrides):  # type: ignore[no-untyped-def]
        overrides.setdefault("anonymous_contexts", ANONYMOUS_CONTEXTS)
        return await gateway_factory(**overrides)

    return start


def address(gw) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    host, port = gw.listeners["segment"].address
    return host, port


def framed(body: bytes) -> bytes:
    return struct.pack(">iI", 0, len(body)) + body


async def all_events(store: EventStore, context: str, stream: str) -> list[bytes]:
    out: list[bytes] = []
    version = 1
    while True:
        batch = await store.read_stream(ReadStream(context, stream, version, 5000))
        if not batch:
            return out
        out += [e.body for e in batch]
        version = batch[-1].version + 1


class Raw:
    """A bare TCP connection speaking bytes, for malformed input."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameReader(max_message_size=MAX_WIRE_LENGTH, accepted_types=REPLY_TYPES)
        self.pending: list[Frame] = []

    @classmethod
    async def open(cls, host: str, port: int) -> Raw:
        return cls(*await asyncio.open_connection(host, port))

    async def send(self, *frames: Frame | bytes) -> None:
        for f in frames:
            self.writer.write(f if isinstance(f, bytes) else encode_frame(f))
        await self.writer.drain()

    async def reply(self, seconds: float = 5.0) -> Frame:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), seconds)
            assert data, "connection closed before a reply"
            self.pending += [f for f, _ in self.frames.feed(data)]
        return self.pending.pop(0)

    async def closed(self, seconds: float = 5.0) -> bool:
        """True once the server closed the connection (EOF)."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), seconds)
        except (ConnectionError, OSError):
            return True
        self.pending += [f for f, _ in self.frames.feed(data)] if data else []
        return not data

    def close(self) -> None:
        self.writer.close()


# --- setup, append, ack ----------------------------------------------------------------


async def test_blocks_acks_and_several_segments_per_connection(gateway_factory, store) -> None:
    gw = await gateway_factory()
    writer = await SegmentWriter.connect(*address(gw))
    orders = await writer.open_segment("shop/orders")
    plain = await writer.open_segment("plain")  # no slash: context "default"
    assert orders.connection_id != plain.connection_id
    assert orders.ack_level == plain.ack_level == 0

    await orders.append([b"o1", b"o22", b"o333"])
    # A block cut at a fixed size: the last event straddles EndAppendBlock.
    await orders.append([b"o4", b"o55"], boundary=10 + 9 + 6)
    await plain.append([b"p1"])
    await orders.flush(5)
    await plain.flush(5)
    assert orders.ack_level == sum(len(framed(b)) for b in [b"o1", b"o22", b"o333", b"o4", b"o55"])
    assert plain.ack_level == len(framed(b"p1"))

    evs = await store.read_stream(ReadStream("shop", "orders"))
    assert [e.body for e in evs] == [b"o1", b"o22", b"o333", b"o4", b"o55"]
    assert {(e.type, e.content_type, e.origin, len(e.headers)) for e in evs} == {
        ("segment-event", "application/octet-stream", "segment", 0)
    }
    assert [e.body for e in await store.read_stream(ReadStream("default", "plain"))] == [b"p1"]
    assert await store.producer_ack_level(orders.connection_id, "shop", "orders") == 54

    # A new connection with the same ConnectionId learns the ack level.
    again = await SegmentWriter.connect(*address(gw))
    resumed = await again.open_segment("shop/orders", orders.connection_id)
    assert resumed.ack_level == 54 and resumed.offset == 54
    await resumed.append([b"o6"])
    await resumed.flush(5)
    assert len(await store.read_stream(ReadStream("shop", "orders"))) == 6
    for w in (writer, again):
        await w.close()


async def test_resent_data_at_or_below_ack_level_is_dropped(gateway_factory, store) -> None:
    gw = await gateway_factory()
    cid = uuid.uuid4()
    raw = await Raw.open(*address(gw))
    await raw.send(SetupAppend(cid, "c/dups"))
    assert await raw.reply() == AppendSetup("c/dups", cid, 0)
    a, b, c = framed(b"a"), framed(b"bb"), framed(b"ccc")
    await raw.send(BeginAppendBlock(cid, 0, len(a + b)), Event(b"a"), Event(b"bb"),
                   EndAppendBlock(cid, len(a + b), len(a + b)))
    assert await raw.reply() == DataAppended(cid, len(a + b))
    raw.close()

    # Reconnect and resend everything from offset 0 plus one new event.
    raw = await Raw.open(*address(gw))
    await raw.send(SetupAppend(cid, "c/dups"))
    assert await raw.reply() == AppendSetup("c/dups", cid, len(a + b))
    total = len(a + b + c)
    await raw.send(BeginAppendBlock(cid, 0, total), Event(b"a"), Event(b"bb"), Event(b"ccc"),
                   EndAppendBlock(cid, total, total))
    assert await raw.reply() == DataAppended(cid, total)
    # A block wholly below the ack level (after a resync) is acknowledged, not written.
    await raw.send(SetupAppend(cid, "c/dups"))
    assert await raw.reply() == AppendSetup("c/dups", cid, total)
    await raw.send(
        BeginAppendBlock(cid, 0, len(a)), Event(b"a"), EndAppendBlock(cid, len(a), len(a))
    )
    assert await raw.reply() == DataAppended(cid, total)
    raw.close()
    assert await all_events(store, "c", "dups") == [b"a", b"bb", b"ccc"]


# --- exactly once across a dropped connection and a SIGKILLed gateway ------------------


class GatewayProcess:
    """``python -m polyport.gateway.cli.main serve`` in a subprocess with only the segment
    listener."""

    def __init__(self, db_url: str) -> None:
        off = port_flags("off", but=("segment",))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "polyport.gateway.cli.main", "serve", "--database-url", db_url,
             "--segment-port", "0", *off],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1",
                 "POLYPORT_ANONYMOUS_CONTEXTS": ",".join(ANONYMOUS_CONTEXTS)},
        )
        self.address: tuple[str, int] | None = None

    async def started(self, seconds: float = 30.0) -> tuple[str, int]:
        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            line = await loop.run_in_executor(None, self.proc.stdout.readline)
            if not line:
                raise AssertionError(f"gateway exited with {self.proc.wait()}")
            if line.startswith("polyport: segment listening on "):
                host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
                self.address = (host, int(port))
                return self.address
        raise AssertionError("gateway did not start in time")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(10)


@pytest.fixture
async def gateway_process(db_url: str) -> AsyncIterator[Callable[[], GatewayProcess]]:
    procs: list[GatewayProcess] = []

    def start() -> GatewayProcess:
        p = GatewayProcess(db_url)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill(signal.SIGKILL)


async def test_exactly_once_across_connection_drop_and_sigkill(
    gateway_factory, gateway_process, store
) -> None:
    total, per_block = 100_000, 1000
    bodies = [b"e%06d" % i for i in range(total)]
    blocks = [bodies[i : i + per_block] for i in range(0, total, per_block)]

    def boundary(block: list[bytes]) -> int:
        # Cut the last event in the middle: partial messages across the End.
        return sum(len(framed(b)) for b in block[:-1]) + 9 + len(framed(block[-1])) // 2

    async def append(app, i: int) -> None:  # type: ignore[no-untyped-def]
        await app.append(blocks[i], boundary=boundary(blocks[i]) if i % 3 == 0 else None)

    async def half_block_then(app, writer, i: int) -> None:  # type: ignore[no-untyped-def]
        data = app.encode_block(blocks[i], boundary=boundary(blocks[i]))
        await writer.write_raw(data[: len(data) // 2])

    second = gateway_process()  # starts in the background meanwhile
    gw = await gateway_factory()
    writer = await SegmentWriter.connect(*address(gw), window_bytes=256 << 10)
    app = await writer.open_segment("e2e/numbers")

    # 1. Connection dropped mid-block, with earlier blocks still unacknowledged.
    for i in range(0, 30):
        await append(app, i)
    await half_block_then(app, writer, 30)
    writer.abort()
    await writer.reconnect()
    for i in range(31, 60):
        await append(app, i)
    await app.flush(20)
    assert app.ack_level == app.offset

    # 2. A gateway process killed with SIGKILL mid-block, commits in flight.
    await writer.reconnect(*await second.started())
    for i in range(60, 80):
        await append(app, i)
    await half_block_then(app, writer, 80)
    await asyncio.sleep(0.05)
    second.kill(signal.SIGKILL)
    with pytest.raises(SegmentError):
        for i in range(81, 100):  # fails as soon as the loss is noticed
            await append(app, i)
        await app.flush(20)
    done = app.offset  # everything handed over so far, acknowledged or not
    third = gateway_process()
    await writer.reconnect(*await third.started())
    # Finish: append the blocks not handed over before the kill (the others
    # were resent by reconnect, from the new gateway's ack level).
    handed = position = 0
    while position < done:
        position += sum(len(framed(b)) for b in blocks[handed])
        handed += 1
    for i in range(handed, 100):
        await append(app, i)
    await app.flush(20)
    await writer.close()

    assert await all_events(store, "e2e", "numbers") == bodies
    assert await store.producer_ack_level(app.connection_id, "e2e", "numbers") == app.offset
    reader = await SegmentReader.connect(*address(gw))
    assert await reader.read_to_tail("e2e/numbers") == b"".join(map(framed, bodies))
    await reader.close()


# --- reads -------------------------------------------------------------------------------


async def test_read_segment_offsets_include_other_protocols(gateway_factory, store) -> None:
    gw = await gateway_factory(extra=FAST_READS)
    writer = await SegmentWriter.connect(*address(gw))
    app = await writer.open_segment("mix/s")
    expected: list[bytes] = []
    for round_ in range(3):
        seg = [b"seg-%d-%d" % (round_, i) for i in range(3)]
        await app.append(seg)
        await app.flush(5)
        core = [b'{"n": %d}' % round_, b"\x00\x01binary" * (round_ + 1)]
        await store.append(Append("mix", "s", tuple(
            EventData("core-type", body, content_type=ct, headers={"h": "v"})
            for body, ct in zip(core, ["application/json", "application/octet-stream"], strict=True)
        )))
        # The writer's connection offset counts only its own bytes.
        expected += seg + core
    whole = b"".join(map(framed, expected))
    stored = await store.read_stream(ReadStream("mix", "s"))
    assert b"".join(segment_frame(e) for e in stored) == whole
    assert app.offset == sum(len(framed(b)) for b in expected if b.startswith(b"seg"))

    reader = await SegmentReader.connect(*address(gw))
    assert await reader.read_to_tail("mix/s") == whole
    first = await reader.read("mix/s", 0)
    assert first.offset == 0 and first.at_tail and not first.end_of_segment
    # From every event boundary: exactly the rest of the segment.
    for ev in stored:
        assert ev.segment_offset == whole.index(framed(ev.body))
        reply = await reader.read("mix/s", ev.segment_offset)
        assert reply.data == whole[ev.segment_offset :] and reply.at_tail
        assert list(iter_events(reply.data)) == [e.body for e in stored[ev.version - 1 :]]
    # From an offset inside an event, and in small replies.
    assert (await reader.read("mix/s", 3)).data == whole[3:]
    pieces = [r async for r in reader.iterate("mix/s", 5, suggested_length=7)]
    assert all(len(p.data) <= 7 for p in pieces) and pieces[-1].at_tail
    assert not any(p.at_tail for p in pieces[:-1])
    assert b"".join(p.data for p in pieces) == whole[5:]

    # Errors leave a reader connection usable.
    with pytest.raises(NoSuchSegmentError):
        await reader.read("mix/nothing", 0)
    with pytest.raises(NoSuchSegmentError):
        await reader.read("mix/nothing", 100)
    with pytest.raises(SegmentError) as info:
        await reader.read("mix/s", len(whole) + 1)
    assert info.value.code == "malformed"
    with pytest.raises(SegmentError) as info:
        await reader.read("mix/", 0)
    assert info.value.code == "malformed"
    assert (await reader.read("mix/s", len(whole) - 8)).data == whole[-8:]
    await reader.close()
    await writer.close()


async def test_read_at_tail_waits_for_new_data(gateway_factory, store) -> None:
    gw = await gateway_factory(extra={"segment_read_wait": 3.0})
    await store.append(Append("t", "s", (EventData("x", b"first"),)))
    tail = len(framed(b"first"))
    reader = await SegmentReader.connect(*address(gw))

    async def later() -> None:
        await asyncio.sleep(0.3)
        await store.append(Append("t", "s", (EventData("x", b"second"),)))

    started = time.monotonic()
    task = asyncio.create_task(later())
    reply = await reader.read("t/s", tail)
    await task
    assert reply.data == framed(b"second") and reply.at_tail
    assert 0.25 < time.monotonic() - started < 2.5  # woken by the append, not the time limit

    gw2 = await gateway_factory(extra={"segment_read_wait": 0.4})
    reader2 = await SegmentReader.connect(*address(gw2))
    started = time.monotonic()
    reply = await reader2.read("t/s", tail + len(framed(b"second")))
    assert reply.data == b"" and reply.at_tail
    assert 0.35 < time.monotonic() - started < 2.0
    await reader.close()
    await reader2.close()


async def test_a_burst_that_wakes_a_tail_read_is_answered_whole_or_in_part(
    gateway_factory, store
) -> None:
    # The wait is answered from the appends that woke it: three events in one
    # commit, asked for with room for one, then for the rest.
    gw = await gateway_factory(extra={"segment_read_wait": 3.0})
    await store.append(Append("t", "burst", (EventData("x", b"first"),)))
    tail = len(framed(b"first"))
    reader = await SegmentReader.connect(*address(gw))
    bodies = [b"second", b"third", b"fourth"]

    async def later() -> None:
        await asyncio.sleep(0.3)
        await store.append(Append("t", "burst", tuple(EventData("x", b) for b in bodies)))

    task = asyncio.create_task(later())
    reply = await reader.read("t/burst", tail, suggested_length=len(framed(b"second")))
    await task
    assert reply.data == framed(b"second") and not reply.at_tail
    rest = await reader.read("t/burst", tail + len(reply.data))
    assert rest.data == framed(b"third") + framed(b"fourth") and rest.at_tail
    await reader.close()


async def test_a_reader_following_the_tail_costs_the_database_nothing(gateway_factory) -> None:
    """Held reads at the tail start their wait from the tailer's memory, and
    reads that find events there are answered from it: a reader keeping up
    with a stream, or catching up a little, sends no query."""
    gw = await gateway_factory(extra={"segment_read_wait": 3.0})
    await gw.store.append(Append("t", "follow", (EventData("x", b"0"),)))
    reader = await SegmentReader.connect(*address(gw))
    # The first reads keep the tailer's memory from here on.
    first = len((await reader.read("t/follow", 0)).data)
    await gw.store.append(Append("t", "follow", (EventData("x", b"00"),)))
    offset = first + len((await reader.read("t/follow", first)).data)
    sent: list[str] = []
    real = gw.store._read

    async def counted(query, *args):  # type: ignore[no-untyped-def]
        sent.append(query)
        return await real(query, *args)

    gw.store._read = counted
    for i in range(1, 6):
        held = asyncio.create_task(reader.read("t/follow", offset))
        await asyncio.sleep(0.05)
        await gw.store.append(Append("t", "follow", (EventData("x", str(i).encode()),)))
        reply = await held
        assert reply.data == framed(str(i).encode()) and reply.at_tail
        offset += len(reply.data)
    behind = [str(i).encode() for i in range(6, 9)]
    for body in behind:
        await gw.store.append(Append("t", "follow", (EventData("x", body),)))
    reply = await reader.read("t/follow", offset)
    assert reply.data == b"".join(framed(b) for b in behind) and reply.at_tail
    assert sent == []
    await reader.close()


# --- keep-alive and idle connections ---------------------------------------------------


async def test_keep_alive_echo_and_idle_timeout(gateway_factory) -> None:
    gw = await gateway_factory(idle_timeout=0.6)
    lively = await Raw.open(*address(gw))
    idle = await Raw.open(*address(gw))
    for _ in range(8):  # 1.6 s, well past the idle timeout
        await lively.send(KeepAlive(b"ping"))
        assert await lively.reply() == KeepAlive(b"ping")
        await asyncio.sleep(0.2)
    assert await idle.closed(0.1)
    await lively.send(KeepAlive())
    assert await lively.reply() == KeepAlive()
    lively.close()


# --- bad input -------------------------------------------------------------------------

CID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
HEADER = struct.Struct(">iI")


def _setup() -> list[Frame | bytes]:
    return [SetupAppend(CID, "bad/input")]


BAD_INPUTS: dict[str, tuple[list[Frame | bytes], str, str]] = {
    "unknown type": ([HEADER.pack(42, 0)], "unsupported", "unknown message type 42"),
    "reply type from a client": (
        [encode_frame(DataAppended(CID, 0))], "malformed", "not a message a client may send"
    ),
    "length of 2^24": ([HEADER.pack(0, 1 << 24)], "malformed", "under 2^24"),
    "event above max_event_bytes": ([HEADER.pack(0, 70_000)], "too_large", "maximum message"),
    "fixed-size body with a wrong length": (
        [HEADER.pack(3, 20) + bytes(20)], "malformed", "must be 28 bytes"
    ),
    "EndAppendBlock without Begin": (
        [EndAppendBlock(CID, 0, 0)], "malformed", "EndAppendBlock without a BeginAppendBlock"
    ),
    "append before SetupAppend": (
        [BeginAppendBlock(CID, 0, 9), Event(b"x"), EndAppendBlock(CID, 9, 9)],
        "malformed", "before its SetupAppend",
    ),
    "event outside a block": ([Event(b"x")], "malformed", "only valid inside an append block"),
    "block length that lies": (
        [*_setup(), BeginAppendBlock(CID, 0, 18), Event(b"a"), Event(b"b"),
         EndAppendBlock(CID, 10, 10)],
        "malformed", "differs from the 18 EVENT bytes",
    ),
    "block overrun": (
        [*_setup(), BeginAppendBlock(CID, 0, 9), Event(b"a"), Event(b"b")],
        "malformed", "overruns",
    ),
    "block that leaves a gap": (
        [*_setup(), BeginAppendBlock(CID, 100, 9), Event(b"a"), EndAppendBlock(CID, 109, 9)],
        "malformed", "leaves a gap",
    ),
    "empty stream name": ([SetupAppend(CID, "bad/")], "malformed", "empty context or stream"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
async def test_bad_input_error_then_close_others_unaffected(
    gateway_factory, store, name: str
) -> None:
    frames, code, text = BAD_INPUTS[name]
    gw = await gateway_factory(max_event_bytes=65_536)
    # A healthy writer and reader on their own connections, mid-stream.
    writer = await SegmentWriter.connect(*address(gw))
    good = await writer.open_segment("bad/input")
    await good.append([b"g1"])
    await good.flush(5)

    bad = await Raw.open(*address(gw))
    setup_sent = bool(frames) and frames[0] == SetupAppend(CID, "bad/input")
    if setup_sent:
        await bad.send(frames[0])
        assert await bad.reply() == AppendSetup("bad/input", CID, 0)
        frames = frames[1:]
    await bad.send(*frames)
    reply = await bad.reply()
    assert isinstance(reply, ErrorMessage), reply
    assert reply.code == code and text in reply.message
    assert await bad.closed()
    bad.close()

    await good.append([b"g2"])
    await good.flush(5)
    reader = await SegmentReader.connect(*address(gw))
    data = await reader.read_to_tail("bad/input")
    # Nothing of the bad connection's block was written.
    assert list(iter_events(data)) == [b"g1", b"g2"]
    assert gw.listeners["segment"].stats.errors[code] >= 1
    await reader.close()
    await writer.close()


async def test_protocol_error_after_complete_block_keeps_that_block(gateway_factory, store) -> None:
    """A block that arrived whole is stored and acknowledged even if garbage
    follows it; the garbage gets the error reply."""
    gw = await gateway_factory()
    raw = await Raw.open(*address(gw))
    await raw.send(SetupAppend(CID, "p/q"))
    assert await raw.reply() == AppendSetup("p/q", CID, 0)
    await raw.send(BeginAppendBlock(CID, 0, 9), Event(b"a"), EndAppendBlock(CID, 9, 9))
    assert await raw.reply() == DataAppended(CID, 9)
    await raw.send(HEADER.pack(-7, 0))
    reply = await raw.reply()
    assert isinstance(reply, ErrorMessage) and reply.code == "unsupported"
    assert await raw.closed()
    assert await all_events(store, "p", "q") == [b"a"]


async def test_same_connection_id_on_a_new_connection_fences_the_old_one(
    gateway_factory, store
) -> None:
    gw = await gateway_factory()
    first = await SegmentWriter.connect(*address(gw))
    a = await first.open_segment("f/s")
    await a.append([b"1"])
    await a.flush(5)
    second = await SegmentWriter.connect(*address(gw))
    b = await second.open_segment("f/s", a.connection_id)
    assert b.offset == 9
    await b.append([b"2"])
    await b.flush(5)
    with pytest.raises(SegmentError) as info:
        await a.append([b"stale"])
        await a.flush(5)
    assert info.value.code == "wrong_expected_version"
    assert await all_events(store, "f", "s") == [b"1", b"2"]
    await first.close()
    await second.close()


async def test_read_of_missing_segment_is_no_such_segment(gateway_factory) -> None:
    gw = await gateway_factory(extra=FAST_READS)
    raw = await Raw.open(*address(gw))
    await raw.send(ReadSegment("none/here", 0, 100))
    reply = await raw.reply()
    assert isinstance(reply, NoSuchSegment) and reply.segment == "none/here"
    # The connection stays open for further requests.
    await raw.send(KeepAlive(b"k"))
    assert await raw.reply() == KeepAlive(b"k")
    raw.close()


async def test_anonymous_access_disabled_is_auth_failed(gateway_factory) -> None:
    gw = await gateway_factory(allow_anonymous=False, extra=FAST_READS)
    reader = await Raw.open(*address(gw))
    await reader.send(ReadSegment("a/b", 0, 10))
    reply = await reader.reply()
    assert isinstance(reply, AuthFailed) and reply.segment == "a/b"
    assert "anonymous" in reply.message
    writer = await Raw.open(*address(gw))
    await writer.send(SetupAppend(CID, "a/b"))
    reply = await writer.reply()
    assert isinstance(reply, AuthFailed) and reply.segment == "a/b"
    assert await writer.closed()  # an appender that cannot be set up: the connection ends
    reader.close()
