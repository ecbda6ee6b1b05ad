"""Sans-IO RSocket 1.0 connections.

``ServerConnection`` is the responder polyport runs; ``ClientConnection`` the
requester its client uses.  ``receive_data(bytes)`` returns frames (requests
and PAYLOADs whole: fragments are reassembled) and :class:`StreamError`
events; ``send(frame)`` checks the frame against the tables of ``state.py``
and returns the bytes to write.

Transports: ``"tcp"`` (a byte stream; frames carry a 24-bit length) or
``"websocket"`` (every ``receive_data`` call is exactly one binary message,
and every ``bytes`` from ``send`` is one message).

Time enters only through ``clock`` (default :func:`time.monotonic`), which
the server reads to expire a LEASE; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Unpack

from polyport.protocols.reactive.connection import (
    ConnectionLimits,
    RequesterConveniences,
    StreamConnection,
    StreamError,
)
from polyport.protocols.reactive.streams import Action, ConnectionState, Ev, Phase
from polyport.protocols.rsocket import errors, frames, state, wire
from polyport.protocols.rsocket.errors import (
    BUSY,
    MALFORMED,
    TOO_LARGE,
    UNSUPPORTED,
    LocalProtocolError,
    RemoteProtocolError,
    error_frame,
)
from polyport.protocols.rsocket.frames import (
    CONNECTION_STREAM_ID,
    FRAME_TYPE_OF,
    HEADER_SIZE,
    INVALID_SETUP,
    MAJOR_VERSION,
    MAX_FRAME_LENGTH,
    MAX_U63,
    REJECTED_RESUME,
    REJECTED_SETUP,
    UNSUPPORTED_SETUP,
    ErrorFrame,
    Ext,
    Frame,
    Keepalive,
    Lease,
    MetadataPush,
    Payload,
    Request,
    RequestChannel,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    Resume,
    ResumeOk,
    Setup,
    UnknownFrame,
    describe,
)
from polyport.protocols.rsocket.state import CONNECTION_TABLE, Kind, StreamRecord, add_credits
from polyport.protocols.rsocket.wire import (
    fragment,
)

_REQUEST_CLASSES = (RequestResponse, RequestFnf, RequestStream, RequestChannel)
# ERROR codes on stream 0 a server ignores (the spec: they only answer SETUP).
_SETUP_ERROR_CODES = frozenset({INVALID_SETUP, UNSUPPORTED_SETUP, REJECTED_SETUP, REJECTED_RESUME})


Event = Frame | StreamError


class _Connection(StreamConnection, frames=frames, wire=wire, state=state, errors=errors):
    """RSocket's codec on the core the draft shares
    (``protocols/reactive/connection.py``), plus what is RSocket's alone: a
    24-bit TCP length that does not count itself, frames without the I flag
    refused (no extension is understood), SETUP errors a side ignores, LEASE /
    KEEPALIVE / METADATA_PUSH, and stream faults that are ignored where the
    table has no row ("Handling the Unexpected")."""

    length_counts_itself = False
    credit_cap = MAX_U63


    def _check_limits(self) -> None:
        if not HEADER_SIZE <= self.max_frame_size <= MAX_FRAME_LENGTH:
            raise ValueError(f"max_frame_size must be {HEADER_SIZE}..{MAX_FRAME_LENGTH}")
        if self.max_fragment < 1 or self.max_message_size < 0:
            raise ValueError("max_fragment >= 1, max_message_size >= 0")
        # A fragment's metadata + data, leaving room for the largest header.
        self.max_fragment = min(self.max_fragment, self.max_frame_size - HEADER_SIZE - 7)

    @property
    def reassembly_bytes(self) -> int:
        """Bytes of fragmented messages held now, all streams together."""
        # A sum over at most max_streams records, taken per fragment.
        return sum(rec.size for rec in self._streams.values())

    def _check_length(self, length: int) -> None:
        if length < HEADER_SIZE:
            raise RemoteProtocolError(f"frame of {length} bytes is shorter than the header")
        if length > self.max_frame_size:
            raise RemoteProtocolError(
                f"frame of {length} bytes exceeds the limit of {self.max_frame_size}",
                code=TOO_LARGE,
            )

    def _check_tcp_length(self, length: int) -> None:
        self._check_length(length)

    def _check_message(self, message: bytes) -> None:
        self._check_length(len(message))

    # --- receiving ---------------------------------------------------------------------

    def _skip_unknown(self, frame: Frame, out: list[Event]) -> bool:
        if not isinstance(frame, (UnknownFrame, Ext)):
            return False
        # No extension is understood here.
        if frame.ignore:
            return True
        raise RemoteProtocolError(
            f"{describe(frame)} not understood and without the I (ignore) flag",
            code=UNSUPPORTED,
        )

    def _violation(
        self, sid: int, rec: StreamRecord | None, kind: Kind, code: str, message: str,
        out: list[Event],
    ) -> None:
        t = self._transition(rec, kind, Ev.VIOLATION)
        if t is None:
            return
        to, action = t
        if rec is not None:
            rec.first, rec.metadata, rec.data, rec.size, rec.credits = None, None, [], 0, 0
        self._apply(sid, rec, kind, to)
        if action is Action.REJECT:
            out.append(StreamError(sid, code, message))

    def _collect(
        self, rec: StreamRecord, metadata: bytes | None, data: bytes, what: str,
        *, last: bool = False,
    ) -> tuple[str, str] | None:
        """Add a fragment of ``what`` to ``rec``; (code, why) not, when the
        whole exceeds max_message_size, all messages being reassembled on the
        connection exceed max_reassembly_bytes (too_large), or the budget
        shared with other connections has no room (busy).  The ``last``
        fragment is not held against the latter two: its message is joined
        and released at once."""
        added = len(metadata or b"") + len(data)
        size = rec.size + added
        if size > self.max_message_size:
            return TOO_LARGE, f"{what} exceeds max_message_size {self.max_message_size}"
        budget = self.max_reassembly_bytes
        if budget is not None and not last:
            # One message alone always fits (within max_message_size).
            others = self.reassembly_bytes - rec.size
            if others and others + size > budget:
                return TOO_LARGE, (
                    "fragmented messages on this connection exceed "
                    f"max_reassembly_bytes {budget}"
                )
        if not last:
            refused = self._reserve_fragment(added)
            if refused is not None:
                return BUSY, f"{refused}; retry later"
        if metadata is not None:
            rec.metadata = [*(rec.metadata or []), metadata]
        rec.data.append(data)
        rec.size = size
        return None

    @staticmethod
    def _joined(rec: StreamRecord) -> tuple[bytes | None, bytes]:
        metadata = None if rec.metadata is None else b"".join(rec.metadata)
        data = b"".join(rec.data)
        rec.first, rec.metadata, rec.data, rec.size = None, None, [], 0
        return metadata, data

    # --- sending -------------------------------------------------------------------------

    def _send_connection_frame(self, frame: Frame) -> bool:
        if not isinstance(frame, (Lease, Keepalive, MetadataPush)):
            return False
        what = f"send {describe(frame)}"
        nxt = CONNECTION_TABLE.get((self.role, self.state, what))
        if nxt is None:
            raise LocalProtocolError(f"cannot {what} while the connection is {self.state.value}")
        self._sent_connection_frame(frame)
        self.state = nxt
        return True

    def _sent_connection_frame(self, frame: Frame) -> None:
        pass

    def send_error(self, stream_id: int, code: str, message: str,
                   rsocket_code: int | None = None) -> bytes:
        """ERROR with ``<code>: <message>``; stream 0 ends the connection."""
        return self.send(error_frame(stream_id, code, message, rsocket_code))


class ServerConnection(_Connection, role="server"):
    """The responder side (polyport's server).

    The first frame must be SETUP (checked: version 1.x, positive keepalive
    and lifetime; resumption refused).  The application decides whether to
    accept it; it answers a refusal with ``send_error(0, ...,
    REJECTED_SETUP)`` and, when the SETUP asked for LEASE, grants one with
    ``send(Lease(...))`` before any request is served: requests without a
    valid lease become :class:`StreamError` ``busy`` (ERROR[REJECTED]).

    Requests come out whole; answer them with :meth:`send_payload` /
    :meth:`send_complete` / :meth:`send_error`.  On REQUEST_STREAM every NEXT
    uses one credit (``credits(stream_id)``); REQUEST_N frames add credits and
    are returned so the application can resume sending.
    """

    def __init__(
        self,
        transport: str = "tcp",
        *,
        clock: Callable[[], float] = time.monotonic,
        **limits: Unpack[ConnectionLimits],
    ) -> None:
        super().__init__(transport, **limits)
        self.clock = clock
        self.setup: Setup | None = None
        # LEASE book-keeping when the SETUP asked for it.
        self.lease_required = False
        self.lease_left = 0
        self.lease_expires = 0.0

    # --- receiving -------------------------------------------------------------------

    def _ignore_connection_error(self, frame: ErrorFrame) -> bool:
        # "A server MUST ignore an ERROR[INVALID_SETUP|UNSUPPORTED_SETUP|
        # REJECTED_SETUP|REJECTED_RESUME] frame."
        return frame.code in _SETUP_ERROR_CODES

    def _receive_frame(self, frame: Frame, out: list[Event]) -> None:
        if self.state is ConnectionState.AWAITING_SETUP:
            self._receive_first(frame, out)
            return
        if isinstance(frame, (Setup, Resume, ResumeOk, Lease, ErrorFrame)):
            # After SETUP: a second SETUP is ignored (the spec); we make no
            # requests, so LEASE and stream ERRORs answer nothing of ours.
            return
        if isinstance(frame, Keepalive):
            out.append(frame)
            return
        if isinstance(frame, MetadataPush):
            if frame.stream_id == CONNECTION_STREAM_ID:
                out.append(frame)
            return
        if frame.stream_id == CONNECTION_STREAM_ID:
            raise RemoteProtocolError(f"{describe(frame)} on stream 0, which is the connection's")
        if isinstance(frame, _REQUEST_CLASSES):
            if frame.stream_id % 2 == 0:
                raise RemoteProtocolError(
                    f"{describe(frame)} on even stream id {frame.stream_id}: "
                    "client stream ids are odd"
                )
            self._receive_request(frame, out)
        elif isinstance(frame, Payload):
            self._receive_fragment(frame, out)
        else:
            # "a CANCEL on an unknown Stream ID MUST be ignored": _follow does.
            self._receive_credit_or_cancel(frame, out)

    def _receive_first(self, frame: Frame, out: list[Event]) -> None:
        if isinstance(frame, Resume):
            raise RemoteProtocolError(
                "resumption is not supported", code=UNSUPPORTED, error_code=REJECTED_RESUME
            )
        if not isinstance(frame, Setup):
            raise RemoteProtocolError(
                f"the first frame must be SETUP on stream 0, got {describe(frame)} "
                f"on stream {frame.stream_id}",
                error_code=INVALID_SETUP,
            )
        if frame.major != MAJOR_VERSION:
            raise RemoteProtocolError(
                f"protocol version {frame.major}.{frame.minor} is not served (1.x is)",
                code=UNSUPPORTED,
                error_code=UNSUPPORTED_SETUP,
            )
        if frame.keepalive <= 0 or frame.lifetime <= 0:
            raise RemoteProtocolError(
                "keepalive interval and max lifetime must be > 0", error_code=INVALID_SETUP
            )
        if frame.resume_token is not None:
            # "A server that receives a SETUP frame that has (R)esume Enabled
            # set, but does not support resuming operation, MUST reject the
            # SETUP with an ERROR[REJECTED_SETUP]."
            raise RemoteProtocolError(
                "resumption is not supported", code=UNSUPPORTED, error_code=REJECTED_SETUP
            )
        self._connection_event("recv SETUP", frame)
        self.setup = frame
        self.lease_required = frame.lease
        out.append(frame)

    def _lease_allows(self) -> bool:
        if not self.lease_required:
            return True
        return self.lease_left > 0 and self.clock() < self.lease_expires

    def _receive_request(self, frame: Request, out: list[Event]) -> None:
        sid = frame.stream_id
        kind = Kind(FRAME_TYPE_OF[type(frame)])
        rec = self._streams.get(sid)
        if rec is not None:
            return  # "a Request frame on a Stream ID that is already in use MUST be ignored"
        if isinstance(frame, (RequestStream, RequestChannel)) and frame.initial_n <= 0:
            return self._violation(sid, None, kind, MALFORMED,
                                   "Initial Request N must be > 0", out)
        if not self._lease_allows():
            return self._violation(sid, None, kind, BUSY, "no valid LEASE for this request", out)
        if kind is not Kind.REQUEST_FNF and len(self._streams) >= self.max_streams:
            return self._violation(
                sid, None, kind, BUSY, f"too many streams in use (limit {self.max_streams})", out
            )
        if self.lease_required:
            # A fragmented request counts once against the lease (the spec).
            self.lease_left -= 1
        ev = Ev.RECV_REQUEST_BEGIN if frame.follows else Ev.RECV_REQUEST
        t = self._transition(None, kind, ev)
        assert t is not None
        to, action = t
        rec = self._apply(sid, None, kind, to)
        if ev is Ev.RECV_REQUEST_BEGIN:
            assert rec is not None
            rec.first = frame
            refused = self._collect(rec, frame.metadata, frame.data, "request")
            if refused is not None:
                return self._violation(sid, rec, kind, *refused, out)
            return
        if rec is not None and isinstance(frame, (RequestStream, RequestChannel)):
            rec.credits = add_credits(0, frame.initial_n)
        if action is Action.DELIVER:
            out.append(frame)

    def _receive_fragment(self, frame: Payload, out: list[Event]) -> None:
        sid = frame.stream_id
        rec = self._streams.get(sid)
        if rec is None:
            return  # "a PAYLOAD on an unknown Stream ID MUST be ignored"
        ev = Ev.RECV_REQUEST_MORE if frame.follows else Ev.RECV_REQUEST_END
        t = self._transition(rec, rec.kind, ev)
        if t is None:
            return  # e.g. a channel's PAYLOAD: nothing was granted, nothing is read
        to, action = t
        if rec.phase is Phase.RECEIVING_REQUEST:
            refused = self._collect(
                rec, frame.metadata, frame.data, "request", last=not frame.follows
            )
            if refused is not None:
                return self._violation(sid, rec, rec.kind, *refused, out)
        whole: Request | None = None
        if ev is Ev.RECV_REQUEST_END and rec.phase is Phase.RECEIVING_REQUEST:
            first = rec.first
            assert isinstance(first, _REQUEST_CLASSES)
            metadata, data = self._joined(rec)
            whole = _rebuild(first, metadata, data)
        kept = self._apply(sid, rec, rec.kind, to)
        if whole is not None and action is Action.DELIVER:
            if kept is not None and isinstance(whole, (RequestStream, RequestChannel)):
                kept.credits = add_credits(kept.credits, whole.initial_n)
            out.append(whole)

    def _receive_request_n(self, frame: RequestN, out: list[Event]) -> None:
        rec = self._streams.get(frame.stream_id)
        if rec is None:
            return  # races with completion: the stream is gone
        t = self._transition(rec, rec.kind, Ev.RECV_REQUEST_N)
        if t is None:
            return
        if frame.n <= 0:
            return self._violation(frame.stream_id, rec, rec.kind, MALFORMED,
                                   "Request N must be > 0", out)
        self._take_request_n(rec, frame, t, rec.kind.has_credits, out)

    # --- sending -------------------------------------------------------------------

    def _sent_connection_frame(self, frame: Frame) -> None:
        if isinstance(frame, Lease):
            self.lease_left = frame.requests
            self.lease_expires = self.clock() + frame.ttl / 1000

    def _send_frame(self, frame: Frame) -> None:
        if self.state is not ConnectionState.OPEN:
            raise LocalProtocolError(f"{describe(frame)} before the SETUP is accepted")
        self._send_answer_or_error(
            frame, Payload, self._send_payload_frame,
            "PAYLOAD, ERROR, LEASE, KEEPALIVE and METADATA_PUSH",
        )

    def _send_payload_frame(self, frame: Payload) -> None:
        sid, rec = self._answered(frame, "PAYLOAD")
        item = False
        if rec.phase is Phase.SENDING_FRAGMENTS:
            if frame.follows:
                ev = Ev.SEND_MORE
            else:
                ev = Ev.SEND_END_COMPLETE if frame.complete else Ev.SEND_END
        elif frame.follows:
            if frame.complete or not frame.next:
                raise LocalProtocolError("a first fragment is a NEXT without C")
            ev, item = Ev.SEND_BEGIN, True
        elif frame.complete:
            ev, item = Ev.SEND_COMPLETE, frame.next
        else:
            ev, item = Ev.SEND_NEXT, True
        hint = ""
        if rec.kind is Kind.REQUEST_RESPONSE and ev is Ev.SEND_NEXT:
            hint = "a REQUEST_RESPONSE is answered by one PAYLOAD with C (complete)"
        to, _ = self._send_transition(rec, rec.kind, ev, sid, hint)
        if item and rec.kind.has_credits:
            self._spend_credit(rec, sid)
        self._apply(sid, rec, rec.kind, to)

    def payload_frames(self, stream_id: int, data: bytes, *, metadata: bytes | None = None,
                       complete: bool = False) -> list[Payload]:
        frames = fragment(Payload(stream_id, metadata, data, complete=complete, next=True),
                          self.max_fragment)
        return [f for f in frames if isinstance(f, Payload)]

    def item_frames(self, stream_id: int, data: bytes) -> list[Any]:
        # fragment() itself: an item has no metadata and never completes, so
        # payload_frames' filtering is not needed on this per-event path.
        return fragment(Payload(stream_id, None, data, next=True), self.max_fragment)

    def send_payload(self, stream_id: int, data: bytes, *, metadata: bytes | None = None,
                     complete: bool = False) -> list[bytes]:
        """NEXT (or NEXT+COMPLETE) with ``data``, fragmented as needed: one
        ``bytes`` per frame, all or nothing."""
        frames: list[Frame] = list(
            self.payload_frames(stream_id, data, metadata=metadata, complete=complete)
        )
        return self._send_all(stream_id, frames)

    def send_complete(self, stream_id: int) -> bytes:
        """COMPLETE without data (ends a REQUEST_STREAM; uses no credit)."""
        return self.send(Payload(stream_id, complete=True))


def _rebuild(first: Request, metadata: bytes | None, data: bytes) -> Request:
    if isinstance(first, RequestStream):
        return RequestStream(first.stream_id, first.initial_n, metadata, data)
    if isinstance(first, RequestChannel):
        return RequestChannel(first.stream_id, first.initial_n, metadata, data,
                              complete=first.complete)
    if isinstance(first, RequestFnf):
        return RequestFnf(first.stream_id, metadata, data)
    return RequestResponse(first.stream_id, metadata, data)


class ClientConnection(_Connection, RequesterConveniences, role="client"):
    """The requester side.  Send SETUP first (:meth:`setup`), then requests on
    ids from :meth:`next_stream_id` (odd: 1, 3, 5, ...; never reused).
    PAYLOADs come out of ``receive_data`` reassembled; LEASE, KEEPALIVE and
    ERROR on stream 0 come out as they are.  "A client assumes a SETUP is
    accepted if it receives a response to a request, a LEASE frame, or if it
    sees a REQUEST type" (``setup_accepted``)."""

    def _check_can_request(self) -> None:
        if self.state is not ConnectionState.OPEN:
            # Checked here so that a refused request does not use up an id.
            raise LocalProtocolError("requests need an open connection: send SETUP first")

    def _ignore_connection_error(self, frame: ErrorFrame) -> bool:
        # SETUP errors count only before the SETUP is known to be accepted.
        return self.setup_accepted and frame.code in _SETUP_ERROR_CODES

    # --- receiving -------------------------------------------------------------------

    def _receive_frame(self, frame: Frame, out: list[Event]) -> None:
        if self.state is ConnectionState.AWAITING_SETUP:
            raise RemoteProtocolError(f"received {describe(frame)} before SETUP was sent")
        if isinstance(frame, (Lease, Keepalive)):
            self.setup_accepted = self.setup_accepted or isinstance(frame, Lease)
            out.append(frame)
        elif isinstance(frame, Payload) and frame.stream_id != CONNECTION_STREAM_ID:
            self._receive_payload(frame, out)
        elif isinstance(frame, ErrorFrame):
            self._receive_error(frame, out)
        elif isinstance(frame, _REQUEST_CLASSES):
            # Requests from the server: this client serves none (ignored).
            self.setup_accepted = True

    def _receive_payload(self, frame: Payload, out: list[Event]) -> None:
        sid, rec = self._answer_record(frame)
        if rec is None:
            return
        if rec.phase is Phase.RECEIVING_FRAGMENTS:
            last = Ev.RECV_END_COMPLETE if frame.complete else Ev.RECV_END
            ev = Ev.RECV_MORE if frame.follows else last
        elif frame.follows:
            ev = Ev.RECV_BEGIN
        elif frame.complete:
            ev = Ev.RECV_COMPLETE
        else:
            ev = Ev.RECV_NEXT
        t = self._transition(rec, rec.kind, ev)
        if t is None:
            return
        to, action = t
        item = frame.next and ev in (Ev.RECV_NEXT, Ev.RECV_COMPLETE, Ev.RECV_BEGIN)
        if item and rec.kind.has_credits:
            rec.credits = max(0, rec.credits - 1)
        whole: Payload | None = None
        if ev in (Ev.RECV_NEXT, Ev.RECV_COMPLETE):
            whole = frame
        elif rec.phase is not Phase.ABANDONED:
            if ev is Ev.RECV_BEGIN:
                rec.metadata, rec.data, rec.size = None, [], 0
            refused = self._collect(
                rec, frame.metadata, frame.data, "PAYLOAD", last=not frame.follows
            )
            if refused is not None:
                return self._violation(sid, rec, rec.kind, *refused, out)
            if ev in (Ev.RECV_END, Ev.RECV_END_COMPLETE):
                metadata, data = self._joined(rec)
                whole = Payload(sid, metadata, data, complete=frame.complete, next=True)
        self._deliver(sid, rec, rec.kind, to, action, whole, out)

    # --- sending -------------------------------------------------------------------

    def _send_frame(self, frame: Frame) -> None:
        if self._send_setup(frame):
            return
        sid = frame.stream_id
        rec = self._streams.get(sid)
        if isinstance(frame, (RequestResponse, RequestFnf, RequestStream)):
            kind = Kind(FRAME_TYPE_OF[type(frame)])
            if rec is not None:
                raise LocalProtocolError(f"stream id {sid} is in use")
            ev = Ev.SEND_REQUEST_BEGIN if frame.follows else Ev.SEND_REQUEST
            to, _ = self._send_transition(None, kind, ev, sid)
            new = self._apply(sid, None, kind, to)
            if new is not None and isinstance(frame, RequestStream):
                new.credits = frame.initial_n
        elif isinstance(frame, Payload):
            # Continuations of our fragmented request.
            kind = rec.kind if rec is not None else Kind.REQUEST_RESPONSE
            ev = Ev.SEND_REQUEST_MORE if frame.follows else Ev.SEND_REQUEST_END
            to, _ = self._send_transition(rec, kind, ev, sid)
            self._apply(sid, rec, kind, to)
        elif not self._send_control(frame, Kind.REQUEST_STREAM):
            raise LocalProtocolError(
                f"the client sends SETUP, KEEPALIVE, METADATA_PUSH, REQUEST_RESPONSE, "
                f"REQUEST_FNF, REQUEST_STREAM, REQUEST_N and CANCEL, not {describe(frame)}"
            )

    # --- conveniences --------------------------------------------------------------------

    def setup(self, frame: Setup) -> bytes:
        return self.send(frame)

    def _fragment(self, frame: Request) -> list[Frame]:
        return list(fragment(frame, self.max_fragment))

    def request_response(self, metadata: bytes | None, data: bytes) -> tuple[int, list[bytes]]:
        """Allocate a stream id and send the request (fragmented as needed)."""
        return self._request(RequestResponse(self.next_stream_id(), metadata, data))

    def request_fnf(self, metadata: bytes | None, data: bytes) -> tuple[int, list[bytes]]:
        return self._request(RequestFnf(self.next_stream_id(), metadata, data))

    def request_stream(self, metadata: bytes | None, data: bytes,
                       initial_n: int) -> tuple[int, list[bytes]]:
        return self._request(RequestStream(self.next_stream_id(), initial_n, metadata, data))
