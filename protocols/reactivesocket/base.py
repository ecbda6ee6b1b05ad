"""What ReactiveSocket's server and client connections share.

:class:`BaseConnection` does the framing per transport, the connection's own
states (``CONNECTION_TABLE``), the checks every send goes through and the
book-keeping of streams; ``connection.py`` adds the responder's and the
requester's stream rules.  :class:`StreamError` and :func:`error_frame` are
part of the connection objects' interface and are exported from there too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from polyport.protocols.reactivesocket import payloads
from polyport.protocols.reactivesocket.errors import (
    MALFORMED,
    TOO_LARGE,
    UNSUPPORTED,
    LocalProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.reactivesocket.frames import (
    CONNECTION_STREAM_ID,
    DEFAULT_MAX_FRAGMENT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    LENGTH_SIZE,
    Cancel,
    ErrorFrame,
    Ext,
    Frame,
    UnknownFrame,
)
from polyport.protocols.reactivesocket.state import (
    CONNECTION_TABLE,
    Action,
    ConnectionState,
    Ev,
    Kind,
    Phase,
    StreamInfo,
    StreamRecord,
    Table,
    Transition,
)
from polyport.protocols.reactivesocket.wire import (
    TRANSPORTS,
    add_tcp_length,
    check_message_size,
    check_tcp_length,
    decode_frame,
    describe,
    encode_frame,
)


@dataclass(frozen=True, slots=True)
class StreamError:
    """The peer broke one stream's rules; the connection lives on.

    The connection object has already terminated the stream's normal flow.  The
    application stops any work for ``stream_id`` and answers: a server sends
    ``conn.send_error(e.stream_id, e.code, e.message)``, a client sends
    ``conn.cancel(e.stream_id)``.
    """

    stream_id: int
    code: str
    message: str


Event = Frame | StreamError


def error_frame(stream_id: int, code: str, message: str) -> ErrorFrame:
    """ERROR with the service's ``{code, message}`` data."""
    return ErrorFrame(stream_id, payloads.encode_error_data(code, message))


class BaseConnection:
    """What the server and the client share: framing per transport, the
    connection's own states, the send checks and the stream book-keeping.
    Subclasses receive and send stream frames by their role's table."""

    role = ""
    table: Table = {}
    live_phases: frozenset[Phase] = frozenset()

    def __init__(
        self,
        transport: str = "tcp",
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_fragment: int = DEFAULT_MAX_FRAGMENT,
        extensions: Iterable[int] = (),
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if max_frame_size < 12 or max_fragment < 1 or max_message_size < 0:
            raise ValueError("max_frame_size >= 12, max_fragment >= 1, max_message_size >= 0")
        self.transport = transport
        self.max_frame_size = max_frame_size
        self.max_message_size = max_message_size
        self.max_fragment = max_fragment
        self.extensions = frozenset(extensions)
        self.state = ConnectionState.AWAITING_SETUP
        self._buffer = bytearray()
        self._streams: dict[int, StreamRecord] = {}

    # --- introspection -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state in (ConnectionState.CLOSED, ConnectionState.ERRORED)

    @property
    def streams(self) -> dict[int, StreamInfo]:
        """Every stream with book-keeping, live or winding down."""
        return {
            sid: StreamInfo(sid, rec.kind, rec.phase, rec.credits)
            for sid, rec in self._streams.items()
        }

    @property
    def reassembly_bytes(self) -> int:
        """Bytes of fragmented messages held now (requests on the server,
        RESPONSEs on the client), all streams together."""
        # A sum over at most max_streams records, taken per request fragment.
        return sum(rec.reassembly.size for rec in self._streams.values())

    def live_streams(self) -> list[int]:
        return sorted(sid for sid, rec in self._streams.items() if rec.phase in self.live_phases)

    def is_live(self, stream_id: int) -> bool:
        rec = self._streams.get(stream_id)
        return rec is not None and rec.phase in self.live_phases

    def credits(self, stream_id: int) -> int:
        """Outstanding credits of a live stream (0 for an unknown one)."""
        rec = self._streams.get(stream_id)
        return rec.credits if rec is not None else 0

    # --- receiving -------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes (TCP) or one message (WebSocket); get every complete frame.

        Raises :class:`RemoteProtocolError` on a connection-level fault; the error's
        ``frames`` are those decoded before it.  After the fault or after an
        ERROR on stream 0, further data is discarded.
        """
        out: list[Event] = []
        if self.closed:
            return out
        try:
            if self.transport == "tcp":
                self._receive_tcp(data, out)
            else:
                check_message_size(data, self.max_frame_size)
                self._receive_message(bytes(data), out)
        except RemoteProtocolError as exc:
            self.state = ConnectionState.ERRORED
            self._buffer.clear()
            exc.frames = list(out)
            raise
        if self.closed:
            # The peer ended the connection later in the same read: a stream
            # error before that has no one to answer (send_error would raise).
            return [ev for ev in out if not isinstance(ev, StreamError)]
        return out

    def _receive_tcp(self, data: bytes, out: list[Event]) -> None:
        buf = self._buffer
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= LENGTH_SIZE and not self.closed:
                length = int.from_bytes(buf[pos : pos + LENGTH_SIZE], "big")
                check_tcp_length(length, self.max_frame_size)
                if len(buf) - pos < length:
                    break
                message = bytes(buf[pos + LENGTH_SIZE : pos + length])
                pos += length
                self._receive_message(message, out)
        finally:
            del buf[:pos]
        if self.closed:
            buf.clear()

    def _receive_message(self, message: bytes, out: list[Event]) -> None:
        frame = decode_frame(message)
        if isinstance(frame, UnknownFrame):
            if frame.ignore:
                return
            raise RemoteProtocolError(
                f"unknown frame type 0x{frame.frame_type:04X} without the I (ignore) flag",
                code=UNSUPPORTED,
            )
        if isinstance(frame, Ext):
            if frame.extended_type in self.extensions:
                if self.state is ConnectionState.OPEN:
                    out.append(frame)
                    return
            elif frame.ignore:
                return
            else:
                raise RemoteProtocolError(
                    f"unsupported extension type 0x{frame.extended_type:08X} "
                    "without the I (ignore) flag",
                    code=UNSUPPORTED,
                )
        if isinstance(frame, ErrorFrame) and frame.stream_id == CONNECTION_STREAM_ID:
            self._connection_event("recv ERROR 0", frame)
            out.append(frame)
            return
        self._receive_frame(frame, out)

    def _connection_event(self, what: str, frame: Frame) -> None:
        nxt = CONNECTION_TABLE.get((self.role, self.state, what))
        if nxt is None:
            raise RemoteProtocolError(
                f"{describe(frame)} is not allowed while the connection is {self.state.value}",
                code=MALFORMED,
            )
        self.state = nxt

    def _check_stream_zero(self, frame: Frame) -> None:
        if frame.stream_id == CONNECTION_STREAM_ID:
            raise RemoteProtocolError(
                f"{describe(frame)} on stream 0, which is reserved for the connection",
                code=MALFORMED,
            )

    def _receive_frame(self, frame: Frame, out: list[Event]) -> None:
        raise NotImplementedError

    # --- sending ---------------------------------------------------------------

    def send(self, frame: Frame) -> bytes:
        """Bytes for one frame (one WebSocket message), after checking that the
        frame is legal now.  Raises :class:`LocalProtocolError` otherwise."""
        message = encode_frame(frame)
        if len(message) > self.max_frame_size:
            raise LocalProtocolError(
                f"{describe(frame)} of {len(message)} bytes exceeds max_frame_size "
                f"{self.max_frame_size}; fragment it",
                code=TOO_LARGE,
            )
        if self.state is ConnectionState.CLOSED:
            raise LocalProtocolError("the connection is closed")
        if isinstance(frame, ErrorFrame) and frame.stream_id == CONNECTION_STREAM_ID:
            nxt = CONNECTION_TABLE.get((self.role, self.state, "send ERROR 0"))
            if nxt is None:
                raise LocalProtocolError(
                    f"ERROR on stream 0 is not allowed while {self.state.value}"
                )
            self.state = nxt
            self._streams.clear()
        elif self.state is ConnectionState.ERRORED:
            raise LocalProtocolError("after a protocol error only ERROR on stream 0 may be sent")
        elif isinstance(frame, (Ext, UnknownFrame)):
            if self.state is not ConnectionState.OPEN:
                raise LocalProtocolError(f"{describe(frame)} before the connection is set up")
        else:
            self._send_frame(frame)
        return add_tcp_length(message) if self.transport == "tcp" else message

    def send_error(self, stream_id: int, code: str, message: str) -> bytes:
        """ERROR with ``{code, message}``; stream 0 ends the connection."""
        return self.send(error_frame(stream_id, code, message))

    def _send_frame(self, frame: Frame) -> None:
        raise NotImplementedError

    def _send_all(self, stream_id: int, frames: list[Frame]) -> list[bytes]:
        """Send several frames of one stream all or nothing."""
        rec = self._streams.get(stream_id)
        saved = None if rec is None else (rec.phase, rec.credits)
        sent: list[bytes] = []
        try:
            for frame in frames:
                sent.append(self.send(frame))
        except LocalProtocolError:
            if saved is None:
                self._streams.pop(stream_id, None)
            else:
                assert rec is not None
                rec.phase, rec.credits = saved
                self._streams[stream_id] = rec
            raise
        return sent

    # --- stream table helpers ----------------------------------------------------

    def _apply(self, stream_id: int, rec: StreamRecord | None, kind: Kind, to: Phase) -> None:
        if to is Phase.CLOSED:
            self._streams.pop(stream_id, None)
        elif rec is None:
            self._streams[stream_id] = StreamRecord(kind, to)
        else:
            rec.phase = to

    def _reject(
        self,
        stream_id: int,
        rec: StreamRecord | None,
        kind: Kind,
        ev: Ev,
        code: str,
        message: str,
        out: list[Event],
    ) -> None:
        """The peer broke one stream's rules: follow the table's violation row,
        drop any half-received message and, where the row says REJECT, tell the
        application with a :class:`StreamError`."""
        phase = rec.phase if rec is not None else Phase.CLOSED
        lookup = rec.kind if rec is not None else kind
        to, action = self.table[(lookup, phase, ev)]
        if rec is not None:
            rec.reassembly.clear()
        self._apply(stream_id, rec, lookup, to)
        if action is Action.REJECT:
            out.append(StreamError(stream_id, code, message))

    def _follow(self, frame: Cancel | ErrorFrame, ev: Ev, out: list[Event]) -> None:
        """A frame whose only effect is its table row (CANCEL to the responder,
        ERROR to the requester).  Without a record or a row it is dropped: it
        crossed the stream's end on the wire."""
        sid = frame.stream_id
        rec = self._streams.get(sid)
        if rec is None:
            return
        t = self.table.get((rec.kind, rec.phase, ev))
        if t is None:
            return
        to, action = t
        self._apply(sid, rec, rec.kind, to)
        if action is Action.DELIVER:
            out.append(frame)

    def _send_transition(
        self, rec: StreamRecord | None, kind: Kind, ev: Ev, stream_id: int, hint: str = ""
    ) -> Transition:
        phase = rec.phase if rec is not None else Phase.CLOSED
        t = self.table.get((rec.kind if rec is not None else kind, phase, ev))
        if t is None:
            what = ev.value.replace("send_", "").replace("_", " ").upper()
            state = f"a {rec.kind.name} stream in phase {phase.value}" if rec else "no live stream"
            raise LocalProtocolError(
                f"cannot send {what} on stream {stream_id}: {state}"
                + (f" ({hint})" if hint else "")
            )
        return t
