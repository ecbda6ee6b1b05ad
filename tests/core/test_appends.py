from __future__ import annotations

import asyncio

import pytest

from polyport.core.commands import NO_STREAM, AppendBatch, ExactVersion, ReadSegment, ReadStream
from polyport.core.errors import Malformed, WrongExpectedVersion
from polyport.core.segments import segment_frame
from polyport.core.store import EventStore
from tests.core.helpers import append, ev


async def test_append_assigns_versions_and_positions(store: EventStore) -> None:
    r1 = await store.append(append("a", ev(1), ev(2)))
    r2 = await store.append(append("b", ev(3)))
    assert (r1.first_version, r1.last_version) == (1, 2)
    assert (r1.first_position, r1.last_position) == (1, 2)
    assert (r2.first_version, r2.first_position) == (1, 3)
    events = await store.read_stream(ReadStream("default", "a"))
    assert [e.version for e in events] == [1, 2]
    assert [e.body for e in events] == [b'{"n": 1}', b'{"n": 2}']
    assert events[0].recorded_at < events[1].recorded_at


@pytest.mark.parametrize(
    ("expected", "existing", "ok"),
    [
        (NO_STREAM, 0, True),
        (NO_STREAM, 2, False),
        (ExactVersion(1), 0, True),
        (ExactVersion(3), 2, True),
        (ExactVersion(2), 2, False),
        (ExactVersion(4), 2, False),
    ],
)
async def test_expected_version_outcomes(store: EventStore, expected, existing, ok) -> None:
    if existing:
        await store.append(append("s", *[ev(i) for i in range(existing)]))
    if ok:
        r = await store.append(append("s", ev(9), expected=expected))
        assert r.first_version == existing + 1
    else:
        with pytest.raises(WrongExpectedVersion) as info:
            await store.append(append("s", ev(9), expected=expected))
        assert info.value.current_version == existing
        assert len(await store.read_stream(ReadStream("default", "s"))) == existing


async def test_conflict_in_a_batch_fails_alone(store: EventStore) -> None:
    await store.append(append("busy", ev(0)))
    # Submitted together so the writer commits them in one transaction.
    results = await asyncio.gather(
        store.append(append("n1", ev(1))),
        store.append(append("busy", ev(2), expected=NO_STREAM)),
        store.append(append("n2", ev(3))),
        return_exceptions=True,
    )
    assert isinstance(results[1], WrongExpectedVersion)
    assert results[0].last_position + 1 == results[2].first_position  # gapless around it
    assert len(await store.read_stream(ReadStream("default", "n1"))) == 1
    assert len(await store.read_stream(ReadStream("default", "n2"))) == 1


async def test_idempotent_reappend(store: EventStore) -> None:
    cmd = append("idem", ev(1), ev(2), expected=NO_STREAM)
    first = await store.append(cmd)
    again = await store.append(cmd)
    assert again.idempotent
    assert (again.first_version, again.last_version) == (1, 2)
    assert again.first_position == first.first_position
    assert len(await store.read_stream(ReadStream("default", "idem"))) == 2
    # The same ids twice inside one group commit are written once.
    cmd2 = append("idem2", ev(5))
    a, b = await asyncio.gather(store.append(cmd2), store.append(cmd2))
    assert a.first_position == b.first_position
    assert len(await store.read_stream(ReadStream("default", "idem2"))) == 1


async def test_partial_reappend_is_rejected(store: EventStore) -> None:
    e1, e2 = ev(1), ev(2)
    await store.append(append("p", e1))
    with pytest.raises(WrongExpectedVersion):
        await store.append(append("p", e1, e2))
    with pytest.raises(WrongExpectedVersion):
        await store.append(append("other", e1))


async def test_append_batch_is_atomic(store: EventStore) -> None:
    await store.append(append("x", ev(0)))
    with pytest.raises(WrongExpectedVersion):
        await store.append_batch(
            AppendBatch((append("y", ev(1)), append("x", ev(2), expected=NO_STREAM)))
        )
    assert await store.read_stream(ReadStream("default", "y")) == []
    res = await store.append_batch(AppendBatch((append("y", ev(1)), append("z", ev(2)))))
    assert [r.stream for r in res] == ["y", "z"]
    assert res[0].commit_id == res[1].commit_id
    with pytest.raises(Malformed):
        await store.append_batch(AppendBatch(()))


async def test_read_segment_by_byte_offset(store: EventStore) -> None:
    bodies = [b"a", b"bbbb", b"", b"cc"]
    await store.append(append("seg", *[ev(body=b) for b in bodies]))
    events = await store.read_stream(ReadStream("default", "seg"))
    whole = b"".join(segment_frame(e) for e in events)
    assert [e.segment_offset for e in events] == [0, 9, 21, 29]
    full = await store.read_segment(ReadSegment("default", "seg", 0))
    assert full.data == whole and full.at_tail and full.end_offset == len(whole)
    for offset in range(len(whole) + 1):
        chunk = await store.read_segment(ReadSegment("default", "seg", offset))
        assert chunk.data == whole[offset:]
    small = await store.read_segment(ReadSegment("default", "seg", 9, max_bytes=10))
    assert small.data == whole[9:21] and not small.at_tail
    with pytest.raises(Malformed):
        await store.read_segment(ReadSegment("default", "seg", len(whole) + 1))


def _database_reads(store: EventStore) -> list[str]:
    """The statements the store's reads send from now on."""
    sent: list[str] = []
    real = store._read

    async def counted(query, *args):  # type: ignore[no-untyped-def]
        sent.append(query)
        return await real(query, *args)

    store._read = counted  # type: ignore[method-assign]
    return sent


async def test_a_held_segment_read_takes_what_memory_holds_without_a_query(
    store: EventStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A held segment read (its reader waits at the tail) whose offset memory
    holds (the event starting there, or the one ending there) is answered
    from the tailer's memory: the segment's bytes, whole events within every
    budget, and at the tail the head its wait starts from.  An offset inside
    an event, and a read that is not held, read the database."""
    await store.append(append("mseg", ev(body=b"zz")))
    await store.read_segment(ReadSegment("default", "mseg", 0))  # memory kept from here
    first_tail = (await store.read_segment(ReadSegment("default", "mseg", 0))).tail_offset
    for i, body in enumerate((b"a", b"bbbb", b"", b"c" * 40, b"dd")):
        await store.append(append("mseg", ev(body=body)))
        await store.append(append(f"other-{i}", ev(body=b"o")))
    sent = _database_reads(store)
    from_memory = {}
    offsets = [first_tail]
    for e in (await store.read_stream(ReadStream("default", "mseg")))[1:]:
        offsets.append(e.segment_offset + 8 + len(e.body))
    del sent[:]
    for offset in offsets[:-1]:
        for budget in (1, 20, 60, 1 << 20):
            from_memory[offset, budget] = await store.read_segment(
                ReadSegment("default", "mseg", offset, max_bytes=budget, held=True))
    at_tail = await store.read_segment(ReadSegment("default", "mseg", offsets[-1], held=True))
    assert sent == []
    assert (at_tail.data, at_tail.at_tail, at_tail.end_offset, at_tail.head_position) == (
        b"", True, offsets[-1], store.tailer.head)
    whole = (await store.read_segment(ReadSegment("default", "mseg", 0))).data
    for (offset, budget), got in from_memory.items():
        # Whole events from the offset, within the budget (one event even
        # when larger), at the tail once the last is in: the segment's bytes.
        assert got.end_offset in offsets and got.data == whole[offset:got.end_offset]
        assert len(got.data) <= budget or got.end_offset == offsets[offsets.index(offset) + 1]
        assert got.at_tail == (got.end_offset == offsets[-1]) and got.tail_offset == offsets[-1]
        if budget == 1 << 20:  # the database's read, which stops at rows, not bytes
            read = await store.read_segment(ReadSegment("default", "mseg", offset))
            assert (got.data, got.at_tail, got.end_offset) == (
                read.data, read.at_tail, read.end_offset)
    del sent[:]
    inside = await store.read_segment(
        ReadSegment("default", "mseg", first_tail + 3, held=True))
    unheld = await store.read_segment(ReadSegment("default", "mseg", offsets[-2]))
    assert len(sent) == 4  # each: the stream's state, then the read
    assert inside.data and unheld.data == whole[offsets[-2]:]


async def test_a_wait_from_memory_misses_nothing_another_process_commits(
    store: EventStore, db_url: str,
) -> None:
    """The tail from memory may be behind what another process committed a
    moment ago: the wait that starts at that memory's head delivers it."""
    from polyport.core.commands import FromPosition, Selector, Subscribe
    from polyport.core.store import StoreConfig

    await store.append(append("far", ev(body=b"1")))
    await store.read_segment(ReadSegment("default", "far", 0))
    await store.append(append("far", ev(body=b"2")))
    other = EventStore(StoreConfig(db_url))
    await other.start()
    try:
        for i in range(3, 23):
            tail = (await store.read_segment(ReadSegment("default", "far", 0))).tail_offset
            await other.append(append("far", ev(body=str(i).encode())))
            held = await store.read_segment(
                ReadSegment("default", "far", tail, held=True))
            if held.data:
                assert held.data.endswith(str(i).encode())
                continue
            assert held.head_position is not None
            sub = await store.subscribe(Subscribe(Selector(context="default", stream="far"),
                                                  start=FromPosition(held.head_position)))
            [got] = await sub.next_batch(10, timeout=5.0)
            assert got.body == str(i).encode() and got.segment_offset == tail
            sub.close()
    finally:
        await other.close()


async def test_bad_text_fails_alone_not_its_batch(store: EventStore) -> None:
    from polyport.core.events import EventData

    bad = [
        append("nul\x00stream", ev(1)),
        append("ok", EventData(type="t\ud800", body=b"x")),
        append("ok", EventData(type="t", body=b"x", headers={"h": "a\x00b"})),
    ]
    e = ev(9)
    bad.append(append("dup", e, e))
    results = await asyncio.gather(
        store.append(append("good-1", ev(1))),
        *(store.append(b) for b in bad),
        store.append(append("good-2", ev(2))),
        return_exceptions=True,
    )
    assert all(isinstance(r, Malformed) for r in results[1:-1]), results
    # Gapless around the refused ones.  (Concurrent appends to different
    # streams have no defined order between them: either may go first.)
    positions = sorted(r.first_position for r in (results[0], results[-1]))
    assert positions[0] + 1 == positions[1]


async def test_a_started_append_is_queued_at_once_and_counted_once_committed(
    store: EventStore,
) -> None:
    counted: list[int] = []
    store.on_append = counted.append
    try:
        first = store.start_append(append("started", ev(1), ev(2)))
        second = store.start_append(append("started", ev(3), expected=NO_STREAM))
        # Queued in call order without awaiting: the second fails its check.
        (result,) = await first
        assert (result.first_version, result.last_version) == (1, 2)
        with pytest.raises(WrongExpectedVersion):
            await second
        await asyncio.sleep(0)  # the counting callback
        assert counted == [2]  # the failed one is not counted
    finally:
        store.on_append = None


async def test_a_segment_chunk_from_live_events_reads_as_the_database(store: EventStore) -> None:
    from polyport.core.segments import segment_chunk_from_live

    await store.append(append("seg", ev(1)))
    tail = (await store.read_segment(ReadSegment("default", "seg", 0))).tail_offset
    await store.append(append("seg", ev(2), ev(3), ev(4)))
    live = await store.read_stream(ReadStream("default", "seg", from_version=2))
    whole = (await store.read_segment(ReadSegment("default", "seg", 0))).data
    for budget, events in ((1, 1), (40, 2), (1 << 20, 3)):
        made = segment_chunk_from_live(tail, live, budget)
        assert made is not None
        # The bytes of the segment view from ``tail``: whole events, within
        # the budget (one event even when larger), at the tail once all fit.
        assert made.data == whole[tail:made.end_offset]
        assert made.end_offset == tail + 16 * events  # each framed event is 16 bytes
        assert made.tail_offset == len(whole)
        assert made.at_tail == (events == 3)
    # Events that do not start at the offset asked for: read the database.
    assert segment_chunk_from_live(tail + 1, live, 1 << 20) is None
    assert segment_chunk_from_live(0, live, 1 << 20) is None
    assert segment_chunk_from_live(tail, [], 1 << 20) is None


async def test_an_empty_segment_read_names_the_head_its_next_event_comes_after(
    store: EventStore,
) -> None:
    # A segment reader at the tail waits from the head its read saw: an append
    # committed between that read and the wait is still delivered.
    from polyport.core.commands import FromPosition, Selector, Subscribe

    await store.append(append("wait", ev(1)))
    await store.append(append("elsewhere", ev(2)))
    at_tail = await store.read_segment(ReadSegment("default", "wait", 16))
    assert at_tail.data == b"" and at_tail.head_position == 2
    await store.append(append("wait", ev(3)))  # before the subscription exists
    sub = await store.subscribe(Subscribe(
        Selector(context="default", stream="wait"), start=FromPosition(at_tail.head_position)))
    try:
        got = await sub.next(timeout=5)
        assert got is not None and got.segment_offset == 16 and got.body == b'{"n": 3}'
    finally:
        sub.close()
