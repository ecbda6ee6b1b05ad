"""State tables of RSocket 1.0 ("Stream Sequences and Lifetimes" of the spec).

Stream tables map ``(kind, phase, event) -> (next phase, action)``; a stream
with no record is CLOSED.  ``action`` says what the connection does with a
received frame: deliver it to the application, drop it, or reject the stream
(the application then answers: ERROR from a responder, CANCEL from a
requester).  A send missing from the table is a :class:`LocalProtocolError`.
A receive missing from the table is ignored, as the spec's "Handling the
Unexpected" asks (a PAYLOAD or CANCEL on a stream in the wrong state, ...).

The connection table maps ``(role, state, what) -> next state``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from polyport.protocols.rsocket.frames import (
    MAX_U63,
    TYPE_REQUEST_CHANNEL,
    TYPE_REQUEST_FNF,
    TYPE_REQUEST_RESPONSE,
    TYPE_REQUEST_STREAM,
)


class Kind(enum.Enum):
    REQUEST_RESPONSE = TYPE_REQUEST_RESPONSE
    REQUEST_FNF = TYPE_REQUEST_FNF
    REQUEST_STREAM = TYPE_REQUEST_STREAM
    REQUEST_CHANNEL = TYPE_REQUEST_CHANNEL

    @property
    def has_credits(self) -> bool:
        return self in (Kind.REQUEST_STREAM, Kind.REQUEST_CHANNEL)


class Phase(enum.Enum):
    CLOSED = "closed"
    # responder
    RECEIVING_REQUEST = "receiving_request"  # request fragments arriving
    RESPONDING = "responding"
    SENDING_FRAGMENTS = "sending_fragments"  # a fragmented PAYLOAD is half sent
    REJECTED = "rejected"  # the stream must be answered with ERROR
    # requester
    SENDING_REQUEST = "sending_request"  # our request fragments going out
    REQUESTED = "requested"
    RECEIVING_FRAGMENTS = "receiving_fragments"  # a fragmented PAYLOAD arriving
    ABANDONED = "abandoned"  # the stream must be answered with CANCEL


class Ev(enum.Enum):
    # responder side
    RECV_REQUEST = "recv_request"  # a whole request
    RECV_REQUEST_FIRST = "recv_request_first"  # a request with F
    RECV_FRAGMENT = "recv_fragment"  # PAYLOAD with F continuing a request
    RECV_FRAGMENT_LAST = "recv_fragment_last"  # PAYLOAD without F ending it
    RECV_REQUEST_N = "recv_request_n"
    RECV_CANCEL = "recv_cancel"
    SEND_NEXT = "send_next"
    SEND_COMPLETE = "send_complete"  # C, with or without N
    SEND_FIRST_FRAGMENT = "send_first_fragment"
    SEND_FRAGMENT = "send_fragment"
    SEND_LAST_FRAGMENT = "send_last_fragment"
    SEND_LAST_FRAGMENT_COMPLETE = "send_last_fragment_complete"
    SEND_ERROR = "send_error"
    # requester side
    SEND_REQUEST = "send_request"
    SEND_REQUEST_FIRST = "send_request_first"
    SEND_REQUEST_FRAGMENT = "send_request_fragment"
    SEND_REQUEST_LAST = "send_request_last"
    SEND_REQUEST_N = "send_request_n"
    SEND_CANCEL = "send_cancel"
    RECV_NEXT = "recv_next"
    RECV_COMPLETE = "recv_complete"
    RECV_PAYLOAD_FIRST = "recv_payload_first"
    RECV_PAYLOAD_MORE = "recv_payload_more"
    RECV_PAYLOAD_LAST = "recv_payload_last"
    RECV_PAYLOAD_LAST_COMPLETE = "recv_payload_last_complete"
    RECV_ERROR = "recv_error"
    # either side: the stream cannot go on (limits, lease, bad flags)
    VIOLATION = "violation"


class Action(enum.Enum):
    DELIVER = "deliver"
    DROP = "drop"
    REJECT = "reject"


Transition = tuple[Phase, Action]
Table = dict[tuple[Kind, Phase, Ev], Transition]

P, E = Phase, Ev
DELIVER, DROP, REJECT = Action.DELIVER, Action.DROP, Action.REJECT

# Rows every answered request shares (not FNF) on the responder.
_RESPONDER_COMMON: dict[tuple[Phase, Ev], Transition] = {
    (P.CLOSED, E.RECV_REQUEST): (P.RESPONDING, DELIVER),
    (P.CLOSED, E.RECV_REQUEST_FIRST): (P.RECEIVING_REQUEST, DROP),
    (P.CLOSED, E.VIOLATION): (P.REJECTED, REJECT),
    (P.RECEIVING_REQUEST, E.RECV_FRAGMENT): (P.RECEIVING_REQUEST, DROP),
    (P.RECEIVING_REQUEST, E.RECV_FRAGMENT_LAST): (P.RESPONDING, DELIVER),
    # The application never saw the request, so the CANCEL is not shown either.
    (P.RECEIVING_REQUEST, E.RECV_CANCEL): (P.CLOSED, DROP),
    (P.RECEIVING_REQUEST, E.VIOLATION): (P.REJECTED, REJECT),
    (P.RESPONDING, E.RECV_CANCEL): (P.CLOSED, DELIVER),
    (P.RESPONDING, E.SEND_ERROR): (P.CLOSED, DROP),
    (P.RESPONDING, E.SEND_FIRST_FRAGMENT): (P.SENDING_FRAGMENTS, DROP),
    (P.RESPONDING, E.VIOLATION): (P.REJECTED, REJECT),
    (P.SENDING_FRAGMENTS, E.RECV_CANCEL): (P.CLOSED, DELIVER),
    (P.SENDING_FRAGMENTS, E.SEND_FRAGMENT): (P.SENDING_FRAGMENTS, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_ERROR): (P.CLOSED, DROP),
    (P.SENDING_FRAGMENTS, E.VIOLATION): (P.REJECTED, REJECT),
    # Waiting for our ERROR: whatever the peer sends meanwhile is moot.  The
    # rest of a rejected fragmented request lands on a closed stream once the
    # ERROR is out, where PAYLOADs are ignored.
    (P.REJECTED, E.SEND_ERROR): (P.CLOSED, DROP),
    (P.REJECTED, E.RECV_FRAGMENT): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_FRAGMENT_LAST): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_REQUEST_N): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_CANCEL): (P.REJECTED, DROP),
    (P.REJECTED, E.VIOLATION): (P.REJECTED, DROP),
}

_RESPONDER_CREDITED: dict[tuple[Phase, Ev], Transition] = {
    # Credits granted while the request is still arriving count once it is whole.
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_N): (P.RECEIVING_REQUEST, DROP),
    (P.RESPONDING, E.RECV_REQUEST_N): (P.RESPONDING, DELIVER),
    (P.SENDING_FRAGMENTS, E.RECV_REQUEST_N): (P.SENDING_FRAGMENTS, DELIVER),
    (P.RESPONDING, E.SEND_NEXT): (P.RESPONDING, DROP),
    (P.RESPONDING, E.SEND_COMPLETE): (P.CLOSED, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_LAST_FRAGMENT): (P.RESPONDING, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_LAST_FRAGMENT_COMPLETE): (P.CLOSED, DROP),
}

RESPONDER_TABLE: Table = {}
for _kind, _rows in (
    (
        Kind.REQUEST_RESPONSE,
        {
            **_RESPONDER_COMMON,
            # REQUEST_N means nothing to a single response.
            (P.RECEIVING_REQUEST, E.RECV_REQUEST_N): (P.RECEIVING_REQUEST, DROP),
            (P.RESPONDING, E.RECV_REQUEST_N): (P.RESPONDING, DROP),
            (P.SENDING_FRAGMENTS, E.RECV_REQUEST_N): (P.SENDING_FRAGMENTS, DROP),
            # The one answer is PAYLOAD with C (whole, or C on its last fragment).
            (P.RESPONDING, E.SEND_COMPLETE): (P.CLOSED, DROP),
            (P.SENDING_FRAGMENTS, E.SEND_LAST_FRAGMENT_COMPLETE): (P.CLOSED, DROP),
        },
    ),
    (Kind.REQUEST_STREAM, {**_RESPONDER_COMMON, **_RESPONDER_CREDITED}),
    (Kind.REQUEST_CHANNEL, {**_RESPONDER_COMMON, **_RESPONDER_CREDITED}),
    (
        Kind.REQUEST_FNF,
        {
            # Terminated on reception; nothing is ever sent back, so a fault
            # just drops the request (fire-and-forget is best effort).
            (P.CLOSED, E.RECV_REQUEST): (P.CLOSED, DELIVER),
            (P.CLOSED, E.RECV_REQUEST_FIRST): (P.RECEIVING_REQUEST, DROP),
            (P.CLOSED, E.VIOLATION): (P.CLOSED, DROP),
            (P.RECEIVING_REQUEST, E.RECV_FRAGMENT): (P.RECEIVING_REQUEST, DROP),
            (P.RECEIVING_REQUEST, E.RECV_FRAGMENT_LAST): (P.CLOSED, DELIVER),
            (P.RECEIVING_REQUEST, E.RECV_CANCEL): (P.CLOSED, DROP),
            (P.RECEIVING_REQUEST, E.VIOLATION): (P.CLOSED, DROP),
        },
    ),
):
    for (_phase, _ev), _to in _rows.items():
        RESPONDER_TABLE[(_kind, _phase, _ev)] = _to


_REQUESTER_COMMON: dict[tuple[Phase, Ev], Transition] = {
    (P.CLOSED, E.SEND_REQUEST): (P.REQUESTED, DROP),
    (P.CLOSED, E.SEND_REQUEST_FIRST): (P.SENDING_REQUEST, DROP),
    (P.SENDING_REQUEST, E.SEND_REQUEST_FRAGMENT): (P.SENDING_REQUEST, DROP),
    (P.SENDING_REQUEST, E.SEND_REQUEST_LAST): (P.REQUESTED, DROP),
    (P.SENDING_REQUEST, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.REQUESTED, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.RECEIVING_FRAGMENTS, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.ABANDONED, E.SEND_CANCEL): (P.CLOSED, DROP),
    # The responder may refuse a fragmented request before its last fragment.
    (P.SENDING_REQUEST, E.RECV_ERROR): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.RECV_ERROR): (P.CLOSED, DELIVER),
    (P.RECEIVING_FRAGMENTS, E.RECV_ERROR): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.RECV_COMPLETE): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.RECV_PAYLOAD_FIRST): (P.RECEIVING_FRAGMENTS, DROP),
    (P.RECEIVING_FRAGMENTS, E.RECV_PAYLOAD_MORE): (P.RECEIVING_FRAGMENTS, DROP),
    (P.RECEIVING_FRAGMENTS, E.RECV_PAYLOAD_LAST_COMPLETE): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.VIOLATION): (P.ABANDONED, REJECT),
    (P.RECEIVING_FRAGMENTS, E.VIOLATION): (P.ABANDONED, REJECT),
    # Until our CANCEL goes out, the responder keeps talking: drop it.
    (P.ABANDONED, E.RECV_NEXT): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_COMPLETE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_PAYLOAD_FIRST): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_PAYLOAD_MORE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_PAYLOAD_LAST): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_PAYLOAD_LAST_COMPLETE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_ERROR): (P.ABANDONED, DROP),
    (P.ABANDONED, E.VIOLATION): (P.ABANDONED, DROP),
}

REQUESTER_TABLE: Table = {}
for _kind, _rows in (
    (
        Kind.REQUEST_RESPONSE,
        {
            **_REQUESTER_COMMON,
            # "If a PAYLOAD for a REQUEST_RESPONSE is received that does not
            # have a COMPLETE flag set, the implementation MUST assume it is set."
            (P.REQUESTED, E.RECV_NEXT): (P.CLOSED, DELIVER),
            (P.RECEIVING_FRAGMENTS, E.RECV_PAYLOAD_LAST): (P.CLOSED, DELIVER),
        },
    ),
    (
        Kind.REQUEST_STREAM,
        {
            **_REQUESTER_COMMON,
            (P.SENDING_REQUEST, E.SEND_REQUEST_N): (P.SENDING_REQUEST, DROP),
            (P.REQUESTED, E.SEND_REQUEST_N): (P.REQUESTED, DROP),
            (P.RECEIVING_FRAGMENTS, E.SEND_REQUEST_N): (P.RECEIVING_FRAGMENTS, DROP),
            (P.ABANDONED, E.SEND_REQUEST_N): (P.ABANDONED, DROP),
            (P.REQUESTED, E.RECV_NEXT): (P.REQUESTED, DELIVER),
            (P.RECEIVING_FRAGMENTS, E.RECV_PAYLOAD_LAST): (P.REQUESTED, DELIVER),
        },
    ),
    (
        Kind.REQUEST_FNF,
        {
            (P.CLOSED, E.SEND_REQUEST): (P.CLOSED, DROP),
            (P.CLOSED, E.SEND_REQUEST_FIRST): (P.SENDING_REQUEST, DROP),
            (P.SENDING_REQUEST, E.SEND_REQUEST_FRAGMENT): (P.SENDING_REQUEST, DROP),
            (P.SENDING_REQUEST, E.SEND_REQUEST_LAST): (P.CLOSED, DROP),
            (P.SENDING_REQUEST, E.SEND_CANCEL): (P.CLOSED, DROP),
        },
    ),
):
    for (_phase, _ev), _to in _rows.items():
        REQUESTER_TABLE[(_kind, _phase, _ev)] = _to

# Phases in which the application still owes the peer something (responder:
# payloads or an ERROR; requester: it awaits payloads or owes a CANCEL).
RESPONDER_LIVE = frozenset({P.RESPONDING, P.SENDING_FRAGMENTS, P.REJECTED})
REQUESTER_LIVE = frozenset({P.SENDING_REQUEST, P.REQUESTED, P.RECEIVING_FRAGMENTS, P.ABANDONED})


class ConnectionState(enum.Enum):
    AWAITING_SETUP = "awaiting_setup"
    OPEN = "open"
    # We found the peer at fault (RemoteProtocolError raised): only ERROR on
    # stream 0 may still be sent, then the connection closes.
    ERRORED = "errored"
    CLOSED = "closed"


S = ConnectionState
CONNECTION_TABLE: dict[tuple[str, ConnectionState, str], ConnectionState] = {
    ("server", S.AWAITING_SETUP, "recv SETUP"): S.OPEN,
    ("server", S.AWAITING_SETUP, "send ERROR 0"): S.CLOSED,
    ("server", S.OPEN, "recv ERROR 0"): S.CLOSED,
    ("server", S.OPEN, "send ERROR 0"): S.CLOSED,
    ("server", S.OPEN, "send LEASE"): S.OPEN,
    ("server", S.OPEN, "send KEEPALIVE"): S.OPEN,
    ("server", S.OPEN, "send METADATA_PUSH"): S.OPEN,
    ("server", S.ERRORED, "send ERROR 0"): S.CLOSED,
    ("client", S.AWAITING_SETUP, "send SETUP"): S.OPEN,
    ("client", S.OPEN, "recv ERROR 0"): S.CLOSED,
    ("client", S.OPEN, "send ERROR 0"): S.CLOSED,
    ("client", S.OPEN, "send KEEPALIVE"): S.OPEN,
    ("client", S.OPEN, "send METADATA_PUSH"): S.OPEN,
    ("client", S.ERRORED, "send ERROR 0"): S.CLOSED,
}


def add_credits(current: int, n: int) -> int:
    """Credits add up (the spec: "credits are cumulative"), saturating far
    above anything a connection can use."""
    return min(current + n, MAX_U63)


@dataclass(slots=True)
class StreamRecord:
    """Mutable book-keeping of one stream (internal)."""

    kind: Kind
    phase: Phase
    credits: int = 0
    # Reassembly of a fragmented frame (request on the responder, PAYLOAD on
    # the requester): the first frame, metadata and data parts.
    first: object = None
    metadata: list[bytes] | None = None
    data: list[bytes] = field(default_factory=list)
    size: int = 0


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """Read-only snapshot of a stream for the application."""

    stream_id: int
    kind: Kind
    phase: Phase
    # Responder: PAYLOADs it may still send.  Requester: PAYLOADs it asked
    # for and has not received.
    credits: int
