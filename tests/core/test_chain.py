"""The commit chain (core/chain.py): its MessagePack messages round-trip every
field, and stores that append through one chain commit in one order, hear of
each other's commits, and fall back to their own writer when it goes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyport.core.chain import CommitChain
from polyport.core.chain_wire import (
    APPEND,
    COMMIT,
    RESULT,
    decode_append,
    decode_failure,
    decode_results,
    decode_rows,
    encode_append,
    encode_failure,
    encode_results,
    encode_rows,
)
from polyport.core.commands import (
    ANY,
    NO_STREAM,
    Append,
    AppendBatch,
    AppendResult,
    ExactVersion,
    ProducerCheckpoint,
    ReadStream,
    Selector,
    Subscribe,
)
from polyport.core.errors import ALL_ERRORS, Busy, WrongExpectedVersion
from polyport.core.events import EventData
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore, StoreConfig
from tests.core.helpers import append, ev, unique

pytestmark = pytest.mark.timeout(60)

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                min_size=1, max_size=20)
_times = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1),
                      timezones=st.just(UTC))
_events = st.builds(
    EventData, type=_text, body=st.binary(max_size=64), event_id=st.uuids(),
    headers=st.dictionaries(_text, _text, max_size=3), content_type=_text,
    client_time=st.none() | _times)
_appends = st.builds(
    Append, context=_text, stream=_text, events=st.lists(_events, min_size=1, max_size=4).map(
        tuple),
    expected=st.sampled_from([ANY, NO_STREAM]) | st.integers(1, 2**40).map(ExactVersion),
    origin=_text,
    producer_checkpoint=st.none() | st.builds(ProducerCheckpoint, st.uuids(),
                                              st.integers(0, 2**62)))


@given(_appends)
def test_an_append_round_trips(a: Append) -> None:
    assert decode_append(encode_append(a)) == a


@given(st.lists(st.builds(AppendResult, _text, _text, st.integers(1, 2**40),
                          st.integers(1, 2**40), st.integers(1, 2**62), st.integers(1, 2**62),
                          _times, st.uuids(), st.booleans()), max_size=4))
def test_results_round_trip(results: list[AppendResult]) -> None:
    # A result travels without its context and stream: the worker's own
    # appends, in the same order, name them.
    appends = [append(r.stream, ev(), context=r.context) for r in results]
    assert decode_results(appends, encode_results(results)) == results


def test_every_canonical_error_round_trips_with_its_details() -> None:
    for cls in ALL_ERRORS:
        err = cls("why")
        _kind, uid, *rest = encode_failure(7, err)
        back = decode_failure(*rest)
        assert uid == 7 and type(back) is cls and back.message == "why"
    back = decode_failure(*encode_failure(1, WrongExpectedVersion("no", current_version=4))[2:])
    assert isinstance(back, WrongExpectedVersion) and back.current_version == 4
    back = decode_failure(*encode_failure(1, Busy("full", reader=True))[2:])
    assert isinstance(back, Busy) and back.reader


def test_rows_round_trip_in_the_planner_layout() -> None:
    t = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    rows = [(uuid.uuid4(), "c", "s", 3, "T", {"k": "v"}, b"\x00body", "text/plain", t,
             "bson", 42),
            (uuid.uuid4(), "c", "s", 4, "T", {}, b"", "application/json", None, "core", 58)]
    assert decode_rows(encode_rows(rows)) == rows


# --- through a real chain -----------------------------------------------------------


class _Chain:
    """A CommitChain served on a unix socket, as gateway/process/chain.py serves it."""

    def __init__(self, db_url: str, path: Path) -> None:
        self.chain = CommitChain(asyncpg_dsn(db_url))
        self.path = path
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.chain.start()

        self.server = await asyncio.get_running_loop().create_unix_server(
            self.chain.protocol, str(self.path))

    async def connect(
        self, factory: Callable[[], asyncio.Protocol]
    ) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
        return await asyncio.get_running_loop().create_unix_connection(factory, str(self.path))

    async def connect_raw(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to speak the chain's messages by hand."""
        return await asyncio.open_unix_connection(str(self.path))

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        self.chain.disconnect(abort=True)
        await self.chain.drain_and_stop()


@pytest.fixture
async def chain(db_url: str) -> AsyncIterator[_Chain]:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="pp-chain-", dir="/tmp")) / "chain.sock"
    c = _Chain(db_url, path)
    await c.start()
    yield c
    await c.stop()


async def _store(db_url: str, chain: _Chain, first: bool) -> EventStore:
    s = EventStore(StoreConfig(db_url, poll_interval=0.2, chain=chain.connect,
                               chain_counts_commits=first))
    await s.start()
    writer = s.writer
    await asyncio.wait_for(writer.connected.wait(), 10)  # type: ignore[union-attr]
    return s


async def test_two_stores_commit_through_one_chain_gapless_and_feed_live(
    db_url: str, chain: _Chain
) -> None:
    a = await _store(db_url, chain, True)
    b = await _store(db_url, chain, False)
    try:
        stream = unique("chain")
        sub = await b.subscribe(Subscribe(Selector(context="default", stream=stream)))
        results = await asyncio.gather(*(
            (a if i % 2 else b).append(append(stream, ev(i))) for i in range(40)))
        assert sorted(r.first_version for r in results) == list(range(1, 41))
        got = [await asyncio.wait_for(sub.next(), 5) for _ in range(40)]
        assert [e.version for e in got] == list(range(1, 41))
        assert [e.position for e in got] == sorted(r.first_position for r in results)
        assert a.writer.stats.commits >= 1 and b.writer.stats.commits == 0
        # One chain made every commit: both stores' own writers made none.
        assert a.writer.local.stats.commits == 0  # type: ignore[union-attr]
        assert b.writer.local.stats.commits == 0  # type: ignore[union-attr]
        sub.close()
    finally:
        await a.close()
        await b.close()
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        positions = [r[0] for r in await conn.fetch(
            "SELECT position FROM events ORDER BY position")]
    finally:
        await conn.close()
    assert positions == list(range(1, 41))


async def test_the_counting_store_reports_the_chains_commits_at_planned_positions(
    db_url: str, chain: _Chain
) -> None:
    """The chain writer's running totals ride on its COMMIT messages: the
    store that counts commits shows them as its own writer's, the other
    none."""
    a = await _store(db_url, chain, True)
    b = await _store(db_url, chain, False)
    try:
        async def publish(store: EventStore, stream: str) -> None:
            for i in range(40):
                await store.append(append(stream, ev(i)))

        await asyncio.gather(*(publish(a if i % 2 else b, unique("planned"))
                               for i in range(8)))
        chain_stats = chain.chain.writer.stats
        assert chain_stats.planned_commits > 0
        assert a.writer.stats.planned_commits == chain_stats.planned_commits
        assert a.writer.stats.planned_refused == chain_stats.planned_refused == 0
        assert b.writer.stats.planned_commits == 0
    finally:
        await a.close()
        await b.close()


def test_planned_totals_only_rise_across_a_new_chain() -> None:
    """What the totals grew by since the last COMMIT is added; a new chain
    connection starts from its own zero (ChainClient._lost resets)."""
    from types import SimpleNamespace

    from polyport.core.chain import ChainClient
    from polyport.core.writer import WriterStats

    client = SimpleNamespace(_counts_commits=True, _chain_planned=(0, 0), _stats=WriterStats())
    for planned, refused in ((3, 0), (5, 1), (5, 1)):
        ChainClient._planned_totals(client, planned, refused)  # type: ignore[arg-type]
    assert (client._stats.planned_commits, client._stats.planned_refused) == (5, 1)
    client._chain_planned = (0, 0)  # the chain went away; a new one answers
    ChainClient._planned_totals(client, 2, 0)  # type: ignore[arg-type]
    assert (client._stats.planned_commits, client._stats.planned_refused) == (7, 1)
    quiet = SimpleNamespace(_counts_commits=False, _chain_planned=(0, 0), _stats=WriterStats())
    ChainClient._planned_totals(quiet, 4, 2)  # type: ignore[arg-type]
    assert quiet._stats.planned_commits == 0


async def test_a_commit_and_its_results_reach_a_worker_in_one_write(chain: _Chain) -> None:
    # The worker wakes once per commit, not once for the COMMIT and again
    # for the results (the writer tells the chain of each outcome in the
    # turn that commits it).
    reader, writer = await chain.connect_raw()
    try:
        units = [[APPEND, uid, [encode_append(append(unique("one"), ev(uid)))], 100, 100]
                 for uid in range(3)]
        writer.write(msgpack.packb(units))
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        writes: list[list[list[object]]] = []
        while sum(m[0] == RESULT for w in writes for m in w) < 3:
            unpacker.feed(await asyncio.wait_for(reader.read(1 << 16), 5))
            writes.extend(unpacker)
        for w in writes:
            # Each write: a commit, then the results it settled (two commits
            # settled in one turn travel together, each before its results).
            committed: set[int] = set()
            for m in w:
                if m[0] == COMMIT:
                    base, count = m[1], m[3]
                    committed.update(range(base + 1, base + count + 1))
                else:
                    assert m[0] == RESULT, w
                    for r in m[2]:
                        first, last = r[4], r[5]
                        assert set(range(first, last + 1)) <= committed, w
    finally:
        writer.close()


async def test_a_lost_chain_hands_its_unanswered_appends_to_the_local_writer(
    db_url: str, chain: _Chain
) -> None:
    s = await _store(db_url, chain, True)
    try:
        stream = unique("lost")
        await s.append(append(stream, ev(0)))
        # The chain stops answering: its writer holds the next append ...
        held = asyncio.Event()
        real = chain.chain._committed

        def stall(base: int, t0: datetime, rows: list[tuple[object, ...]]) -> None:
            real(base, t0, rows)
            held.set()

        # The commit planned from the wire form takes the second callback.
        real_wire = chain.chain._committed_wire

        def stall_wire(base: int, t0: int, n: int, rows: list[list[object]] | None) -> None:
            real_wire(base, t0, n, rows)
            held.set()

        chain.chain.writer._on_commit = stall
        chain.chain.writer._on_wire_commit = stall_wire  # type: ignore[attr-defined]
        pending = asyncio.create_task(s.append(append(stream, ev(1), expected=ExactVersion(2))))
        await asyncio.wait_for(held.wait(), 5)
        # ... and its connection drops after the commit, before the result
        # reached the store (aborted in the same loop turn as the commit).
        chain.chain.disconnect(abort=True)
        result = await asyncio.wait_for(pending, 10)
        # Committed by the chain, answered by the local writer from the ids.
        assert result.first_version == 2
        after = await s.append(append(stream, ev(2), expected=ExactVersion(3)))
        assert after.first_version == 3
    finally:
        await s.close()
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        versions = [r[0] for r in await conn.fetch(
            "SELECT version FROM events WHERE stream = $1 ORDER BY position", stream)]
    finally:
        await conn.close()
    assert versions == [1, 2, 3]


async def _hosted_pair(db_url: str) -> tuple[EventStore, EventStore, asyncio.Server]:
    """commit_chain = worker: a store hosting the chain on a unix socket,
    and a store feeding it, connected."""
    import tempfile

    host = EventStore(StoreConfig(db_url, poll_interval=0.2, hosts_chain=True))
    await host.start()
    assert host.chain is not None
    path = Path(tempfile.mkdtemp(prefix="pp-chain-", dir="/tmp")) / "chain.sock"
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(host.chain.protocol, str(path))

    async def connect(
        factory: Callable[[], asyncio.Protocol]
    ) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
        return await loop.create_unix_connection(factory, str(path))

    peer = EventStore(StoreConfig(db_url, poll_interval=0.2, chain=connect,
                                  chain_counts_commits=False))
    await peer.start()
    await asyncio.wait_for(peer.writer.connected.wait(), 10)  # type: ignore[union-attr]
    return host, peer, server


async def test_a_store_hosting_the_chain_commits_for_another_and_feeds_both(
    db_url: str
) -> None:
    """commit_chain = worker: one store's own writer is the chain the other
    feeds.  Both commit in one order, each hears of the other's commits,
    and the host's metrics count only the appends of its own callers."""
    host, peer, server = await _hosted_pair(db_url)
    assert host.chain is not None and host.chain.writer is host.writer
    seen: list[int] = []
    host.writer.observer = lambda o: seen.extend(o.sizes)
    try:
        stream = unique("hosted")
        on_host = await host.subscribe(Subscribe(Selector(context="default", stream=stream)))
        on_peer = await peer.subscribe(Subscribe(Selector(context="default", stream=stream)))
        results = await asyncio.gather(*(
            (host if i % 2 else peer).append(append(stream, ev(i))) for i in range(40)))
        assert sorted(r.first_version for r in results) == list(range(1, 41))
        for sub in (on_host, on_peer):
            got = [await asyncio.wait_for(sub.next(), 5) for _ in range(40)]
            assert [e.version for e in got] == list(range(1, 41))
            sub.close()
        assert peer.writer.local.stats.commits == 0  # type: ignore[union-attr]
        assert sum(seen) == 20  # the host's own 20, not the peer's
        # The host stopping hands the peer back to its own writer.
        server.close()
        host.chain.disconnect()
        await asyncio.sleep(0.2)
        late = await peer.append(append(stream, ev(99), expected=ExactVersion(41)))
        assert late.first_version == 41
        assert peer.writer.local.stats.commits == 1  # type: ignore[union-attr]
    finally:
        await peer.close()
        await host.close()


async def _scenario(store: EventStore, context: str) -> list[object]:
    """Appends of every kind, answered and stored; what they came to, with
    positions and times made relative."""
    at = datetime(2026, 11, 28, 1, 2, 3, 456789, tzinfo=UTC)
    producer = uuid.uuid4()

    def event(n: int, **kw: object) -> EventData:
        return EventData(type=f"t{n}", body=f"body {n}".encode(), **kw)  # type: ignore[arg-type]

    first = (event(1, headers={"k": "v", "q\"": "ü"}, content_type="text/plain",
                   client_time=at), event(2))
    answers: list[object] = [await store.append(
        Append(context, "s", first, NO_STREAM, "bson"))]
    # Good appends only: one batch planned from the chain's wire form.
    answers += await asyncio.gather(
        store.append(Append(context, "t", (event(3),), ANY, "segment",
                            ProducerCheckpoint(producer, 7))),
        store.append(Append(context, "t", (event(4), event(5)), ANY, "segment",
                            ProducerCheckpoint(producer, 9))),
        store.append(Append(context, "s", (event(6),), ExactVersion(3), "micromsg2")))
    # Then everything the wire form leaves to the writer's usual paths.
    answers += await asyncio.gather(
        store.append(Append(context, "s", (event(7),), ExactVersion(9))),
        store.append(Append(context, "s", first, NO_STREAM, "bson")),  # re-sent
        store.append_batch(AppendBatch((Append(context, "u", (event(8),)),
                                        Append(context, "s", (event(9),), NO_STREAM)))),
        store.append(Append(context, "u", (event(10),), NO_STREAM)),
        return_exceptions=True)
    base = answers[0].first_position - 1  # type: ignore[attr-defined]
    out: list[object] = []
    for a in answers:
        for r in a if isinstance(a, list) else [a]:
            if isinstance(r, AppendResult):
                out.append((r.context == context, r.stream, r.first_version, r.last_version,
                            r.last_position - r.first_position, r.idempotent))
            else:
                out.append((type(r).__name__, getattr(r, "current_version", None)))
    for stream in ("s", "t", "u"):
        for e in await store.read_stream(ReadStream(context, stream)):
            out.append((e.stream, e.version, e.type, dict(e.headers), e.body, e.content_type,
                        e.client_time, e.origin, e.segment_offset,
                        e.recorded_at >= answers[0].recorded_at))  # type: ignore[attr-defined]
    out.append(await store.producer_ack_level(producer, context, "t"))
    out.append(base >= 0)
    return out


async def test_the_chain_answers_and_stores_as_one_process_does(
    db_url: str, chain: _Chain
) -> None:
    """The chain plans good batches from the workers' wire form and leaves
    the rest to the writer's usual paths: either way, every append is
    answered, and every event stored, exactly as by a store of its own."""
    through = await _store(db_url, chain, True)
    alone = EventStore(StoreConfig(db_url, poll_interval=0.2))
    await alone.start()
    try:
        got = await _scenario(through, unique("via-chain"))
        want = await _scenario(alone, unique("alone"))
        assert got == want
        assert ("WrongExpectedVersion", 3) in got  # the checks really ran
        assert through.writer.local.stats.commits == 0  # type: ignore[union-attr]
    finally:
        await through.close()
        await alone.close()


async def test_a_hosted_chain_answers_and_stores_as_one_process_does(db_url: str) -> None:
    """commit_chain = worker: the host's own appends and its peer's share
    batches planned from the wire form; both answer as a store alone."""
    host, peer, server = await _hosted_pair(db_url)
    alone = EventStore(StoreConfig(db_url, poll_interval=0.2))
    await alone.start()
    try:
        want = await _scenario(alone, unique("alone"))
        # Both at once, so that their units share the host's batches.
        got = await asyncio.gather(_scenario(host, unique("host")),
                                   _scenario(peer, unique("peer")))
        assert got == [want, want]
        assert peer.writer.local.stats.commits == 0  # type: ignore[union-attr]
    finally:
        server.close()
        await peer.close()
        await host.close()
        await alone.close()


def test_time_round_trip_is_exact_to_the_microsecond() -> None:
    from polyport.core.chain_wire import from_us, us

    t = datetime(2026, 11, 27, 9, 0, 0, 1, tzinfo=UTC)
    assert from_us(us(t)) == t
    assert from_us(us(t + timedelta(microseconds=1))) - t == timedelta(microseconds=1)
