"""State tables of RSocket 1.0 ("Stream Sequences and Lifetimes" of the spec).

Stream tables map ``(kind, phase, event) -> (next phase, action)``; a stream
with no record is CLOSED.  ``action`` says what the connection does with a
received frame: deliver it to the application, drop it, or reject the stream
(the application then answers: ERROR from a responder, CANCEL from a
requester).  A send missing from the table is a :class:`LocalProtocolError`.
A receive missing from the table is ignored, as the spec's "Handling the
Unexpected" asks (a PAYLOAD or CANCEL on a stream in the wrong state, ...).

The connection table maps ``(role, state, what) -> next state``.

The enums and the rows the ReactiveSocket draft shares are in
``protocols/reactive/streams.py``; this module names RSocket's kinds and adds
its own rows, each group saying why it differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyport.protocols.reactive import streams
from polyport.protocols.reactive.streams import (
    DROP,
    REQUESTER_LIVE,
    RESPONDER_LIVE,
    Action,
    ConnectionState,
    E,
    Ev,
    P,
    Phase,
    StreamInfo,
    Transition,
    build_table,
)
from polyport.protocols.rsocket import frames

# this module's own
__all__ = [
    "CONNECTION_TABLE", "REQUESTER_TABLE", "RESPONDER_TABLE",
    "Kind", "StreamRecord", "Table", "add_credits",
]
# passed on from protocols/reactive/streams.py
__all__ += [
    "REQUESTER_LIVE", "RESPONDER_LIVE", "Action", "ConnectionState", "Ev", "Phase",
    "StreamInfo", "Transition",
]


class Kind(streams.StreamKind):
    """RSocket's interactions, by the frame type of their request (a
    channel is refused by the server, but its frames are still followed)."""

    REQUEST_RESPONSE = frames.TYPE_REQUEST_RESPONSE
    REQUEST_FNF = frames.TYPE_REQUEST_FNF
    REQUEST_STREAM = frames.TYPE_REQUEST_STREAM
    REQUEST_CHANNEL = frames.TYPE_REQUEST_CHANNEL


Table = streams.Table[Kind]

# RSocket's own rows: the rest of a rejected fragmented request (PAYLOADs
# with or without F) is dropped while our ERROR is pending; once it is out the
# stream is closed, where PAYLOADs are ignored.  (The draft instead follows
# the fragments to the end: see its REJECTED_MID_REQUEST rows.)
_RESPONDER_ANSWERED = {
    **streams.RESPONDER_ANSWERED,
    (P.REJECTED, E.RECV_REQUEST_MORE): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_REQUEST_END): (P.REJECTED, DROP),
}

# A channel's responder completes like a stream's.
_RESPONDER_STREAMED = {
    **_RESPONDER_ANSWERED, **streams.RESPONDER_CREDITED, **streams.RESPONDER_COMPLETES
}

RESPONDER_TABLE: Table = build_table(
    [
        (
            Kind.REQUEST_RESPONSE,
            {**_RESPONDER_ANSWERED, **streams.RESPONDER_SINGLE, **streams.RESPONDER_COMPLETES},
        ),
        (Kind.REQUEST_STREAM, _RESPONDER_STREAMED),
        (Kind.REQUEST_CHANNEL, _RESPONDER_STREAMED),
        (Kind.REQUEST_FNF, streams.RESPONDER_FNF),
    ]
)

# This requester makes no REQUEST_CHANNEL; a frame that breaks the rules
# while our request is still going out is ignored ("Handling the Unexpected").
REQUESTER_TABLE: Table = build_table(
    [
        (Kind.REQUEST_RESPONSE, {**streams.REQUESTER_ANSWERED, **streams.REQUESTER_SINGLE}),
        (Kind.REQUEST_STREAM, {**streams.REQUESTER_ANSWERED, **streams.REQUESTER_CREDITED}),
        (Kind.REQUEST_FNF, streams.REQUESTER_FNF),
    ]
)

S = ConnectionState
CONNECTION_TABLE: dict[tuple[str, ConnectionState, str], ConnectionState] = {
    **streams.CONNECTION_ROWS,
    # RSocket's connection frames (the draft has none of them): the server
    # grants LEASEs, both sides send KEEPALIVE and METADATA_PUSH once open.
    ("server", S.OPEN, "send LEASE"): S.OPEN,
    ("server", S.OPEN, "send KEEPALIVE"): S.OPEN,
    ("server", S.OPEN, "send METADATA_PUSH"): S.OPEN,
    ("client", S.OPEN, "send KEEPALIVE"): S.OPEN,
    ("client", S.OPEN, "send METADATA_PUSH"): S.OPEN,
}


def add_credits(current: int, n: int) -> int:
    """Credits add up (the spec: "credits are cumulative"), saturating far
    above anything a connection can use."""
    return streams.add_credits(current, n, frames.MAX_U63)


@dataclass(slots=True)
class StreamRecord(streams.StreamRecord[Kind]):
    """A stream's book-keeping, with RSocket's reassembly."""

    # Reassembly of a fragmented frame (request on the responder, PAYLOAD on
    # the requester): the first frame, metadata and data parts.
    first: object = None
    metadata: list[bytes] | None = None
    data: list[bytes] = field(default_factory=list)
    size: int = 0
