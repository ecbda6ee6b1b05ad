"""The group commit's planner, without a database: random batches of appends
against random stream states, checked against a plain sequential model."""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from polyport.core import sql
from polyport.core.commands import (
    ANY,
    NO_STREAM,
    Append,
    AppendBatch,
    AppendResult,
    ExactVersion,
    NoStream,
    ProducerCheckpoint,
)
from polyport.core.errors import PolyportError, WrongExpectedVersion
from polyport.core.events import EventData, RecordedEvent
from polyport.core.planner import ONE_MICROSECOND, Plan, Planned, StreamState, plan_batch
from polyport.core.records import record_from_row
from polyport.core.segments import segment_frame

KEYS = [("c1", "a"), ("c1", "b"), ("c2", "a")]
PRODUCERS = [uuid.UUID(int=1), uuid.UUID(int=2)]
BASE = 1000
T0 = datetime(2024, 5, 1, 12, tzinfo=UTC)

Key = tuple[str, str]


@st.composite
def batches(draw: st.DrawFn, min_events: int = 0) -> list[AppendBatch]:
    """Units of one to three appends; every event id is new."""
    ids = iter(range(1, 1_000_000))
    units = []
    for _ in range(draw(st.integers(1, 8))):
        appends = []
        for _ in range(draw(st.integers(1, 3))):
            context, stream = draw(st.sampled_from(KEYS))
            events = tuple(
                EventData("t", draw(st.binary(max_size=24)), event_id=uuid.UUID(int=next(ids)))
                for _ in range(draw(st.integers(min_events, 4)))
            )
            expected = draw(
                st.one_of(st.just(ANY), st.just(NO_STREAM),
                          st.builds(ExactVersion, st.integers(1, 8)))
            )
            checkpoint = draw(
                st.none()
                | st.builds(ProducerCheckpoint, st.sampled_from(PRODUCERS), st.integers(0, 50))
            )
            appends.append(Append(context, stream, events, expected,
                                  producer_checkpoint=checkpoint))
        units.append(AppendBatch(tuple(appends)))
    return units


@st.composite
def states(draw: st.DrawFn) -> dict[Key, StreamState]:
    out = {}
    for k in KEYS:
        version = draw(st.integers(0, 4))
        out[k] = StreamState(version, draw(st.integers(0, 500)) if version else 0)
    return out


def model(units: Sequence[AppendBatch], initial: dict[Key, StreamState]) -> list[bool]:
    """Which units pass their expected-version checks, one after another, each
    seeing what the units before it wrote (none of the units re-sends ids)."""
    versions = {k: s.last_version for k, s in initial.items()}
    passed = []
    for unit in units:
        trial = dict(versions)
        ok = True
        for a in unit.appends:
            current = trial[(a.context, a.stream)]
            if isinstance(a.expected, NoStream) and current != 0:
                ok = False
            if isinstance(a.expected, ExactVersion) and a.expected.next_version != current + 1:
                ok = False
            if not ok:
                break
            trial[(a.context, a.stream)] = current + len(a.events)
        passed.append(ok)
        if ok:
            versions = trial
    return passed


def recorded(plan: Plan) -> dict[tuple[str, uuid.UUID], RecordedEvent]:
    """The plan's rows as the checked commit path stores them, at BASE/T0,
    by (context, event id) as the writer looks them up."""
    out = {}
    for i, r in enumerate(plan.rows):
        values = (BASE + i + 1, *r[:9], T0 + i * ONE_MICROSECOND, r[9], r[10])
        ev = record_from_row(dict(zip(sql.EVENT_COLUMNS, values, strict=True)))
        out[(ev.context, ev.event_id)] = ev
    return out


def results(plan: Plan) -> list[list[AppendResult] | PolyportError]:
    return [
        o if isinstance(o, PolyportError) else [p.resolve(BASE, T0) for p in o]
        for o in plan.outcomes
    ]


def final_states(plan: Plan, initial: dict[Key, StreamState]) -> dict[Key, StreamState]:
    return {k: plan.after.get(k, s) for k, s in initial.items()}


@settings(max_examples=200, deadline=None)
@given(units=batches(), initial=states())
def test_plan_follows_the_sequential_model(
    units: list[AppendBatch], initial: dict[Key, StreamState]
) -> None:
    untouched = copy.deepcopy(initial)
    plan = plan_batch(units, initial, {})
    passed = model(units, initial)
    assert initial == untouched  # the state handed in is only read

    for outcome, ok in zip(plan.outcomes, passed, strict=True):
        assert isinstance(outcome, list) == ok
        if not ok:
            assert isinstance(outcome, WrongExpectedVersion)
    assert plan.any_failed == (not all(passed))

    # The rows: every event of the passing units, in submission order.
    kept = [u for u, ok in zip(units, passed, strict=True) if ok]
    assert [r[0] for r in plan.rows] == [e.event_id for u in kept for a in u.appends
                                         for e in a.events]

    # Per stream: versions continue gaplessly from the state handed in, and
    # segment offsets advance by each event's framed size (an EVENT command).
    rows = recorded(plan)
    final = final_states(plan, initial)
    for k in KEYS:
        mine = [rows[(r[1], r[0])] for r in plan.rows if (r[1], r[2]) == k]
        start = initial[k]
        assert [e.version for e in mine] == list(
            range(start.last_version + 1, start.last_version + 1 + len(mine))
        )
        offset = start.segment_length
        for e in mine:
            assert e.segment_offset == offset
            offset += len(segment_frame(e))
        assert (final[k].last_version, final[k].segment_length) == (
            start.last_version + len(mine), offset)
    assert plan.new_streams() == sorted(
        {(r[1], r[2]) for r in plan.rows} - {k for k in KEYS if initial[k].last_version}
    )

    # Each result names exactly its own events: versions and positions.
    by_position = {e.position: e for e in rows.values()}
    for unit, outcome in zip(units, results(plan), strict=True):
        if isinstance(outcome, PolyportError):
            continue
        for a, res in zip(unit.appends, outcome, strict=True):
            assert (res.context, res.stream, res.idempotent) == (a.context, a.stream, False)
            assert res.last_version - res.first_version + 1 == len(a.events)
            assert res.last_position - res.first_position + 1 == len(a.events)
            got = [by_position[p] for p in range(res.first_position, res.last_position + 1)]
            assert [e.event_id for e in got] == [e.event_id for e in a.events]
            assert [e.version for e in got] == list(
                range(res.first_version, res.last_version + 1))
            if got:
                assert res.recorded_at == got[-1].recorded_at

    # One producer checkpoint per (producer, stream): the highest passing level.
    highest: dict[tuple[Any, ...], int] = {}
    for u in kept:
        for a in u.appends:
            cp = a.producer_checkpoint
            if cp is not None:
                key = (cp.producer_id, a.context, a.stream)
                highest[key] = max(cp.ack_level, highest.get(key, cp.ack_level))
    assert {c[:3]: c[3] for c in plan.checkpoints} == highest
    assert len(plan.checkpoints) == len(highest)


@settings(max_examples=200, deadline=None)
@given(units=batches(), initial=states())
def test_a_failing_unit_leaves_no_trace(
    units: list[AppendBatch], initial: dict[Key, StreamState]
) -> None:
    plan = plan_batch(units, initial, {})
    passing = [u for u, o in zip(units, plan.outcomes, strict=True)
               if not isinstance(o, PolyportError)]
    alone = plan_batch(passing, initial, {})
    assert not alone.any_failed
    assert alone.rows == plan.rows
    assert final_states(alone, initial) == final_states(plan, initial)
    assert alone.checkpoints == plan.checkpoints

    # Its event ids are not taken either: retried later in the same batch
    # (without the check that failed), it is a fresh append, not a resend.
    retries = [AppendBatch(tuple(dataclasses.replace(a, expected=ANY) for a in u.appends))
               for u, o in zip(units, plan.outcomes, strict=True)
               if isinstance(o, PolyportError)]
    retried = plan_batch([*units, *retries], initial, {})
    assert retried.rows == plan_batch([*passing, *retries], initial, {}).rows
    for outcome in retried.outcomes[len(units):]:
        assert isinstance(outcome, list)
        assert not any(p.idempotent for p in outcome)


@settings(max_examples=100, deadline=None)
@given(units=batches(min_events=1), initial=states())
def test_resending_committed_units_writes_nothing_and_repeats_their_results(
    units: list[AppendBatch], initial: dict[Key, StreamState]
) -> None:
    plan = plan_batch(units, initial, {})
    committed = [(u, r) for u, r in zip(units, results(plan), strict=True)
                 if not isinstance(r, PolyportError)]
    # The same units again, in a later commit that sees the first one's
    # events and stream states (their expected versions no longer hold).
    again = plan_batch([u for u, _ in committed], final_states(plan, initial), recorded(plan))
    assert again.rows == []
    assert not again.any_failed
    for (_, first), outcome in zip(committed, again.outcomes, strict=True):
        assert isinstance(outcome, list)
        repeat = [p.resolve(BASE + 500, T0) for p in outcome]
        assert repeat == [dataclasses.replace(r, commit_id=repeat[0].commit_id, idempotent=True)
                          for r in first]


@settings(max_examples=100, deadline=None)
@given(units=batches(min_events=1), initial=states(), data=st.data())
def test_a_resend_later_in_the_same_batch_matches_the_first(
    units: list[AppendBatch], initial: dict[Key, StreamState], data: st.DataObject
) -> None:
    passed = model(units, initial)
    ok = [i for i, p in enumerate(passed) if p]
    resent = data.draw(st.lists(st.sampled_from(ok), max_size=4)) if ok else []
    plan = plan_batch([*units, *(units[i] for i in resent)], initial, {})
    alone = plan_batch(units, initial, {})
    assert plan.rows == alone.rows
    got = results(plan)
    for i, outcome in zip(resent, got[len(units):], strict=True):
        first = got[i]
        assert isinstance(first, list) and isinstance(outcome, list)
        assert outcome == [dataclasses.replace(r, idempotent=True) for r in first]


@settings(max_examples=100, deadline=None)
@given(units=batches(min_events=1), initial=states(), data=st.data())
def test_a_resend_that_does_not_match_exactly_fails_alone(
    units: list[AppendBatch], initial: dict[Key, StreamState], data: st.DataObject
) -> None:
    passed = model(units, initial)
    earlier = [a for u, ok in zip(units, passed, strict=True) if ok for a in u.appends]
    assume(earlier)
    a = data.draw(st.sampled_from(earlier))
    # Ids are a context's own: another stream of the same context.
    others = [k for k in KEYS if k[0] == a.context and k != (a.context, a.stream)]
    if not others or data.draw(st.booleans()):
        # Its events and one more: only some of the ids were appended before.
        fresh = EventData("t", b"new", event_id=uuid.uuid4())
        bad = dataclasses.replace(a, events=(*a.events, fresh))
    else:
        # The same events to another stream.
        context, stream = data.draw(st.sampled_from(others))
        bad = dataclasses.replace(a, context=context, stream=stream)
    after = AppendBatch((Append("c1", "late", (EventData("t", b"late"),)),))
    state = {**initial, ("c1", "late"): StreamState()}
    plan = plan_batch([*units, AppendBatch((bad,)), after], state, {})
    assert isinstance(plan.outcomes[len(units)], WrongExpectedVersion)
    assert isinstance(plan.outcomes[-1], list)
    assert plan.rows == plan_batch([*units, after], state, {}).rows


def test_the_same_ids_in_another_context_are_new_events() -> None:
    """An event id is its context's own: another tenant's append with the
    same ids is neither a resend nor a conflict, committed or in this batch."""
    mine = Append("c1", "a", (EventData("t", b"1"), EventData("t", b"2")))
    theirs = dataclasses.replace(mine, context="c2")
    state = {("c1", "a"): StreamState(), ("c2", "a"): StreamState()}
    plan = plan_batch([AppendBatch((mine,)), AppendBatch((theirs,))], state, {})
    assert [isinstance(o, list) for o in plan.outcomes] == [True, True]
    assert [(r[1], r[3]) for r in plan.rows] == [("c1", 1), ("c1", 2), ("c2", 1), ("c2", 2)]
    committed = plan_batch([AppendBatch((mine,))], state, {})
    again = plan_batch([AppendBatch((theirs,))], final_states(committed, state),
                       recorded(committed))
    [[result]] = again.outcomes
    assert not result.idempotent and [r[1] for r in again.rows] == ["c2", "c2"]


def test_a_resend_mixing_committed_ids_with_ids_from_this_batch_fails() -> None:
    committed = Append("c1", "a", (EventData("t", b"1"),))
    first = plan_batch([AppendBatch((committed,))], {("c1", "a"): StreamState()}, {})
    fresh = Append("c1", "a", (EventData("t", b"2"),))
    mixed = Append("c1", "a", (*committed.events, *fresh.events))
    plan = plan_batch([AppendBatch((fresh,)), AppendBatch((mixed,))],
                      final_states(first, {("c1", "a"): StreamState()}), recorded(first))
    assert isinstance(plan.outcomes[0], list)
    assert isinstance(plan.outcomes[1], WrongExpectedVersion)
    assert [r[0] for r in plan.rows] == [fresh.events[0].event_id]


def test_planned_resolves_against_the_commits_base_and_time() -> None:
    commit = uuid.uuid4()
    planned = Planned("c", "s", 3, 5, 2, 4, commit)
    assert planned.resolve(100, T0) == AppendResult(
        "c", "s", 3, 5, 102, 104, T0 + 3 * ONE_MICROSECOND, commit)
