"""Events: what a client proposes (``EventData``) and what the log holds
(``RecordedEvent``)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

from polyport.core.builders import frozen_builder, uuid_from_int

# Each event in a stream's segment view is framed as a segment-wire EVENT
# command: type (i32) + length (u32) + body.  Offsets count these bytes.
SEGMENT_EVENT_HEADER_SIZE = 8

DEFAULT_CONTEXT = "default"
DEFAULT_CONTENT_TYPE = "application/octet-stream"


# Fresh event ids are drawn from the OS's random source 256 at a time: a
# uuid4() per event was a getrandom system call each (~6 % of the gateway's
# W1 samples, where system calls are dear).  The bytes are the same CSPRNG's;
# a forked child drops what it inherited, so no two processes share ids.
_ID_BYTES = 16 * 256
# What uuid.UUID(version=4) does to the random bits (RFC 4122 variant and
# version), precomputed.
_V4_MASK = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 128) - 1)
_V4_BITS = (0x8000 << 48) | (4 << 76)


class _RandomIds:
    def __init__(self) -> None:
        self._random = b""
        self._taken = _ID_BYTES
        # Threads (an executor, the pipeline) must never take the same slice.
        self._lock = threading.Lock()

    def take(self) -> uuid.UUID:
        with self._lock:
            if self._taken >= _ID_BYTES:
                self._random = os.urandom(_ID_BYTES)
                self._taken = 0
            start = self._taken
            self._taken = start + 16
            chunk = self._random[start:start + 16]
        return uuid_from_int((int.from_bytes(chunk) & _V4_MASK) | _V4_BITS)

    def forget(self) -> None:
        self._random = b""
        self._taken = _ID_BYTES
        self._lock = threading.Lock()  # a fork may have copied it held


_ids = _RandomIds()
os.register_at_fork(after_in_child=_ids.forget)


def new_event_id() -> uuid.UUID:
    """A random (version 4) UUID, as ``uuid.uuid4()``."""
    return _ids.take()


def _frozen_headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(headers or {}))


@dataclass(frozen=True, slots=True)
class EventData:
    """An event proposed for appending.  ``event_id`` is the idempotency key:
    appending the same ids to the same stream again succeeds without writing."""

    type: str
    body: bytes
    event_id: uuid.UUID = field(default_factory=new_event_id)
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


# Without __init__, for values already in the kept form (core/builders.py):
# the commit chain's decoded events (headers frozen, bodies bytes, times UTC),
# and every event read or fed live.
build_event_data = frozen_builder(EventData)
build_recorded_event = frozen_builder(RecordedEvent)

# The headers of every event proposed without any: nothing can change it.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def event_data(
    type: str, body: bytes, event_id: uuid.UUID, content_type: str = DEFAULT_CONTENT_TYPE,
    headers: Mapping[str, str] | None = None, client_time: datetime | None = None,
) -> EventData:
    """``EventData(...)`` with the same fields, for a protocol's path that
    proposes one per event: the values are put in the kept form here and
    the instance built without ``__init__``, whose keywords, ``__post_init__``
    and ``object.__setattr__`` calls were 2-3 % of a worker's W1 CPU.  An
    event without headers shares :data:`NO_HEADERS`."""
    if not isinstance(body, bytes):
        body = bytes(body)
    if client_time is not None and client_time.tzinfo is None:
        client_time = client_time.replace(tzinfo=UTC)
    return build_event_data(type, body, event_id,
                            _frozen_headers(headers) if headers else NO_HEADERS,
                            content_type, client_time)
