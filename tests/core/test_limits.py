"""Hostile clients at admission: the writer's queue is bounded in bytes, and
names, headers and body nesting are checked before anything is queued, for
every protocol (they all append through the writer)."""

from __future__ import annotations

import asyncio
import logging
import struct

import bson
import msgpack
import pytest

from polyport.core.bodies import body_depth_exceeds
from polyport.core.commands import Append, ReadStream
from polyport.core.errors import Busy, Malformed, TooLarge
from polyport.core.events import EventData
from polyport.core.store import EventStore, StoreConfig
from polyport.core.writer import WriterLimits
from tests.core.helpers import append, ev, unique
from tests.pg import HEAD_LOCK, row_locked

pytestmark = pytest.mark.timeout(60)


def _nested_json(levels: int) -> bytes:
    return b'{"a":' * (levels - 1) + b"[1]" + b"}" * (levels - 1)


def _nested_bson(levels: int) -> bytes:
    """A BSON document ``levels`` deep, built by hand: the encoder itself
    would recurse."""
    doc = struct.pack("<i", 5) + b"\x00"
    for _ in range(levels - 1):
        element = b"\x03a\x00" + doc + b"\x00"
        doc = struct.pack("<i", 4 + len(element)) + element
    return doc


def _nested_msgpack(levels: int) -> bytes:
    return b"\x91" * levels + b"\x01"


def test_body_depth_is_measured_without_recursion() -> None:
    for content_type, make in (
        ("application/json", _nested_json),
        ("application/bson", _nested_bson),
        ("application/msgpack", _nested_msgpack),
    ):
        assert not body_depth_exceeds(content_type, make(64), 64), content_type
        assert body_depth_exceeds(content_type, make(65), 64), content_type
        # Far past Python's recursion limit: still an answer, not a crash.
        assert body_depth_exceeds(content_type, make(100_000), 64), content_type
    # Brackets inside JSON strings do not nest; escaped quotes do not end strings.
    assert not body_depth_exceeds("application/json", b'["\\"' + b"[" * 500 + b'"]', 64)
    assert body_depth_exceeds("application/json", b'["\\\\"' + b"[" * 500 + b'"]', 64)
    # Other content types are opaque bytes.
    assert not body_depth_exceeds("text/plain", b"[" * 500, 64)
    assert not body_depth_exceeds("application/json; charset=utf-8", b"[" * 64, 64)
    assert bson.decode(_nested_bson(3)) == {"a": {"a": {}}}
    assert msgpack.unpackb(_nested_msgpack(2)) == [[1]]


async def test_deep_bodies_are_refused_at_admission(store: EventStore) -> None:
    stream = unique("deep")
    for content_type, make in (
        ("application/json", _nested_json),
        ("application/bson", _nested_bson),
        ("application/msgpack", _nested_msgpack),
    ):
        with pytest.raises(Malformed, match="max_body_depth") as info:
            await store.append(append(stream, EventData("t", make(500),
                                                        content_type=content_type)))
        assert "64 levels" in str(info.value)
        await store.append(append(stream, EventData("t", make(64), content_type=content_type)))
    events = await store.read_stream(ReadStream("default", stream))
    assert len(events) == 3


async def test_a_long_stream_name_is_refused_without_touching_its_batch(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A 3 KB stream name used to reach the unique index inside the group
    commit, which then re-committed the whole batch one append at a time."""
    caplog.set_level(logging.WARNING, logger="polyport.writer")
    good = [unique("ok") for _ in range(5)]
    long_name = "s" * 3000
    outcomes = await asyncio.gather(
        *(store.append(append(s, ev(1))) for s in good[:2]),
        store.append(append(long_name, ev(2))),
        *(store.append(append(s, ev(3))) for s in good[2:]),
        return_exceptions=True,
    )
    refused = outcomes[2]
    assert isinstance(refused, TooLarge), refused
    assert "max_name_bytes" in str(refused) and "3000 bytes" in str(refused)
    assert [type(o).__name__ for i, o in enumerate(outcomes) if i != 2] == ["AppendResult"] * 5
    assert not [r for r in caplog.records if r.name == "polyport.writer"]
    assert all(e.stream != long_name for e in await store.read_all())
    # Reads check names by the same rule (issue 27, item 6).
    with pytest.raises(TooLarge):
        await store.stream_state("default", long_name)


async def test_names_and_headers_have_limits(store: EventStore) -> None:
    stream = unique("limits")
    at_limit = "é" * 128  # 256 bytes in UTF-8
    await store.append(Append(at_limit, at_limit, (EventData(
        at_limit, b"x", content_type=at_limit,
        headers={f"h{i}": "v" * 4096 for i in range(63)} | {"k" * 256: "v"}),)))
    cases: list[tuple[Append, str]] = [
        (Append(at_limit + "x", stream, (ev(),)), "context of 257 bytes"),
        (append(stream, EventData("t" * 257, b"x")), "event type of 257 bytes"),
        (append(stream, EventData("t", b"x", content_type="c" * 300)), "content type of 300"),
        (append(stream, EventData("t", b"x", headers={f"h{i}": "" for i in range(65)})),
         "65 headers exceed the limit of 64 (max_headers)"),
        (append(stream, EventData("t", b"x", headers={"k" * 257: ""})),
         "max_header_name_bytes"),
        (append(stream, EventData("t", b"x", headers={"k": "v" * 4097})),
         "of 4097 bytes (UTF-8) exceeds the limit of 4096 bytes (max_header_value_bytes)"),
    ]
    for command, message in cases:
        with pytest.raises(TooLarge) as info:
            await store.append(command)
        assert message in str(info.value)
    assert await store.stream_state("default", stream) is None


async def test_the_writer_queue_is_bounded_in_bytes(db_url: str) -> None:
    limits = WriterLimits(max_pending_bytes=250_000, pipeline_depth=2, commit_timeout=20)
    store = EventStore(StoreConfig(db_url, writer=limits, run_binders=False))
    await store.start()
    body = b"x" * 100_000
    try:
        async with row_locked(db_url, HEAD_LOCK):
            tasks = []
            for _ in range(3):
                # In the database (waiting for the lock), planned behind it, queued.
                tasks.append(asyncio.create_task(store.append(append(unique("b"), ev(
                    body=body)))))
                await asyncio.sleep(0.2)
            held = store.writer.queued_bytes
            assert 200_000 < held <= 250_000
            with pytest.raises(Busy, match="max_pending_bytes"):
                await store.append(append(unique("refused"), ev(body=body)))
            # What still fits is admitted.
            tasks.append(asyncio.create_task(store.append(append(unique("small"), ev(1)))))
            await asyncio.sleep(0.1)
            assert store.writer.queued_bytes > held
            assert store.writer.queued_bytes <= 250_000
        results = await asyncio.gather(*tasks)
        assert len(results) == 4
        assert store.writer.queued_bytes == 0 and store.writer.queue_depth == 0
        # One append larger than the whole budget passes when the queue is empty.
        big = await store.append(append(unique("big"), ev(body=b"y" * 400_000)))
        assert big.first_version == 1
        assert store.writer.queued_bytes == 0
    finally:
        await store.close()
