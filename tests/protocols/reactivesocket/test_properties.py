"""Property tests: round trips, fuzzing, truncation, splitting, fragmentation."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

from polyport.protocols.reactivesocket import (
    Cancel,
    ClientConnection,
    ErrorFrame,
    Ext,
    LocalProtocolError,
    RemoteProtocolError,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Response,
    ServerConnection,
    Setup,
    StreamError,
    UnknownFrame,
    decode_frame,
    encode_frame,
    encode_tcp_frame,
    split_tcp_frames,
)
from polyport.protocols.reactivesocket.frames import MAX_I64, MIN_I64
from polyport.protocols.reactivesocket.state import Kind

from .util import SETUP_TCP, SETUP_WS, deliver, open_pair

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

stream_ids = st.integers(0, (1 << 64) - 1)
small_ids = st.integers(1, 4)
i64 = st.integers(MIN_I64, MAX_I64)
data = st.binary(max_size=64)
known_types = {0x0001, 0x0011, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016, 0x0020, 0x0021, 0xFFFF}

frames = st.one_of(
    st.builds(Setup, data),
    st.builds(RequestResponse, stream_ids, data, st.booleans(), st.booleans()),
    st.builds(RequestFnf, stream_ids, data, st.booleans(), st.booleans()),
    st.builds(RequestStream, stream_ids, i64, data, st.booleans(), st.booleans()),
    st.builds(RequestSub, stream_ids, i64, data, st.booleans(), st.booleans()),
    st.builds(RequestN, stream_ids, i64),
    st.builds(Cancel, stream_ids),
    st.builds(Response, stream_ids, data, st.booleans(), st.booleans(), st.booleans()),
    st.builds(ErrorFrame, stream_ids, data),
    st.builds(Ext, stream_ids, st.integers(0, 0xFFFFFFFF), data, st.booleans()),
    st.builds(
        UnknownFrame,
        st.integers(0, 0xFFFF).filter(lambda t: t not in known_types),
        st.integers(0, 0xFF),
        stream_ids,
        data,
    ),
)


@SETTINGS
@given(frames)
def test_frames_round_trip(frame):
    message = encode_frame(frame)
    assert decode_frame(message) == frame
    wire = encode_tcp_frame(frame)
    assert wire[4:] == message and int.from_bytes(wire[:4], "big") == len(wire)


@SETTINGS
@given(st.lists(frames, max_size=8), st.data())
def test_tcp_stream_split_anywhere_gives_the_same_frames(fs, draw):
    wire = b"".join(encode_tcp_frame(f) for f in fs)
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    buf = bytearray()
    got = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        buf += wire[prev:cut]
        prev = cut
        got.extend(decode_frame(m) for m in split_tcp_frames(buf, 1 << 20))
    assert got == fs and buf == b""


@SETTINGS
@given(frames, st.data())
def test_truncated_frame_waits_for_more(frame, draw):
    wire = encode_tcp_frame(frame)
    cut = draw.draw(st.integers(0, len(wire) - 1))
    buf = bytearray(wire[:cut])
    assert split_tcp_frames(buf, 1 << 20) == []
    assert len(buf) == cut


# A session: SETUP and requests a client may legally send, as TCP bytes.
def session_frames():
    def build(specs):
        out = [Setup(b"\x80")]
        for i, (kind, payload, n, frag) in enumerate(specs):
            sid = 2 * i + 1
            frame = {
                0: RequestResponse(sid, payload),
                1: RequestFnf(sid, payload),
                2: RequestStream(sid, n, payload),
                3: RequestSub(sid, n, payload),
            }[kind]
            if frag and len(payload) > 1:
                half = len(payload) // 2
                out.append(replace(frame, data=payload[:half], begin=True, end=False))
                out.append(replace(frame, data=payload[half:], begin=False, end=True))
            else:
                out.append(frame)
            if kind in (2, 3):
                out.append(RequestN(sid, n + 1))
            if kind == 0:
                out.append(Cancel(sid))
        return out

    spec = st.tuples(st.integers(0, 3), data, st.integers(0, 100), st.booleans())
    return st.lists(spec, max_size=6).map(build)


@SETTINGS
@given(session_frames(), st.data())
def test_server_split_anywhere_gives_the_same_events(fs, draw):
    wire = b"".join(encode_tcp_frame(f) for f in fs)
    expected = ServerConnection().receive_data(wire)
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    server = ServerConnection()
    got = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        got.extend(server.receive_data(wire[prev:cut]))
        prev = cut
    assert got == expected
    assert all(not isinstance(e, StreamError) for e in got)


@SETTINGS
@given(session_frames(), st.data())
def test_server_truncated_session_never_errors(fs, draw):
    wire = b"".join(encode_tcp_frame(f) for f in fs)
    cut = draw.draw(st.integers(0, len(wire)))
    server = ServerConnection()
    part = server.receive_data(wire[:cut])  # no exception
    full = ServerConnection().receive_data(wire)
    assert part == full[: len(part)]
    assert part + server.receive_data(wire[cut:]) == full


@SETTINGS
@given(frames)
def test_any_strict_prefix_of_a_frame_yields_nothing_on_the_connection(frame):
    wire = encode_tcp_frame(frame)
    for cut in range(len(wire)):
        server = ServerConnection()
        server.receive_data(SETUP_TCP)
        assert server.receive_data(wire[:cut]) == []


def _fuzz(conn: ServerConnection | ClientConnection, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            for event in conn.receive_data(chunk):
                # An application that answers stream faults as told.
                if isinstance(event, StreamError):
                    if isinstance(conn, ServerConnection):
                        conn.send_error(event.stream_id, event.code, event.message)
                    else:
                        conn.cancel(event.stream_id)
    except RemoteProtocolError:
        pass  # a connection fault; our own LocalProtocolError fails the test
    for info in conn.streams.values():
        assert info.credits >= 0


@SETTINGS
@given(st.lists(st.binary(max_size=40), max_size=6), st.sampled_from(["tcp", "websocket"]))
def test_random_bytes_raise_only_protocol_error(chunks, transport):
    _fuzz(ServerConnection(transport, max_frame_size=64), chunks)
    client = ClientConnection(transport, max_frame_size=64)
    client.setup()
    _fuzz(client, chunks)


# Random but well-framed frames after a valid SETUP reach the stream logic.
raw_frames = st.builds(
    lambda t, flags, sid, body: (
        bytes([0, flags]) + t.to_bytes(2, "big") + sid.to_bytes(8, "big") + body
    ),
    st.sampled_from(sorted(known_types | {0x0030})),
    st.sampled_from([0x00, 0x20, 0x40, 0x60, 0x10, 0x30, 0x70, 0x80]),
    st.integers(0, 3),
    st.one_of(
        st.binary(max_size=12), st.integers(-2, 3).map(lambda n: n.to_bytes(8, "big", signed=True))
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(raw_frames, max_size=14), st.sampled_from(["tcp", "websocket"]))
def test_well_framed_random_frames_raise_only_protocol_error(messages, transport):
    if transport == "tcp":
        chunks = [SETUP_TCP] + [(len(m) + 4).to_bytes(4, "big") + m for m in messages]
    else:
        chunks = [SETUP_WS, *messages]
    _fuzz(ServerConnection(transport, max_message_size=16, max_streams=3), chunks)
    client = ClientConnection(transport, max_message_size=16)
    client.setup()
    for _ in range(2):
        client.request_stream(b"", 1)
        client.request_response(b"")
    _fuzz(client, chunks[1:])


@SETTINGS
@given(
    st.binary(min_size=0, max_size=3000),
    st.integers(1, 700),
    st.booleans(),
    st.sampled_from(["tcp", "websocket"]),
    st.data(),
)
def test_random_fragmentation_of_large_responses_reassembles_exactly(
    payload, max_fragment, complete, transport, draw
):
    client, server = open_pair(transport)
    sid, wire = client.request_stream(b"q", 3)
    deliver(server, wire)
    wire = server.send_response(sid, payload, complete=complete, max_fragment=max_fragment)
    assert all(
        len(decode_frame(w[4:] if transport == "tcp" else w).data) <= max_fragment for w in wire
    )
    if transport == "tcp":
        stream = b"".join(wire)
        cuts = sorted(draw.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    else:
        chunks = wire
    events = deliver(client, chunks)
    assert events == [Response(sid, payload, complete=complete)]
    if complete:
        assert client.streams == {} == server.streams
    else:
        assert client.credits(sid) == server.credits(sid) == 2


@SETTINGS
@given(st.binary(min_size=1, max_size=2000), st.integers(1, 300), st.sampled_from(range(4)))
def test_random_fragmentation_of_requests_reassembles_exactly(payload, max_fragment, kind):
    client, server = open_pair(max_fragment=max_fragment)
    call = [client.request_response, client.request_fnf][kind] if kind < 2 else None
    if call is not None:
        sid, wire = call(payload)
    else:
        sid, wire = [client.request_stream, client.request_sub][kind - 2](payload, 7)
    [request] = deliver(server, wire)
    assert request.data == payload and request.stream_id == sid
    assert (
        type(request).__name__
        == ["RequestResponse", "RequestFnf", "RequestStream", "RequestSub"][kind]
    )


class ClientServerMachine(RuleBasedStateMachine):
    """A client and a server exchanging frames immediately: after every step
    both sides agree on which streams are live and on their credits."""

    streams = Bundle("streams")

    def __init__(self) -> None:
        super().__init__()
        self.client, self.server = open_pair(max_fragment=5)
        self.kinds: dict[int, Kind] = {}

    def _to_server(self, wire: list[bytes]) -> list:
        return deliver(self.server, wire)

    def _to_client(self, wire: list[bytes]) -> list:
        return deliver(self.client, wire)

    @rule(
        target=streams,
        kind=st.sampled_from(list(Kind)),
        payload=st.binary(max_size=12),
        n=st.integers(0, 3),
    )
    def request(self, kind, payload, n):
        if kind is Kind.REQUEST_RESPONSE:
            sid, wire = self.client.request_response(payload)
        elif kind is Kind.REQUEST_FNF:
            sid, wire = self.client.request_fnf(payload)
        elif kind is Kind.REQUEST_STREAM:
            sid, wire = self.client.request_stream(payload, n)
        else:
            sid, wire = self.client.request_sub(payload, n)
        [event] = self._to_server(wire)
        assert event.stream_id == sid and event.data == payload
        self.kinds[sid] = kind
        return sid

    @rule(sid=streams, n=st.integers(1, 3))
    def request_n(self, sid, n):
        wire = b""
        if self.client.is_live(sid) and self.kinds[sid] in (Kind.REQUEST_STREAM, Kind.REQUEST_SUB):
            wire = self.client.request_n(sid, n)
        self._to_server([wire])

    @rule(sid=consumes(streams))
    def cancel(self, sid):
        events = self._to_server([self.client.cancel(sid)])
        assert events in ([], [Cancel(sid)])

    @rule(sid=streams, payload=st.binary(max_size=14), complete=st.booleans())
    def respond(self, sid, payload, complete):
        if not self.server.is_live(sid):
            return
        kind = self.kinds[sid]
        needs_credit = complete is False or payload
        legal = (
            (kind is Kind.REQUEST_RESPONSE and complete)
            or (kind is Kind.REQUEST_STREAM and (self.server.credits(sid) > 0 or not needs_credit))
            or (kind is Kind.REQUEST_SUB and not complete and self.server.credits(sid) > 0)
        )
        try:
            wire = self.server.send_response(sid, payload, complete=complete)
        except LocalProtocolError:
            assert not legal
            return
        assert legal
        events = self._to_client(wire)
        assert events == [Response(sid, payload, complete=complete)]

    @rule(sid=streams)
    def error(self, sid):
        if self.server.is_live(sid):
            [event] = self._to_client([self.server.send_error(sid, "internal", "x")])
            assert isinstance(event, ErrorFrame)

    @invariant()
    def agree(self):
        assert self.client.live_streams() == self.server.live_streams()
        for sid in self.server.live_streams():
            assert self.client.credits(sid) == self.server.credits(sid)
            assert self.server.streams[sid].kind is self.kinds[sid]
            assert self.kinds[sid] is not Kind.REQUEST_FNF


TestClientServer = ClientServerMachine.TestCase
TestClientServer.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
