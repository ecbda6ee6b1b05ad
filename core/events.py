"""Events: what a client proposes (``EventData``) and what the log holds
(``RecordedEvent``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

# Each event in a stream's segment view is framed as a segment-wire EVENT
# command: type (i32) + length (u32) + body.  Offsets count these bytes.
SEGMENT_EVENT_HEADER_SIZE = 8

DEFAULT_CONTEXT = "default"
DEFAULT_CONTENT_TYPE = "application/octet-stream"


def _frozen_headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(headers or {}))


@dataclass(frozen=True, slots=True)
class EventData:
    """An event proposed for appending.  ``event_id`` is the idempotency key:
    appending the same ids to the same stream again succeeds without writing."""

    type: str
    body: bytes
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = DEFAULT_CONTENT_TYPE
    client_time: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", _frozen_headers(self.headers))
        if not isinstance(self.body, bytes):
            object.__setattr__(self, "body", bytes(self.body))
        # A client time without a zone is UTC (the database driver would
        # otherwise read it as the server machine's local time).
        ct = self.client_time
        if ct is not None and ct.tzinfo is None:
            object.__setattr__(self, "client_time", ct.replace(tzinfo=UTC))

    @property
    def segment_size(self) -> int:
        return SEGMENT_EVENT_HEADER_SIZE + len(self.body)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as committed: immutable, positioned, readable by every protocol."""

    position: int
    event_id: uuid.UUID
    context: str
    stream: str
    version: int
    type: str
    headers: Mapping[str, str]
    body: bytes
    content_type: str
    client_time: datetime | None
    recorded_at: datetime
    origin: str
    segment_offset: int

    @property
    def segment_size(self) -> int:
        return SEGMENT_EVENT_HEADER_SIZE + len(self.body)

    @property
    def recorded_at_ms(self) -> int:
        return int(self.recorded_at.timestamp() * 1000)
