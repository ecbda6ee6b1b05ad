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
    "CONNECTION_TABLE", "REQUESTER_TABLE", "RESPONDER_LIVE", "RESPONDER_TABLE",
    "Kind", "StreamRecord", "Table", "add_credits", "use_credit",
]
# passed on from protocols/reactive/streams.py
__all__ += [
    "REQUESTER_LIVE", "Action", "ConnectionState", "Ev", "Phase", "StreamInfo", "Transition",
]
