"""Res01 wire format: pure encode/decode of multipart messages, no state.

Request  (client → ROUTER): ``[routing…][""][protocol][command][requestId][details…]``
Response (ROUTER → client): ``[routing…][""][protocol][requestId][command][details…]``

Every message decodes on its own.  Which replies may answer which request,
and when a request is done, is ``state.py``'s table, kept per request by the
connection objects (``connection.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polyport.protocols.res01.errors import ErrorCode, LocalProtocolError, Res01Error
from polyport.protocols.res01.frames import (
    ACCEPTED_PROTOCOLS,
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
    FRAMES_PER_FETCH_ENTRY,
    FRAMES_PER_FETCHED_EVENT,
    FRAMES_PER_NEW_EVENT,
    FRAMES_PER_PROGRESS_ENTRY,
    FRAMES_PER_SET_ENTRY,
    FRAMES_PER_SUBSCRIPTION_DEFINITION,
    PROTOCOL_FRAME,
    AppendCommit,
    CommitResult,
    Error,
    EventsFetched,
    FetchedEvent,
    FetchEntry,
    FetchEvents,
    NewEvent,
    ProgressEntry,
    ProgressSubscriptions,
    RegisterSubscriptions,
    Request,
    Response,
    SetEntry,
    SetSubscription,
    SubscribeResult,
    SubscriptionDefinition,
    SubscriptionProgressed,
    SubscriptionSet,
)
from polyport.protocols.res01.values import (
    decode_datetime,
    decode_guid,
    decode_int,
    decode_long,
    decode_text,
    encode_datetime,
    encode_guid,
    encode_int,
    encode_long,
    encode_text,
    quote,
)

Routing = tuple[bytes, ...]

EMPTY = b""
_ACCEPTED_PROTOCOL_FRAMES = {p.encode("ascii"): p for p in ACCEPTED_PROTOCOLS}


def _malformed(message: str) -> Res01Error:
    return Res01Error(message, ErrorCode.MALFORMED)


class _Cursor:
    """Reads the detail frames of one message, front to back."""

    __slots__ = ("_frames", "_name", "_pos")

    def __init__(self, frames: Sequence[bytes], start: int, name: str) -> None:
        self._frames = frames
        self._pos = start
        self._name = name

    def remaining(self) -> int:
        return len(self._frames) - self._pos

    def take(self, what: str) -> bytes:
        if self._pos >= len(self._frames):
            raise _malformed(f"{self._name}: message ends before the {what} frame")
        frame = self._frames[self._pos]
        self._pos += 1
        return frame

    def text(self, what: str) -> str:
        return decode_text(self.take(what), f"{self._name} {what}")

    def int32(self, what: str) -> int:
        return decode_int(self.take(what), f"{self._name} {what}")

    def int64(self, what: str) -> int:
        return decode_long(self.take(what), f"{self._name} {what}")

    def count(self, what: str, frames_per_entry: int) -> int:
        """A count frame, which must describe exactly the frames that follow.

        Checked before any entry is read, so a huge or negative count costs
        nothing and a message with extra or missing frames is refused whole.
        """
        count = self.int32(f"{what} count")
        remaining = self.remaining()
        if count < 0:
            raise _malformed(f"{self._name}: negative {what} count {count}")
        if count * frames_per_entry != remaining:
            raise _malformed(
                f"{self._name}: {what} count {count} needs {count * frames_per_entry} "
                f"frames ({frames_per_entry} each) but {remaining} follow"
            )
        return count

    def end(self) -> None:
        extra = self.remaining()
        if extra:
            raise _malformed(f"{self._name}: {extra} unexpected frame(s) at the end")


def _split_routing(frames: Sequence[bytes]) -> tuple[Routing, int] | None:
    """Routing frames and the index of the empty delimiter, if there is one."""
    for i, frame in enumerate(frames):
        if len(frame) == 0:
            return tuple(bytes(f) for f in frames[:i]), i
    return None


# --- request decoders ---------------------------------------------------------


def _decode_append_commit(rid: bytes, protocol: str, c: _Cursor) -> AppendCommit:
    context = c.text("context")
    stream = c.text("stream")
    expected = c.int64("expected version")
    count = c.count("event", FRAMES_PER_NEW_EVENT)
    events = tuple(
        NewEvent(
            event_id=decode_guid(c.take("event id"), f"AppendCommit event {i} id"),
            timestamp=decode_datetime(c.take("timestamp"), f"AppendCommit event {i} timestamp"),
            type=c.text(f"event {i} type"),
            headers=c.text(f"event {i} headers"),
            body=c.text(f"event {i} body"),
        )
        for i in range(count)
    )
    return AppendCommit(rid, context, stream, expected, events, protocol)


def _decode_register_subscriptions(rid: bytes, protocol: str, c: _Cursor) -> RegisterSubscriptions:
    subscriber_id = c.text("subscriber id")
    count = c.count("subscription", FRAMES_PER_SUBSCRIPTION_DEFINITION)
    subs = tuple(
        SubscriptionDefinition(
            context=c.text(f"subscription {i} context"),
            filter=c.text(f"subscription {i} filter"),
            start_time=decode_datetime(
                c.take("start time"), f"RegisterSubscriptions subscription {i} start time"
            ),
        )
        for i in range(count)
    )
    return RegisterSubscriptions(rid, subscriber_id, subs, protocol)


def _decode_fetch_events(rid: bytes, protocol: str, c: _Cursor) -> FetchEvents:
    count = c.count("subscription", FRAMES_PER_FETCH_ENTRY)
    entries = tuple(
        FetchEntry(
            subscription_id=c.int64(f"entry {i} subscription id"),
            suggested_count=c.int32(f"entry {i} suggested count"),
        )
        for i in range(count)
    )
    return FetchEvents(rid, entries, protocol)


def _decode_progress_subscriptions(rid: bytes, protocol: str, c: _Cursor) -> ProgressSubscriptions:
    count = c.count("subscription", FRAMES_PER_PROGRESS_ENTRY)
    entries = tuple(
        ProgressEntry(
            subscription_id=c.int64(f"entry {i} subscription id"),
            last_event_time=decode_datetime(
                c.take("last event time"), f"ProgressSubscriptions entry {i} last event time"
            ),
        )
        for i in range(count)
    )
    return ProgressSubscriptions(rid, entries, protocol)


def _decode_set_subscription(rid: bytes, protocol: str, c: _Cursor) -> SetSubscription:
    count = c.count("subscription", FRAMES_PER_SET_ENTRY)
    entries = tuple(
        SetEntry(
            subscriber_id=c.text(f"entry {i} subscriber id"),
            context=c.text(f"entry {i} context"),
            filter=c.text(f"entry {i} filter"),
            set_to=decode_datetime(c.take("set-to time"), f"SetSubscription entry {i} set-to"),
        )
        for i in range(count)
    )
    return SetSubscription(rid, entries, protocol)


_RequestDecoder = Callable[[bytes, str, _Cursor], Request]

_REQUEST_DECODERS: dict[bytes, tuple[str, _RequestDecoder]] = {
    CMD_APPEND_COMMIT: ("AppendCommit", _decode_append_commit),
    CMD_REGISTER_SUBSCRIPTIONS: ("RegisterSubscriptions", _decode_register_subscriptions),
    CMD_FETCH_EVENTS: ("FetchEvents", _decode_fetch_events),
    CMD_PROGRESS_SUBSCRIPTIONS: ("ProgressSubscriptions", _decode_progress_subscriptions),
    CMD_SET_SUBSCRIPTION: ("SetSubscription", _decode_set_subscription),
}


def request_envelope(frames: Sequence[bytes]) -> tuple[Routing, str | None, bytes | None]:
    """Routing frames, protocol (when accepted) and request id of a request
    message, as far as its first frames tell: enough to answer a message that
    is not decoded at all (one over the size limits)."""
    split = _split_routing(frames)
    if split is None:
        return tuple(bytes(f) for f in frames[:1]), None, None
    routing, delim = split
    n = len(frames)
    protocol = _ACCEPTED_PROTOCOL_FRAMES.get(bytes(frames[delim + 1])) if n > delim + 1 else None
    request_id = bytes(frames[delim + 3]) if n > delim + 3 else None
    return routing, protocol, request_id


def decode_request(frames: Sequence[bytes]) -> tuple[Routing, Request]:
    """Decode a multipart message received on a ROUTER socket.

    Returns the routing frames (everything before the first empty frame, kept
    as they are so the reply reaches a brokered client) and the request.
    Raises :class:`Res01Error` carrying ``code``, ``routing`` and, once read,
    ``request_id`` and ``protocol``: enough to send the ER reply
    (:func:`encode_error_reply`).
    """
    split = _split_routing(frames)
    if split is None:
        # Without a delimiter nothing says where routing ends; a ROUTER puts
        # the peer's identity first, so answering to that is the best guess.
        raise Res01Error(
            "no empty delimiter frame between routing frames and the message",
            ErrorCode.MALFORMED,
            routing=tuple(bytes(f) for f in frames[:1]),
        )
    routing, delim = split
    n = len(frames)
    request_id = bytes(frames[delim + 3]) if n > delim + 3 else None

    if n <= delim + 1:
        raise Res01Error("message ends before the protocol frame", routing=routing)
    protocol = _ACCEPTED_PROTOCOL_FRAMES.get(bytes(frames[delim + 1]))
    if protocol is None:
        raise Res01Error(
            f"unsupported protocol {quote(frames[delim + 1])}; this server speaks {PROTOCOL_FRAME}",
            ErrorCode.UNSUPPORTED_PROTOCOL,
            routing=routing,
            request_id=request_id,
        )
    if n <= delim + 2:
        raise Res01Error(
            "message ends before the command frame", routing=routing, protocol=protocol
        )
    command = bytes(frames[delim + 2])
    entry = _REQUEST_DECODERS.get(command)
    if entry is None:
        raise Res01Error(
            f"unsupported command {quote(command)}",
            ErrorCode.UNSUPPORTED_COMMAND,
            routing=routing,
            request_id=request_id,
            protocol=protocol,
        )
    name, decoder = entry
    if request_id is None:
        raise Res01Error(
            f"{name}: message ends before the request id frame",
            routing=routing,
            protocol=protocol,
        )
    try:
        cursor = _Cursor(frames, delim + 4, name)
        request = decoder(request_id, protocol, cursor)
        cursor.end()
    except Res01Error as exc:
        exc.routing, exc.request_id, exc.protocol = routing, request_id, protocol
        raise
    return routing, request


# --- request encoders ---------------------------------------------------------


def _check_protocol(protocol: str) -> bytes:
    if protocol not in ACCEPTED_PROTOCOLS:
        raise LocalProtocolError(
            f"protocol must be one of {sorted(ACCEPTED_PROTOCOLS)}, not {protocol!r}"
        )
    return protocol.encode("ascii")


def _request_details(request: Request) -> list[bytes]:
    if isinstance(request, AppendCommit):
        out = [
            encode_text(request.context),
            encode_text(request.stream),
            encode_long(request.expected_version),
            encode_int(len(request.events)),
        ]
        for e in request.events:
            out += [
                encode_guid(e.event_id),
                encode_datetime(e.timestamp),
                encode_text(e.type),
                encode_text(e.headers),
                encode_text(e.body),
            ]
        return out
    if isinstance(request, RegisterSubscriptions):
        out = [encode_text(request.subscriber_id), encode_int(len(request.subscriptions))]
        for s in request.subscriptions:
            out += [encode_text(s.context), encode_text(s.filter), encode_datetime(s.start_time)]
        return out
    if isinstance(request, FetchEvents):
        out = [encode_int(len(request.entries))]
        for f in request.entries:
            out += [encode_long(f.subscription_id), encode_int(f.suggested_count)]
        return out
    if isinstance(request, ProgressSubscriptions):
        out = [encode_int(len(request.entries))]
        for p in request.entries:
            out += [encode_long(p.subscription_id), encode_datetime(p.last_event_time)]
        return out
    if isinstance(request, SetSubscription):
        out = [encode_int(len(request.entries))]
        for entry in request.entries:
            out += [
                encode_text(entry.subscriber_id),
                encode_text(entry.context),
                encode_text(entry.filter),
                encode_datetime(entry.set_to),
            ]
        return out
    raise TypeError(f"not a Res01 request: {request!r}")


def encode_request(request: Request) -> list[bytes]:
    """Frames for a DEALER client to send: no routing, but the empty delimiter
    (the ROUTER adds the peer identity in front)."""
    details = _request_details(request)
    return [
        EMPTY,
        _check_protocol(request.protocol),
        request.command,
        bytes(request.request_id),
        *details,
    ]


# --- response encoders --------------------------------------------------------


def _response_details(response: Response) -> list[bytes]:
    if isinstance(response, CommitResult):
        return [encode_guid(response.commit_id)]
    if isinstance(response, SubscribeResult | SubscriptionProgressed):
        ids = response.subscription_ids
        return [encode_int(len(ids)), *(encode_long(i) for i in ids)]
    if isinstance(response, EventsFetched):
        out = [encode_long(response.subscription_id), encode_int(len(response.events))]
        for e in response.events:
            out += [
                encode_guid(e.event_id),
                encode_text(e.stream),
                encode_text(e.context),
                encode_long(e.sequence),
                encode_datetime(e.timestamp),
                encode_text(e.type),
                encode_text(e.headers),
                encode_text(e.body),
            ]
        return out
    if isinstance(response, SubscriptionSet):
        return [encode_int(len(response.results)), *(encode_text(r) for r in response.results)]
    if isinstance(response, Error):
        return [encode_int(response.code), encode_text(response.message)]
    raise TypeError(f"not a Res01 response: {response!r}")


def encode_response(routing: Sequence[bytes], response: Response) -> list[bytes]:
    """Frames for the ROUTER to send back: the routing frames unchanged, the
    empty delimiter, then protocol, request id, command, details."""
    for frame in routing:
        if len(frame) == 0:
            # An empty routing frame would end the envelope early.
            raise LocalProtocolError("routing frames must not be empty")
    details = _response_details(response)
    return [
        *(bytes(f) for f in routing),
        EMPTY,
        _check_protocol(response.protocol),
        bytes(response.request_id),
        response.command,
        *details,
    ]


def encode_error_reply(error: Res01Error) -> list[bytes]:
    """The ER reply to a request that :func:`decode_request` refused.

    A request id that could not be read is sent as an empty frame, keeping the
    usual layout; an unsupported protocol is answered in ``Res01``.
    """
    reply = Error(
        request_id=error.request_id if error.request_id is not None else EMPTY,
        code=error.er_code,
        message=error.message,
        protocol=error.protocol if error.protocol is not None else PROTOCOL_FRAME,
    )
    return encode_response(error.routing, reply)


# --- response decoders --------------------------------------------------------


def _decode_commit_result(rid: bytes, protocol: str, c: _Cursor) -> CommitResult:
    return CommitResult(rid, decode_guid(c.take("commit id"), "CommitResult commit id"), protocol)


def _decode_ids(c: _Cursor) -> tuple[int, ...]:
    count = c.count("subscription", 1)
    return tuple(c.int64(f"subscription id {i}") for i in range(count))


def _decode_subscribe_result(rid: bytes, protocol: str, c: _Cursor) -> SubscribeResult:
    return SubscribeResult(rid, _decode_ids(c), protocol)


def _decode_subscription_progressed(
    rid: bytes, protocol: str, c: _Cursor
) -> SubscriptionProgressed:
    return SubscriptionProgressed(rid, _decode_ids(c), protocol)


def _decode_events_fetched(rid: bytes, protocol: str, c: _Cursor) -> EventsFetched:
    subscription_id = c.int64("subscription id")
    count = c.count("event", FRAMES_PER_FETCHED_EVENT)
    events = tuple(
        FetchedEvent(
            event_id=decode_guid(c.take("event id"), f"EventsFetched event {i} id"),
            stream=c.text(f"event {i} stream"),
            context=c.text(f"event {i} context"),
            sequence=c.int64(f"event {i} sequence"),
            timestamp=decode_datetime(c.take("timestamp"), f"EventsFetched event {i} timestamp"),
            type=c.text(f"event {i} type"),
            headers=c.text(f"event {i} headers"),
            body=c.text(f"event {i} body"),
        )
        for i in range(count)
    )
    return EventsFetched(rid, subscription_id, events, protocol)


def _decode_subscription_set(rid: bytes, protocol: str, c: _Cursor) -> SubscriptionSet:
    count = c.count("result", 1)
    return SubscriptionSet(rid, tuple(c.text(f"result {i}") for i in range(count)), protocol)


def _decode_error(rid: bytes, protocol: str, c: _Cursor) -> Error:
    code = c.int32("error code")
    message = c.text("error message")
    return Error(rid, code, message, protocol)


_ResponseDecoder = Callable[[bytes, str, _Cursor], Response]

_RESPONSE_DECODERS: dict[bytes, tuple[str, _ResponseDecoder]] = {
    CMD_COMMIT_RESULT: ("CommitResult", _decode_commit_result),
    CMD_SUBSCRIBE_RESULT: ("SubscribeResult", _decode_subscribe_result),
    CMD_EVENTS_FETCHED: ("EventsFetched", _decode_events_fetched),
    CMD_SUBSCRIPTION_PROGRESSED: ("SubscriptionProgressed", _decode_subscription_progressed),
    CMD_SUBSCRIPTION_SET: ("SubscriptionSet", _decode_subscription_set),
    CMD_ERROR: ("Error", _decode_error),
}


def decode_response(frames: Sequence[bytes]) -> Response:
    """Decode a multipart message received on a DEALER socket.

    Frames before the first empty frame (none for a DEALER) are ignored.
    Raises :class:`Res01Error`; ``request_id`` is set when it was readable, so
    a client can fail the matching pending request.
    """
    split = _split_routing(frames)
    if split is None:
        raise Res01Error("no empty delimiter frame before the response")
    routing, delim = split
    n = len(frames)
    request_id = bytes(frames[delim + 2]) if n > delim + 2 else None

    if n <= delim + 1:
        raise Res01Error("response ends before the protocol frame", routing=routing)
    protocol = _ACCEPTED_PROTOCOL_FRAMES.get(bytes(frames[delim + 1]))
    if protocol is None:
        raise Res01Error(
            f"unsupported protocol {quote(frames[delim + 1])} in response",
            ErrorCode.UNSUPPORTED_PROTOCOL,
            routing=routing,
            request_id=request_id,
        )
    if request_id is None:
        raise Res01Error(
            "response ends before the request id frame", routing=routing, protocol=protocol
        )
    if n <= delim + 3:
        raise Res01Error(
            "response ends before the command frame",
            routing=routing,
            request_id=request_id,
            protocol=protocol,
        )
    command = bytes(frames[delim + 3])
    entry = _RESPONSE_DECODERS.get(command)
    if entry is None:
        raise Res01Error(
            f"unsupported response command {quote(command)}",
            ErrorCode.UNSUPPORTED_COMMAND,
            routing=routing,
            request_id=request_id,
            protocol=protocol,
        )
    name, decoder = entry
    try:
        cursor = _Cursor(frames, delim + 4, name)
        response = decoder(request_id, protocol, cursor)
        cursor.end()
    except Res01Error as exc:
        exc.routing, exc.request_id, exc.protocol = routing, request_id, protocol
        raise
    return response
