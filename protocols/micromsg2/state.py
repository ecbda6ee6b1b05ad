"""Connection states and the tables of legal transitions.

Handshake: client hello -> server reply -> client final, then frames both
ways.  An ERROR during the handshake ends the connection (the spec: send ERROR,
then disconnect).  After the handshake an ERROR is an ordinary frame (a failed
``subscribe`` is answered with one); the connection owner decides to close.
An ERROR may arrive in any state but CLOSED.  CLOSED is also entered when
received bytes raise RemoteProtocolError; the only thing left to do then is to
send an ERROR frame explaining why.
"""

from __future__ import annotations

from polyport.protocols.enums import IdentityEnum
from polyport.protocols.micromsg2.frames import Ack, Command, Error, Extension, Handshake, Message


class State(IdentityEnum):
    # server
    AWAIT_HELLO = "await_hello"
    HELLO_RECEIVED = "hello_received"
    AWAIT_FINAL = "await_final"
    # client
    START = "start"
    AWAIT_REPLY = "await_reply"
    REPLY_RECEIVED = "reply_received"
    # both
    OPEN = "open"
    CLOSED = "closed"


class Direction(IdentityEnum):
    RECEIVE = "receive"
    SEND = "send"


RECEIVE = Direction.RECEIVE
SEND = Direction.SEND

# States in which the next bytes received are a handshake (or an ERROR frame).
HANDSHAKE_STATES = frozenset(
    {
        State.AWAIT_HELLO,
        State.HELLO_RECEIVED,
        State.AWAIT_FINAL,
        State.START,
        State.AWAIT_REPLY,
        State.REPLY_RECEIVED,
    }
)

Transitions = dict[tuple[State, Direction, type], State]

_OPEN_FRAMES = (Message, Command, Extension, Ack, Error)


def _open_and_closed() -> Transitions:
    table: Transitions = {}
    for frame_type in _OPEN_FRAMES:
        for direction in Direction:
            table[(State.OPEN, direction, frame_type)] = State.OPEN
    table[(State.CLOSED, SEND, Error)] = State.CLOSED
    return table


SERVER_TRANSITIONS: Transitions = {
    (State.AWAIT_HELLO, RECEIVE, Handshake): State.HELLO_RECEIVED,
    (State.AWAIT_HELLO, RECEIVE, Error): State.CLOSED,
    (State.AWAIT_HELLO, SEND, Error): State.CLOSED,
    (State.HELLO_RECEIVED, RECEIVE, Error): State.CLOSED,
    (State.HELLO_RECEIVED, SEND, Handshake): State.AWAIT_FINAL,
    (State.HELLO_RECEIVED, SEND, Error): State.CLOSED,
    (State.AWAIT_FINAL, RECEIVE, Handshake): State.OPEN,
    (State.AWAIT_FINAL, RECEIVE, Error): State.CLOSED,
    (State.AWAIT_FINAL, SEND, Error): State.CLOSED,
    **_open_and_closed(),
}

CLIENT_TRANSITIONS: Transitions = {
    (State.START, SEND, Handshake): State.AWAIT_REPLY,
    (State.START, RECEIVE, Error): State.CLOSED,
    (State.START, SEND, Error): State.CLOSED,
    (State.AWAIT_REPLY, RECEIVE, Handshake): State.REPLY_RECEIVED,
    (State.AWAIT_REPLY, RECEIVE, Error): State.CLOSED,
    (State.AWAIT_REPLY, SEND, Error): State.CLOSED,
    (State.REPLY_RECEIVED, RECEIVE, Error): State.CLOSED,
    (State.REPLY_RECEIVED, SEND, Handshake): State.OPEN,
    (State.REPLY_RECEIVED, SEND, Error): State.CLOSED,
    **_open_and_closed(),
}
