"""The stream lifecycle both ReactiveSocket versions share, as table rows.

A stream table maps ``(kind, phase, event) -> (next phase, action)``; a stream
with no record is CLOSED.  ``action`` says what the connection does with a
received frame: deliver it to the application, drop it, or reject the stream
(the application must then answer: ERROR from a responder, CANCEL from a
requester).  Send events have no action that matters: a send missing from the
table is a ``LocalProtocolError``.

The rows here are the ones the draft and RSocket 1.0 agree on, grouped by what
they are for.  Each version's ``state.py`` builds its tables from these groups
plus its own rows, with :func:`build_table`, so every transition of a version
is either in this file or in its ``state.py``.  The kinds (REQUEST_SUB in the
draft, REQUEST_CHANNEL in RSocket, with their frame type codes) stay per
version: they are keys of the version's tables, not of these rows.

Fragments: the draft marks them with B(egin)/E(nd) flags, RSocket with F
(follows); either way a fragmented message has a first, middle and last
part, which are the ``*_BEGIN`` / ``*_MORE`` / ``*_END`` events here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from polyport.protocols.enums import IdentityEnum


class ConnectionState(IdentityEnum):
    AWAITING_SETUP = "awaiting_setup"
    OPEN = "open"
    # We found the peer at fault (RemoteProtocolError raised): only ERROR on
    # stream 0 may still be sent, then the connection closes.
    ERRORED = "errored"
    CLOSED = "closed"


class Phase(IdentityEnum):
    CLOSED = "closed"
    # responder
    RECEIVING_REQUEST = "receiving_request"  # request fragments arriving
    RESPONDING = "responding"
    SENDING_FRAGMENTS = "sending_fragments"  # a fragmented answer is half sent
    REJECTED = "rejected"  # the stream must be answered with ERROR
    # Draft only: there a request's continuation fragments are request frames,
    # which would open a new stream on a closed id, so a rejected fragmented
    # request is followed to its last fragment.  RSocket continues requests
    # with PAYLOAD frames, which a closed stream ignores: it needs neither.
    REJECTED_MID_REQUEST = "rejected_mid_request"  # REJECTED, more fragments to come
    DISCARDING = "discarding"  # ERROR sent; dropping the request's last fragments
    # requester
    SENDING_REQUEST = "sending_request"  # our request fragments going out
    REQUESTED = "requested"
    RECEIVING_FRAGMENTS = "receiving_fragments"  # a fragmented answer is arriving
    ABANDONED = "abandoned"  # the stream must be answered with CANCEL


class Ev(IdentityEnum):
    # responder side
    RECV_REQUEST = "recv_request"  # a whole request
    RECV_REQUEST_BEGIN = "recv_request_begin"  # its first fragment
    RECV_REQUEST_MORE = "recv_request_more"
    RECV_REQUEST_END = "recv_request_end"
    RECV_REQUEST_N = "recv_request_n"
    RECV_CANCEL = "recv_cancel"
    SEND_NEXT = "send_next"
    SEND_COMPLETE = "send_complete"  # with or without data
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
    # either side: the stream cannot go on (the peer broke its rules, a limit)
    VIOLATION = "violation"
    # Draft only (see REJECTED_MID_REQUEST): ... and more fragments will follow.
    VIOLATION_MID_REQUEST = "violation_mid_request"


class Action(IdentityEnum):
    DELIVER = "deliver"
    DROP = "drop"
    REJECT = "reject"


Transition = tuple[Phase, Action]
Rows = dict[tuple[Phase, Ev], Transition]
K = TypeVar("K", bound=enum.Enum)
# A version's table: ``streams.Table[Kind]``.
Table = dict[tuple[K, Phase, Ev], Transition]

# The kinds whose answers use credits: a stream, the draft's subscription and
# RSocket's channel.
CREDITED_KINDS = frozenset({"REQUEST_STREAM", "REQUEST_SUB", "REQUEST_CHANNEL"})


class StreamKind(IdentityEnum):
    """Base of a version's kinds of stream (valued by its request frame types)."""

    @property
    def has_credits(self) -> bool:
        return self.name in CREDITED_KINDS

P, E = Phase, Ev
DELIVER, DROP, REJECT = Action.DELIVER, Action.DROP, Action.REJECT


def build_table(groups: Iterable[tuple[K, Mapping[tuple[Phase, Ev], Transition]]]) -> dict[
    tuple[K, Phase, Ev], Transition
]:
    """``{(kind, phase, event): transition}`` from each kind's rows."""
    table: dict[tuple[K, Phase, Ev], Transition] = {}
    for kind, rows in groups:
        for (phase, ev), to in rows.items():
            table[(kind, phase, ev)] = to
    return table


# --- the connection ---------------------------------------------------------------

S = ConnectionState
# (role, state, what) -> next state, with "recv X" / "send X" by frame name.
# RSocket adds its LEASE / KEEPALIVE / METADATA_PUSH rows (the draft has none
# of those frames).
CONNECTION_ROWS: dict[tuple[str, ConnectionState, str], ConnectionState] = {
    ("server", S.AWAITING_SETUP, "recv SETUP"): S.OPEN,
    ("server", S.AWAITING_SETUP, "send ERROR 0"): S.CLOSED,
    ("server", S.OPEN, "recv ERROR 0"): S.CLOSED,
    ("server", S.OPEN, "send ERROR 0"): S.CLOSED,
    ("server", S.ERRORED, "send ERROR 0"): S.CLOSED,
    ("client", S.AWAITING_SETUP, "send SETUP"): S.OPEN,
    ("client", S.OPEN, "recv ERROR 0"): S.CLOSED,
    ("client", S.OPEN, "send ERROR 0"): S.CLOSED,
    ("client", S.ERRORED, "send ERROR 0"): S.CLOSED,
}

# --- the responder ------------------------------------------------------------------

# Every answered request (not FNF).
RESPONDER_ANSWERED: Rows = {
    (P.CLOSED, E.RECV_REQUEST): (P.RESPONDING, DELIVER),
    (P.CLOSED, E.RECV_REQUEST_BEGIN): (P.RECEIVING_REQUEST, DROP),
    (P.CLOSED, E.VIOLATION): (P.REJECTED, REJECT),
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_MORE): (P.RECEIVING_REQUEST, DROP),
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_END): (P.RESPONDING, DELIVER),
    # The application never saw the request, so the CANCEL is not shown either.
    (P.RECEIVING_REQUEST, E.RECV_CANCEL): (P.CLOSED, DROP),
    (P.RECEIVING_REQUEST, E.VIOLATION): (P.REJECTED, REJECT),
    (P.RESPONDING, E.RECV_CANCEL): (P.CLOSED, DELIVER),
    (P.RESPONDING, E.VIOLATION): (P.REJECTED, REJECT),
    (P.RESPONDING, E.SEND_ERROR): (P.CLOSED, DROP),
    (P.RESPONDING, E.SEND_BEGIN): (P.SENDING_FRAGMENTS, DROP),
    (P.SENDING_FRAGMENTS, E.RECV_CANCEL): (P.CLOSED, DELIVER),
    (P.SENDING_FRAGMENTS, E.VIOLATION): (P.REJECTED, REJECT),
    (P.SENDING_FRAGMENTS, E.SEND_MORE): (P.SENDING_FRAGMENTS, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_ERROR): (P.CLOSED, DROP),
    # A rejected stream waits for our ERROR; what the peer sends meanwhile is
    # moot (the ERROR answers it), so it is dropped.
    (P.REJECTED, E.SEND_ERROR): (P.CLOSED, DROP),
    (P.REJECTED, E.RECV_REQUEST_N): (P.REJECTED, DROP),
    (P.REJECTED, E.RECV_CANCEL): (P.REJECTED, DROP),
    (P.REJECTED, E.VIOLATION): (P.REJECTED, DROP),
}

# Streams with credits (REQUEST_STREAM; REQUEST_SUB / REQUEST_CHANNEL).
RESPONDER_CREDITED: Rows = {
    # Credits granted while the request is still arriving count once it is whole.
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_N): (P.RECEIVING_REQUEST, DROP),
    (P.RESPONDING, E.RECV_REQUEST_N): (P.RESPONDING, DELIVER),
    (P.SENDING_FRAGMENTS, E.RECV_REQUEST_N): (P.SENDING_FRAGMENTS, DELIVER),
    (P.RESPONDING, E.SEND_NEXT): (P.RESPONDING, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_END): (P.RESPONDING, DROP),
}

# REQUEST_RESPONSE: REQUEST_N means nothing to a single response.
RESPONDER_SINGLE: Rows = {
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_N): (P.RECEIVING_REQUEST, DROP),
    (P.RESPONDING, E.RECV_REQUEST_N): (P.RESPONDING, DROP),
    (P.SENDING_FRAGMENTS, E.RECV_REQUEST_N): (P.SENDING_FRAGMENTS, DROP),
}

# Streams that end with COMPLETE (whole, or C on the last fragment); a
# REQUEST_RESPONSE's one answer is such a COMPLETE.
RESPONDER_COMPLETES: Rows = {
    (P.RESPONDING, E.SEND_COMPLETE): (P.CLOSED, DROP),
    (P.SENDING_FRAGMENTS, E.SEND_END_COMPLETE): (P.CLOSED, DROP),
}

# REQUEST_FNF: terminated on reception; nothing is ever sent back, so a fault
# just drops the request (fire-and-forget is best effort).
RESPONDER_FNF: Rows = {
    (P.CLOSED, E.RECV_REQUEST): (P.CLOSED, DELIVER),
    (P.CLOSED, E.RECV_REQUEST_BEGIN): (P.RECEIVING_REQUEST, DROP),
    (P.CLOSED, E.VIOLATION): (P.CLOSED, DROP),
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_MORE): (P.RECEIVING_REQUEST, DROP),
    (P.RECEIVING_REQUEST, E.RECV_REQUEST_END): (P.CLOSED, DELIVER),
    (P.RECEIVING_REQUEST, E.RECV_CANCEL): (P.CLOSED, DROP),
    (P.RECEIVING_REQUEST, E.VIOLATION): (P.CLOSED, DROP),
}

# Phases in which the responder's application still owes the peer answers or
# an ERROR (the draft adds REJECTED_MID_REQUEST).
RESPONDER_LIVE = frozenset({P.RESPONDING, P.SENDING_FRAGMENTS, P.REJECTED})

# --- the requester ------------------------------------------------------------------

# An abandoned stream (we owe a CANCEL): until our CANCEL goes out, the
# responder keeps talking: drop it.
REQUESTER_ABANDONED: Rows = {
    (P.ABANDONED, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.ABANDONED, E.RECV_NEXT): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_COMPLETE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_BEGIN): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_MORE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_END): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_END_COMPLETE): (P.ABANDONED, DROP),
    (P.ABANDONED, E.RECV_ERROR): (P.ABANDONED, DROP),
    (P.ABANDONED, E.VIOLATION): (P.ABANDONED, DROP),
}

# Sending a request, whole or in fragments; FNF's requester ends right there.
REQUESTER_SENDING: Rows = {
    (P.CLOSED, E.SEND_REQUEST_BEGIN): (P.SENDING_REQUEST, DROP),
    (P.SENDING_REQUEST, E.SEND_REQUEST_MORE): (P.SENDING_REQUEST, DROP),
    (P.SENDING_REQUEST, E.SEND_CANCEL): (P.CLOSED, DROP),
}

# Every answered request (not FNF).
REQUESTER_ANSWERED: Rows = {
    **REQUESTER_SENDING,
    (P.CLOSED, E.SEND_REQUEST): (P.REQUESTED, DROP),
    (P.SENDING_REQUEST, E.SEND_REQUEST_END): (P.REQUESTED, DROP),
    (P.REQUESTED, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.RECEIVING_FRAGMENTS, E.SEND_CANCEL): (P.CLOSED, DROP),
    (P.REQUESTED, E.RECV_ERROR): (P.CLOSED, DELIVER),
    # The responder may refuse a fragmented request before its last fragment.
    (P.SENDING_REQUEST, E.RECV_ERROR): (P.CLOSED, DELIVER),
    (P.RECEIVING_FRAGMENTS, E.RECV_ERROR): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.RECV_BEGIN): (P.RECEIVING_FRAGMENTS, DROP),
    (P.RECEIVING_FRAGMENTS, E.RECV_MORE): (P.RECEIVING_FRAGMENTS, DROP),
    (P.RECEIVING_FRAGMENTS, E.RECV_END_COMPLETE): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.RECV_COMPLETE): (P.CLOSED, DELIVER),
    (P.REQUESTED, E.VIOLATION): (P.ABANDONED, REJECT),
    (P.RECEIVING_FRAGMENTS, E.VIOLATION): (P.ABANDONED, REJECT),
    **REQUESTER_ABANDONED,
}

# Streams with credits.
REQUESTER_CREDITED: Rows = {
    (P.SENDING_REQUEST, E.SEND_REQUEST_N): (P.SENDING_REQUEST, DROP),
    (P.REQUESTED, E.SEND_REQUEST_N): (P.REQUESTED, DROP),
    (P.RECEIVING_FRAGMENTS, E.SEND_REQUEST_N): (P.RECEIVING_FRAGMENTS, DROP),
    (P.ABANDONED, E.SEND_REQUEST_N): (P.ABANDONED, DROP),
    (P.REQUESTED, E.RECV_NEXT): (P.REQUESTED, DELIVER),
    (P.RECEIVING_FRAGMENTS, E.RECV_END): (P.REQUESTED, DELIVER),
}

# REQUEST_RESPONSE: the answer is a COMPLETE; a lone NEXT is the answer too,
# since a single response can be nothing else (RSocket: "If a PAYLOAD for a
# REQUEST_RESPONSE is received that does not have a COMPLETE flag set, the
# implementation MUST assume it is set").
REQUESTER_SINGLE: Rows = {
    (P.REQUESTED, E.RECV_NEXT): (P.CLOSED, DELIVER),
    (P.RECEIVING_FRAGMENTS, E.RECV_END): (P.CLOSED, DELIVER),
}

# REQUEST_FNF: closed as soon as the request is out.
REQUESTER_FNF: Rows = {
    **REQUESTER_SENDING,
    (P.CLOSED, E.SEND_REQUEST): (P.CLOSED, DROP),
    (P.SENDING_REQUEST, E.SEND_REQUEST_END): (P.CLOSED, DROP),
}

# Phases in which the requester awaits answers or owes a CANCEL.
REQUESTER_LIVE = frozenset({P.SENDING_REQUEST, P.REQUESTED, P.RECEIVING_FRAGMENTS, P.ABANDONED})


def add_credits(current: int, n: int, cap: int) -> int:
    """Credits add up (RSocket: "credits are cumulative"), saturating at
    ``cap`` (the draft: 2**63-1 means unbounded)."""
    return min(current + n, cap)


@dataclass(frozen=True, slots=True)
class StreamInfo(Generic[K]):
    """Read-only snapshot of a stream for the application."""

    stream_id: int
    kind: K
    phase: Phase
    # Responder: answers it may still send.  Requester: answers it has asked
    # for and not yet received.
    credits: int


@dataclass(slots=True)
class StreamRecord(Generic[K]):
    """Mutable book-keeping of one stream (internal); each version's
    ``state.py`` adds how it holds a fragmented message."""

    kind: K
    phase: Phase
    credits: int = 0
