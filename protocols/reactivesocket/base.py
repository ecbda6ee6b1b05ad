"""What ReactiveSocket's server and client connections share.

:class:`BaseConnection` plugs the draft's codec into the core both versions
share (``protocols/reactive/connection.py``: framing, the connection's own
states, the send checks, the stream book-keeping) and adds what is the
draft's alone: EXT frames and the I (ignore) flag, a TCP length that counts
itself, and stream rejection that follows the rest of a fragmented request.
``connection.py`` adds the responder's and the requester's stream rules.
:class:`StreamError` and :func:`error_frame` are part of the connection
objects' interface and are exported from there too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from polyport.protocols.reactive.connection import (
    ConnectionLimits,
    StreamConnection,
    StreamError,
)
from polyport.protocols.reactivesocket import errors, frames, state, wire
from polyport.protocols.reactivesocket.errors import (
    MALFORMED,
    UNSUPPORTED,
    LocalProtocolError,
    RemoteProtocolError,
    error_frame,
)
from polyport.protocols.reactivesocket.frames import (
    CONNECTION_STREAM_ID,
    MAX_I64,
    Ext,
    Frame,
    UnknownFrame,
)
from polyport.protocols.reactivesocket.state import (
    Action,
    ConnectionState,
    Ev,
    Kind,
    Phase,
    StreamRecord,
)
from polyport.protocols.reactivesocket.wire import (
    check_message_size,
    check_tcp_length,
    describe,
)

Event = Frame | StreamError

__all__ = ["BaseConnection", "Event", "StreamError", "error_frame"]


class BaseConnection(
    StreamConnection, frames=frames, wire=wire, state=state, errors=errors
):
    """The draft's codec on the shared core; subclasses receive and send
    stream frames by their role's table."""

    # The draft's Frame Length includes its own 4 bytes.
    length_counts_itself = True
    credit_cap = MAX_I64
    unbounded_credits = MAX_I64


    def __init__(
        self,
        transport: str = "tcp",
        *,
        extensions: Iterable[int] = (),
        **limits: Unpack[ConnectionLimits],
    ) -> None:
        super().__init__(transport, **limits)
        self.extensions = frozenset(extensions)

    def _check_limits(self) -> None:
        if self.max_frame_size < 12 or self.max_fragment < 1 or self.max_message_size < 0:
            raise ValueError("max_frame_size >= 12, max_fragment >= 1, max_message_size >= 0")

    @property
    def reassembly_bytes(self) -> int:
        """Bytes of fragmented messages held now (requests on the server,
        RESPONSEs on the client), all streams together."""
        # A sum over at most max_streams records, taken per request fragment.
        return sum(rec.reassembly.size for rec in self._streams.values())

    def _check_tcp_length(self, length: int) -> None:
        check_tcp_length(length, self.max_frame_size)

    def _check_message(self, message: bytes) -> None:
        check_message_size(message, self.max_frame_size)

    # --- receiving -------------------------------------------------------------

    def _skip_unknown(self, frame: Frame, out: list[Event]) -> bool:
        if isinstance(frame, UnknownFrame):
            if frame.ignore:
                return True
            raise RemoteProtocolError(
                f"unknown frame type 0x{frame.frame_type:04X} without the I (ignore) flag",
                code=UNSUPPORTED,
            )
        if isinstance(frame, Ext):
            if frame.extended_type in self.extensions:
                if self.state is ConnectionState.OPEN:
                    out.append(frame)
                    return True
            elif frame.ignore:
                return True
            else:
                raise RemoteProtocolError(
                    f"unsupported extension type 0x{frame.extended_type:08X} "
                    "without the I (ignore) flag",
                    code=UNSUPPORTED,
                )
        return False

    def _check_stream_zero(self, frame: Frame) -> None:
        if frame.stream_id == CONNECTION_STREAM_ID:
            raise RemoteProtocolError(
                f"{describe(frame)} on stream 0, which is reserved for the connection",
                code=MALFORMED,
            )

    # --- sending ---------------------------------------------------------------

    def _send_connection_frame(self, frame: Frame) -> bool:
        if not isinstance(frame, (Ext, UnknownFrame)):
            return False
        if self.state is not ConnectionState.OPEN:
            raise LocalProtocolError(f"{describe(frame)} before the connection is set up")
        return True

    def send_error(self, stream_id: int, code: str, message: str) -> bytes:
        """ERROR with ``{code, message}``; stream 0 ends the connection."""
        return self.send(error_frame(stream_id, code, message))

    # --- stream table helpers ----------------------------------------------------

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
