"""The chain process's writer (core/chain_writer.py): a batch planned from
the wire form writes exactly what the writer's own planner would, and
everything unusual goes to the writer's usual paths."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyport.core.chain_wire import encode_append
from polyport.core.chain_writer import ChainWriter, WirePlan, plan_wire
from polyport.core.commands import ANY, NO_STREAM, Append, ExactVersion, ProducerCheckpoint
from polyport.core.events import EventData
from polyport.core.planner import Plan, StreamState
from polyport.core.writer import Pending, Writer

_IDS = [uuid.UUID(int=i + 1) for i in range(6)]
_KEYS = [("a", "s1"), ("a", "s2"), ("b", "s1")]

_events = st.builds(
    EventData, type=st.sampled_from(["t", "ünï\"cøde"]), body=st.binary(max_size=12),
    # Mostly fresh ids; sometimes one of a few, to make an id come twice.
    event_id=st.uuids() | st.sampled_from(_IDS),
    headers=st.sampled_from([{}, {"k": "v"}, {"q\"": "\\"}]),
    content_type=st.sampled_from(["application/json", "text/plain"]),
    client_time=st.none() | st.just(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)))


@st.composite
def _append(draw: st.DrawFn) -> Append:
    context, stream = draw(st.sampled_from(_KEYS))
    return Append(
        context=context, stream=stream,
        events=tuple(draw(st.lists(_events, max_size=3))),
        expected=draw(st.sampled_from([ANY, ANY, NO_STREAM]) | st.integers(1, 4).map(
            ExactVersion)),
        origin=draw(st.sampled_from(["bson", "segment"])),
        producer_checkpoint=draw(st.none() | st.builds(
            ProducerCheckpoint, st.sampled_from(_IDS[:2]), st.integers(0, 9))))


def _ids_unique(unit: list[Append]) -> bool:
    # As check_appends (core/limits.py) makes every submitted unit.
    ids = [e.event_id for a in unit for e in a.events]
    return len(ids) == len(set(ids))


_batches = st.lists(st.lists(_append(), min_size=1, max_size=2).filter(_ids_unique),
                    min_size=1, max_size=5)
_caches = st.dictionaries(st.sampled_from(_KEYS), st.builds(
    StreamState, st.integers(1, 3), st.integers(0, 100)), max_size=3)


def _pending(units: list[list[Append]], wire: bool) -> list[Pending]:
    return [Pending((), None, 0, 0, 0.0, wire=[encode_append(a) for a in unit]) if wire  # type: ignore[arg-type]
            else Pending(tuple(unit), None, 0, 0, 0.0)  # type: ignore[arg-type]
            for unit in units]


@given(_batches, _caches)
def test_a_wire_batch_plans_the_statement_the_writer_would(
    units: list[list[Append]], cache: dict[tuple[str, str], StreamState]
) -> None:
    writer = Writer("postgresql://unused")
    writer._streams.update(cache)
    keys = {(a.context, a.stream) for unit in units for a in unit}
    ours = plan_wire(_pending(units, True), writer._streams, keep_rows=True)
    theirs = writer._plan_fast(_pending(units, False), keys)
    ids = [(a.context, e.event_id) for unit in units for a in unit for e in a.events]
    if ours is None:
        # Left to the writer's paths: a check it fails too, an id twice
        # (idempotent or refused, the checked path decides), or no events.
        assert theirs is None or len(set(ids)) < len(ids)
        return
    assert theirs is not None
    assert ours.statement == theirs.statement
    # Byte for byte the same document: the worker's part and the chain's
    # splice make what one process encodes.
    assert ours.args == theirs.args
    assert ours.after == theirs.after
    plan, wire = theirs.plan, ours.plan
    assert isinstance(plan, Plan) and isinstance(wire, WirePlan)
    assert wire.n == len(plan.rows)
    assert wire.outcomes == [[(r.first_version, r.last_version, r.first, r.last) for r in o]
                             for o in plan.outcomes if not isinstance(o, Exception)]
    # The rows a worker with live subscribers gets: the planner's layout.
    assert wire.rows is not None
    assert [[*r[:5], r[5] or {}, *r[6:8], r[9], r[10]] for r in wire.rows] == [
        [r[0].bytes, *r[1:8], r[9], r[10]] for r in plan.rows]


def test_what_the_wire_plan_leaves_to_the_checked_path() -> None:
    def plan(*appends: Append, cache: dict[tuple[str, str], StreamState] | None = None) -> Any:
        return plan_wire(_pending([list(appends)], True), cache or {}, keep_rows=False)

    e = EventData(type="t", body=b"x")
    assert plan(Append("a", "s", (e,), ExactVersion(1))) is not None
    # A failed expected version: the unit fails alone, on the checked path.
    assert plan(Append("a", "s", (e,), ExactVersion(3))) is None
    assert plan(Append("a", "s", (e,), NO_STREAM), cache={("a", "s"): StreamState(2, 9)}) is None
    # An id twice in one batch: an idempotent re-append, or refused.
    assert plan(Append("a", "s", (e,)), Append("a", "t", (e,))) is None
    # Another tenant's event of the same id is another event.
    assert plan(Append("a", "s", (e,)), Append("b", "s", (e,))) is not None
    # Nothing to write.
    assert plan(Append("a", "s", ())) is None


async def test_wire_units_count_against_the_queue_bounds() -> None:
    from polyport.core.errors import Busy
    from polyport.core.writer import WriterLimits

    writer = ChainWriter("postgresql://unused", WriterLimits(max_pending_events=3),
                         on_commit=lambda *a: None, on_wire_commit=lambda *a: None,
                         wants_rows=lambda: False)
    wire = [encode_append(Append("a", "s", (EventData(type="t", body=b"x"),) * 2))]
    fut = writer.enqueue_wire(wire, (1, 10), lambda f: None)
    assert writer.queue_depth == 2 and writer.queued_bytes == 10
    with pytest.raises(Busy):
        writer.enqueue_wire(wire, (1, 10), lambda f: None)
    fut.cancel()
    await asyncio.sleep(0)
