"""Sans-IO connection objects: bytes in, frames out; frames in, bytes out.

Typical server loop (the adapter)::

    conn = ServerConnection()
    frames = conn.receive_data(data)
    while frames:
        for frame in frames:
            ...                        # handle; reply with conn.send(...)
        frames = conn.receive_data(b"")

``receive_data`` must be called again with ``b""`` after the returned frames
are handled, because it stops early in two cases:

* after CONNECT, the server parses nothing more until it has sent the verdict
  RESPONSE (pipelined requests are judged in the state the verdict creates);
* when bytes after some good frames are bad, the good frames are returned
  first and the RemoteProtocolError is raised by the next call.

A RemoteProtocolError from ``receive_data`` is fatal (the state becomes
MUST_CLOSE): the server answers with ``send_error(err)`` and closes.
"""

from __future__ import annotations

from collections import deque

from polyport.protocols.bson.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.bson.frames import (
    CLIENT_FRAME_TYPES,
    CONNECT,
    DEFAULT_FLOW_PAUSE_BYTES,
    DEFAULT_FLOW_RESUME_BYTES,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_UNACKED_QUERY_RESULTS,
    SERVER_FRAME_TYPES,
    SUBSCRIBE,
    AckEv,
    Frame,
    Query,
    QueryAck,
    QueryResponse,
    QueryResult,
    Recev,
    Response,
    SubResponse,
    Unsubscribe,
)
from polyport.protocols.bson.state import (
    CLIENT_RECEIVE,
    CLIENT_SEND,
    ON_CONNECT_REFUSED,
    REPLIES,
    REPLY_TYPES,
    SERVER_RECEIVE,
    SERVER_SEND,
    DeliveryWindow,
    QueryProgress,
    State,
    Table,
    TransactionTable,
)
from polyport.protocols.bson.wire import check_length, decode_frame, encode_frame, read_length
from polyport.protocols.budgets import BudgetAccount, frame_refusal
from polyport.protocols.errors import BUSY, MALFORMED, TOO_LARGE, UNAUTHENTICATED
from polyport.protocols.framing import InputBuffer

_ENDED = (State.MUST_CLOSE, State.CLOSED)


class _Connection:
    """What both ends share: buffering, the request/reply queue, and the
    subscription and query bookkeeping (each end keeps its own copy)."""

    _receive_table: Table
    _send_table: Table
    _peer_types: frozenset[str]
    _own_types: frozenset[str]
    _peer_name: str
    # This connection's share of a budget other connections draw on too (the
    # gateway's): the bytes of a frame not yet whole are held against it, as
    # a peer can leave them there as long as it likes.  None: only
    # max_frame_size bounds them.
    budget: BudgetAccount | None = None

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        flow_pause_bytes: int = DEFAULT_FLOW_PAUSE_BYTES,
        flow_resume_bytes: int = DEFAULT_FLOW_RESUME_BYTES,
    ) -> None:
        self.max_frame_size = max_frame_size
        self.flow_pause_bytes = flow_pause_bytes
        self.flow_resume_bytes = flow_resume_bytes
        self.state = State.AWAIT_CONNECT
        self._buffer = InputBuffer()
        # Requests awaiting their reply, oldest first.
        self._pending: deque[Frame] = deque()
        self._subscriptions: dict[int, DeliveryWindow] = {}
        self._queries: dict[int, QueryProgress] = {}

    # --- public queries ------------------------------------------------------

    @property
    def pending_requests(self) -> tuple[Frame, ...]:
        """Requests not answered yet, in the order the replies must come."""
        return tuple(self._pending)

    @property
    def subscriptions(self) -> frozenset[int]:
        """subIDs granted by a successful SUBRESPONSE and not unsubscribed."""
        return frozenset(self._subscriptions)

    def unacked_bytes(self, sub_id: int) -> int:
        """Encoded bytes of RECEV frames of ``sub_id`` not acknowledged yet."""
        window = self._subscriptions.get(sub_id)
        return window.unacked if window is not None else 0

    def is_delivery_paused(self, sub_id: int) -> bool:
        window = self._subscriptions.get(sub_id)
        return window.paused if window is not None else False

    def is_query_active(self, query_id: int) -> bool:
        """Whether QUERYRESULT frames are still due for ``query_id``."""
        progress = self._queries.get(query_id)
        return progress is not None and progress.remaining > 0

    def unacked_query_results(self, query_id: int) -> int:
        progress = self._queries.get(query_id)
        return progress.unacked if progress is not None else 0

    @property
    def input_buffer(self) -> InputBuffer:
        """Received bytes not decoded yet: the start of a frame still arriving."""
        return self._buffer

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    # --- bytes in ----------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Frame]:
        """Buffer ``data`` and return every complete frame it finishes (see the
        module docstring for when to call again with ``b""``)."""
        return [frame for frame, _size in self.receive_sized(data)]

    def receive_sized(self, data: bytes) -> list[tuple[Frame, int]]:
        """Like :meth:`receive_data`, with each frame's encoded size (what an
        ACKEV ``bytes`` counts for a RECEV)."""
        if self.state in _ENDED:
            # Input after a fatal error or close has no one to answer it.
            return []
        self._buffer += data
        frames: list[tuple[Frame, int]] = []
        offset = 0
        try:
            while not self._paused() and self.state not in _ENDED:
                length = read_length(self._buffer, offset)
                if length is None:
                    break
                check_length(length, self.max_frame_size)
                if len(self._buffer) - offset < length:
                    break
                frame = decode_frame(self._buffer[offset : offset + length], self.max_frame_size)
                next_state = self._check_receive(frame)
                self._apply_receive(frame, length, next_state)
                offset += length
                frames.append((frame, length))
            self._check_paused_buffer(len(self._buffer) - offset)
            self._hold_unfinished(len(self._buffer) - offset)
        except RemoteProtocolError:
            del self._buffer[:offset]
            if frames:
                # The bad bytes stay at the head of the buffer; the next call
                # finds them again and raises.
                return frames
            self.state = State.MUST_CLOSE
            self._buffer.clear()
            raise
        if self.state is State.CLOSED:
            self._buffer.clear()
        else:
            del self._buffer[:offset]
        return frames

    def _paused(self) -> bool:
        return False

    def _hold_unfinished(self, size: int) -> None:
        if self.budget is not None:
            refused = self.budget.hold(size)
            if refused is not None:
                raise RemoteProtocolError(frame_refusal(size, refused), code=BUSY)

    def _check_paused_buffer(self, size: int) -> None:
        pass

    # --- frames out --------------------------------------------------------------

    def send(self, frame: Frame) -> bytes:
        """Encode ``frame`` after checking it is legal now; update the state."""
        if self.state is State.CLOSED:
            raise LocalProtocolError(f"cannot send {_type(frame)}: the connection is closed")
        frame_type = _type(frame)
        if frame_type in self._peer_types:
            raise LocalProtocolError(
                f"cannot send {frame_type}: it is sent by the {self._peer_name}"
            )
        next_state = self._send_table.get((self.state, frame_type))
        if next_state is None:
            raise LocalProtocolError(f"cannot send {frame_type} in state {self.state.name}")
        next_state = self._check_send(frame, next_state)
        data = encode_frame(frame)
        if len(data) > self.max_frame_size:
            raise LocalProtocolError(
                f"cannot send {frame_type}: {len(data)} bytes exceed the maximum frame size "
                f"of {self.max_frame_size}",
                code=TOO_LARGE,
            )
        self._apply_send(frame, len(data), next_state)
        return data

    def close(self) -> None:
        """The transport is gone (or we closed it): drop everything."""
        self.state = State.CLOSED
        self._buffer.clear()

    # --- shared checks -----------------------------------------------------------

    def _check_receive(self, frame: Frame) -> State:
        """Validate a received frame against the state; must not mutate."""
        frame_type = _type(frame)
        if frame_type in self._own_types:
            raise RemoteProtocolError(
                f"{frame_type} is sent by the {_other(self._peer_name)}, "
                f"not by the {self._peer_name}",
                code=MALFORMED,
            )
        next_state = self._receive_table.get((self.state, frame_type))
        if next_state is None:
            raise self._illegal_receive(frame_type)
        return next_state

    def _illegal_receive(self, frame_type: str) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"{frame_type} is not allowed in state {self.state.name}", code=MALFORMED
        )

    def _check_reply(self, frame: Frame, *, local: bool) -> Frame:
        """The pending request ``frame`` answers; must not mutate."""
        error: type[ProtocolError] = LocalProtocolError if local else RemoteProtocolError
        frame_type = _type(frame)
        if not self._pending:
            raise error(f"{frame_type} answers no request: none is pending", code=MALFORMED)
        request = self._pending[0]
        request_type = _type(request)
        if frame_type not in REPLIES[request_type]:
            raise error(
                f"{frame_type} cannot answer the pending {request_type}", code=MALFORMED
            )
        if isinstance(frame, Response) and frame.ok and isinstance(request, Query):
            raise error("a successful QUERY is answered by QUERYRESPONSE", code=MALFORMED)
        if isinstance(frame, Response) and frame.ok and request_type == SUBSCRIBE:
            raise error("a successful SUBSCRIBE is answered by SUBRESPONSE", code=MALFORMED)
        if isinstance(frame, SubResponse) and frame.ok:
            if frame.sub_id is None:
                raise error("SUBRESPONSE ok=true must carry subID", code=MALFORMED)
            if frame.sub_id in self._subscriptions:
                raise error(f"subID {frame.sub_id} is already in use", code=MALFORMED)
        if isinstance(frame, QueryResponse):
            assert isinstance(request, Query)
            if frame.query_id != request.query_id:
                raise error(
                    f"QUERYRESPONSE for queryID {frame.query_id} but the pending QUERY "
                    f"has queryID {request.query_id}",
                    code=MALFORMED,
                )
            if self.is_query_active(frame.query_id):
                raise error(f"queryID {frame.query_id} is still active", code=MALFORMED)
        return request

    def _check_unsolicited(self, frame: Frame, *, local: bool) -> None:
        error: type[ProtocolError] = LocalProtocolError if local else RemoteProtocolError
        if isinstance(frame, Recev) and frame.sub_id not in self._subscriptions:
            raise error(f"RECEV for unknown subID {frame.sub_id}", code=MALFORMED)
        if isinstance(frame, QueryResult) and not self.is_query_active(frame.query_id):
            raise error(
                f"QUERYRESULT for queryID {frame.query_id}, which has no results due",
                code=MALFORMED,
            )

    def _apply_reply(self, frame: Frame) -> None:
        request = self._pending.popleft()
        if isinstance(frame, SubResponse) and frame.ok and frame.sub_id is not None:
            self._subscriptions[frame.sub_id] = DeliveryWindow(
                self.flow_pause_bytes, self.flow_resume_bytes
            )
        elif isinstance(frame, Response) and frame.ok and isinstance(request, Unsubscribe):
            self._subscriptions.pop(request.sub_id, None)
        elif isinstance(frame, QueryResponse) and frame.num_results > 0:
            self._queries[frame.query_id] = QueryProgress(frame.num_results)

    def _apply_unsolicited(self, frame: Frame, size: int) -> None:
        if isinstance(frame, Recev):
            self._subscriptions[frame.sub_id].sent(size)
        elif isinstance(frame, QueryResult):
            progress = self._queries[frame.query_id]
            progress.remaining -= 1
            progress.unacked += 1

    def _apply_ack(self, frame: Frame) -> None:
        # Acks naming an unknown subscription or query are ignored: they can
        # legitimately cross an UNSUBSCRIBE or the end of a query.
        if isinstance(frame, AckEv):
            window = self._subscriptions.get(frame.sub_id)
            if window is not None:
                window.acked(frame.num_bytes)
        elif isinstance(frame, QueryAck):
            progress = self._queries.get(frame.query_id)
            if progress is not None:
                progress.unacked = max(0, progress.unacked - 1)
                if progress.finished:
                    del self._queries[frame.query_id]

    # --- per side ----------------------------------------------------------------

    def _check_send(self, frame: Frame, next_state: State) -> State:
        raise NotImplementedError

    def _apply_send(self, frame: Frame, size: int, next_state: State) -> None:
        raise NotImplementedError

    def _apply_receive(self, frame: Frame, size: int, next_state: State) -> None:
        raise NotImplementedError


class ServerConnection(_Connection):
    """The server end of one client connection.

    Besides the state machine it keeps, for the adapter: ``transactions``
    (open transactions by sessID), the granted subIDs with their ACKEV flow
    control windows, and the progress of each query's QUERYRESULT frames.
    """

    _receive_table = SERVER_RECEIVE
    _send_table = SERVER_SEND
    _peer_types = CLIENT_FRAME_TYPES
    _own_types = SERVER_FRAME_TYPES
    _peer_name = "client"

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        flow_pause_bytes: int = DEFAULT_FLOW_PAUSE_BYTES,
        flow_resume_bytes: int = DEFAULT_FLOW_RESUME_BYTES,
        max_unacked_query_results: int = DEFAULT_MAX_UNACKED_QUERY_RESULTS,
    ) -> None:
        super().__init__(
            max_frame_size=max_frame_size,
            flow_pause_bytes=flow_pause_bytes,
            flow_resume_bytes=flow_resume_bytes,
        )
        self.max_unacked_query_results = max_unacked_query_results
        self.transactions = TransactionTable()

    def can_send_query_result(self, query_id: int) -> bool:
        """Results are due and the unacknowledged window has room."""
        progress = self._queries.get(query_id)
        return (
            progress is not None
            and progress.remaining > 0
            and progress.unacked < self.max_unacked_query_results
        )

    def send_error(self, error: ProtocolError) -> bytes:
        """The last frame of a connection that broke the protocol: RESPONSE
        ok=false with the error's code and message.  The state becomes CLOSED;
        the caller closes the transport after writing the bytes."""
        if self.state is State.CLOSED:
            raise LocalProtocolError("cannot send the error RESPONSE: the connection is closed")
        data = encode_frame(error.to_response())
        self.close()
        return data

    def _paused(self) -> bool:
        return self.state is State.CONNECTING

    def _check_paused_buffer(self, size: int) -> None:
        if self._paused() and size > self.max_frame_size:
            raise RemoteProtocolError(
                f"more than {self.max_frame_size} bytes sent before the CONNECT verdict",
                code=BUSY,
            )

    def _illegal_receive(self, frame_type: str) -> RemoteProtocolError:
        if self.state is State.AWAIT_CONNECT:
            return RemoteProtocolError(
                f"{frame_type} before CONNECT: the first frame must be CONNECT",
                code=UNAUTHENTICATED,
            )
        if frame_type == CONNECT:
            return RemoteProtocolError("CONNECT on a connection that is already connected")
        return super()._illegal_receive(frame_type)

    def _apply_receive(self, frame: Frame, size: int, next_state: State) -> None:
        self.state = next_state
        if _type(frame) in REPLIES:
            self._pending.append(frame)
        else:
            self._apply_ack(frame)

    def _check_send(self, frame: Frame, next_state: State) -> State:
        if _type(frame) in REPLY_TYPES:
            self._check_reply(frame, local=True)
        else:
            self._check_unsolicited(frame, local=True)
        if self.state is State.CONNECTING and isinstance(frame, Response) and not frame.ok:
            return ON_CONNECT_REFUSED
        return next_state

    def _apply_send(self, frame: Frame, size: int, next_state: State) -> None:
        self.state = next_state
        if isinstance(frame, (Response, SubResponse, QueryResponse)):
            self._apply_reply(frame)
        else:
            self._apply_unsolicited(frame, size)
        if next_state is State.CLOSED:
            # Pipelined requests behind a refused CONNECT are never answered.
            self._buffer.clear()


class ClientConnection(_Connection):
    """The client end.  Requests may be pipelined behind CONNECT; replies are
    matched to requests in order (``pending_requests``)."""

    _receive_table = CLIENT_RECEIVE
    _send_table = CLIENT_SEND
    _peer_types = SERVER_FRAME_TYPES
    _own_types = CLIENT_FRAME_TYPES
    _peer_name = "server"

    def _check_receive(self, frame: Frame) -> State:
        if (
            isinstance(frame, Response)
            and not frame.ok
            and not self._pending
            and self.state is not State.AWAIT_CONNECT
        ):
            # Nothing to answer: this is the server's report of a fatal
            # protocol error, and it closes the connection next.
            return State.CLOSED
        next_state = super()._check_receive(frame)
        if isinstance(frame, (Response, SubResponse, QueryResponse)):
            self._check_reply(frame, local=False)
        else:
            self._check_unsolicited(frame, local=False)
        if self.state is State.CONNECTING and isinstance(frame, Response) and not frame.ok:
            return ON_CONNECT_REFUSED
        return next_state

    def _illegal_receive(self, frame_type: str) -> RemoteProtocolError:
        if self.state is State.AWAIT_CONNECT:
            return RemoteProtocolError(f"server sent {frame_type} before the client sent CONNECT")
        if self.state is State.CONNECTING:
            return RemoteProtocolError(f"server sent {frame_type} before answering CONNECT")
        return super()._illegal_receive(frame_type)

    def _apply_receive(self, frame: Frame, size: int, next_state: State) -> None:
        was_pending = bool(self._pending)
        self.state = next_state
        if isinstance(frame, (Response, SubResponse, QueryResponse)):
            if was_pending:
                self._apply_reply(frame)
        else:
            self._apply_unsolicited(frame, size)

    def _check_send(self, frame: Frame, next_state: State) -> State:
        return next_state

    def _apply_send(self, frame: Frame, size: int, next_state: State) -> None:
        self.state = next_state
        if _type(frame) in REPLIES:
            self._pending.append(frame)
        else:
            self._apply_ack(frame)


def _type(frame: Frame) -> str:
    return str(getattr(frame, "TYPE", type(frame).__name__))


def _other(peer_name: str) -> str:
    return "server" if peer_name == "client" else "client"
