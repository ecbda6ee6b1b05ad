"""Property tests: round trips, fuzzing, truncation, arbitrary splitting, and
strict field typing for every field of every frame."""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyport.protocols.bson import (
    ClientConnection,
    Connect,
    Ping,
    Query,
    QueryResponse,
    QueryResult,
    Recev,
    RemoteProtocolError,
    Response,
    ServerConnection,
    State,
    SubResponse,
    Subscribe,
    decode_frame,
    encode_frame,
)
from polyport.protocols.bson.frames import (
    CLIENT_FRAME_TYPES,
    CONNECT,
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_CLASSES,
    Field,
    Frame,
)
from tests.protocols.bson.strategies import (
    BSON_SAMPLES,
    accepted,
    all_frames,
    documents,
    envelope,
    frames_of,
    int32s,
    raw,
    scalars,
    text,
    wire_body,
)

# BSON_FUZZ_EXAMPLES=5000 for a longer fuzzing run.
SETTINGS = settings(
    max_examples=int(os.environ.get("BSON_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

CLIENT_REQUEST_CLASSES = [
    cls for name, cls in FRAME_CLASSES.items() if name in CLIENT_FRAME_TYPES and name != CONNECT
]
client_requests = st.one_of([frames_of(cls) for cls in CLIENT_REQUEST_CLASSES])

ALL_FIELDS: list[tuple[str, Field]] = [
    (name, field) for name, cls in FRAME_CLASSES.items() for field in cls.FIELDS
]
FIELD_IDS = [f"{name}.{field.wire}" for name, field in ALL_FIELDS]


def connected_server() -> ServerConnection:
    conn = ServerConnection()
    assert conn.receive_data(encode_frame(Connect("1.0"))) == [Connect("1.0")]
    conn.send(Response(ok=True))
    assert conn.state is State.CONNECTED
    return conn


def drain(conn: ServerConnection | ClientConnection, data: bytes) -> list[Frame]:
    """The adapter loop: call again with b"" until nothing more comes."""
    out: list[Frame] = []
    frames = conn.receive_data(data)
    while frames:
        out.extend(frames)
        frames = conn.receive_data(b"")
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# --- round trips ---------------------------------------------------------------------


@SETTINGS
@given(all_frames)
def test_random_frames_round_trip(frame: Frame) -> None:
    wire = encode_frame(frame)
    assert decode_frame(wire) == frame
    # Encoding is deterministic and canonical.
    assert encode_frame(decode_frame(wire)) == wire


@SETTINGS
@given(documents)
def test_event_documents_survive_byte_for_byte(event: dict[str, Any]) -> None:
    # What a client sends is what a subscriber gets: decode/encode is lossless.
    wire = raw({"type": "EMIT", "frame": {"streamName": "s", "eventType": "t", "event": event}})
    frame = decode_frame(wire)
    assert encode_frame(frame) == wire


# --- fuzzing -------------------------------------------------------------------------


@SETTINGS
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_remote_protocol_error(data: bytes) -> None:
    for conn in (ServerConnection(), connected_server(), ClientConnection()):
        try:
            drain(conn, data)
        except RemoteProtocolError:
            assert conn.state is State.MUST_CLOSE


@SETTINGS
@given(st.binary(min_size=1, max_size=60), st.integers(5, 80))
def test_random_bodies_behind_a_plausible_length(body: bytes, length: int) -> None:
    data = length.to_bytes(4, "little") + body
    for conn in (ServerConnection(), connected_server()):
        with contextlib.suppress(RemoteProtocolError):
            drain(conn, data)


@SETTINGS
@given(
    st.one_of(st.sampled_from(sorted(FRAME_CLASSES)), text, scalars),
    st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                f.wire: st.one_of(scalars, documents) for _, f in ALL_FIELDS
            },
        ),
        scalars,
    ),
)
def test_random_envelopes_raise_only_remote_protocol_error(frame_type: Any, body: Any) -> None:
    wire = envelope(frame_type, body)
    for conn in (connected_server(), ClientConnection()):
        with contextlib.suppress(RemoteProtocolError):
            drain(conn, wire)


# --- lengths -------------------------------------------------------------------------


@SETTINGS
@given(st.integers(DEFAULT_MAX_FRAME_SIZE + 1, 2**31 - 1))
def test_oversized_length_prefix_fails_at_once(length: int) -> None:
    conn = ServerConnection()
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(length.to_bytes(4, "little"))
    assert info.value.code == "too_large"
    assert conn.state is State.MUST_CLOSE


@SETTINGS
@given(st.integers(-(2**31), 4))
def test_undersized_length_prefix_fails_at_once(length: int) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        ServerConnection().receive_data(length.to_bytes(4, "little", signed=True))
    assert info.value.code == "malformed"


def test_configured_frame_limit() -> None:
    conn = ServerConnection(max_frame_size=64)
    wire = encode_frame(Connect("1.0", username="u" * 64))
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(wire[:4])
    assert info.value.code == "too_large"


# --- truncation and splitting --------------------------------------------------------


@SETTINGS
@given(all_frames, st.data())
def test_truncated_frame_waits_for_more(frame: Frame, data: st.DataObject) -> None:
    wire = encode_frame(frame)
    cut = data.draw(st.integers(0, len(wire) - 1))
    for conn in (ServerConnection(), connected_server(), ClientConnection()):
        assert conn.receive_data(wire[:cut]) == []
        assert conn.state is not State.MUST_CLOSE


@SETTINGS
@given(st.lists(client_requests, max_size=8), st.lists(st.integers(0, 10_000), max_size=12))
def test_client_stream_split_anywhere_gives_same_frames(
    requests: list[Frame], cuts: list[int]
) -> None:
    connect = Connect("0.1", username="tim")
    stream = encode_frame(connect) + b"".join(encode_frame(f) for f in requests)
    conn = ServerConnection()
    received: list[Frame] = []
    for chunk in split(stream, cuts):
        frames = conn.receive_data(chunk)
        while frames:
            for frame in frames:
                if isinstance(frame, Connect):
                    conn.send(Response(ok=True))
            received.extend(frames)
            frames = conn.receive_data(b"")
    assert received == [connect, *requests]
    assert conn.buffered_bytes == 0


@SETTINGS
@given(
    st.lists(st.one_of(st.just("recev"), st.just("result")), max_size=10),
    documents,
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_server_stream_split_anywhere_gives_same_frames(
    order: list[str], event: dict[str, Any], cuts: list[int]
) -> None:
    client = ClientConnection()
    requests: list[Frame] = [Connect("1.0"), Subscribe("orders"), Query(9, "b", {})]
    for request in requests:
        client.send(request)
    n_results = order.count("result")
    replies: list[Frame] = [
        Response(ok=True),
        SubResponse(ok=True, sub_id=4),
        QueryResponse(9, n_results),
    ]
    seq = iter(range(100))
    replies += [
        Recev(4, "orders", "t", 1, next(seq), event) if kind == "recev" else QueryResult(9, event)
        for kind in order
    ]
    stream = b"".join(encode_frame(f) for f in replies)
    received: list[Frame] = []
    for chunk in split(stream, cuts):
        received.extend(drain(client, chunk))
    assert received == replies
    assert client.state is State.CONNECTED
    assert client.unacked_bytes(4) == sum(
        len(encode_frame(f)) for f in replies if isinstance(f, Recev)
    )
    assert client.unacked_query_results(9) == n_results


# --- strict field typing ---------------------------------------------------------------


@pytest.mark.parametrize(("frame_type", "field"), ALL_FIELDS, ids=FIELD_IDS)
def test_every_wrong_bson_type_is_rejected(frame_type: str, field: Field) -> None:
    base = _valid_body(frame_type)
    for value in BSON_SAMPLES:
        body = {**base, field.wire: value}
        wire = envelope(frame_type, body)
        if accepted(field, value):
            decode_frame(wire)
            continue
        with pytest.raises(RemoteProtocolError) as info:
            decode_frame(wire)
        assert info.value.code == "malformed"
        assert f"'{field.wire}'" in info.value.message
        assert frame_type in info.value.message


@pytest.mark.parametrize(("frame_type", "field"), ALL_FIELDS, ids=FIELD_IDS)
def test_missing_field(frame_type: str, field: Field) -> None:
    body = _valid_body(frame_type)
    del body[field.wire]
    wire = envelope(frame_type, body)
    if not field.required:
        assert getattr(decode_frame(wire), field.attr) is None
        return
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(wire)
    assert info.value.code == "malformed"
    assert info.value.message == f"{frame_type}: missing mandatory field '{field.wire}'"


@SETTINGS
@given(st.sampled_from(ALL_FIELDS), st.data())
def test_wrong_types_with_random_neighbours(
    choice: tuple[str, Field], data: st.DataObject
) -> None:
    frame_type, field = choice
    frame = data.draw(frames_of(FRAME_CLASSES[frame_type]))
    value = data.draw(
        st.one_of(scalars, documents, st.sampled_from(BSON_SAMPLES)).filter(
            lambda v: not accepted(field, v)
        )
    )
    body = {**wire_body(frame), field.wire: value}
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(envelope(frame_type, body))
    assert f"'{field.wire}'" in info.value.message


@SETTINGS
@given(int32s.filter(lambda n: n < 0))
def test_negative_ack_bytes_rejected(n: int) -> None:
    with pytest.raises(RemoteProtocolError, match="'bytes' must be >= 0"):
        decode_frame(envelope("ACKEV", {"subID": 1, "bytes": n}))


def test_null_optional_field_means_absent() -> None:
    wire = envelope("CONNECT", {"version": "1.0", "username": None, "password": None})
    assert decode_frame(wire) == Connect("1.0")


def test_null_mandatory_field_is_wrong_type() -> None:
    with pytest.raises(RemoteProtocolError, match="'version' must be string, got null"):
        decode_frame(envelope("CONNECT", {"version": None}))


def test_unknown_fields_ignored() -> None:
    wire = raw({"type": "PING", "frame": {"extra": 1}, "more": True})
    assert decode_frame(wire) == Ping()


def _valid_body(frame_type: str) -> dict[str, Any]:
    """A body with every field (optional ones too) set to a valid value."""
    samples = {"string": "s", "boolean": True, "int32": 1, "int64": 1, "document": {"a": 1}}
    return {f.wire: samples[f.kind.value] for f in FRAME_CLASSES[frame_type].FIELDS}
