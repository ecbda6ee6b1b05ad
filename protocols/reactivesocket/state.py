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

The enums and the rows RSocket 1.0 shares are in
``protocols/reactive/streams.py``; this module names the draft's kinds and
adds the draft's own rows, each group saying why it differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyport.protocols.reactive import streams
from polyport.protocols.reactive.streams import (
    CONNECTION_ROWS,
    DROP,
    REJECT,
    REQUESTER_ABANDONED,
    REQUESTER_ANSWERED,
    REQUESTER_CREDITED,
    REQUESTER_FNF,
    REQUESTER_LIVE,
    REQUESTER_SINGLE,
    RESPONDER_ANSWERED,
    RESPONDER_COMPLETES,
    RESPONDER_CREDITED,
    RESPONDER_FNF,
    RESPONDER_SINGLE,
    Action,
    ConnectionState,
    E,
    Ev,
    P,
    Phase,
    Rows,
    StreamInfo,
    Transition,
    build_table,
)
from polyport.protocols.reactivesocket import frames
from polyport.protocols.reactivesocket.fragments import Reassembly

# The draft has no connection frames beyond SETUP and ERROR on stream 0.
CONNECTION_TABLE = CONNECTION_ROWS


class Kind(streams.StreamKind):
    """The draft's streams, by the frame type of their request."""

    REQUEST_RESPONSE = frames.TYPE_REQUEST_RESPONSE
    REQUEST_FNF = frames.TYPE_REQUEST_FNF
    REQUEST_STREAM = frames.TYPE_REQUEST_STREAM
    REQUEST_SUB = frames.TYPE_REQUEST_SUB


Table = streams.Table[Kind]

# The draft's own rows: a request's continuation fragments are request frames
# (B/E flags), so once a fragmented request is rejected its remaining
# fragments must be followed to the last one (REJECTED_MID_REQUEST, then
# DISCARDING after our ERROR); otherwise they would open a new stream on the
# same id.  RSocket continues requests with PAYLOAD frames, which a closed
# stream simply ignores, so it has none of these rows.
_DISCARDING: Rows = {
    (P.DISCARDING, E.RECV_REQUEST_MORE): (P.DISCARDING, DROP),
    (P.DISCARDING, E.RECV_REQUEST_END): (P.CLOSED, DROP),
    (P.DISCARDING, E.RECV_REQUEST_N): (P.DISCARDING, DROP),
    (P.DISCARDING, E.RECV_CANCEL): (P.CLOSED, DROP),
    (P.DISCARDING, E.VIOLATION): (P.CLOSED, DROP),
    (P.DISCARDING, E.VIOLATION_MID_REQUEST): (P.DISCARDING, DROP),
}

_RESPONDER_MID_REQUEST: Rows = {
    (P.CLOSED, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    (P.RECEIVING_REQUEST, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    (P.RESPONDING, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    (P.SENDING_FRAGMENTS, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, REJECT),
    # A rejected stream waits for our ERROR; a new request on its id is moot.
    (P.REJECTED, E.RECV_REQUEST): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_REQUEST_BEGIN): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.SEND_ERROR): (P.DISCARDING, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_REQUEST_MORE): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_REQUEST_END): (P.REJECTED, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_REQUEST_N): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.RECV_CANCEL): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.VIOLATION): (P.REJECTED_MID_REQUEST, DROP),
    (P.REJECTED_MID_REQUEST, E.VIOLATION_MID_REQUEST): (P.REJECTED_MID_REQUEST, DROP),
    **_DISCARDING,
}

_RESPONDER_ANSWERED: Rows = {**RESPONDER_ANSWERED, **_RESPONDER_MID_REQUEST}

RESPONDER_TABLE: Table = build_table(
    [
        (Kind.REQUEST_RESPONSE, {**_RESPONDER_ANSWERED, **RESPONDER_SINGLE, **RESPONDER_COMPLETES}),
        (Kind.REQUEST_STREAM, {**_RESPONDER_ANSWERED, **RESPONDER_CREDITED, **RESPONDER_COMPLETES}),
        # A subscription never COMPLETEs: it ends by ERROR or CANCEL only.
        (Kind.REQUEST_SUB, {**_RESPONDER_ANSWERED, **RESPONDER_CREDITED}),
        (
            Kind.REQUEST_FNF,
            {
                **RESPONDER_FNF,
                (P.CLOSED, E.VIOLATION_MID_REQUEST): (P.DISCARDING, DROP),
                (P.RECEIVING_REQUEST, E.RECV_REQUEST_N): (P.RECEIVING_REQUEST, DROP),
                (P.RECEIVING_REQUEST, E.VIOLATION_MID_REQUEST): (P.DISCARDING, DROP),
                **_DISCARDING,
            },
        ),
    ]
)

# The draft also rejects a stream on a bad frame while our fragmented request
# is still going out (RSocket ignores what arrives then: "Handling the
# Unexpected"), and abandons a fire-and-forget in that phase.
_REQUESTER_SENDING_FAULT: Rows = {(P.SENDING_REQUEST, E.VIOLATION): (P.ABANDONED, REJECT)}

REQUESTER_TABLE: Table = build_table(
    [
        (
            Kind.REQUEST_RESPONSE,
            {**REQUESTER_ANSWERED, **_REQUESTER_SENDING_FAULT, **REQUESTER_SINGLE},
        ),
        (
            Kind.REQUEST_STREAM,
            {**REQUESTER_ANSWERED, **_REQUESTER_SENDING_FAULT, **REQUESTER_CREDITED},
        ),
        # The spec gives a subscription no COMPLETE, but a peer that sends one
        # clearly means the end: the answered rows close the stream on it.
        (
            Kind.REQUEST_SUB,
            {**REQUESTER_ANSWERED, **_REQUESTER_SENDING_FAULT, **REQUESTER_CREDITED},
        ),
        (
            Kind.REQUEST_FNF,
            {**REQUESTER_FNF, **_REQUESTER_SENDING_FAULT, **REQUESTER_ABANDONED},
        ),
    ]
)

RESPONDER_LIVE = streams.RESPONDER_LIVE | {P.REJECTED_MID_REQUEST}


# --- which event a received frame is --------------------------------------------
#
# The draft marks fragments with B(egin) and E(nd) flags on the request and
# RESPONSE frames themselves.  Which stream-table event a received frame is
# follows from its flags and from whether its stream is in the middle of a
# fragmented message; some combinations are malformed whatever the stream's
# kind.  The rows below say which, so the connection looks them up rather than
# deciding in branches.


@dataclass(frozen=True, slots=True)
class FrameFault:
    """A received frame that is malformed where it arrives: the stream is
    rejected with MALFORMED and this message.  The message may name the
    frame's kind (``{name}``), the stream (``{sid}``) and the kind of the
    request in progress there (``{kind}``)."""

    message: str

    def text(self, name: str, sid: int, kind: str = "") -> str:
        return self.message.format(name=name, sid=sid, kind=kind)


# The responder's phases in which more fragments of a request are due.
MID_REQUEST = frozenset({P.RECEIVING_REQUEST, P.REJECTED_MID_REQUEST, P.DISCARDING})

# A received request frame, by (its stream mid-request?, B, E).  A request
# with both flags, or neither (a peer that never fragments), is whole.
REQUEST_FRAMES: dict[tuple[bool, bool, bool], Ev | FrameFault] = {
    (False, False, False): E.RECV_REQUEST,
    (False, True, True): E.RECV_REQUEST,
    (False, True, False): E.RECV_REQUEST_BEGIN,
    (False, False, True): FrameFault("{name} fragment with E but no earlier B on stream {sid}"),
    (True, True, False): FrameFault(
        "{name} fragment with B while stream {sid} is still receiving a fragmented request"
    ),
    (True, True, True): FrameFault(
        "{name} fragment with B while stream {sid} is still receiving a fragmented request"
    ),
    (True, False, False): E.RECV_REQUEST_MORE,
    (True, False, True): E.RECV_REQUEST_END,
}
# Mid-request, a fragment that REQUEST_FRAMES lets through must also be of the
# request's own kind.
FRAGMENT_OF_ANOTHER_KIND = FrameFault("{name} fragment continues a {kind} on stream {sid}")

# The request events that carry a fragment (sized against the limits).
REQUEST_FRAGMENT_EVENTS = frozenset({E.RECV_REQUEST_BEGIN, E.RECV_REQUEST_MORE, E.RECV_REQUEST_END})

# A received RESPONSE, by (its stream mid-response, i.e. RECEIVING_FRAGMENTS?,
# B, E, C).  C (complete) goes on a whole RESPONSE or on the last fragment.
_B_MID_RESPONSE = FrameFault(
    "RESPONSE with B while stream {sid} is still receiving a fragmented response"
)
_E_WITHOUT_B = FrameFault("RESPONSE fragment with E but no earlier B on stream {sid}")
RESPONSE_FRAMES: dict[tuple[bool, bool, bool, bool], Ev | FrameFault] = {
    # a whole RESPONSE: both flags, or neither (a peer that never fragments)
    (False, False, False, False): E.RECV_NEXT,
    (False, False, False, True): E.RECV_COMPLETE,
    (False, True, True, False): E.RECV_NEXT,
    (False, True, True, True): E.RECV_COMPLETE,
    (False, True, False, False): E.RECV_BEGIN,
    (False, True, False, True): FrameFault("C (complete) on the first RESPONSE fragment"),
    (False, False, True, False): _E_WITHOUT_B,
    (False, False, True, True): _E_WITHOUT_B,
    (True, True, False, False): _B_MID_RESPONSE,
    (True, True, False, True): _B_MID_RESPONSE,
    (True, True, True, False): _B_MID_RESPONSE,
    (True, True, True, True): _B_MID_RESPONSE,
    (True, False, False, False): E.RECV_MORE,
    (True, False, False, True): FrameFault("C (complete) on a RESPONSE fragment before the last"),
    (True, False, True, False): E.RECV_END,
    (True, False, True, True): E.RECV_END_COMPLETE,
}

# The RESPONSE events that carry a fragment (sized against the limits).
RESPONSE_FRAGMENT_EVENTS = frozenset({E.RECV_BEGIN, E.RECV_MORE, E.RECV_END, E.RECV_END_COMPLETE})


def add_credits(current: int, n: int) -> int:
    """Credits saturate at 2**63-1, which (as in Reactive Streams) means
    unbounded: it is never used up."""
    return streams.add_credits(current, n, frames.MAX_I64)


def use_credit(current: int) -> int:
    return current if current >= frames.MAX_I64 else current - 1


@dataclass(slots=True)
class StreamRecord(streams.StreamRecord[Kind]):
    """A stream's book-keeping, with the draft's reassembly."""

    # A fragmented message arriving (request on the responder, RESPONSE on
    # the requester).
    reassembly: Reassembly = field(default_factory=Reassembly)


# this module's own
__all__ = [
    "CONNECTION_TABLE", "FRAGMENT_OF_ANOTHER_KIND", "MID_REQUEST", "REQUESTER_TABLE",
    "REQUEST_FRAGMENT_EVENTS", "REQUEST_FRAMES", "RESPONDER_LIVE", "RESPONDER_TABLE",
    "RESPONSE_FRAGMENT_EVENTS", "RESPONSE_FRAMES",
    "FrameFault", "Kind", "StreamRecord", "Table", "add_credits", "use_credit",
]
# passed on from protocols/reactive/streams.py
__all__ += [
    "REQUESTER_LIVE", "Action", "ConnectionState", "Ev", "Phase", "StreamInfo", "Transition",
]
