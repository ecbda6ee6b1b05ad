"""The tailer's memory of recent commits (``Tailer.recent_selected``), without
a database: whatever range a reader asks for and from whichever end of the
memory it is taken, the events are those positions, selected, in order."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from polyport.core.commands import Selector
from polyport.core.events import RecordedEvent
from polyport.core.subscriptions import Tailer

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _event(position: int) -> RecordedEvent:
    return RecordedEvent(position, uuid.UUID(int=position), "default", f"s-{position % 3}",
                         position, "t", {}, b"{}", "application/json", None, AT, "core", 0)


def _tailer(first: int, count: int) -> Tailer:
    tailer = Tailer(None, "")  # type: ignore[arg-type]  # never started: memory only
    for position in range(first, first + count):
        tailer._remember(_event(position))
    tailer.head = first + count - 1
    return tailer


@given(first=st.integers(1, 50), count=st.integers(1, 300), data=st.data())
def test_memory_answers_any_range_as_the_positions_it_holds(
    first: int, count: int, data: st.DataObject,
) -> None:
    tailer = _tailer(first, count)
    head = tailer.head
    after = data.draw(st.integers(first - 1, head), label="after")
    upper = data.draw(st.integers(after, head), label="upper")
    every = Selector(context="default")
    one = Selector(context="default", stream="s-1")
    got = tailer.recent_selected(every, after, upper)
    assert got is not None
    assert [e.position for e in got] == list(range(after + 1, upper + 1))
    some = tailer.recent_selected(one, after, upper)
    assert some is not None
    assert [e.position for e in some] == [
        p for p in range(after + 1, upper + 1) if p % 3 == 1]


@given(first=st.integers(2, 50), count=st.integers(1, 100), back=st.integers(1, 5))
def test_memory_that_does_not_reach_back_answers_none(first: int, count: int,
                                                      back: int) -> None:
    tailer = _tailer(first, count)
    assert tailer.recent_selected(Selector(context="default"), first - 1 - back,
                                  tailer.head) is None
    assert tailer.recent_selected(Selector(context="default"), first - 1,
                                  tailer.head + 1) is None
