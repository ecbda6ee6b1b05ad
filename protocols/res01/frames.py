"""Res01 messages as typed values.

A Res01 message is one ZeroMQ multipart message: a list of frames.  Each
dataclass below is the part after the envelope (routing frames, empty
delimiter, protocol, command, request id); ``command`` names its command frame.
Every request and response carries the client's ``request_id`` (opaque bytes,
echoed verbatim) and ``protocol`` (the protocol frame the client used, echoed
back in the reply).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Final

DEFAULT_PORT: Final = 5560
# polyport's name for the protocol (listener, metrics, event origin).
PROTOCOL: Final = "res01"

PROTOCOL_FRAME: Final = "Res01"
# The original .NET client sends "RC0.1" (its ResProtocol.ResClient01).
PROTOCOL_RC01: Final = "RC0.1"
ACCEPTED_PROTOCOLS: Final = frozenset({PROTOCOL_FRAME, PROTOCOL_RC01})

# Command frames.
CMD_APPEND_COMMIT: Final = b"AC"
CMD_REGISTER_SUBSCRIPTIONS: Final = b"RS"
CMD_FETCH_EVENTS: Final = b"FE"
CMD_PROGRESS_SUBSCRIPTIONS: Final = b"PS"
CMD_SET_SUBSCRIPTION: Final = b"SS"
CMD_COMMIT_RESULT: Final = b"CR"
CMD_SUBSCRIBE_RESULT: Final = b"SR"
CMD_EVENTS_FETCHED: Final = b"EF"
CMD_SUBSCRIPTION_PROGRESSED: Final = b"SP"
CMD_SUBSCRIPTION_SET: Final = b"ST"
CMD_ERROR: Final = b"ER"

# Frames per repeated entry, after each message's count frame.
FRAMES_PER_NEW_EVENT: Final = 5
FRAMES_PER_SUBSCRIPTION_DEFINITION: Final = 3
FRAMES_PER_FETCH_ENTRY: Final = 2
FRAMES_PER_PROGRESS_ENTRY: Final = 2
FRAMES_PER_SET_ENTRY: Final = 4
FRAMES_PER_FETCHED_EVENT: Final = 8

# AC ExpectedVersion values with a meaning of their own.
EXPECTED_VERSION_ANY: Final = -1
EXPECTED_VERSION_NEW_STREAM: Final = 1

# RS / SS filter values that select every stream of the context.
FILTER_ALL: Final = frozenset({"", "*"})


def _tuple(obj: object, name: str) -> None:
    # Lists are accepted for convenience but stored as tuples so that
    # messages stay hashable and immutable.
    value = getattr(obj, name)
    if not isinstance(value, tuple):
        object.__setattr__(obj, name, tuple(value))


# --- requests ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewEvent:
    """One event of an AppendCommit: 5 frames."""

    event_id: uuid.UUID
    timestamp: datetime
    type: str
    headers: str
    body: str


@dataclass(frozen=True, slots=True)
class AppendCommit:
    """AC: append events to one stream.  ``expected_version`` is the version the
    first event gets (1 = new stream, -1 = no concurrency check)."""

    command: ClassVar[bytes] = CMD_APPEND_COMMIT

    request_id: bytes
    context: str
    stream: str
    expected_version: int
    events: tuple[NewEvent, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "events")


@dataclass(frozen=True, slots=True)
class SubscriptionDefinition:
    """One entry of RegisterSubscriptions: 3 frames."""

    context: str
    filter: str
    start_time: datetime


@dataclass(frozen=True, slots=True)
class RegisterSubscriptions:
    """RS: register (idempotently) subscriptions for one subscriber."""

    command: ClassVar[bytes] = CMD_REGISTER_SUBSCRIPTIONS

    request_id: bytes
    subscriber_id: str
    subscriptions: tuple[SubscriptionDefinition, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "subscriptions")


@dataclass(frozen=True, slots=True)
class FetchEntry:
    """One entry of FetchEvents: 2 frames."""

    subscription_id: int
    suggested_count: int


@dataclass(frozen=True, slots=True)
class FetchEvents:
    """FE: fetch the current batch of each subscription (one EF reply each)."""

    command: ClassVar[bytes] = CMD_FETCH_EVENTS

    request_id: bytes
    entries: tuple[FetchEntry, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "entries")


@dataclass(frozen=True, slots=True)
class ProgressEntry:
    """One entry of ProgressSubscriptions: 2 frames."""

    subscription_id: int
    last_event_time: datetime


@dataclass(frozen=True, slots=True)
class ProgressSubscriptions:
    """PS: acknowledge fetched batches."""

    command: ClassVar[bytes] = CMD_PROGRESS_SUBSCRIPTIONS

    request_id: bytes
    entries: tuple[ProgressEntry, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "entries")


@dataclass(frozen=True, slots=True)
class SetEntry:
    """One entry of SetSubscription: 4 frames."""

    subscriber_id: str
    context: str
    filter: str
    set_to: datetime


@dataclass(frozen=True, slots=True)
class SetSubscription:
    """SS: move subscriptions to a point in time."""

    command: ClassVar[bytes] = CMD_SET_SUBSCRIPTION

    request_id: bytes
    entries: tuple[SetEntry, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "entries")


Request = (
    AppendCommit | RegisterSubscriptions | FetchEvents | ProgressSubscriptions | SetSubscription
)

# --- responses --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitResult:
    """CR: the commit succeeded."""

    command: ClassVar[bytes] = CMD_COMMIT_RESULT

    request_id: bytes
    commit_id: uuid.UUID
    protocol: str = PROTOCOL_FRAME


@dataclass(frozen=True, slots=True)
class SubscribeResult:
    """SR: one subscription id per registered definition, in request order."""

    command: ClassVar[bytes] = CMD_SUBSCRIBE_RESULT

    request_id: bytes
    subscription_ids: tuple[int, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "subscription_ids")


@dataclass(frozen=True, slots=True)
class FetchedEvent:
    """One event of EventsFetched: 8 frames."""

    event_id: uuid.UUID
    stream: str
    context: str
    sequence: int
    timestamp: datetime
    type: str
    headers: str
    body: str


@dataclass(frozen=True, slots=True)
class EventsFetched:
    """EF: the batch of one subscription (an FE gets one EF per entry)."""

    command: ClassVar[bytes] = CMD_EVENTS_FETCHED

    request_id: bytes
    subscription_id: int
    events: tuple[FetchedEvent, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "events")


@dataclass(frozen=True, slots=True)
class SubscriptionProgressed:
    """SP: echoes the progressed subscription ids."""

    command: ClassVar[bytes] = CMD_SUBSCRIPTION_PROGRESSED

    request_id: bytes
    subscription_ids: tuple[int, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "subscription_ids")


@dataclass(frozen=True, slots=True)
class SubscriptionSet:
    """ST: one text per SS entry; empty = success, else the failure message."""

    command: ClassVar[bytes] = CMD_SUBSCRIPTION_SET

    request_id: bytes
    results: tuple[str, ...]
    protocol: str = PROTOCOL_FRAME

    def __post_init__(self) -> None:
        _tuple(self, "results")


@dataclass(frozen=True, slots=True)
class Error:
    """ER: the request failed; ``code`` from :class:`~protocols.res01.errors.ErrorCode`
    (kept as a plain int on decode: peers may send codes we do not know)."""

    command: ClassVar[bytes] = CMD_ERROR

    request_id: bytes
    code: int
    message: str
    protocol: str = PROTOCOL_FRAME


Response = (
    CommitResult
    | SubscribeResult
    | EventsFetched
    | SubscriptionProgressed
    | SubscriptionSet
    | Error
)
