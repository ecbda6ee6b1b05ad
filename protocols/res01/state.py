"""The one sequence Res01 has: a request and its replies.

A ROUTER server keeps no session per peer: every request is complete in one
message, and the durable state the spec talks about (the subscription, the
fetched batch that FE repeats until a PS with the matching LastEventTime
progresses it) lives in the store, shared by every peer that names the
subscription id.  What does follow a sequence is each request's exchange,
paired by request id (spec: "passed back as part of response enabling client
to correlate"):

- each request command is answered by its own response command, or by ER
  (:data:`ANSWERS`);
- AC, RS, PS and SS get one reply; FE gets one EF per entry, all with the
  request's id (:func:`replies_due`);
- ER is final: a failure after some EF ends the request;
- nothing may come after the final reply.

:data:`TRANSITIONS` is the table; the connection objects (``connection.py``)
keep one :class:`RequestProgress` per open request, the server per peer and
request, the client per request id.  A reply the table does not allow is
refused with the error class the caller names: ``LocalProtocolError`` when we
are about to send it, ``RemoteProtocolError`` when the peer sent it.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyport.protocols.enums import IdentityEnum
from polyport.protocols.res01.errors import ProtocolError
from polyport.protocols.res01.frames import (
    CMD_APPEND_COMMIT,
    CMD_COMMIT_RESULT,
    CMD_ERROR,
    CMD_EVENTS_FETCHED,
    CMD_FETCH_EVENTS,
    CMD_PROGRESS_SUBSCRIPTIONS,
    CMD_REGISTER_SUBSCRIPTIONS,
    CMD_SET_SUBSCRIPTION,
    CMD_SUBSCRIBE_RESULT,
    CMD_SUBSCRIPTION_PROGRESSED,
    CMD_SUBSCRIPTION_SET,
    Error,
    FetchEvents,
    Request,
    Response,
)


class RequestState(IdentityEnum):
    # Sent (client) or received (server); its final reply not given yet (an
    # FE may have had some of its EF: ``RequestProgress.replies`` counts them).
    PENDING = "PENDING"
    # The final reply given: the request is over and its id free again.
    ANSWERED = "ANSWERED"
    # Client only: nobody waits for the replies any more (timed out,
    # cancelled, failed, or nothing was due), but the server may still send
    # them; they are counted and dropped until the final one.  The server
    # forgets a request it abandons at once: it sends nothing more.
    ABANDONED = "ABANDONED"


class Event(IdentityEnum):
    # A reply after which more are due: an EF that is not the last.
    PART = "PART"
    # The reply that ends the request: its only or last reply, or an ER.
    FINAL = "FINAL"
    # A reply beyond those due (an EF more than FE's entries); in no state legal.
    EXTRA = "EXTRA"
    # Nobody waits for the replies any more.
    ABANDON = "ABANDON"


TRANSITIONS: dict[tuple[RequestState, Event], RequestState] = {
    (RequestState.PENDING, Event.PART): RequestState.PENDING,
    (RequestState.PENDING, Event.FINAL): RequestState.ANSWERED,
    (RequestState.PENDING, Event.ABANDON): RequestState.ABANDONED,
    (RequestState.ABANDONED, Event.PART): RequestState.ABANDONED,
    (RequestState.ABANDONED, Event.FINAL): RequestState.ANSWERED,
}

# Request command → the response commands that may answer it.
ANSWERS: dict[bytes, frozenset[bytes]] = {
    CMD_APPEND_COMMIT: frozenset({CMD_COMMIT_RESULT, CMD_ERROR}),
    CMD_REGISTER_SUBSCRIPTIONS: frozenset({CMD_SUBSCRIBE_RESULT, CMD_ERROR}),
    CMD_FETCH_EVENTS: frozenset({CMD_EVENTS_FETCHED, CMD_ERROR}),
    CMD_PROGRESS_SUBSCRIPTIONS: frozenset({CMD_SUBSCRIPTION_PROGRESSED, CMD_ERROR}),
    CMD_SET_SUBSCRIPTION: frozenset({CMD_SUBSCRIPTION_SET, CMD_ERROR}),
}


def replies_due(request: Request) -> int:
    """Successful replies a request gets: one EF per FE entry, else one.  An FE
    without entries gets none (it may still be answered by an ER)."""
    if isinstance(request, FetchEvents):
        return len(request.entries)
    return 1


def reply_event(request: Request, reply: Response, given: int) -> Event:
    """What ``reply`` is to ``request`` after ``given`` earlier replies."""
    if isinstance(reply, Error):
        return Event.FINAL
    due = replies_due(request)
    if given >= due:
        return Event.EXTRA
    return Event.FINAL if given + 1 == due else Event.PART


def _name(message: Request | Response) -> str:
    return type(message).__name__


@dataclass(slots=True)
class RequestProgress:
    """Where one request's exchange stands: its state and the replies given."""

    request: Request
    state: RequestState = RequestState.PENDING
    replies: int = 0

    @property
    def owed(self) -> int:
        """Successful replies still due while the request is open."""
        if self.state is RequestState.ANSWERED:
            return 0
        return max(0, replies_due(self.request) - self.replies)

    def next_state(self, reply: Response, error: type[ProtocolError]) -> RequestState:
        """The state ``reply`` leads to; raises ``error`` when the table does not
        allow it.  Changes nothing (see :meth:`record`)."""
        request = self.request
        rid = request.request_id
        if reply.request_id != rid:
            raise error(
                f"{_name(reply)} for request id {reply.request_id!r} cannot answer "
                f"{_name(request)} {rid!r}: a reply carries its request's id",
                request_id=rid,
            )
        if reply.command not in ANSWERS[request.command]:
            raise error(f"{_name(reply)} does not answer {_name(request)} {rid!r}", request_id=rid)
        event = reply_event(request, reply, self.replies)
        state = TRANSITIONS.get((self.state, event))
        if state is None:
            if event is Event.EXTRA:
                raise error(
                    f"{_name(reply)} beyond the {replies_due(request)} due to "
                    f"{_name(request)} {rid!r}",
                    request_id=rid,
                )
            raise error(
                f"{_name(reply)} for {_name(request)} {rid!r} in state {self.state.name}",
                request_id=rid,
            )
        return state

    def record(self, state: RequestState) -> None:
        """Take the state :meth:`next_state` gave for one more reply."""
        self.state = state
        self.replies += 1

    def advance(self, reply: Response, error: type[ProtocolError]) -> RequestState:
        """Check and take one reply."""
        state = self.next_state(reply, error)
        self.record(state)
        return state

    def abandon(self) -> RequestState:
        """Nobody waits any more; an answered request stays answered."""
        self.state = TRANSITIONS.get((self.state, Event.ABANDON), self.state)
        return self.state
