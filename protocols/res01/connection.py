"""Sans-IO connection objects: multipart messages in, requests out; replies in,
messages out.  No sockets; the listener and the client do the IO.

ZeroMQ delivers whole messages, so there is no byte buffer here.  What these
objects keep is the request/reply pairing of ``state.py``: which requests are
open, how many replies each has had, whether the next one is legal.

Server (one object per ROUTER socket; requests are kept per peer, the peer
being its routing frames)::

    conn = ServerConnection(max_request_bytes=limits.max_request_bytes)
    try:
        exchange = conn.receive_message(frames)
    except Res01Error as err:                      # undecodable or too large
        socket.send(conn.refuse(err))              # its ER; no request was opened
    ...
    socket.send(conn.send(exchange, reply))        # per reply; LocalProtocolError if illegal
    conn.abandon(exchange)                         # the handler is done or the peer gone

Client (one object per DEALER socket)::

    conn = ClientConnection()
    socket.send(conn.send(request))                # LocalProtocolError: id already in flight
    answered = conn.receive_message(frames)        # None until the request's last reply
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from polyport.protocols.errors import TOO_LARGE
from polyport.protocols.res01.errors import (
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    Res01Error,
)
from polyport.protocols.res01.frames import Error, Request, Response
from polyport.protocols.res01.state import RequestProgress, RequestState, replies_due
from polyport.protocols.res01.wire import (
    Routing,
    decode_request,
    decode_response,
    encode_error_reply,
    encode_request,
    encode_response,
    request_envelope,
)

# Client: abandoned requests remembered, so that their late replies are
# dropped quietly rather than taken for replies to requests never sent.
DEFAULT_MAX_ABANDONED = 1024


# --- server -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Exchange:
    """One received request: what to answer, to whom.  ``serial`` tells apart
    two open requests of one peer with the same request id (both are served,
    as the spec does not forbid it)."""

    routing: Routing
    request: Request
    size: int
    serial: int


class ServerConnection:
    """The ROUTER side: decodes requests and checks every reply against its
    request's progress, per peer."""

    def __init__(self, *, max_request_bytes: int | None = None) -> None:
        # Largest whole message (all frames); None = no limit here.
        self.max_request_bytes = max_request_bytes
        self._serials = itertools.count(1)
        self._open: dict[int, RequestProgress] = {}
        self._peers: dict[Routing, set[int]] = {}

    # --- queries -------------------------------------------------------------

    @property
    def peers(self) -> frozenset[Routing]:
        """Peers (routing frames) with a request open."""
        return frozenset(self._peers)

    def in_flight(self, routing: Routing | None = None) -> int:
        """Open requests, of one peer or of all."""
        if routing is None:
            return len(self._open)
        return len(self._peers.get(routing, ()))

    def is_open(self, exchange: Exchange) -> bool:
        return exchange.serial in self._open

    def owed(self, exchange: Exchange) -> int:
        """Successful replies still due to an open request (0 when closed)."""
        progress = self._open.get(exchange.serial)
        return progress.owed if progress is not None else 0

    # --- messages in -----------------------------------------------------------

    def receive_message(self, frames: Sequence[bytes]) -> Exchange:
        """Decode one message received on the ROUTER and open its request.

        Raises :class:`Res01Error` for a message that cannot be decoded or is
        over ``max_request_bytes``; nothing is opened, and
        :meth:`refuse` gives the ER reply.
        """
        routing, request = decode_request(frames)
        size = sum(len(f) for f in frames)
        limit = self.max_request_bytes
        if limit is not None and size > limit:
            raise Res01Error(
                f"message of {size} bytes exceeds the limit of {limit} bytes",
                ErrorCode.MALFORMED,
                code=TOO_LARGE,
                routing=routing,
                request_id=request.request_id,
                protocol=request.protocol,
            )
        exchange = Exchange(routing, request, size, next(self._serials))
        # Open even when no reply is due (FE without entries): an ER may
        # still answer it (busy), and the owner closes it with abandon().
        self._open[exchange.serial] = RequestProgress(request)
        self._peers.setdefault(routing, set()).add(exchange.serial)
        return exchange

    @staticmethod
    def refuse(error: Res01Error) -> list[bytes]:
        """The ER reply to a message :meth:`receive_message` refused.  No
        request was opened for it, so there is nothing to pair."""
        return encode_error_reply(error)

    # --- replies out -------------------------------------------------------------

    def send(self, exchange: Exchange, reply: Response) -> list[bytes]:
        """Frames for one reply to ``exchange``.

        Raises :class:`LocalProtocolError`, changing nothing, when the reply
        may not be sent now (the request is closed, the reply does not answer
        it, one reply too many, a different protocol frame) or cannot be
        encoded: the request stays open for an ER instead.
        """
        progress = self._open.get(exchange.serial)
        request = exchange.request
        if progress is None:
            raise LocalProtocolError(
                f"cannot send {type(reply).__name__}: {type(request).__name__} "
                f"{request.request_id!r} is not open (answered or abandoned)",
                request_id=request.request_id,
            )
        if reply.protocol != request.protocol:
            raise LocalProtocolError(
                f"a reply echoes its request's protocol {request.protocol!r}, "
                f"not {reply.protocol!r}",
                request_id=request.request_id,
            )
        state = progress.next_state(reply, LocalProtocolError)
        try:
            frames = encode_response(exchange.routing, reply)
        except LocalProtocolError:
            raise
        except ValueError as exc:  # e.g. text the wire cannot carry
            raise LocalProtocolError(str(exc), request_id=request.request_id) from exc
        progress.record(state)
        if state is RequestState.ANSWERED:
            self._close(exchange)
        return frames

    def abandon(self, exchange: Exchange) -> None:
        """Close ``exchange`` without (more) replies: its handler finished or
        stopped, or the peer is gone.  Closing a closed request is a no-op."""
        if exchange.serial in self._open:
            self._close(exchange)

    def _close(self, exchange: Exchange) -> None:
        del self._open[exchange.serial]
        serials = self._peers[exchange.routing]
        serials.discard(exchange.serial)
        if not serials:
            # ROUTER gives no per-peer disconnect: a peer's entry lives exactly
            # as long as it has a request open.
            del self._peers[exchange.routing]


@dataclass(frozen=True, slots=True)
class Received:
    """One whole message from :class:`MessageAssembler`.  ``frames`` is every
    part when the message is within the limits; of one over them only the
    parts received before the limit was passed (the rest were dropped as they
    came), and ``error`` says why it is refused."""

    frames: list[bytes]
    parts: int
    size: int
    error: Res01Error | None = None


class MessageAssembler:
    """Collects one multipart message part by part, within limits.

    libzmq's ``MAXMSGSIZE`` bounds each part and its high-water mark counts
    whole messages, so one message of many small parts is not bounded by
    ZeroMQ.  The receiver hands the parts over one at a time (with ZeroMQ's
    RCVMORE flag) and this object stops keeping them once the message has
    more than ``max_parts`` parts or ``max_bytes`` bytes; the rest of that
    message is counted and dropped, and the message is answered ER 1
    (``too_large``) from the routing and request id of its first parts::

        assembler = MessageAssembler(max_parts=limits.max_message_parts,
                                     max_bytes=limits.max_request_bytes)
        while (received := assembler.add(await sock.recv(), sock.rcvmore)) is None:
            pass
    """

    def __init__(self, *, max_parts: int, max_bytes: int) -> None:
        self.max_parts = max_parts
        self.max_bytes = max_bytes
        self._frames: list[bytes] = []
        self._parts = 0
        self._size = 0
        self._over = False

    @property
    def kept(self) -> int:
        """Parts of the message in progress held in memory."""
        return len(self._frames)

    def add(self, part: bytes, more: bool) -> Received | None:
        """Take the next part; the whole message once ``more`` is false."""
        self._parts += 1
        self._size += len(part)
        if not self._over:
            if self._parts > self.max_parts or self._size > self.max_bytes:
                self._over = True
            else:
                self._frames.append(part)
        if more:
            return None
        frames, parts, size = self._frames, self._parts, self._size
        error = self._error(frames, parts, size) if self._over else None
        self._frames, self._parts, self._size, self._over = [], 0, 0, False
        return Received(frames, parts, size, error)

    def _error(self, frames: list[bytes], parts: int, size: int) -> Res01Error:
        routing, protocol, request_id = request_envelope(frames)
        if parts > self.max_parts:
            what = (
                f"message of {parts} parts exceeds the limit of {self.max_parts} parts "
                "(res01_max_message_parts)"
            )
        else:
            what = (
                f"message of {size} bytes exceeds the limit of {self.max_bytes} bytes "
                "(res01_max_request_bytes)"
            )
        return Res01Error(
            what,
            ErrorCode.MALFORMED,
            code=TOO_LARGE,
            routing=routing,
            request_id=request_id,
            protocol=protocol,
        )


# --- client -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answered:
    """Every reply to one request, the last one final."""

    request_id: bytes
    replies: tuple[Response, ...]

    @property
    def error(self) -> Error | None:
        """The ER that ended the request, if it failed."""
        last = self.replies[-1] if self.replies else None
        return last if isinstance(last, Error) else None


class ClientConnection:
    """The DEALER side: request ids in flight and the replies each has had."""

    def __init__(self, *, max_abandoned: int = DEFAULT_MAX_ABANDONED) -> None:
        self.max_abandoned = max_abandoned
        self._pending: dict[bytes, RequestProgress] = {}
        self._replies: dict[bytes, list[Response]] = {}
        self._abandoned: OrderedDict[bytes, RequestProgress] = OrderedDict()

    @property
    def pending(self) -> frozenset[bytes]:
        """Request ids whose replies someone waits for."""
        return frozenset(self._pending)

    def is_pending(self, request_id: bytes) -> bool:
        return request_id in self._pending

    def send(self, request: Request) -> list[bytes]:
        """Frames for ``request``.  Its id must not be in flight: replies are
        told apart by it (LocalProtocolError, nothing changes).  A request with
        no reply due (FE without entries) is not waited for."""
        rid = request.request_id
        if rid in self._pending:
            raise LocalProtocolError(f"request id {rid!r} is already in flight", request_id=rid)
        frames = encode_request(request)
        # A new request with an abandoned id takes its place: a late reply to
        # the old one is then this one's (the id says no more).
        self._abandoned.pop(rid, None)
        progress = RequestProgress(request)
        if replies_due(request) == 0:
            # Nothing to wait for; an ER (busy) may still come and is dropped.
            progress.abandon()
            self._remember_abandoned(rid, progress)
        else:
            self._pending[rid] = progress
            self._replies[rid] = []
        return frames

    def receive_message(self, frames: Sequence[bytes]) -> Answered | None:
        """Take one message received on the DEALER.

        Returns the request's replies once its final one arrived, else None
        (more due, or a late reply to an abandoned request).  Raises
        :class:`RemoteProtocolError` for a reply that cannot be decoded
        (:class:`Res01Error`), answers no request in flight, or breaks the
        request's sequence; a request it names stops being waited for.
        """
        try:
            reply = decode_response(frames)
        except Res01Error as exc:
            if exc.request_id is not None and exc.request_id in self._pending:
                self.abandon(exc.request_id)
            raise
        rid = reply.request_id
        progress = self._pending.get(rid)
        if progress is None:
            late = self._abandoned.get(rid)
            if late is None:
                raise RemoteProtocolError(
                    f"{type(reply).__name__} for request id {rid!r}, which is not in flight",
                    request_id=rid,
                )
            # A wrong reply raises and leaves the request abandoned, as a
            # wrong reply to a pending one does.
            state = late.advance(reply, RemoteProtocolError)
            if state is RequestState.ANSWERED:
                del self._abandoned[rid]
            return None
        try:
            state = progress.advance(reply, RemoteProtocolError)
        except RemoteProtocolError:
            self.abandon(rid)
            raise
        self._replies[rid].append(reply)
        if state is not RequestState.ANSWERED:
            return None
        del self._pending[rid]
        return Answered(rid, tuple(self._replies.pop(rid)))

    def abandon(self, request_id: bytes) -> None:
        """Stop waiting for ``request_id`` (timed out, cancelled, failed).  Its
        remaining replies are dropped as they come.  No-op when not pending."""
        progress = self._pending.pop(request_id, None)
        if progress is None:
            return
        del self._replies[request_id]
        progress.abandon()
        self._remember_abandoned(request_id, progress)

    def _remember_abandoned(self, request_id: bytes, progress: RequestProgress) -> None:
        self._abandoned[request_id] = progress
        # A server may never send them (its reply dropped, restarted): bound
        # the memory; a reply after eviction counts as one never asked for.
        while len(self._abandoned) > self.max_abandoned:
            self._abandoned.popitem(last=False)
