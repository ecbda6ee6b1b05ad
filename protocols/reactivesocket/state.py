"""The state machines of a ReactiveSocket connection, as explicit tables.

``CONNECTION_TABLE`` holds the connection's own states (SETUP first, ERROR on
stream 0 last).  ``RESPONDER_TABLE`` and ``REQUESTER_TABLE`` are the per-stream
machines ("Stream Sequences and Lifetimes" of the spec).

The stream tables map ``(kind, phase, event) -> (next phase, action)``.  A stream
with no record is CLOSED.  ``action`` says what the connection does with a
received frame: deliver it to the application, drop it, or reject the stream
(the application must then answer: ERROR from a responder, CANCEL from a
requester).  Send events have no action: a send missing from the table is a
:class:`LocalProtocolError`.  A receive missing from the table is a peer fault
(rules in ``connection.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from polyport.protocols.reactivesocket.fragments import Reassembly
from polyport.protocols.reactivesocket.frames import (
    MAX_I64,
    TYPE_REQUEST_FNF,
    TYPE_REQUEST_RESPONSE,
    TYPE_REQUEST_STREAM,
    TYPE_REQUEST_SUB,
)


class ConnectionState(enum.Enum):
    AWAITING_SETUP = "awaiting_setup"
    OPEN = "open"
    # We found the peer at fault (RemoteProtocolError raised): only ERROR on
    # stream 0 may still be sent, then the connection closes.
    ERRORED = "errored"
    CLOSED = "closed"


# Connection-level transitions: (role, state, what) -> next state, with "recv
# X" / "send X" by frame name.  A receive missing here is a peer fault, a send
# a LocalProtocolError.
CONNECTION_TABLE: dict[tuple[str, ConnectionState, str], ConnectionState] = {
    ("server", ConnectionState.AWAITING_SETUP, "recv SETUP"): ConnectionState.OPEN,
    ("server", ConnectionState.AWAITING_SETUP, "send ERROR 0"): ConnectionState.CLOSED,
    ("server", ConnectionState.OPEN, "recv ERROR 0"): ConnectionState.CLOSED,
    ("server", ConnectionState.OPEN, "send ERROR 0"): ConnectionState.CLOSED,
    ("server", ConnectionState.ERRORED, "send ERROR 0"): ConnectionState.CLOSED,
    ("client", ConnectionState.AWAITING_SETUP, "send SETUP"): ConnectionState.OPEN,
    ("client", ConnectionState.OPEN, "recv ERROR 0"): ConnectionState.CLOSED,
    ("client", ConnectionState.OPEN, "send ERROR 0"): ConnectionState.CLOSED,
    ("client", ConnectionState.ERRORED, "send ERROR 0"): ConnectionState.CLOSED,
}


class Kind(enum.Enum):
    REQUEST_RESPONSE = TYPE_REQUEST_RESPONSE
    REQUEST_FNF = TYPE_REQUEST_FNF
    REQUEST_STREAM = TYPE_REQUEST_STREAM
    REQUEST_SUB = TYPE_REQUEST_SUB

    @property
    def has_credits(self) -> bool:
        return self in (Kind.REQUEST_STREAM, Kind.REQUEST_SUB)


class Phase(enum.Enum):
    CLOSED = "closed"
    # responder
    RECEIVING_REQUEST = "receiving_request"  # request fragments arriving
    RESPONDING = "responding"
    SENDING_FRAGMENTS = "sending_fragments"  # a fragmented RESPONSE is half sent
    REJECTED = "rejected"  # peer fault: ERROR must be sent
    REJECTED_MID_REQUEST = "rejected_mid_request"  # same, more request fragments will come
    DISCARDING = "discarding"  # ERROR sent; dropping the request's last fragments
    # requester
    SENDING_REQUEST = "sending_request"  # our request fragments going out
    REQUESTED = "requested"
    RECEIVING_FRAGMENTS = "receiving_fragments"  # a fragmented RESPONSE is arriving
    ABANDONED = "abandoned"  # peer fault: CANCEL must be sent


class Ev(enum.Enum):
    # responder side
    RECV_REQUEST = "recv_request"  # a whole request
    RECV_REQUEST_BEGIN = "recv_request_begin"
    RECV_REQUEST_MORE = "recv_request_more"
    RECV_REQUEST_END = "recv_request_end"
    RECV_REQUEST_N = "recv_request_n"
    RECV_CANCEL = "recv_cancel"
    SEND_NEXT = "send_next"
    SEND_COMPLETE = "send_complete"
    SEND_BEGIN = "send_begin"
    SEND_MORE = "send_more"
    SEND_END = "send_end"
    SEND_END_COMPLETE = "send_end_complete"
    SEND_ERROR = "send_error"
    # requester side
    SEND_REQUEST = "send_request"
    SEND_REQUEST_BEGIN = "send_request_begin"
    SEND_REQUEST_MORE = "send_request_more"
    SEND_REQUEST_END = "send_request_end"
    SEND_REQUEST_N = "send_request_n"
    SEND_CANCEL = "send_cancel"
    RECV_NEXT = "recv_next"
    RECV_COMPLETE = "recv_complete"
    RECV_BEGIN = "recv_begin"
    RECV_MORE = "recv_more"
    RECV_END = "recv_end"
    RECV_END_COMPLETE = "recv_end_complete"
    RECV_ERROR = "recv_error"
    # either side: the peer broke the stream's rules
    VIOLATION = "violation"
    VIOLATION_MID_REQUEST = "violation_mid_request"  # ... and more fragments will follow


class Action(enum.Enum):
    DELIVER = "deliver"
    DROP = "drop"
    REJECT = "reject"


Transition = tuple[Phase, Action]
Table = dict[tuple[Kind, Phase, Ev], Transition]

P = Phase
E = Ev
DELIVER, DROP, REJECT = Action.DELIVER, Action.DROP, Action.REJECT

# Rows shared by the responder of every answered request (not FNF).
_RESPONDER_COMMON: dict[tuple[Phase, Ev], Transition] = {
    (P.CLOSED, E.RECV_REQUEST): (P.RESPONDING, DELIVER),
    (P.CLOSED, E.RECV_REQUEST_BEGIN): (P.RECEIVING_REQUEST, DROP),
    (P.CLOSED, E.VIOLATION): (P.REJECTED, REJECT),
    (P.CLOSED, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_MORE): (P.RECEIVING_REQUEST, DROP),
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_END): (P.RESPONDING, DELIVER),
    # The application never saw the request, so the CANCEL is not shown either.
    (P.RECEIVING_REQUEST, E.RECV_CANCEL): (P.CLOSED, DROP),
    (P.RECEIVING_REQUEST, E.VIOLATION): (P.REJECTED, REJECT),
    (P.RECEIVING_REQUEST, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    (P.RESPONDING, E.RECV_CANCEL): (P.CLOSED, DELIVER),
    (P.RESPONDING, E.VIOLATION): (P.REJECTED, REJECT),
    (P.RESPONDING, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    (P.RESPONDING, E.SEND_ERROR): (P.CLOSED, DROP),
    (P.SENDING_FRAGMENTS, E.RECV_CANCEL): (P.CLOSED, DELIVER),
    (P.SENDING_FRAGMENTS, E.VIOLATION): (P.REJECTED, REJECT),
    (P.SENDING_FRAGMENTS, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    (P.SENDING_FRAGMENTS, E.SEND_MORE): (P.SENDING_FRAGMENTS, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_ERROR): (P.CLOSED, DROP),
    # A rejected stream waits for our ERROR; what the peer sends meanwhile is
    # moot (the ERROR answers it), so it is dropped.
    (P.REJECTED, E.SEND_ERROR): (P.CLOSED, DROP),
    (P.REJECTED, E.RECV_REQUEST): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_REQUEST_BEGIN): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED, E.RECV_REQUEST_N): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_CANCEL): (P.REJECTED, DROP),
    (P.REJECTED, E.VIOLATION): (P.REJECTED, DROP),
    (P.REJECTED, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.SEND_ERROR): (P.DISCARDING, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_REQUEST_MORE): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_REQUEST_END): (P.REJECTED, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_REQUEST_N): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_CANCEL): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.VIOLATION): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, DROP),
    # After the ERROR the rest of a fragmented request is still on its way; it
    # must not be mistaken for a new request on the same id.
    (P.DISCARDING, E.RECV_REQUEST_MORE): (P.DISCARDING, DROP),
    (P.DISCARDING, E.RECV_REQUEST_END): (P.CLOSED, DROP),
    (P.DISCARDING, E.RECV_REQUEST_N): (P.DISCARDING, DROP),
    (P.DISCARDING, E.RECV_CANCEL): (P.CLOSED, DROP),
    (P.DISCARDING, E.VIOLATION): (P.CLOSED, DROP),
    (P.DISCARDING, E.VIOLATION_MID_REQUEST): (P.DISCARDING, DROP),
}

_RESPONDER_CREDITED: dict[tuple[Phase, Ev], Transition] = {
    # Credits granted while the request is still arriving count once it is whole.
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_N): (P.RECEIVING_REQUEST, DROP),
    (P.RESPONDING, E.RECV_REQUEST_N): (P.RESPONDING, DELIVER),
    (P.SENDING_FRAGMENTS, E.RECV_REQUEST_N): (P.SENDING_FRAGMENTS, DELIVER),
    (P.RESPONDING, E.SEND_NEXT): (P.RESPONDING, DROP),
    (P.RESPONDING, E.SEND_BEGIN): (P.SENDING_FRAGMENTS, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_END): (P.RESPONDING, DROP),
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
            # The one response is a COMPLETE (whole, or C on its last fragment).
            (P.RESPONDING, E.SEND_COMPLETE): (P.CLOSED, DROP),
            (P.RESPONDING, E.SEND_BEGIN): (P.SENDING_FRAGMENTS, DROP),
            (P.SENDING_FRAGMENTS, E.SEND_END_COMPLETE): (P.CLOSED, DROP),
        },
    ),
    (
        Kind.REQUEST_STREAM,
        {
            **_RESPONDER_COMMON,
            **_RESPONDER_CREDITED,
            (P.RESPONDING, E.SEND_COMPLETE): (P.CLOSED, DROP),
            (P.SENDING_FRAGMENTS, E.SEND_END_COMPLETE): (P.CLOSED, DROP),
        },
    ),
    # A subscription never COMPLETEs: it ends by ERROR or CANCEL only.
    (Kind.REQUEST_SUB, {**_RESPONDER_COMMON, **_RESPONDER_CREDITED}),
    (
        Kind.REQUEST_FNF,
        {
            # Terminated on reception; nothing is ever sent back, so faults
            # are dropped (fire-and-forget is best effort).
            (P.CLOSED, E.RECV_REQUEST): (P.CLOSED, DELIVER),
            (P.CLOSED, E.RECV_REQUEST_BEGIN): (P.RECEIVING_REQUEST, DROP),
            (P.CLOSED, E.VIOLATION): (P.CLOSED, DROP),
            (P.CLOSED, E.VIOLATION_MID_REQUEST): (P.DISCARDING, DROP),
            (P.RECEIVING_REQUEST, E.RECV_REQUEST_MORE): (P.RECEIVING_REQUEST, DROP),
            (P.RECEIVING_REQUEST, E.RECV_REQUEST_END): (P.CLOSED, DELIVER),
            (P.RECEIVING_REQUEST, E.RECV_REQUEST_N): (P.RECEIVING_REQUEST, DROP),
            (P.RECEIVING_REQUEST, E.RECV_CANCEL): (P.CLOSED, DROP),
            (P.RECEIVING_REQUEST, E.VIOLATION): (P.CLOSED, DROP),
            (P.RECEIVING_REQUEST, E.VIOLATION_MID_REQUEST): (P.DISCARDING, DROP),
            (P.DISCARDING, E.RECV_REQUEST_MORE): (P.DISCARDING, DROP),
            (P.DISCARDING, E.RECV_REQUEST_END): (P.CLOSED, DROP),
            (P.DISCARDING, E.RECV_REQUEST_N): (P.DISCARDING, DROP),
            (P.DISCARDING, E.RECV_CANCEL): (P.CLOSED, DROP),
            (P.DISCARDING, E.VIOLATION): (P.CLOSED, DROP),
            (P.DISCARDING, E.VIOLATION_MID_REQUEST): (P.DISCARDING, DROP),
        },
    ),
):
    for (_phase, _ev), _to in _rows.items():
        RESPONDER_TABLE[(_kind, _phase, _ev)] = _to


_REQUESTER_COMMON: dict[tuple[Phase, Ev], Transition] = {
    (P.CLOSED, E.SEND_REQUEST): (P.REQUESTED, DROP),
    (P.CLOSED, E.SEND_REQUEST_BEGIN): (P.SENDING_REQUEST, DROP),
    (P.SENDING_REQUEST, E.SEND_REQUEST_MORE): (P.SENDING_REQUEST, DROP),
    (P.SENDING_REQUEST, E.SEND_REQUEST_END): (P.REQUESTED, DROP),
    (P.SENDING_REQUEST, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.REQUESTED, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.RECEIVING_FRAGMENTS, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.ABANDONED, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.REQUESTED, E.RECV_ERROR): (P.CLOSED, DELIVER),
    # The responder may refuse a fragmented request before its last fragment.
    (P.SENDING_REQUEST, E.RECV_ERROR): (P.CLOSED, DELIVER),
    (P.RECEIVING_FRAGMENTS, E.RECV_ERROR): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.RECV_BEGIN): (P.RECEIVING_FRAGMENTS, DROP),
    (P.RECEIVING_FRAGMENTS, E.RECV_MORE): (P.RECEIVING_FRAGMENTS, DROP),
    (P.RECEIVING_FRAGMENTS, E.RECV_END_COMPLETE): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.RECV_COMPLETE): (P.CLOSED, DELIVER),
    (P.SENDING_REQUEST, E.VIOLATION): (P.ABANDONED, REJECT),
    (P.REQUESTED, E.VIOLATION): (P.ABANDONED, REJECT),
    (P.RECEIVING_FRAGMENTS, E.VIOLATION): (P.ABANDONED, REJECT),
    # Until our CANCEL goes out, the responder keeps talking: drop it.
    (P.ABANDONED, E.RECV_NEXT): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_COMPLETE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_BEGIN): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_MORE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_END): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_END_COMPLETE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_ERROR): (P.ABANDONED, DROP),
    (P.ABANDONED, E.VIOLATION): (P.ABANDONED, DROP),
}

_REQUESTER_CREDITED: dict[tuple[Phase, Ev], Transition] = {
    (P.SENDING_REQUEST, E.SEND_REQUEST_N): (P.SENDING_REQUEST, DROP),
    (P.REQUESTED, E.SEND_REQUEST_N): (P.REQUESTED, DROP),
    (P.RECEIVING_FRAGMENTS, E.SEND_REQUEST_N): (P.RECEIVING_FRAGMENTS, DROP),
    (P.ABANDONED, E.SEND_REQUEST_N): (P.ABANDONED, DROP),
    (P.REQUESTED, E.RECV_NEXT): (P.REQUESTED, DELIVER),
    (P.RECEIVING_FRAGMENTS, E.RECV_END): (P.REQUESTED, DELIVER),
}

REQUESTER_TABLE: Table = {}
for _kind, _rows in (
    (
        Kind.REQUEST_RESPONSE,
        {
            **_REQUESTER_COMMON,
            # The spec's answer is a COMPLETE; a lone NEXT is taken as the
            # answer too, since a single response can be nothing else.
            (P.REQUESTED, E.RECV_NEXT): (P.CLOSED, DELIVER),
            (P.RECEIVING_FRAGMENTS, E.RECV_END): (P.CLOSED, DELIVER),
        },
    ),
    (Kind.REQUEST_STREAM, {**_REQUESTER_COMMON, **_REQUESTER_CREDITED}),
    # The spec gives a subscription no COMPLETE, but a peer that sends one
    # clearly means the end: the common rows close the stream on it.
    (Kind.REQUEST_SUB, {**_REQUESTER_COMMON, **_REQUESTER_CREDITED}),
    (
        Kind.REQUEST_FNF,
        {
            (P.CLOSED, E.SEND_REQUEST): (P.CLOSED, DROP),
            (P.CLOSED, E.SEND_REQUEST_BEGIN): (P.SENDING_REQUEST, DROP),
            (P.SENDING_REQUEST, E.SEND_REQUEST_MORE): (P.SENDING_REQUEST, DROP),
            (P.SENDING_REQUEST, E.SEND_REQUEST_END): (P.CLOSED, DROP),
            (P.SENDING_REQUEST, E.SEND_CANCEL): (P.CLOSED, DROP),
            (P.SENDING_REQUEST, E.VIOLATION): (P.ABANDONED, REJECT),
            (P.ABANDONED, E.SEND_CANCEL): (P.CLOSED, DROP),
            (P.ABANDONED, E.RECV_NEXT): (P.ABANDONED, DROP),
            (P.ABANDONED, E.RECV_COMPLETE): (P.ABANDONED, DROP),
            (P.ABANDONED, E.RECV_BEGIN): (P.ABANDONED, DROP),
            (P.ABANDONED, E.RECV_MORE): (P.ABANDONED, DROP),
            (P.ABANDONED, E.RECV_END): (P.ABANDONED, DROP),
            (P.ABANDONED, E.RECV_END_COMPLETE): (P.ABANDONED, DROP),
            (P.ABANDONED, E.RECV_ERROR): (P.ABANDONED, DROP),
            (P.ABANDONED, E.VIOLATION): (P.ABANDONED, DROP),
        },
    ),
):
    for (_phase, _ev), _to in _rows.items():
        REQUESTER_TABLE[(_kind, _phase, _ev)] = _to

# Phases in which the application still owes the peer something (responder:
# responses or an ERROR; requester: it awaits responses or owes a CANCEL).
RESPONDER_LIVE = frozenset({P.RESPONDING, P.SENDING_FRAGMENTS, P.REJECTED, P.REJECTED_MID_REQUEST})
REQUESTER_LIVE = frozenset({P.SENDING_REQUEST, P.REQUESTED, P.RECEIVING_FRAGMENTS, P.ABANDONED})


def add_credits(current: int, n: int) -> int:
    """Credits saturate at 2**63-1, which (as in Reactive Streams) means
    unbounded: it is never used up."""
    return min(current + n, MAX_I64)


def use_credit(current: int) -> int:
    return current if current >= MAX_I64 else current - 1


@dataclass(slots=True)
class StreamRecord:
    """Mutable book-keeping of one stream (internal)."""

    kind: Kind
    phase: Phase
    credits: int = 0
    # A fragmented message arriving (request on the responder, RESPONSE on
    # the requester).
    reassembly: Reassembly = field(default_factory=Reassembly)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """Read-only snapshot of a stream for the application."""

    stream_id: int
    kind: Kind
    phase: Phase
    # Responder: RESPONSEs it may still send (2**63-1 = unbounded).
    # Requester: RESPONSEs it has asked for and not yet received.
    credits: int
