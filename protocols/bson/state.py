"""Connection states, the transition tables, and per-connection bookkeeping
(transactions, subscription flow control, query progress).

The tables say which frame types are legal in which state and where they
lead.  Anything not in a table is a protocol error.  One transition depends on
the frame's content rather than its type: the RESPONSE that answers CONNECT
goes to CONNECTED when ``ok`` is true and to CLOSED otherwise
(``ON_CONNECT_REFUSED``).
"""

from __future__ import annotations

from dataclasses import dataclass

from polyport.protocols.bson.errors import RequestError
from polyport.protocols.bson.frames import (
    ABORTTX,
    CLIENT_FRAME_TYPES,
    COMMITTX,
    CONNECT,
    DEFAULT_FLOW_PAUSE_BYTES,
    DEFAULT_FLOW_RESUME_BYTES,
    EMIT,
    PING,
    QUERY,
    QUERYRESPONSE,
    RESPONSE,
    SERVER_FRAME_TYPES,
    STARTTX,
    SUBRESPONSE,
    SUBSCRIBE,
    UNSUBSCRIBE,
)
from polyport.protocols.enums import IdentityEnum
from polyport.protocols.errors import MALFORMED, NOT_FOUND


class State(IdentityEnum):
    AWAIT_CONNECT = "AWAIT_CONNECT"
    # CONNECT seen (server) or sent (client); the verdict RESPONSE is awaited.
    CONNECTING = "CONNECTING"
    CONNECTED = "CONNECTED"
    # A fatal protocol error happened: the connection must be closed.  The
    # server may still answer requests already in flight and then send the
    # error RESPONSE (ServerConnection.send_error).
    MUST_CLOSE = "MUST_CLOSE"
    CLOSED = "CLOSED"


ON_CONNECT_REFUSED = State.CLOSED

# Client requests other than CONNECT.
REQUEST_TYPES = CLIENT_FRAME_TYPES - {CONNECT}

# Request type -> frame types that may answer it.  Replies come in request
# order (RESPONSE carries no request id); ACKEV and QUERYACK get no reply.
# A RESPONSE answering SUBSCRIBE or QUERY is a failure (ok=false): those have
# their own success replies.
REPLIES: dict[str, frozenset[str]] = {
    CONNECT: frozenset({RESPONSE}),
    EMIT: frozenset({RESPONSE}),
    STARTTX: frozenset({RESPONSE}),
    COMMITTX: frozenset({RESPONSE}),
    ABORTTX: frozenset({RESPONSE}),
    UNSUBSCRIBE: frozenset({RESPONSE}),
    PING: frozenset({RESPONSE}),
    SUBSCRIBE: frozenset({SUBRESPONSE, RESPONSE}),
    QUERY: frozenset({QUERYRESPONSE, RESPONSE}),
}
REPLY_TYPES = frozenset({RESPONSE, SUBRESPONSE, QUERYRESPONSE})

Table = dict[tuple[State, str], State]

# Server side: frames received from the client.  Nothing is parsed while
# CONNECTING: input waits in the buffer until the verdict is sent.
SERVER_RECEIVE: Table = {
    (State.AWAIT_CONNECT, CONNECT): State.CONNECTING,
    **{(State.CONNECTED, t): State.CONNECTED for t in REQUEST_TYPES},
}

# Server side: frames sent to the client.
SERVER_SEND: Table = {
    (State.CONNECTING, RESPONSE): State.CONNECTED,  # or ON_CONNECT_REFUSED
    **{(State.CONNECTED, t): State.CONNECTED for t in SERVER_FRAME_TYPES},
    **{(State.MUST_CLOSE, t): State.MUST_CLOSE for t in REPLY_TYPES},
}

# Client side: frames sent to the server.  Requests may be pipelined behind
# CONNECT; the server holds them until its verdict.
CLIENT_SEND: Table = {
    (State.AWAIT_CONNECT, CONNECT): State.CONNECTING,
    **{(State.CONNECTING, t): State.CONNECTING for t in REQUEST_TYPES},
    **{(State.CONNECTED, t): State.CONNECTED for t in REQUEST_TYPES},
}

# Client side: frames received from the server.
CLIENT_RECEIVE: Table = {
    (State.CONNECTING, RESPONSE): State.CONNECTED,  # or ON_CONNECT_REFUSED
    **{(State.CONNECTED, t): State.CONNECTED for t in SERVER_FRAME_TYPES},
}


class TransactionTable:
    """Open transactions of one connection, by sessID.

    Misuse is not fatal: the spec answers it with RESPONSE ok=false, so the
    methods raise :class:`RequestError` (``err.to_response()`` is the reply)
    and leave the table unchanged.  The adapter calls them as it handles
    STARTTX / COMMITTX / ABORTTX, in frame order, and keeps the buffered
    events itself.
    """

    def __init__(self) -> None:
        self._open: set[int] = set()

    def is_open(self, sess_id: int) -> bool:
        return sess_id in self._open

    @property
    def open_sessions(self) -> frozenset[int]:
        return frozenset(self._open)

    def start(self, sess_id: int) -> None:
        if sess_id in self._open:
            raise RequestError(
                f"STARTTX: a transaction is already in progress for sessID {sess_id}",
                code=MALFORMED,
            )
        self._open.add(sess_id)

    def commit(self, sess_id: int) -> None:
        self._finish(COMMITTX, sess_id)

    def abort(self, sess_id: int) -> None:
        self._finish(ABORTTX, sess_id)

    def _finish(self, frame_type: str, sess_id: int) -> None:
        if sess_id not in self._open:
            raise RequestError(
                f"{frame_type}: no transaction in progress for sessID {sess_id}", code=NOT_FOUND
            )
        self._open.discard(sess_id)

    def clear(self) -> frozenset[int]:
        """Forget every open transaction (connection lost); returns them."""
        dropped = frozenset(self._open)
        self._open.clear()
        return dropped


@dataclass(slots=True)
class DeliveryWindow:
    """Unacknowledged RECEV bytes of one subscription, with the pause/resume
    hysteresis of the design brief (pause above 4 MiB, resume below 2 MiB)."""

    pause_bytes: int = DEFAULT_FLOW_PAUSE_BYTES
    resume_bytes: int = DEFAULT_FLOW_RESUME_BYTES
    unacked: int = 0
    paused: bool = False

    def sent(self, size: int) -> None:
        self.unacked += size
        if self.unacked > self.pause_bytes:
            self.paused = True

    def acked(self, size: int | None) -> None:
        # An ACKEV without ``bytes`` acknowledges everything delivered so far.
        self.unacked = 0 if size is None else max(0, self.unacked - size)
        if self.paused and self.unacked < self.resume_bytes:
            self.paused = False


@dataclass(slots=True)
class QueryProgress:
    """QUERYRESULT frames still to come, and those not yet acknowledged."""

    remaining: int
    unacked: int = 0

    @property
    def finished(self) -> bool:
        return self.remaining == 0 and self.unacked == 0
