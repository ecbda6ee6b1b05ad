"""Small builders shared by core tests."""

from __future__ import annotations

import uuid

from polyport.core.commands import ANY, Append, Expected
from polyport.core.events import EventData


def ev(n: int = 0, *, type: str = "thing-happened", body: bytes | None = None) -> EventData:
    return EventData(type=type, body=body if body is not None else f'{{"n": {n}}}'.encode(),
                     content_type="application/json")


def append(stream: str, *events: EventData, expected: Expected = ANY,
           context: str = "default") -> Append:
    return Append(context=context, stream=stream, events=tuple(events) or (ev(),),
                  expected=expected)


def unique(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
