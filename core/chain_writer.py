"""The commit chain's writer, in the chain process or in the worker hosting
the chain: the group commit of core/writer.py, fed units in the form the
workers send them (core/chain_wire.py).

Why.  Every commit of ``serve --workers N`` goes through the one core of
the chain process, so what it spends per event caps the whole gateway.
Decoding each unit into an :class:`~core.commands.Append` and its events,
planning rows of Python objects, encoding them as JSON and building an
:class:`~core.commands.AppendResult` per append only to encode it again
was most of that core (83 % object work, docs/performance.md, session 18).
Here the common batch -- every expected version as cached, no event id
twice -- is planned straight from the wire form: the worker already
encoded each event's part of the fast statement's row document, and the
chain splices in the stream version and the offsets, and answers with the
wire form of the results.

Anything else takes the writer's usual paths, unchanged: the batch's units
are decoded into Appends first (:meth:`ChainWriter._materialize`), so a
failed check, a re-sent event id, a stream another process moved on, a
refused statement or a lost connection are handled exactly as in one
process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from polyport.core.builders import uuid_from_bytes
from polyport.core.chain_wire import decode_append, decode_results, encode_append, us
from polyport.core.commands import Append
from polyport.core.events import SEGMENT_EVENT_HEADER_SIZE, new_event_id
from polyport.core.health import Health
from polyport.core.planner import StreamKey, StreamState
from polyport.core.writer import (
    FastPlan,
    Pending,
    Writer,
    WriterLimits,
    check_room,
    fast_statement,
)

# (base position, first recorded_at in µs, event count, the rows in the
# wire's row layout (core/chain_wire.py, encode_rows) or None)
OnWireCommit = Callable[[int, int, int, list[list[Any]] | None], None]


class WirePlan:
    """A batch planned from the wire form: per unit, per append, (first
    version, last version, first row, last row), rows 1-based in the batch."""

    __slots__ = ("n", "outcomes", "rows")

    def __init__(self, n: int, outcomes: list[list[tuple[int, int, int, int]]],
                 rows: list[list[Any]] | None) -> None:
        self.n = n
        self.outcomes = outcomes
        self.rows = rows


def plan_wire(
    batch: list[Pending], streams: Mapping[StreamKey, StreamState], keep_rows: bool,
) -> FastPlan | None:
    """The fast statement for a batch of wire units planned against the
    cached ``streams``, or None when one of its checks fails or an event id
    comes twice (the checked path decides those).  ``keep_rows``: also
    build the rows in the wire's row layout, for workers with live
    subscribers."""
    states: dict[StreamKey, list[int]] = {}
    fresh: set[StreamKey] = set()  # no events before this batch
    touched: set[StreamKey] = set()
    seen: set[tuple[str, bytes]] = set()
    parts: list[str] = []
    bodies: list[bytes] = []
    rows: list[list[Any]] | None = [] if keep_rows else None
    outcomes: list[list[tuple[int, int, int, int]]] = []
    checkpoints: dict[tuple[bytes, str, str], int] = {}
    index = offset_in_bodies = 0
    for p in batch:
        unit: list[tuple[int, int, int, int]] = []
        assert p.wire is not None
        for context, stream, expected, origin, cp_id, cp_level, tail, events in p.wire:
            key = (context, stream)
            st = states.get(key)
            if st is None:
                known = streams.get(key)
                st = states[key] = [0, 0] if known is None else [known.last_version,
                                                                  known.segment_length]
                if not st[0]:
                    fresh.add(key)
            version, offset = st
            if expected > 0:
                if expected != version + 1:
                    return None
            elif expected == 0 and version:
                return None
            first_version, first_index = version + 1, index + 1
            if events:
                touched.add(key)
            for event in events:
                seen_key = (context, event[0])
                if seen_key in seen:
                    return None
                seen.add(seen_key)
                body = event[2]
                size = len(body)
                version += 1
                index += 1
                parts.append(f"{event[6]}{tail}{version},{offset},{offset_in_bodies},{size}]")
                bodies.append(body)
                if rows is not None:
                    rows.append([event[0], context, stream, version, event[1], event[3], body,
                                 event[4], event[5], origin, offset])
                offset_in_bodies += size
                offset += SEGMENT_EVENT_HEADER_SIZE + size
            st[0] = version
            st[1] = offset
            unit.append((first_version, version, first_index, index))
            if cp_id is not None:
                cp_key = (cp_id, context, stream)
                checkpoints[cp_key] = max(cp_level, checkpoints.get(cp_key, cp_level))
        outcomes.append(unit)
    if not index:
        return None
    # New streams in key order, as the checked path creates them.
    return FastPlan(*_statement(index, parts, bodies, sorted(touched & fresh), checkpoints),
                    {k: StreamState(*states[k]) for k in touched},
                    WirePlan(index, outcomes, rows))


def _statement(
    n: int, parts: list[str], bodies: list[bytes], new: list[StreamKey],
    checkpoints: dict[tuple[bytes, str, str], int],
) -> tuple[str, list[Any], list[Any]]:
    cps = list(checkpoints.items())
    return fast_statement(
        n, "[" + ",".join(parts) + "]", b"".join(bodies), new,
        [uuid_from_bytes(k[0]) for k, _ in cps], [k[1] for k, _ in cps],
        [k[2] for k, _ in cps], [level for _, level in cps])


class ChainWriter(Writer):
    """:class:`~core.writer.Writer` with :meth:`enqueue_wire` (see the
    module docstring).  ``on_wire_commit`` hears of the commits made from
    the wire form, ``on_commit`` of the others, both in commit order.

    ``hosted``: the writer of a worker that hosts the chain
    (``commit_chain = worker``), whose own appends share batches with the
    other workers' units.  Those are encoded too as they are queued (the
    Appends kept), so that a batch of both still plans from the wire form;
    their callers get AppendResults, as from any writer."""

    def __init__(
        self, dsn: str, limits: WriterLimits | None = None, *,
        on_commit: Callable[[int, datetime, list[tuple[Any, ...]]], None],
        on_wire_commit: OnWireCommit, wants_rows: Callable[[], bool],
        health: Health | None = None, hosted: bool = False,
    ) -> None:
        super().__init__(dsn, limits, on_commit=on_commit, health=health)
        self._on_wire_commit = on_wire_commit
        self._wants_rows = wants_rows
        self._hosted = hosted

    def _wire_form(self, appends: Sequence[Append]) -> list[Any] | None:
        return [encode_append(a) for a in appends] if self._hosted else None

    def enqueue_wire(
        self, wire: list[Any], checked: tuple[int, int],
        on_settle: Callable[[asyncio.Future[Any]], None],
    ) -> asyncio.Future[Any]:
        """Queue one unit in its wire form, which a worker checked against
        the same limits (``checked``: its size and cost).  The future gets
        its results in the wire's form, or its error."""
        self._refuse_if_closing()
        n = 0
        for a in wire:
            n += len(a[7])
        size, cost = checked
        check_room(self.limits, self._waiting_events, self._waiting_bytes, n, cost)
        return self._queue_unit((), n, size, cost, False, on_settle, wire)

    def _batch_keys(self, batch: list[Pending]) -> set[tuple[str, str]]:
        keys: set[tuple[str, str]] = set()
        for p in batch:
            if p.wire is not None:
                keys.update((a[0], a[1]) for a in p.wire)
            else:
                keys.update((a.context, a.stream) for a in p.appends)
        return keys

    def _materialize(self, batch: list[Pending]) -> None:
        for p in batch:
            if p.wire is not None:
                if not p.appends:  # a unit that came in its wire form
                    p.appends = tuple([decode_append(a) for a in p.wire])
                p.wire = None

    def _plan_fast(self, batch: list[Pending], keys: set[tuple[str, str]]) -> FastPlan | None:
        if all(p.wire is not None for p in batch):
            fast = plan_wire(batch, self._streams, self._wants_rows())
            if fast is not None:
                return fast
        self._materialize(batch)
        return super()._plan_fast(batch, keys)

    def _finish_fast(
        self, batch: list[Pending], fast: FastPlan, base: int, t0: datetime, slot: int
    ) -> None:
        plan = fast.plan
        if not isinstance(plan, WirePlan):
            super()._finish_fast(batch, fast, base, t0, slot)
            return
        n = plan.n
        self._count_commit(n)
        t0_us = us(t0)
        commit_id = new_event_id().bytes  # as plan_batch draws it
        settle = self._settle[slot]
        for p, unit in zip(batch, plan.outcomes, strict=True):
            if not p.future.done():
                results: list[Any] = [
                    [fv, lv, base + fi, base + li, t0_us + (li - 1 if li > 1 else 0), False,
                     commit_id]
                    for fv, lv, fi, li in unit]
                # A hosting worker's own callers get AppendResults.
                settle.append((p, decode_results(p.appends, results) if p.own else results))
        self._on_wire_commit(base, t0_us, n, plan.rows)
