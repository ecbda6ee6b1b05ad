"""Sans-IO MicroMsg2 connections.

    conn = ServerConnection("polyport")
    frames = conn.receive_data(data)        # client hello
    out = conn.send(conn.reply_frame())     # server reply
    frames = conn.receive_data(data)        # client final -> conn.negotiated

A RemoteProtocolError from ``receive_data`` closes the connection; the owner
then sends ``conn.send(error_frame(exc))`` and disconnects.  ``send`` raises
LocalProtocolError for a frame this side may not send, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from polyport.protocols.budgets import BudgetAccount, frame_refusal
from polyport.protocols.errors import BUSY
from polyport.protocols.framing import InputBuffer
from polyport.protocols.micromsg2.acks import AckWindow, decode_ack_payload, encode_ack_payload
from polyport.protocols.micromsg2.errors import (
    LocalProtocolError,
    RemoteProtocolError,
    as_local,
)
from polyport.protocols.micromsg2.frames import (
    DEFAULT_MAX_PAYLOAD,
    FRAGMENT_SIZE,
    PROTOCOL_VERSION,
    SEQ_FIRST,
    SERVER_EXTENSIONS,
    Ack,
    Extension,
    ExtensionSpec,
    Frame,
    Handshake,
    Message,
)
from polyport.protocols.micromsg2.negotiation import (
    Negotiated,
    as_spec,
    build_negotiated,
    check_final,
    check_hello,
    check_reply,
    client_final,
    negotiate_version,
    server_reply,
)
from polyport.protocols.micromsg2.state import (
    CLIENT_TRANSITIONS,
    HANDSHAKE_STATES,
    RECEIVE,
    SEND,
    SERVER_TRANSITIONS,
    Direction,
    State,
    Transitions,
)
from polyport.protocols.micromsg2.wire import (
    Partial,
    decode_fragment,
    decode_handshake,
    encode_frame,
    encode_handshake,
    reassemble,
    remaining,
    starts_error_frame,
)


class _Connection:
    _transitions: Transitions

    def __init__(
        self,
        state: State,
        version: tuple[int, int],
        max_payload: int,
        fragment_size: int,
        first_outbound_seq: int = SEQ_FIRST,
        first_inbound_seq: int = SEQ_FIRST,
    ) -> None:
        self._state = state
        self._first_outbound_seq = first_outbound_seq
        self._first_inbound_seq = first_inbound_seq
        self._version = version
        self._buffer = InputBuffer()
        self._max_payload = max_payload
        # The CONTINUED payload being received, if any.
        self._partial: Partial | None = None
        # This connection's share of a budget other connections draw on too
        # (the gateway's): a frame not yet whole and a CONTINUED payload not
        # yet complete are held against it, as the peer can leave them
        # unfinished as long as it likes.  None: only max_payload bounds them.
        self.budget: BudgetAccount | None = None
        self._fragment_size = fragment_size
        self._negotiated_version: tuple[int, int] | None = None
        self.negotiated: Negotiated | None = None
        # Replaced by windows of the negotiated size once the handshake is done.
        self.outbound = AckWindow(None, first_seq=first_outbound_seq)
        self.inbound = AckWindow(None, first_seq=first_inbound_seq)

    @property
    def input_buffer(self) -> InputBuffer:
        """Received bytes not decoded yet: the start of a frame still arriving."""
        return self._buffer

    @property
    def state(self) -> State:
        return self._state

    @property
    def next_seq(self) -> int:
        """The sequence number the next MESSAGE sent must carry."""
        return self.outbound.next_seq

    def can_send_message(self) -> bool:
        return self._state is State.OPEN and self.outbound.can_send()

    # --- receiving -------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Frame]:
        """Buffer ``data``; return every frame it completes."""
        if self._state is State.CLOSED:
            # Only after the peer broke the protocol or ended it with ERROR.
            raise RemoteProtocolError("connection is closed")
        self._buffer += data
        frames: list[Frame] = []
        pos = 0
        try:
            # A handshake ERROR closes the connection; what follows it is moot.
            while pos < len(self._buffer) and self.state is not State.CLOSED:
                decoded = self._decode_one(pos)
                if decoded is None:
                    break
                frame, used = decoded
                pos += used
                if frame is not None:
                    frames.append(self._on_receive(frame))
            self._hold_unfinished(len(self._buffer) - pos)
        except RemoteProtocolError:
            self._state = State.CLOSED
            self._buffer.clear()
            raise
        del self._buffer[:pos]
        return frames

    def _hold_unfinished(self, buffered: int) -> None:
        if self.budget is None:
            return
        held = buffered + (self._partial.size if self._partial is not None else 0)
        refused = self.budget.hold(held)
        if refused is not None:
            raise RemoteProtocolError(frame_refusal(held, refused), code=BUSY)

    def _decode_one(self, pos: int) -> tuple[Frame | None, int] | None:
        if (
            self._state in HANDSHAKE_STATES
            and self._partial is None
            and not starts_error_frame(self._buffer[pos])
        ):
            return decode_handshake(self._buffer, pos)
        decoded = decode_fragment(
            self._buffer, pos, max_payload=remaining(self._partial, self._max_payload)
        )
        if decoded is None:
            return None
        fragment, used = decoded
        self._partial, frame = reassemble(self._partial, fragment, max_payload=self._max_payload)
        return frame, used

    def _on_receive(self, frame: Frame) -> Frame:
        next_state = self._next_state(RECEIVE, frame)
        if isinstance(frame, Handshake):
            self._handshake_received(frame)
        elif isinstance(frame, Message):
            if self.negotiated is not None and self.negotiated.ack_window is not None:
                self.inbound.on_sent(frame.seq)
        elif isinstance(frame, Extension) and self._check_extension_id(frame.ext_id):
            seq = decode_ack_payload(frame.payload)
            frame = Ack(seq, acked=self.outbound.on_ack(seq))
        self._state = next_state
        return frame

    # --- sending ---------------------------------------------------------------

    def send(self, frame: Frame) -> bytes:
        """The bytes for ``frame``.  An illegal frame raises LocalProtocolError
        and leaves the connection as it was."""
        # The checks shared with receiving (ack windows, extension ids,
        # negotiation) raise RemoteProtocolError; here the frame is ours.
        with as_local:
            return self._send(frame)

    def _send(self, frame: Frame) -> bytes:
        next_state = self._next_state(SEND, frame)
        if isinstance(frame, Extension) and self._check_extension_id(frame.ext_id):
            frame = Ack(decode_ack_payload(frame.payload))
        if isinstance(frame, Handshake):
            negotiated = self._prepare_handshake(frame)
            data = encode_handshake(frame)
            self._handshake_sent(frame, negotiated)
        elif isinstance(frame, Ack):
            index = self.negotiated.ack_index if self.negotiated else None
            if index is None:
                raise LocalProtocolError("cannot send an ack: no ack extension was negotiated")
            data = encode_frame(Extension(index, encode_ack_payload(frame.seq)))
            self.inbound.on_ack(frame.seq)
        else:
            data = encode_frame(frame, fragment_size=self._fragment_size)
            if isinstance(frame, Message):
                self.outbound.on_sent(frame.seq)
        self._state = next_state
        return data

    # --- shared helpers --------------------------------------------------------

    def _next_state(self, direction: Direction, frame: Frame) -> State:
        try:
            return self._transitions[(self._state, direction, type(frame))]
        except KeyError:
            if direction is RECEIVE:
                raise RemoteProtocolError(
                    f"cannot receive a {type(frame).__name__} frame in state {self._state.value}"
                ) from None
            raise LocalProtocolError(
                f"cannot send a {type(frame).__name__} frame in state {self._state.value}"
            ) from None

    def _check_extension_id(self, ext_id: int) -> bool:
        """Raise for an id that names no negotiated extension; True if it is the
        ack extension's."""
        assert self.negotiated is not None  # EXTENSION frames are legal only when OPEN
        if self.negotiated.by_index(ext_id) is None:
            raise RemoteProtocolError(
                f"EXTENSION frame for id {ext_id}, but "
                f"{len(self.negotiated.extensions)} extension(s) were negotiated"
            )
        return ext_id == self.negotiated.ack_index

    def _open(self, negotiated: Negotiated) -> None:
        self.negotiated = negotiated
        self.outbound = AckWindow(negotiated.ack_window, first_seq=self._first_outbound_seq)
        self.inbound = AckWindow(negotiated.ack_window, first_seq=self._first_inbound_seq)

    def _handshake_received(self, hs: Handshake) -> None:
        raise NotImplementedError

    def _prepare_handshake(self, hs: Handshake) -> Negotiated | None:
        raise NotImplementedError

    def _handshake_sent(self, hs: Handshake, negotiated: Negotiated | None) -> None:
        raise NotImplementedError


class ServerConnection(_Connection):
    _transitions = SERVER_TRANSITIONS

    def __init__(
        self,
        server_identity: str,
        supported_extensions: Iterable[str | ExtensionSpec] = SERVER_EXTENSIONS,
        required_extensions: Iterable[str | ExtensionSpec] = (),
        *,
        version: tuple[int, int] = PROTOCOL_VERSION,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        fragment_size: int = FRAGMENT_SIZE,
        first_outbound_seq: int = SEQ_FIRST,
        first_inbound_seq: int = SEQ_FIRST,
    ) -> None:
        """``first_outbound_seq`` / ``first_inbound_seq``: see AckWindow
        (always 1 outside tests of the sequence wrap)."""
        super().__init__(
            State.AWAIT_HELLO,
            version,
            max_payload,
            fragment_size,
            first_outbound_seq,
            first_inbound_seq,
        )
        self.identity = server_identity
        with as_local:  # the extension lists are this side's configuration
            self.required = tuple(as_spec(e) for e in required_extensions)
            supported = {spec.name: spec for spec in map(as_spec, supported_extensions)}
        for spec in self.required:
            supported.setdefault(spec.name, spec)
        self.supported = supported
        self.hello: Handshake | None = None
        self.reply: Handshake | None = None

    def reply_frame(self) -> Handshake:
        """The reply to the client's hello: the server's required extensions,
        and every other supported one as a suggestion."""
        if self._state is not State.HELLO_RECEIVED or self.hello is None:
            raise LocalProtocolError(f"no client hello to reply to in state {self._state.value}")
        return server_reply(self.identity, self._version, self.hello, self.supported, self.required)

    def _handshake_received(self, hs: Handshake) -> None:
        if self.hello is None:
            self._negotiated_version = negotiate_version(self._version, hs.version)
            check_hello(hs, self.supported)
            self.hello = hs
            return
        assert self.reply is not None and self._negotiated_version is not None
        self._open(
            check_final(
                hs, self.hello, self._negotiated_version, self.supported, self.reply.required
            )
        )

    def _prepare_handshake(self, hs: Handshake) -> Negotiated | None:
        return None

    def _handshake_sent(self, hs: Handshake, negotiated: Negotiated | None) -> None:
        self.reply = hs


class ClientConnection(_Connection):
    _transitions = CLIENT_TRANSITIONS

    def __init__(
        self,
        identity: str,
        required: Iterable[str | ExtensionSpec] = (),
        optional: Iterable[str | ExtensionSpec] = (),
        *,
        supported: Iterable[str] = (),
        version: tuple[int, int] = PROTOCOL_VERSION,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        fragment_size: int = FRAGMENT_SIZE,
        first_outbound_seq: int = SEQ_FIRST,
        first_inbound_seq: int = SEQ_FIRST,
    ) -> None:
        """``supported`` names extensions the client can use without asking for
        them, so it accepts them when the server requires or suggests them.
        ``first_outbound_seq`` / ``first_inbound_seq``: see AckWindow."""
        super().__init__(
            State.START,
            version,
            max_payload,
            fragment_size,
            first_outbound_seq,
            first_inbound_seq,
        )
        self.identity = identity
        with as_local:  # the extension lists are this side's configuration
            self.required = tuple(as_spec(e) for e in required)
            self.optional = tuple(as_spec(e) for e in optional)
        self.supported = frozenset(supported)
        self.hello: Handshake | None = None
        self.reply: Handshake | None = None

    def hello_frame(self) -> Handshake:
        return Handshake(
            self.identity,
            self.required,
            self.optional,
            major=self._version[0],
            minor=self._version[1],
        )

    def final_frame(self) -> Handshake:
        """The hello again, with the extensions this connection will use."""
        if self._state is not State.REPLY_RECEIVED or self.hello is None or self.reply is None:
            raise LocalProtocolError(f"no server reply to answer in state {self._state.value}")
        return client_final(self.hello, self.reply, self.supported)

    def _handshake_received(self, hs: Handshake) -> None:
        assert self.hello is not None
        self._negotiated_version = negotiate_version(self._version, hs.version)
        check_reply(self.hello, hs, self.supported)
        self.reply = hs

    def _prepare_handshake(self, hs: Handshake) -> Negotiated | None:
        if self.hello is None:
            return None
        assert self.reply is not None and self._negotiated_version is not None
        names = {s.name for s in hs.extensions}
        refused = [s.name for s in self.reply.required if s.name not in names]
        if refused:
            raise LocalProtocolError(
                f"final handshake leaves out extension(s) the server requires: {', '.join(refused)}"
            )
        return build_negotiated(self._negotiated_version, self.reply.identity, hs)

    def _handshake_sent(self, hs: Handshake, negotiated: Negotiated | None) -> None:
        if negotiated is None:
            self.hello = hs
        else:
            self._open(negotiated)
