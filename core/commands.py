"""Canonical commands and their results.

Adapters translate protocol frames into these and call the matching
``EventStore`` method.  They are plain values: building one never touches the
database.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from polyport.core.builders import frozen_builder
from polyport.core.events import EventData, RecordedEvent

# --- expected version -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnyVersion:
    """No concurrency check."""


@dataclass(frozen=True, slots=True)
class NoStream:
    """The stream must not exist yet (its first event gets version 1)."""


@dataclass(frozen=True, slots=True)
class ExactVersion:
    """The first appended event must get exactly ``next_version``
    (so the stream's current last version is ``next_version - 1``)."""

    next_version: int


Expected = AnyVersion | NoStream | ExactVersion
ANY = AnyVersion()
NO_STREAM = NoStream()

# --- appends ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProducerCheckpoint:
    """Exactly-once bookkeeping committed in the same transaction as an append:
    the highest offset a producer (e.g. a segment-wire ConnectionId) has had
    stored in this stream."""

    producer_id: uuid.UUID
    ack_level: int


@dataclass(frozen=True, slots=True)
class Append:
    context: str
    stream: str
    events: tuple[EventData, ...]
    expected: Expected = ANY
    origin: str = "core"
    producer_checkpoint: ProducerCheckpoint | None = None


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """Several appends committed atomically: all or none."""

    appends: tuple[Append, ...]


@dataclass(frozen=True, slots=True)
class AppendResult:
    context: str
    stream: str
    first_version: int
    last_version: int
    first_position: int
    last_position: int
    recorded_at: datetime
    commit_id: uuid.UUID
    # True when every event id had already been appended: nothing new written.
    idempotent: bool = False


# Without __init__ (core/builders.py): one result per append of every commit,
# and the appends and results the commit chain decodes.
build_append = frozen_builder(Append)
build_append_result = frozen_builder(AppendResult)


# --- reads ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadStream:
    context: str
    stream: str
    from_version: int = 1
    max_count: int = 1000


@dataclass(frozen=True, slots=True)
class ReadSegment:
    """Bytes of a stream's segment view: each event framed as a segment-wire
    EVENT command, offsets counting those framed bytes."""

    context: str
    stream: str
    offset: int
    max_bytes: int = 1 << 20
    # The caller holds a read at the tail for the stream's next event
    # (segment_read_wait): the answer may then come from the tailer's
    # memory, as of its head (an empty one with head_position there).  An
    # event another gateway committed and this one has not heard of yet
    # comes through the wait rather than through this answer; a read that
    # is not held asks the database, whose snapshot has every commit.
    held: bool = False


@dataclass(frozen=True, slots=True)
class SegmentChunk:
    offset: int
    data: bytes
    at_tail: bool
    # Offset one past the data returned; the segment's current length is tail_offset.
    end_offset: int
    tail_offset: int
    # The log's last position when tail_offset was read, on every empty
    # chunk (None on the others): the stream's next event comes after it.
    head_position: int | None = None


# --- subscriptions ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FromBeginning:
    pass


@dataclass(frozen=True, slots=True)
class FromEnd:
    pass


@dataclass(frozen=True, slots=True)
class FromPosition:
    """Deliver events with position > ``position`` (0 = everything)."""

    position: int


@dataclass(frozen=True, slots=True)
class FromVersion:
    """For an exact-stream subscription: deliver from this stream version on."""

    version: int


@dataclass(frozen=True, slots=True)
class FromTime:
    """Deliver events recorded at or after ``time``."""

    time: datetime


Start = FromBeginning | FromEnd | FromPosition | FromVersion | FromTime
BEGINNING = FromBeginning()
END = FromEnd()

EventMatcher = Callable[[RecordedEvent], bool]


@dataclass(frozen=True, slots=True)
class Selector:
    """Which events a subscription sees.

    ``context`` None means every context.  ``stream`` is an exact stream name,
    ``prefix`` a stream-name prefix; neither means every stream.  ``types``
    empty means every type.  ``matcher`` is any predicate (e.g. a compiled
    MongoDB-subset query from :mod:`core.matcher`); ``matcher_spec`` keeps its
    JSON-able source so a durable subscription can be persisted.
    """

    context: str | None
    stream: str | None = None
    prefix: str | None = None
    types: frozenset[str] = frozenset()
    matcher: EventMatcher | None = field(default=None, compare=False)
    matcher_spec: dict[str, Any] | None = field(default=None, compare=False)

    def matches(self, event: RecordedEvent) -> bool:
        if self.context is not None and event.context != self.context:
            return False
        if self.stream is not None and event.stream != self.stream:
            return False
        if self.prefix is not None and not event.stream.startswith(self.prefix):
            return False
        if self.types and event.type not in self.types:
            return False
        return self.matcher is None or bool(self.matcher(event))


@dataclass(frozen=True, slots=True)
class Subscribe:
    selector: Selector
    start: Start = END
    # A durable name makes the subscription's checkpoint persistent; several
    # live subscribers with the same durable name form a consumer group, each
    # event going to one of them.
    durable: str | None = None
    buffer_size: int = 1000


# --- auth -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection acts as.  ``contexts`` None means every context."""

    user: str | None
    default_context: str
    contexts: frozenset[str] | None

    def may_use(self, context: str) -> bool:
        return self.contexts is None or context in self.contexts
