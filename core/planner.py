"""The group commit's planner: what a batch of appends will write, decided
against known stream states, without the database.

For each pending unit (an ``Append`` or an ``AppendBatch``), in order, it
checks the expected version and recognises re-sent event ids (idempotent
appends, also within the same batch), assigns stream versions and segment
offsets, and builds the rows to insert.  A unit that fails its check fails
alone and leaves no trace in the plan; the units after it plan as if it had
never been submitted.  Positions and recorded times are not known until the
commit takes the head row: rows and results carry 1-based indexes into the
batch instead (:meth:`Planned.resolve`).

The writer plans twice per batch at most: optimistically against its cache of
stream states, then, if that write is refused, against fresh states read
under the head lock.  This module is its hot path: keep per-event work out.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from polyport.core.commands import (
    AnyVersion,
    Append,
    AppendResult,
    ExactVersion,
    NoStream,
    build_append_result,
)
from polyport.core.errors import Malformed, PolyportError, WrongExpectedVersion
from polyport.core.events import RecordedEvent, new_event_id

ONE_MICROSECOND = timedelta(microseconds=1)

StreamKey = tuple[str, str]  # (context, stream)
# An event id is unique within its context (its tenant), not across them.
EventKey = tuple[str, uuid.UUID]  # (context, event id)


class PlanUnit(Protocol):
    """One submitted unit (the writer's queue entry; an ``AppendBatch`` fits
    too): its appends succeed or fail together."""

    @property
    def appends(self) -> Sequence[Append]: ...


@dataclass
class StreamState:
    """A stream as its last event left it; version 0: no events, no stream."""

    last_version: int = 0
    segment_length: int = 0

    def copy(self) -> StreamState:
        return StreamState(self.last_version, self.segment_length)


# Every event without headers shares this one (never mutated) in its row.
_NO_HEADERS: dict[str, str] = {}


class Planned(NamedTuple):
    """An append result before the batch's base position and time are known:
    ``first``/``last`` are 1-based indexes into the batch's rows, or the final
    values when ``done`` (an idempotent re-append).  A NamedTuple: one is
    built per append on the hot path, several times cheaper than a frozen
    dataclass."""

    context: str
    stream: str
    first_version: int
    last_version: int
    first: int
    last: int
    commit_id: uuid.UUID
    done: AppendResult | None = None
    idempotent: bool = False

    def resolve(self, base: int, t0: datetime) -> AppendResult:
        if self.done is not None:
            return self.done
        return build_append_result(
            self.context, self.stream, self.first_version, self.last_version,
            base + self.first, base + self.last,
            t0 + (max(self.last, 1) - 1) * ONE_MICROSECOND, self.commit_id, self.idempotent,
        )


@dataclass
class Plan:
    # Rows without position and recorded_at: event_id, context, stream, version,
    # type, headers, body, content_type, client_time, origin, segment_offset.
    rows: list[tuple[Any, ...]]
    outcomes: list[list[Planned] | PolyportError]
    before: dict[StreamKey, StreamState]
    after: dict[StreamKey, StreamState]
    touched: set[StreamKey]
    checkpoints: list[tuple[uuid.UUID, str, str, int]]
    any_failed: bool

    def new_streams(self) -> list[StreamKey]:
        """Streams this batch creates (no events before it), in key order."""
        return sorted(k for k in self.touched if not self.before[k].last_version)


def plan_batch(
    batch: Sequence[PlanUnit],
    state: dict[StreamKey, StreamState],
    existing: dict[EventKey, RecordedEvent],
) -> Plan:
    """Decide each unit's fate, in order (pure; no I/O).

    ``state`` holds every stream the batch names (``StreamState()`` for one
    without events); it is only read.  ``existing`` holds the already
    recorded events among the batch's event ids, for idempotent re-appends,
    by (context, event id): an id is its tenant's own.
    """
    # ``state`` is only read: ``after`` holds copies, made when a stream is
    # first touched.
    before = state
    after: dict[StreamKey, StreamState] = {}
    rows: list[tuple[Any, ...]] = []
    outcomes: list[list[Planned] | PolyportError] = []
    touched: set[StreamKey] = set()
    checkpoints: list[tuple[uuid.UUID, str, str, int]] = []
    seen: dict[EventKey, RecordedEvent | _Earlier] = dict(existing)
    any_failed = False
    # Drawn like event ids (core/events.py): uuid4() is a system call each,
    # once per commit, which is once per event at low rates (W3).
    commit_id = new_event_id()
    for p in batch:
        trial = _trial_states(p, before, after)
        trial_rows: list[tuple[Any, ...]] = []
        outcome = _plan_unit(p, trial, len(rows), trial_rows, seen, commit_id)
        if isinstance(outcome, PolyportError):
            outcomes.append(outcome)
            any_failed = True
            continue
        after.update(trial)
        rows.extend(trial_rows)
        for a in p.appends:
            if a.events:
                touched.add((a.context, a.stream))
            if a.producer_checkpoint is not None:
                checkpoints.append(
                    (a.producer_checkpoint.producer_id, a.context, a.stream,
                     a.producer_checkpoint.ack_level)
                )
        outcomes.append(outcome)
    return Plan(rows, outcomes, before, after, touched, _one_per_stream(checkpoints), any_failed)


def _trial_states(
    p: PlanUnit, before: dict[StreamKey, StreamState], after: dict[StreamKey, StreamState]
) -> dict[StreamKey, StreamState]:
    """Copies of the states of the streams one unit names, as the units
    before it left them.  Copy-on-write: only the streams this unit touches
    are copied."""
    trial: dict[StreamKey, StreamState] = {}
    for a in p.appends:
        k = (a.context, a.stream)
        if k not in trial:
            trial[k] = (after.get(k) or before[k]).copy()
    return trial


def _plan_unit(
    p: PlanUnit,
    trial: dict[StreamKey, StreamState],
    planned_rows: int,
    trial_rows: list[tuple[Any, ...]],
    seen: dict[EventKey, RecordedEvent | _Earlier],
    commit_id: uuid.UUID,
) -> list[Planned] | PolyportError:
    """One unit's appends, planned against ``trial`` (moved past them) after
    the batch's first ``planned_rows`` rows, their rows added to
    ``trial_rows``: their results, or the error that fails the unit, which
    then leaves none of its events in ``seen``."""
    planned: list[Planned] = []
    added: list[EventKey] = []
    error: PolyportError | None = None
    for a in p.appends:
        st = trial[(a.context, a.stream)]
        match = _idempotent_match(a, seen)
        if isinstance(match, PolyportError):
            error = match
            break
        if match is not None:
            planned.append(_idempotent_planned(a, match, commit_id))
            continue
        error = _check_expected(a, st.last_version)
        if error is not None:
            break
        index = planned_rows + len(trial_rows)
        planned.append(_plan_append(a, st, index, trial_rows, seen, added, commit_id))
    if error is not None:
        for event_key in added:
            del seen[event_key]
        return error
    return planned


def _plan_append(
    a: Append,
    st: StreamState,
    index: int,
    trial_rows: list[tuple[Any, ...]],
    seen: dict[EventKey, RecordedEvent | _Earlier],
    added: list[EventKey],
    commit_id: uuid.UUID,
) -> Planned:
    """The rows of one append's events, after the batch's first ``index``
    rows; its stream's state ``st`` moves past them."""
    context, stream = a.context, a.stream
    version, offset = st.last_version, st.segment_length
    first_version, first_index = version + 1, index + 1
    for e in a.events:
        version += 1
        index += 1
        event_id = e.event_id
        trial_rows.append(
            (
                event_id,
                context,
                stream,
                version,
                e.type,
                dict(e.headers) if e.headers else _NO_HEADERS,
                e.body,
                e.content_type,
                e.client_time,
                a.origin,
                offset,
            )
        )
        seen[(context, event_id)] = _new_earlier((event_id, context, stream, version, index))
        added.append((context, event_id))
        offset += e.segment_size
    st.last_version, st.segment_length = version, offset
    return _new_planned(
        (context, stream, first_version, version, first_index, index, commit_id, None, False))


def _one_per_stream(
    checkpoints: list[tuple[uuid.UUID, str, str, int]],
) -> list[tuple[uuid.UUID, str, str, int]]:
    """One row per (producer, stream), at its highest level: an upsert may
    not touch a row twice."""
    highest: dict[tuple[uuid.UUID, str, str], int] = {}
    for producer, context, stream, level in checkpoints:
        key = (producer, context, stream)
        highest[key] = max(level, highest.get(key, level))
    return [(*k, v) for k, v in highest.items()]


class _Earlier(NamedTuple):
    """An event written earlier in this same batch (``position`` is its
    1-based row index), so a duplicate append later in the batch is
    recognised as idempotent."""

    event_id: uuid.UUID
    context: str
    stream: str
    version: int
    position: int


# A NamedTuple's constructor is a Python function (a lambda that calls
# tuple.__new__); on the hot path, with every field given, call tuple.__new__
# directly: one Planned per append and one _Earlier per event.
_new_planned = functools.partial(tuple.__new__, Planned)
_new_earlier = functools.partial(tuple.__new__, _Earlier)


def _check_expected(a: Append, current: int) -> WrongExpectedVersion | None:
    exp = a.expected
    if isinstance(exp, AnyVersion):
        return None
    if isinstance(exp, NoStream):
        if current == 0:
            return None
        return WrongExpectedVersion(
            f"stream {a.stream!r} already exists (last version {current})",
            current_version=current,
        )
    if isinstance(exp, ExactVersion):
        if exp.next_version == current + 1:
            return None
        return WrongExpectedVersion(
            f"stream {a.stream!r}: expected the first new event to be version "
            f"{exp.next_version}, but the next version is {current + 1}",
            current_version=current,
        )
    raise Malformed(f"unknown expected version {exp!r}")


def _idempotent_match(
    a: Append, seen: dict[EventKey, RecordedEvent | _Earlier]
) -> list[RecordedEvent | _Earlier] | PolyportError | None:
    """None: none of the ids appended before in this context.  The earlier
    records: all of them appended before, to this stream.  An error: only
    some, or to another stream of the context."""
    context = a.context
    for e in a.events:
        if (context, e.event_id) in seen:
            break
    else:
        return None  # the common case, kept cheap
    found = [seen.get((context, e.event_id)) for e in a.events]
    if any(f is None for f in found):
        return WrongExpectedVersion(
            "some of these event ids were already appended and others were not; "
            "re-send exactly the original append"
        )
    recs = [f for f in found if f is not None]
    if any(r.context != a.context or r.stream != a.stream for r in recs):
        return WrongExpectedVersion(
            f"event id {recs[0].event_id} was already appended to another stream"
        )
    earlier = sum(isinstance(r, _Earlier) for r in recs)
    if earlier and earlier != len(recs):
        return WrongExpectedVersion(
            "these event ids were appended by different earlier appends; "
            "re-send exactly the original append"
        )
    return recs


def _idempotent_planned(
    a: Append, recs: list[RecordedEvent | _Earlier], commit_id: uuid.UUID
) -> Planned:
    first, last = recs[0], recs[-1]
    if isinstance(first, _Earlier) or isinstance(last, _Earlier):
        # Written earlier in this same batch (never mixed: see _idempotent_match).
        return Planned(a.context, a.stream, first.version, last.version,
                        first.position, last.position, commit_id, idempotent=True)
    return Planned(
        a.context, a.stream, 0, 0, 0, 0, commit_id,
        AppendResult(
            context=a.context,
            stream=a.stream,
            first_version=first.version,
            last_version=last.version,
            first_position=first.position,
            last_position=last.position,
            recorded_at=last.recorded_at,
            commit_id=commit_id,
            idempotent=True,
        ),
    )
