"""Property tests: round trips, random and truncated bytes, fragmentation."""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyport.protocols.rsocket import frames as F
from polyport.protocols.rsocket.connection import ClientConnection, ServerConnection, StreamError
from polyport.protocols.rsocket.errors import RemoteProtocolError
from polyport.protocols.rsocket.metadata import COMPOSITE, MetadataError, read_metadata
from polyport.protocols.rsocket.wire import decode_frame, encode_frame, encode_tcp_frame, fragment

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.integers(0, F.MAX_STREAM_ID)
positive = st.integers(1, F.MAX_U31)
u31 = st.integers(0, F.MAX_U31)
u63 = st.integers(0, F.MAX_U63)
data = st.binary(max_size=48)
meta = st.none() | st.binary(max_size=16)
mime = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)

frames = st.one_of(
    st.builds(F.Setup, positive, positive, mime, mime, meta, data, st.integers(0, 0xFFFF),
              st.integers(0, 0xFFFF), st.booleans(), st.none() | st.binary(max_size=8)),
    st.builds(F.Lease, u31, u31, meta),
    st.builds(F.Keepalive, st.booleans(), u63, data),
    st.builds(F.RequestResponse, ids, meta, data, st.booleans()),
    st.builds(F.RequestFnf, ids, meta, data, st.booleans()),
    st.builds(F.RequestStream, ids, positive, meta, data, st.booleans()),
    st.builds(F.RequestChannel, ids, positive, meta, data, st.booleans(), st.booleans()),
    st.builds(F.RequestN, ids, positive),
    st.builds(F.Cancel, ids),
    st.builds(lambda sid, m, d, f, c: F.Payload(sid, m, d, f and not c, c, True),
              ids, meta, data, st.booleans(), st.booleans()),
    st.builds(F.ErrorFrame, ids, st.integers(0, 0xFFFF_FFFF), data),
    st.builds(F.MetadataPush, data, ids),
    st.builds(F.Resume, st.binary(max_size=8), u63, u63),
    st.builds(F.ResumeOk, u63),
    st.builds(F.Ext, ids, positive, meta, data, st.booleans()),
)


@SETTINGS
@given(frames)
def test_every_frame_round_trips(frame: F.Frame) -> None:
    assert decode_frame(encode_frame(frame)) == frame


@SETTINGS
@given(st.binary(max_size=80))
def test_random_bytes_never_crash_the_server(blob: bytes) -> None:
    for transport in ("tcp", "websocket"):
        conn = ServerConnection(transport)
        try:
            conn.receive_data(blob)
        except RemoteProtocolError as exc:
            assert exc.error_code in F.CONNECTION_ERROR_CODES
            assert conn.closed


@SETTINGS
@given(st.lists(frames, min_size=1, max_size=6), st.data())
def test_open_server_survives_any_frames_cut_anywhere(
    batch: list[F.Frame], pick: st.DataObject
) -> None:
    conn = ServerConnection("tcp")
    conn.receive_data(encode_tcp_frame(F.Setup(1, 1, COMPOSITE, "application/json")))
    wire = b"".join(encode_tcp_frame(f) for f in batch)
    cut = pick.draw(st.integers(0, len(wire)))
    try:
        for chunk in (wire[:cut], wire[cut:]):
            for ev in conn.receive_data(chunk):
                assert isinstance(ev, F.Frame | StreamError)
    except RemoteProtocolError:
        assert conn.closed


@SETTINGS
@given(frames)
def test_truncated_frames_are_refused_or_read_as_a_shorter_frame(frame: F.Frame) -> None:
    wire = encode_frame(frame)
    for end in range(len(wire)):
        try:
            decode_frame(wire[:end])
        except RemoteProtocolError as exc:
            assert exc.error_code == F.CONNECTION_ERROR


@SETTINGS
@given(st.binary(max_size=60))
def test_random_metadata_is_read_or_refused(blob: bytes) -> None:
    with contextlib.suppress(MetadataError):
        read_metadata(blob, COMPOSITE)


@SETTINGS
@given(ids.filter(lambda i: i % 2 == 1), meta, st.binary(max_size=200), st.integers(1, 40),
       st.booleans())
def test_fragments_reassemble_to_the_whole(
    sid: int, metadata: bytes | None, body: bytes, size: int, complete: bool
) -> None:
    # Our server fragments a PAYLOAD; our client puts it back together.
    whole = F.Payload(sid, metadata, body, complete=complete, next=True)
    parts = fragment(whole, size)
    assert all(len(p.metadata or b"") + len(p.data) <= size for p in parts)
    client = ClientConnection("websocket")
    client.setup(F.Setup(1, 1, COMPOSITE, "application/json"))
    client._next_id = sid
    client.request_stream(None, b"", 1)
    out = []
    for p in parts:
        out += client.receive_data(encode_frame(p))
    assert out == [F.Payload(sid, metadata, body, complete=complete, next=True)]
