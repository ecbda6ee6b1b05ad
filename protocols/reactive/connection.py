"""The sans-IO connection core both ReactiveSocket versions share.

:class:`StreamConnection` does what does not depend on the frame layout: the
TCP length-prefixed framing loop, the connection's own states, the checks
every send goes through, the stream book-keeping (ids, phases, credits) and
the table-driven steps of a stream's lifecycle.  Each version's connection
module subclasses it and supplies its codec (encode / decode / describe, the
length prefix), its error classes and its tables, then adds the rules that
really differ: how a frame maps to a table event (B/E flags vs F), what a
receive the table does not know means (a fault in the draft, ignored in
RSocket's "Handling the Unexpected"), SETUP checks, LEASE, KEEPALIVE and
extensions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, TypedDict, Unpack

from polyport.protocols.budgets import BudgetAccount, frame_refusal
from polyport.protocols.errors import BUSY, MALFORMED, TOO_LARGE
from polyport.protocols.framing import InputBuffer
from polyport.protocols.reactive.frames import CONNECTION_STREAM_ID
from polyport.protocols.reactive.streams import (
    Action,
    ConnectionState,
    Ev,
    Phase,
    StreamInfo,
    Transition,
    add_credits,
)
from polyport.protocols.reactive.wire import TRANSPORTS

# Live streams a peer may open, unless the owner says otherwise.
DEFAULT_MAX_STREAMS = 1024


class ConnectionLimits(TypedDict, total=False):
    """The limits a connection object enforces itself; those left out take
    the version's defaults."""

    max_frame_size: int
    max_message_size: int
    max_fragment: int
    # Live streams the peer may open (a responder's limit).
    max_streams: int
    # Bytes of fragmented messages held for all streams together (None: no
    # limit beyond max_streams x max_message_size).  One message alone is
    # always within it up to max_message_size.
    max_reassembly_bytes: int | None


@dataclass(frozen=True, slots=True)
class StreamError:
    """The peer broke one stream's rules, or the stream cannot go on (a
    limit, RSocket's LEASE); the connection lives on.

    The connection object has already terminated the stream's normal flow.  The
    application stops any work for ``stream_id`` and answers: a server sends
    ``conn.send_error(e.stream_id, e.code, e.message)``, a client sends
    ``conn.cancel(e.stream_id)``.  ``code`` is a canonical error name.
    """

    stream_id: int
    code: str
    message: str


class StreamConnection:
    """Framing, connection states, send checks and stream book-keeping.

    Frames, records and errors are the subclass's (typed ``Any`` here): the
    subclass names them in the class attributes and hooks below.
    """

    # The role's tables (``state.py`` of the version).
    role: ClassVar[str] = ""
    table: ClassVar[Mapping[tuple[Any, Phase, Ev], Transition]] = {}
    live_phases: ClassVar[frozenset[Phase]] = frozenset()
    connection_table: ClassVar[Mapping[tuple[str, ConnectionState, str], ConnectionState]] = {}
    # The version's codec and rules.
    transports: ClassVar[tuple[str, ...]] = TRANSPORTS
    length_size: ClassVar[int] = 0
    # The draft's TCP length counts its own bytes; RSocket's does not.
    length_counts_itself: ClassVar[bool] = False
    # Credits saturate here.  ``unbounded_credits``: a count that is never used
    # up (the draft's 2**63-1, as in Reactive Streams); None: every item counts.
    credit_cap: ClassVar[int] = 0
    unbounded_credits: ClassVar[int | None] = None
    record_type: ClassVar[Any] = None
    error_frame_type: ClassVar[Any] = None
    remote_error: ClassVar[Any] = None
    local_error: ClassVar[Any] = None
    # The version's limits when the owner gives none.
    default_max_frame_size: ClassVar[int] = 0
    default_max_message_size: ClassVar[int] = 0
    default_max_fragment: ClassVar[int] = 1
    # The version's frames.py and state.py (``__init_subclass__``).
    frames: ClassVar[ModuleType]
    state_module: ClassVar[ModuleType]

    def __init_subclass__(
        cls,
        *,
        frames: ModuleType | None = None,
        wire: ModuleType | None = None,
        state: ModuleType | None = None,
        errors: ModuleType | None = None,
        role: str | None = None,
        **kwargs: Any,
    ) -> None:
        """A version's connection names its modules, and a role's its role;
        the attributes above are taken from them by their conventional names,
        so each version says once which codec it is."""
        super().__init_subclass__(**kwargs)
        if frames is not None:
            cls.length_size = frames.LENGTH_SIZE
            cls.error_frame_type = frames.ErrorFrame
            cls.default_max_frame_size = frames.DEFAULT_MAX_FRAME_SIZE
            cls.default_max_message_size = frames.DEFAULT_MAX_MESSAGE_SIZE
            cls.default_max_fragment = frames.DEFAULT_MAX_FRAGMENT
            cls.frames = frames
        if wire is not None:
            cls._decode = staticmethod(wire.decode_frame)
            cls._encode = staticmethod(wire.encode_frame)
            cls._add_tcp_length = staticmethod(wire.add_tcp_length)
            cls._describe = staticmethod(wire.describe)
        if state is not None:
            cls.connection_table = state.CONNECTION_TABLE
            cls.record_type = state.StreamRecord
            cls.state_module = state
        if errors is not None:
            cls.remote_error = errors.RemoteProtocolError
            cls.local_error = errors.LocalProtocolError
        if role is not None:
            cls.role = role
            side = "RESPONDER" if role == "server" else "REQUESTER"
            cls.table = getattr(cls.state_module, f"{side}_TABLE")
            cls.live_phases = getattr(cls.state_module, f"{side}_LIVE")

    def __init__(
        self,
        transport: str = "tcp",
        *,
        max_frame_size: int | None = None,
        max_message_size: int | None = None,
        max_fragment: int | None = None,
        max_streams: int = DEFAULT_MAX_STREAMS,
        max_reassembly_bytes: int | None = None,
    ) -> None:
        if transport not in self.transports:
            raise ValueError(f"transport must be one of {self.transports}, not {transport!r}")
        self.transport = transport
        self.max_frame_size = _given(max_frame_size, self.default_max_frame_size)
        self.max_message_size = _given(max_message_size, self.default_max_message_size)
        self.max_fragment = _given(max_fragment, self.default_max_fragment)
        self.max_streams = max_streams
        self.max_reassembly_bytes = max_reassembly_bytes
        self._check_limits()
        self.state = ConnectionState.AWAITING_SETUP
        self._buffer = InputBuffer()
        self._streams: dict[int, Any] = {}
        # This connection's share of a byte budget other connections draw on
        # too (the gateway's reassembly budget): every fragment kept for
        # reassembly is reserved in it first.  None: only this connection's
        # own limits apply.
        self.budget: BudgetAccount | None = None
        # Bytes of a frame not yet whole kept in _buffer after the last read:
        # a peer can hold them as long as it likes, so they count in the
        # budget too (a frame being decoded in the read does not).
        self._partial_bytes = 0

    # --- the version's codec --------------------------------------------------------

    # The version's wire.py functions, as class attributes (staticmethod).
    _decode: Callable[[bytes], Any]
    _encode: Callable[[Any], bytes]
    _add_tcp_length: Callable[[bytes], bytes]
    _describe: Callable[[Any], str]

    def _check_limits(self) -> None:
        """Refuse limits the version cannot work with (ValueError)."""

    def _check_tcp_length(self, length: int) -> None:
        """Checked as soon as the length is in: we never wait for (or
        allocate) a frame above the limit."""
        raise NotImplementedError

    def _check_message(self, message: bytes) -> None:
        """A WebSocket message (one frame) against the limit."""
        raise NotImplementedError

    # --- the shared budget --------------------------------------------------------------

    @property
    def reassembly_bytes(self) -> int:
        """Bytes of fragmented messages held now, all streams together."""
        raise NotImplementedError

    def _reserve_fragment(self, n: int) -> str | None:
        """Reserve ``n`` more bytes of fragments in the shared budget; why
        not when it has no room."""
        if self.budget is None:
            return None
        # Messages completed or dropped earlier in this read give their
        # bytes back first, so the account is exact when it is asked.
        self.budget.settle(self._budgeted_bytes)
        return self.budget.reserve(n)

    @property
    def _budgeted_bytes(self) -> int:
        return self.reassembly_bytes + self._partial_bytes

    def _settle_budget(self) -> None:
        """Give back what streams no longer hold (a message joined, a stream
        rejected, cancelled or ended; everything once the connection failed)."""
        # Only an account that holds something has anything to give back:
        # every send comes here, and the sum runs over all streams.
        if self.budget is not None and self.budget.held:
            self.budget.settle(0 if self.closed else self._budgeted_bytes)

    def release_budget(self) -> None:
        """The transport is gone: give back everything this connection holds
        of the shared budget, whatever state its streams are in."""
        if self.budget is not None:
            self.budget.close()
            self.budget = None

    # --- introspection ----------------------------------------------------------------

    @property
    def input_buffer(self) -> InputBuffer:
        """Received bytes not decoded yet: on TCP, the start of a frame still
        arriving (a WebSocket message is one whole frame: always empty)."""
        return self._buffer

    @property
    def closed(self) -> bool:
        return self.state in (ConnectionState.CLOSED, ConnectionState.ERRORED)

    @property
    def streams(self) -> dict[int, StreamInfo[Any]]:
        """Every stream with book-keeping, live or winding down."""
        return {
            sid: StreamInfo(sid, rec.kind, rec.phase, rec.credits)
            for sid, rec in self._streams.items()
        }

    def live_streams(self) -> list[int]:
        return sorted(sid for sid, rec in self._streams.items() if rec.phase in self.live_phases)

    def is_live(self, stream_id: int) -> bool:
        rec = self._streams.get(stream_id)
        return rec is not None and rec.phase in self.live_phases

    def credits(self, stream_id: int) -> int:
        """Outstanding credits of a live stream (0 for an unknown one)."""
        rec = self._streams.get(stream_id)
        return rec.credits if rec is not None else 0

    # --- receiving --------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Any]:
        """Feed bytes (TCP) or one message (WebSocket); get every complete frame.

        Raises the version's ``RemoteProtocolError`` on a connection-level
        fault; the error's ``frames`` are those decoded before it.  After the
        fault or after an ERROR on stream 0, further data is discarded.
        """
        out: list[Any] = []
        if self.closed:
            return out
        try:
            if self.transport == "tcp":
                self._receive_tcp(data, out)
            else:
                self._check_message(data)
                self._receive_message(bytes(data), out)
        except self.remote_error as exc:
            self.state = ConnectionState.ERRORED
            self._buffer.clear()
            exc.frames = list(out)
            raise
        finally:
            self._settle_budget()
        if self.closed:
            # The peer ended the connection later in the same read: a stream
            # error before that has no one to answer (send_error would raise).
            return [ev for ev in out if not isinstance(ev, StreamError)]
        return out

    def _receive_tcp(self, data: bytes, out: list[Any]) -> None:
        buf = self._buffer
        buf += data
        pos = 0
        # While frames are decoded the partial frame is not counted: its
        # bytes become a fragment (counted then) or are released.
        self._partial_bytes = 0
        prefix = self.length_size
        try:
            while len(buf) - pos >= prefix and not self.closed:
                length = int.from_bytes(buf[pos : pos + prefix], "big")
                self._check_tcp_length(length)
                end = pos + (length if self.length_counts_itself else prefix + length)
                if len(buf) < end:
                    break
                message = bytes(buf[pos + prefix : end])
                pos = end
                self._receive_message(message, out)
        finally:
            del buf[:pos]
        if self.closed:
            buf.clear()
        elif buf and self.budget is not None:
            refused = self._reserve_fragment(len(buf))
            if refused is not None:
                raise self.remote_error(frame_refusal(len(buf), refused), code=BUSY)
            self._partial_bytes = len(buf)

    def _receive_message(self, message: bytes, out: list[Any]) -> None:
        frame = self._decode(message)
        if self._skip_unknown(frame, out):
            return
        if self._is_connection_error(frame):
            if self._ignore_connection_error(frame):
                return
            self._connection_event("recv ERROR 0", frame)
            out.append(frame)
            return
        self._receive_frame(frame, out)

    def _skip_unknown(self, frame: Any, out: list[Any]) -> bool:
        """Frame types and extensions the version does not understand: True
        when ``frame`` is dealt with (ignored or passed on); raises when it
        lacks the I (ignore) flag."""
        return False

    def _is_connection_error(self, frame: Any) -> bool:
        return isinstance(frame, self.error_frame_type) and frame.stream_id == CONNECTION_STREAM_ID

    def _ignore_connection_error(self, frame: Any) -> bool:
        return False

    def _connection_event(self, what: str, frame: Any) -> None:
        nxt = self.connection_table.get((self.role, self.state, what))
        if nxt is None:
            raise self.remote_error(
                f"{self._describe(frame)} is not allowed while the connection is "
                f"{self.state.value}",
                code=MALFORMED,
            )
        self.state = nxt

    def _receive_frame(self, frame: Any, out: list[Any]) -> None:
        raise NotImplementedError

    def _follow(self, frame: Any, ev: Ev, out: list[Any]) -> None:
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

    # --- sending ----------------------------------------------------------------------

    def send(self, frame: Any) -> bytes:
        """Bytes for one frame (one WebSocket message), after checking that the
        frame is legal now.  Raises the version's ``LocalProtocolError``
        otherwise."""
        message = self._encode(frame)
        if len(message) > self.max_frame_size:
            raise self.local_error(
                f"{self._describe(frame)} of {len(message)} bytes exceeds max_frame_size "
                f"{self.max_frame_size}; fragment it",
                code=TOO_LARGE,
            )
        if self.state is ConnectionState.CLOSED:
            raise self.local_error("the connection is closed")
        if self._is_connection_error(frame):
            nxt = self.connection_table.get((self.role, self.state, "send ERROR 0"))
            if nxt is None:
                raise self.local_error(
                    f"ERROR on stream 0 is not allowed while {self.state.value}"
                )
            self.state = nxt
            self._streams.clear()
        elif self.state is ConnectionState.ERRORED:
            raise self.local_error("after a protocol error only ERROR on stream 0 may be sent")
        elif not self._send_connection_frame(frame):
            self._send_frame(frame)
        # An ERROR or CANCEL may have ended a stream that was reassembling.
        self._settle_budget()
        return self._add_tcp_length(message) if self.transport == "tcp" else message

    def _send_connection_frame(self, frame: Any) -> bool:
        """Frames that belong to the connection, not a stream (the draft's EXT,
        RSocket's LEASE / KEEPALIVE / METADATA_PUSH): check and count them,
        True when ``frame`` was one."""
        return False

    def _send_frame(self, frame: Any) -> None:
        raise NotImplementedError

    def _send_all(self, stream_id: int, frames: list[Any]) -> list[bytes]:
        """Send several frames of one stream all or nothing."""
        with self._all_or_nothing(stream_id):
            return [self.send(frame) for frame in frames]

    @contextlib.contextmanager
    def _all_or_nothing(self, stream_id: int) -> Iterator[None]:
        """Frames sent inside count all or none: on the version's
        LocalProtocolError the stream's record is put back as it was."""
        rec = self._streams.get(stream_id)
        saved = None if rec is None else (rec.phase, rec.credits)
        try:
            yield
        except self.local_error:
            if saved is None or rec is None:
                self._streams.pop(stream_id, None)
            else:
                rec.phase, rec.credits = saved
                self._streams[stream_id] = rec
            raise

    def item_frames(self, stream_id: int, data: bytes) -> list[Any]:
        """The frames of one item (NEXT) carrying ``data``: one when it fits
        a fragment."""
        raise NotImplementedError

    def send_items(self, stream_id: int, datas: Sequence[bytes]) -> list[bytes]:
        """Several items on one stream (a subscription's or a read's batch),
        fragmented as needed, all or nothing: one ``bytes`` per frame.

        The first item's frames go through the table like any frame.  Each
        later item that is one frame, on a stream the first left RESPONDING
        where the table keeps RESPONDING on SEND_NEXT, is that same
        transition again: it spends a credit and is encoded, without the
        per-frame checks (a third of a catch-up's gateway CPU went to them,
        docs/performance.md)."""
        if not datas:
            return []
        frames = [self.item_frames(stream_id, d) for d in datas]
        rest = frames[1:]
        with self._all_or_nothing(stream_id):
            sent = [self.send(f) for f in frames[0]]
            rec = self._streams.get(stream_id)
            if rest and self._repeats_next(rec, len(rest)) and all(len(f) == 1 for f in rest):
                sent += self._send_repeated_items(rec, [f[0] for f in rest])
            else:
                for item in rest:
                    sent += [self.send(f) for f in item]
        return sent

    def _repeats_next(self, rec: Any, n: int) -> bool:
        """Whether ``n`` more single-frame items on ``rec`` are each the
        table's RESPONDING --SEND_NEXT--> RESPONDING, within the credits."""
        if self.state is not ConnectionState.OPEN:
            return False
        if rec is None or rec.phase is not Phase.RESPONDING:
            return False
        t = self.table.get((rec.kind, Phase.RESPONDING, Ev.SEND_NEXT))
        if t is None or t[0] is not Phase.RESPONDING:
            return False
        if not rec.kind.has_credits:
            return True
        unbounded = self.unbounded_credits
        return bool(rec.credits >= n or (unbounded is not None and rec.credits >= unbounded))

    def _send_repeated_items(self, rec: Any, frames: list[Any]) -> list[bytes]:
        encode, limit = self._encode, self.max_frame_size
        messages = [encode(f) for f in frames]
        for m, f in zip(messages, frames, strict=True):
            if len(m) > limit:
                raise self.local_error(
                    f"{self._describe(f)} of {len(m)} bytes exceeds max_frame_size {limit}; "
                    "fragment it",
                    code=TOO_LARGE,
                )
        if rec.kind.has_credits:
            unbounded = self.unbounded_credits
            if unbounded is None or rec.credits < unbounded:
                rec.credits -= len(frames)
        if self.transport == "tcp":
            add = self._add_tcp_length
            return [add(m) for m in messages]
        return messages

    def _send_answer_or_error(
        self, frame: Any, answer_type: type[Any], send_answer: Callable[[Any], None], sends: str
    ) -> None:
        """The responder's stream frames: its answers (RESPONSE / PAYLOAD)
        and ERROR (a stream it never saw counts as a request-response, whose
        table refuses it); ``sends`` names all it may send, for the refusal."""
        if isinstance(frame, answer_type):
            send_answer(frame)
        elif isinstance(frame, self.error_frame_type):
            self._send_error_frame(frame, self.state_module.Kind.REQUEST_RESPONSE)
        else:
            raise self.local_error(f"the server sends {sends}, not {self._describe(frame)}")

    def _answered(self, frame: Any, what: str) -> tuple[int, Any]:
        """The stream id and record an answer goes on (LocalProtocolError
        unless the stream is being answered)."""
        rec = self._streams.get(frame.stream_id)
        if rec is None or rec.phase not in (Phase.RESPONDING, Phase.SENDING_FRAGMENTS):
            state = "it is not live" if rec is None else f"it is {rec.phase.value}"
            raise self.local_error(f"cannot send {what} on stream {frame.stream_id}: {state}")
        return frame.stream_id, rec

    def _send_error_frame(self, frame: Any, default_kind: Any) -> None:
        """The responder's ERROR on a stream (a stream it never saw counts as
        ``default_kind``, whose table refuses it)."""
        rec = self._streams.get(frame.stream_id)
        kind = rec.kind if rec is not None else default_kind
        to, _ = self._send_transition(rec, kind, Ev.SEND_ERROR, frame.stream_id)
        self._apply(frame.stream_id, rec, kind, to)

    def _send_request_n_frame(self, frame: Any, default_kind: Any) -> None:
        rec = self._streams.get(frame.stream_id)
        kind = rec.kind if rec is not None else default_kind
        to, _ = self._send_transition(rec, kind, Ev.SEND_REQUEST_N, frame.stream_id)
        assert rec is not None
        rec.credits = self._add_credits(rec.credits, frame.n)
        rec.phase = to

    def _send_cancel_frame(self, frame: Any, default_kind: Any) -> None:
        rec = self._streams.get(frame.stream_id)
        kind = rec.kind if rec is not None else default_kind
        to, _ = self._send_transition(rec, kind, Ev.SEND_CANCEL, frame.stream_id)
        self._apply(frame.stream_id, rec, kind, to)

    # --- stream table helpers -----------------------------------------------------------

    def _transition(self, rec: Any, kind: Any, ev: Ev) -> Transition | None:
        phase = rec.phase if rec is not None else Phase.CLOSED
        return self.table.get((rec.kind if rec is not None else kind, phase, ev))

    def _apply(self, stream_id: int, rec: Any, kind: Any, to: Phase) -> Any:
        """Move the stream to ``to``; returns its record (None once closed)."""
        if to is Phase.CLOSED:
            self._streams.pop(stream_id, None)
            return None
        if rec is None:
            rec = self.record_type(kind, to)
            self._streams[stream_id] = rec
        else:
            rec.phase = to
        return rec

    def _send_transition(
        self, rec: Any, kind: Any, ev: Ev, stream_id: int, hint: str = ""
    ) -> Transition:
        t = self._transition(rec, kind, ev)
        if t is None:
            what = ev.value.replace("send_", "").replace("_", " ").upper()
            state = (
                f"a {rec.kind.name} stream that is {rec.phase.value}" if rec else "no live stream"
            )
            raise self.local_error(
                f"cannot send {what} on stream {stream_id}: {state}"
                + (f" ({hint})" if hint else "")
            )
        return t

    def _deliver(
        self, stream_id: int, rec: Any, kind: Any, to: Phase, action: Action,
        whole: Any, out: list[Any],
    ) -> Any:
        """Move a stream to its next phase, then hand a whole message (if
        any) to the application where the table says DELIVER."""
        kept = self._apply(stream_id, rec, kind, to)
        if whole is not None and action is Action.DELIVER:
            out.append(whole)
        return kept

    def _receive_request_n(self, frame: Any, out: list[Any]) -> None:
        raise NotImplementedError

    def _receive_credit_or_cancel(self, frame: Any, out: list[Any]) -> None:
        """A responder's REQUEST_N or CANCEL on a stream (a CANCEL on an
        unknown stream id is ignored: ``_follow`` does)."""
        if isinstance(frame, self.frames.RequestN):
            self._receive_request_n(frame, out)
        elif isinstance(frame, self.frames.Cancel):
            self._follow(frame, Ev.RECV_CANCEL, out)

    def _take_request_n(
        self, rec: Any, frame: Any, t: Transition, counting: bool, out: list[Any]
    ) -> None:
        """A REQUEST_N the responder's table takes: its credits (where the
        stream counts them), the stream's next phase, and delivery."""
        if counting:
            rec.credits = self._add_credits(rec.credits, frame.n)
        to, action = t
        rec.phase = to
        if action is Action.DELIVER:
            out.append(frame)

    def _add_credits(self, current: int, n: int) -> int:
        return add_credits(current, n, self.credit_cap)

    def _use_credit(self, current: int) -> int:
        if self.unbounded_credits is not None and current >= self.unbounded_credits:
            return current
        return current - 1

    def _spend_credit(self, rec: Any, stream_id: int) -> None:
        """The responder sends one item on a credited stream."""
        if rec.credits <= 0:
            raise self.local_error(f"no credits left on stream {stream_id}: wait for REQUEST_N")
        rec.credits = self._use_credit(rec.credits)


class RequesterConveniences(StreamConnection):
    """The requester's calls both versions offer, on top of their frames'
    ``request_n_type`` / ``cancel_type`` and the version's ``fragment``.
    Requests go on ids from :meth:`next_stream_id` (odd: 1, 3, 5, ...; never
    reused)."""

    request_n_type: ClassVar[Any] = None
    cancel_type: ClassVar[Any] = None
    setup_type: ClassVar[Any] = None
    max_stream_id: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kwargs.get("role") is not None:
            cls.request_n_type = cls.frames.RequestN
            cls.cancel_type = cls.frames.Cancel
            cls.setup_type = cls.frames.Setup
            cls.max_stream_id = cls.frames.MAX_STREAM_ID

    def __init__(self, transport: str = "tcp", **limits: Unpack[ConnectionLimits]) -> None:
        super().__init__(transport, **limits)
        self._next_id = 1
        # The client takes SETUP as accepted once the server answers anything.
        self.setup_accepted = False

    def _answer_record(self, frame: Any) -> tuple[int, Any]:
        """The stream id an answer came on and our record of it; None when
        there is none (after our CANCEL the responder may still be talking).
        An answer also tells the client its SETUP was accepted."""
        rec = self._streams.get(frame.stream_id)
        if rec is not None:
            self.setup_accepted = True
        return frame.stream_id, rec

    def _send_control(self, frame: Any, default_kind: Any) -> bool:
        """REQUEST_N or CANCEL on a stream of ours (``default_kind`` for an
        id we never used, whose table refuses it); False for other frames."""
        if isinstance(frame, self.request_n_type):
            self._send_request_n_frame(frame, default_kind)
        elif isinstance(frame, self.cancel_type):
            self._send_cancel_frame(frame, default_kind)
        else:
            return False
        return True

    def _check_can_request(self) -> None:
        """Refuse a request before it uses up an id (LocalProtocolError)."""

    def next_stream_id(self) -> int:
        self._check_can_request()
        sid = self._next_id
        if sid > self.max_stream_id:
            raise self.local_error("stream ids are exhausted on this connection")
        self._next_id += 2
        return sid

    def _receive_error(self, frame: Any, out: list[Any]) -> None:
        """ERROR on a stream: an unknown id is ignored (it crossed our CANCEL)."""
        if frame.stream_id not in self._streams:
            return
        self.setup_accepted = True
        self._follow(frame, Ev.RECV_ERROR, out)

    def _send_setup(self, frame: Any) -> bool:
        """SETUP goes first, once; a stream frame needs it sent and a stream
        id other than 0.  True when ``frame`` was the SETUP."""
        if isinstance(frame, self.setup_type):
            nxt = self.connection_table.get((self.role, self.state, "send SETUP"))
            if nxt is None:
                raise self.local_error("SETUP is sent once, as the first frame")
            self.state = nxt
            return True
        if self.state is not ConnectionState.OPEN:
            raise self.local_error(f"send SETUP before {self._describe(frame)}")
        if frame.stream_id == CONNECTION_STREAM_ID:
            raise self.local_error(f"{self._describe(frame)} cannot use stream 0")
        return False

    def _fragment(self, frame: Any) -> list[Any]:
        raise NotImplementedError

    def _request(self, frame: Any) -> tuple[int, list[bytes]]:
        return frame.stream_id, self._send_all(frame.stream_id, self._fragment(frame))

    def request_n(self, stream_id: int, n: int) -> bytes:
        """REQUEST_N, or ``b""`` when the stream has already ended."""
        if not self.is_live(stream_id):
            return b""
        return self.send(self.request_n_type(stream_id, n))

    def cancel(self, stream_id: int) -> bytes:
        """CANCEL, or ``b""`` when the stream has already ended."""
        if not self.is_live(stream_id):
            return b""
        return self.send(self.cancel_type(stream_id))


def _given(value: int | None, default: int) -> int:
    return default if value is None else value
