"""Sans-IO ReactiveSocket connections.

``ServerConnection`` is the responder polyport runs; ``ClientConnection`` the
requester its client uses.  ``receive_data(bytes)`` returns frames (requests
and responses whole: fragments are reassembled) plus :class:`StreamError`
events; ``send(frame)`` checks the frame against the state tables of
``state.py`` and returns the bytes to write.  Fragments are cut and glued by
``fragments.py``; the bytes of single frames are ``wire.py``'s.

Transports: ``"tcp"`` (a byte stream; frames carry a u32 length) or
``"websocket"`` (every ``receive_data`` call is exactly one binary message,
and every ``bytes`` from ``send`` is one message to send).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from polyport.protocols.reactive.connection import DEFAULT_MAX_STREAMS, RequesterConveniences
from polyport.protocols.reactivesocket.base import BaseConnection, Event, StreamError, error_frame
from polyport.protocols.reactivesocket.errors import (
    BUSY,
    MALFORMED,
    TOO_LARGE,
    LocalProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.reactivesocket.fragments import fragment
from polyport.protocols.reactivesocket.frames import (
    CONNECTION_STREAM_ID,
    FRAME_TYPE_OF,
    ErrorFrame,
    Frame,
    Request,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Response,
    Setup,
)
from polyport.protocols.reactivesocket.state import (
    FRAGMENT_OF_ANOTHER_KIND,
    MID_REQUEST,
    REQUEST_FRAGMENT_EVENTS,
    REQUEST_FRAMES,
    RESPONSE_FRAGMENT_EVENTS,
    RESPONSE_FRAMES,
    Action,
    ConnectionState,
    Ev,
    FrameFault,
    Kind,
    Phase,
    StreamRecord,
    add_credits,
)
from polyport.protocols.reactivesocket.wire import describe

__all__ = [
    "DEFAULT_MAX_STREAMS",
    "ClientConnection",
    "ConnectionState",
    "Event",
    "ServerConnection",
    "StreamError",
    "error_frame",
]

_REQUEST_CLASSES = (RequestResponse, RequestFnf, RequestStream, RequestSub)


class ServerConnection(BaseConnection, role="server"):
    """The responder side (polyport's server).

    Requests come out of ``receive_data`` whole, in the spec's frame classes;
    answer them with :meth:`send_response` / :meth:`send_complete` /
    :meth:`send_error` (or :meth:`send`).  On REQUEST_STREAM and REQUEST_SUB
    every NEXT uses one credit (``credits(stream_id)``); REQUEST_N frames add
    credits and are returned so the application can resume sending.
    """

    # --- receiving -------------------------------------------------------------

    def _receive_frame(self, frame: Frame, out: list[Event]) -> None:
        if self.state is ConnectionState.AWAITING_SETUP:
            if not isinstance(frame, Setup):
                raise RemoteProtocolError(
                    f"the first frame must be SETUP on stream 0, got {describe(frame)} "
                    f"on stream {frame.stream_id}",
                    code=MALFORMED,
                )
            self._connection_event("recv SETUP", frame)
            out.append(frame)
            return
        if isinstance(frame, Setup):
            raise RemoteProtocolError("SETUP may only be sent once, as the first frame")
        if isinstance(frame, (Response, ErrorFrame)):
            # We never make requests, so these answer nothing we know: dropped,
            # as the spec says of frames in an unspecified state.
            if frame.stream_id == CONNECTION_STREAM_ID:
                self._check_stream_zero(frame)
            return
        self._check_stream_zero(frame)
        if isinstance(frame, _REQUEST_CLASSES):
            self._receive_request(frame, out)
        else:
            self._receive_credit_or_cancel(frame, out)

    def _violation(
        self,
        rec: StreamRecord | None,
        kind: Kind,
        stream_id: int,
        more: bool,
        code: str,
        message: str,
        out: list[Event],
    ) -> None:
        if rec is not None:
            rec.credits = 0  # a rejected stream gets no more RESPONSEs
        ev = Ev.VIOLATION_MID_REQUEST if more else Ev.VIOLATION
        self._reject(stream_id, rec, kind, ev, code, message, out)

    def _receive_request(self, frame: Request, out: list[Event]) -> None:
        sid = frame.stream_id
        kind = Kind(FRAME_TYPE_OF[type(frame)])
        rec = self._streams.get(sid)
        phase = rec.phase if rec is not None else Phase.CLOSED
        mid_request = phase in MID_REQUEST
        # More fragments of this request follow the frame.
        more = not frame.end and (frame.begin or mid_request)
        row = REQUEST_FRAMES[mid_request, frame.begin, frame.end]
        if mid_request and isinstance(row, Ev) and rec is not None and rec.kind is not kind:
            row = FRAGMENT_OF_ANOTHER_KIND
        if isinstance(row, FrameFault):
            ongoing = rec.kind.name if rec is not None else ""
            return self._violation(
                rec, kind, sid, more, MALFORMED, row.text(kind.name, sid, ongoing), out
            )
        ev = row
        t = self.table.get((rec.kind if rec is not None else kind, phase, ev))
        if t is None:
            assert rec is not None
            return self._violation(
                rec,
                kind,
                sid,
                more,
                MALFORMED,
                f"stream id {sid} is already in use by a live {rec.kind.name}",
                out,
            )
        to, _ = t
        refused = self._refuse_request(frame, rec, kind, phase, ev, to)
        if refused is not None:
            code, message = refused
            return self._violation(rec, kind, sid, more, code, message, out)
        self._take_request(frame, rec, kind, ev, t, out)

    def _refuse_request(
        self,
        frame: Request,
        rec: StreamRecord | None,
        kind: Kind,
        phase: Phase,
        ev: Ev,
        to: Phase,
    ) -> tuple[str, str] | None:
        """The error code and message that refuse a legal request frame (its
        Initial Request N, the stream and size limits), or None to take it."""
        if ev in (Ev.RECV_REQUEST, Ev.RECV_REQUEST_BEGIN) and rec is None:
            if isinstance(frame, (RequestStream, RequestSub)) and frame.initial_n < 0:
                return MALFORMED, f"{kind.name} with negative Initial Request N {frame.initial_n}"
            if to is not Phase.CLOSED and len(self._streams) >= self.max_streams:
                return "busy", f"too many streams in use (limit {self.max_streams})"
        if ev in REQUEST_FRAGMENT_EVENTS and (
            phase is not Phase.DISCARDING and phase is not Phase.REJECTED_MID_REQUEST
        ):
            return self._refuse_fragment(frame, rec, kind, ev)
        return None

    def _refuse_fragment(
        self, frame: Request, rec: StreamRecord | None, kind: Kind, ev: Ev
    ) -> tuple[str, str] | None:
        size = rec.reassembly.size if rec is not None and ev is not Ev.RECV_REQUEST_BEGIN else 0
        if size + len(frame.data) > self.max_message_size:
            return (
                TOO_LARGE,
                f"fragmented {kind.name} exceeds max_message_size {self.max_message_size}",
            )
        if ev is Ev.RECV_REQUEST_END:
            # The END fragment is not counted: it completes its request,
            # whose fragments are then released.
            return None
        budget = self.max_reassembly_bytes
        if budget is not None:
            others = self.reassembly_bytes - (rec.reassembly.size if rec is not None else 0)
            if others and others + size + len(frame.data) > budget:
                return (
                    TOO_LARGE,
                    "fragmented requests on this connection exceed "
                    f"max_reassembly_bytes {budget}",
                )
        # The budget shared with other connections: busy, not too_large, as
        # the same request may fit later.
        refused = self._reserve_fragment(len(frame.data))
        if refused is not None:
            return BUSY, f"{refused}; retry later"
        return None

    def _take_request(
        self,
        frame: Request,
        rec: StreamRecord | None,
        kind: Kind,
        ev: Ev,
        transition: tuple[Phase, Action],
        out: list[Event],
    ) -> None:
        """Apply a request frame the tables allow; a whole request goes out."""
        sid = frame.stream_id
        to, action = transition
        # Hold on to the fragments received before _apply() may drop the record.
        received = rec.reassembly if rec is not None else None
        self._apply(sid, rec, kind, to)
        rec = self._streams.get(sid)
        whole: Request | None = None
        if ev is Ev.RECV_REQUEST:
            whole = replace(frame, begin=False, end=False)
        elif ev is Ev.RECV_REQUEST_BEGIN and rec is not None and to is Phase.RECEIVING_REQUEST:
            rec.reassembly.begin(frame.data, first=frame)
        elif ev is Ev.RECV_REQUEST_MORE and rec is not None and to is Phase.RECEIVING_REQUEST:
            rec.reassembly.add(frame.data)
        elif ev is Ev.RECV_REQUEST_END and action is Action.DELIVER:
            assert received is not None and received.first is not None
            first = received.first
            whole = replace(first, data=received.finish(frame.data), begin=False, end=False)
        if rec is not None and to is not Phase.RECEIVING_REQUEST:
            rec.reassembly.clear()
        if whole is not None and action is Action.DELIVER:
            if rec is not None and isinstance(whole, (RequestStream, RequestSub)):
                rec.credits = add_credits(rec.credits, whole.initial_n)
            out.append(whole)

    def _receive_request_n(self, frame: RequestN, out: list[Event]) -> None:
        sid = frame.stream_id
        rec = self._streams.get(sid)
        if rec is None:
            return  # races with completion: the stream is gone
        t = self.table.get((rec.kind, rec.phase, Ev.RECV_REQUEST_N))
        if t is None:
            return
        counting = rec.kind.has_credits and rec.phase in (
            Phase.RECEIVING_REQUEST,
            Phase.RESPONDING,
            Phase.SENDING_FRAGMENTS,
        )
        if counting and frame.n <= 0:
            return self._violation(
                rec,
                rec.kind,
                sid,
                rec.phase is Phase.RECEIVING_REQUEST,
                MALFORMED,
                f"REQUEST_N of {frame.n} on stream {sid}: Request N must be positive",
                out,
            )
        self._take_request_n(rec, frame, t, counting, out)

    # --- sending ---------------------------------------------------------------

    def _send_frame(self, frame: Frame) -> None:
        self._send_answer_or_error(
            frame, Response, self._send_response_frame, "RESPONSE, ERROR and EXT only"
        )

    def _send_response_frame(self, frame: Response) -> None:
        sid, rec = self._answered(frame, "RESPONSE")
        hint = ""
        item = False
        if rec.phase is Phase.SENDING_FRAGMENTS:
            if frame.begin:
                raise LocalProtocolError(
                    f"stream {sid} is in the middle of a fragmented RESPONSE: no B flag"
                )
            if frame.complete and not frame.end:
                raise LocalProtocolError("C (complete) goes on the last fragment only")
            ev = (
                (Ev.SEND_END_COMPLETE if frame.complete else Ev.SEND_END)
                if frame.end
                else Ev.SEND_MORE
            )
        elif frame.begin and not frame.end:
            if frame.complete:
                raise LocalProtocolError("C (complete) goes on the last fragment only")
            ev, item = Ev.SEND_BEGIN, True
        elif not frame.begin:
            raise LocalProtocolError(
                "a whole RESPONSE has B and E set; fragments start with B alone"
            )
        elif frame.complete:
            ev, item = Ev.SEND_COMPLETE, bool(frame.data)
        else:
            ev, item = Ev.SEND_NEXT, True
        if rec.kind is Kind.REQUEST_SUB and ev in (Ev.SEND_COMPLETE, Ev.SEND_END_COMPLETE):
            hint = "a REQUEST_SUB never completes; end it with ERROR"
        elif rec.kind is Kind.REQUEST_RESPONSE and ev in (Ev.SEND_NEXT, Ev.SEND_END):
            hint = "a REQUEST_RESPONSE is answered by one RESPONSE with C (complete)"
        to, _ = self._send_transition(rec, rec.kind, ev, sid, hint)
        if item and rec.kind.has_credits:
            self._spend_credit(rec, sid)
        self._apply(sid, rec, rec.kind, to)

    def fragment_response(
        self,
        stream_id: int,
        data: bytes,
        *,
        complete: bool = False,
        max_fragment: int | None = None,
    ) -> list[Response]:
        """The RESPONSE frames carrying ``data``: one whole frame when it fits
        ``max_fragment`` (default: the connection's), else B / ... / E fragments."""
        limit = self.max_fragment if max_fragment is None else max_fragment
        frames = fragment(Response(stream_id, data, complete), limit)
        return [f for f in frames if isinstance(f, Response)]

    def item_frames(self, stream_id: int, data: bytes) -> list[Any]:
        # fragment() itself: an item is a RESPONSE that never completes, so
        # fragment_response's filtering is not needed on this per-event path.
        return fragment(Response(stream_id, data), self.max_fragment)

    def send_response(
        self,
        stream_id: int,
        data: bytes,
        *,
        complete: bool = False,
        max_fragment: int | None = None,
    ) -> list[bytes]:
        """NEXT (or NEXT+COMPLETE) with ``data``, fragmented as needed.  One
        ``bytes`` per frame (one WebSocket message each); all or nothing."""
        frames = self.fragment_response(
            stream_id, data, complete=complete, max_fragment=max_fragment
        )
        return self._send_all(stream_id, list(frames))

    def send_complete(self, stream_id: int) -> bytes:
        """COMPLETE without data (ends a REQUEST_STREAM; uses no credit)."""
        return self.send(Response(stream_id, b"", complete=True))


class ClientConnection(BaseConnection, RequesterConveniences, role="client"):
    """The requester side.  Send SETUP first (:meth:`setup`), then requests on
    ids from :meth:`next_stream_id` (odd: 1, 3, 5, ...; never reused).
    RESPONSEs come out of ``receive_data`` reassembled."""

    # --- receiving -------------------------------------------------------------

    def _receive_frame(self, frame: Frame, out: list[Event]) -> None:
        if self.state is ConnectionState.AWAITING_SETUP:
            raise RemoteProtocolError(f"received {describe(frame)} before SETUP was sent")
        if isinstance(frame, Setup):
            raise RemoteProtocolError("SETUP comes from the client, not the server")
        self._check_stream_zero(frame)
        if isinstance(frame, Response):
            self._receive_response(frame, out)
        elif isinstance(frame, ErrorFrame):
            self._receive_error(frame, out)
        # Requests from the server's requester: this client serves none;
        # ignored like any frame in an unspecified state.
        elif isinstance(frame, _REQUEST_CLASSES):
            self.setup_accepted = True

    def _abandon(
        self, rec: StreamRecord, sid: int, code: str, message: str, out: list[Event]
    ) -> None:
        self._reject(sid, rec, rec.kind, Ev.VIOLATION, code, message, out)

    def _receive_response(self, frame: Response, out: list[Event]) -> None:
        sid, rec = self._answer_record(frame)
        if rec is None:
            return
        mid_response = rec.phase is Phase.RECEIVING_FRAGMENTS
        row = RESPONSE_FRAMES[mid_response, frame.begin, frame.end, frame.complete]
        if isinstance(row, FrameFault):
            return self._abandon(rec, sid, MALFORMED, row.text("RESPONSE", sid), out)
        ev = row
        t = self.table.get((rec.kind, rec.phase, ev))
        if t is None:
            return self._abandon(
                rec,
                sid,
                MALFORMED,
                f"unexpected RESPONSE on a {rec.kind.name} stream that is {rec.phase.value}",
                out,
            )
        to, action = t
        if ev in RESPONSE_FRAGMENT_EVENTS and rec.phase is not Phase.ABANDONED:
            size = rec.reassembly.size if ev is not Ev.RECV_BEGIN else 0
            if size + len(frame.data) > self.max_message_size:
                return self._abandon(
                    rec,
                    sid,
                    TOO_LARGE,
                    f"fragmented RESPONSE exceeds max_message_size {self.max_message_size}",
                    out,
                )
        item = ev in (Ev.RECV_NEXT, Ev.RECV_BEGIN) or (ev is Ev.RECV_COMPLETE and frame.data)
        if item and rec.phase is not Phase.ABANDONED and rec.kind.has_credits:
            rec.credits = max(0, self._use_credit(rec.credits))
        whole: Response | None = None
        if ev in (Ev.RECV_NEXT, Ev.RECV_COMPLETE):
            whole = replace(frame, begin=True, end=True)
        elif ev is Ev.RECV_BEGIN:
            rec.reassembly.begin(frame.data)
        elif ev is Ev.RECV_MORE:
            rec.reassembly.add(frame.data)
        elif ev in (Ev.RECV_END, Ev.RECV_END_COMPLETE):
            whole = Response(sid, rec.reassembly.finish(frame.data), frame.complete)
        self._deliver(sid, rec, rec.kind, to, action, whole, out)

    # --- sending ---------------------------------------------------------------

    def _send_frame(self, frame: Frame) -> None:
        if self._send_setup(frame):
            return
        if isinstance(frame, _REQUEST_CLASSES):
            self._send_request_frame(frame)
        elif isinstance(frame, RequestN) and frame.n <= 0:
            raise LocalProtocolError(f"Request N must be positive, not {frame.n}")
        elif not self._send_control(frame, Kind.REQUEST_STREAM):
            raise LocalProtocolError(
                f"the client sends SETUP, requests, REQUEST_N, CANCEL and EXT, "
                f"not {describe(frame)} on a stream"
            )

    def _send_request_frame(self, frame: Request) -> None:
        sid = frame.stream_id
        kind = Kind(FRAME_TYPE_OF[type(frame)])
        rec = self._streams.get(sid)
        if isinstance(frame, (RequestStream, RequestSub)) and frame.initial_n < 0:
            raise LocalProtocolError(f"Initial Request N must not be negative: {frame.initial_n}")
        if rec is not None and rec.phase is Phase.SENDING_REQUEST:
            if frame.begin:
                raise LocalProtocolError(
                    f"stream {sid} is in the middle of a fragmented request: no B flag"
                )
            if rec.kind is not kind:
                raise LocalProtocolError(
                    f"a {kind.name} fragment cannot continue the {rec.kind.name} on {sid}"
                )
            ev = Ev.SEND_REQUEST_END if frame.end else Ev.SEND_REQUEST_MORE
        elif frame.begin and not frame.end:
            ev = Ev.SEND_REQUEST_BEGIN
        elif frame.end and not frame.begin:
            raise LocalProtocolError("a request fragment with E needs an earlier B")
        else:
            ev = Ev.SEND_REQUEST
        to, _ = self._send_transition(
            rec,
            kind,
            ev,
            sid,
            "stream ids must not be reused while live" if rec is not None else "",
        )
        self._apply(sid, rec, kind, to)
        new = self._streams.get(sid)
        if new is not None and rec is None and isinstance(frame, (RequestStream, RequestSub)):
            new.credits = add_credits(0, frame.initial_n)

    # --- conveniences -------------------------------------------------------------

    def setup(self, data: bytes = b"") -> bytes:
        return self.send(Setup(data))

    def _fragment(self, frame: Request) -> list[Frame]:
        return list(fragment(frame, self.max_fragment))

    def request_response(self, data: bytes) -> tuple[int, list[bytes]]:
        """Allocate a stream id and send the request (fragmented as needed).
        Returns the id and one ``bytes`` per frame."""
        return self._request(RequestResponse(self.next_stream_id(), data))

    def request_fnf(self, data: bytes) -> tuple[int, list[bytes]]:
        return self._request(RequestFnf(self.next_stream_id(), data))

    def request_stream(self, data: bytes, initial_n: int) -> tuple[int, list[bytes]]:
        return self._request(RequestStream(self.next_stream_id(), initial_n, data))

    def request_sub(self, data: bytes, initial_n: int) -> tuple[int, list[bytes]]:
        return self._request(RequestSub(self.next_stream_id(), initial_n, data))
