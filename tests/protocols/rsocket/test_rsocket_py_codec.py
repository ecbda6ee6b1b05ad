"""rsocket-py (the ``rsocket`` package from PyPI) and polyport's RSocket codec
agree: frames encoded by one decode to the same thing in the other.  Only this
module needs rsocket-py; the hand-written vectors in test_vectors.py do not."""

from __future__ import annotations

import pytest

from polyport.protocols.rsocket import frames as F
from polyport.protocols.rsocket.frames import (
    Cancel,
    ErrorFrame,
    Keepalive,
    Lease,
    MetadataPush,
    Payload,
    RequestN,
    RequestResponse,
    RequestStream,
    Setup,
)
from polyport.protocols.rsocket.metadata import (
    COMPOSITE,
    request_metadata,
)
from polyport.protocols.rsocket.wire import decode_frame, encode_frame

# --- rsocket-py's encoder and parser agree ----------------------------------------------------

rs_frame = pytest.importorskip("rsocket.frame", reason="rsocket-py is in the test extras")


def _py_frames() -> list[tuple[object, F.Frame]]:
    from rsocket.error_codes import ErrorCode
    from rsocket.extensions.mimetypes import WellKnownMimeTypes
    from rsocket.frame_builders import to_request_n_frame

    setup = rs_frame.SetupFrame()
    setup.keep_alive_milliseconds, setup.max_lifetime_milliseconds = 500, 30_000
    setup.metadata_encoding = WellKnownMimeTypes.MESSAGE_RSOCKET_COMPOSITE_METADATA.value.name
    setup.data_encoding = b"application/json"
    setup.metadata, setup.data, setup.flags_lease = b"md", b"d", True

    rr = rs_frame.RequestResponseFrame()
    rr.stream_id, rr.metadata, rr.data = 1, b"m", b"d"
    rs = rs_frame.RequestStreamFrame()
    rs.stream_id, rs.initial_request_n, rs.data = 3, 5, b"x"
    pl = rs_frame.PayloadFrame()
    pl.stream_id, pl.data, pl.flags_complete = 1, b"ok", True
    err = rs_frame.ErrorFrame()
    err.stream_id, err.error_code, err.data = 1, ErrorCode.INVALID, b"bad"
    ka = rs_frame.KeepAliveFrame(b"k")
    ka.flags_respond = True
    lease = rs_frame.LeaseFrame()
    lease.time_to_live, lease.number_of_requests = 30_000, 10
    cancel = rs_frame.CancelFrame()
    cancel.stream_id = 3
    push = rs_frame.MetadataPushFrame()
    push.metadata = b"mm"
    return [
        (setup, Setup(500, 30_000, COMPOSITE, "application/json", b"md", b"d", lease=True)),
        (rr, RequestResponse(1, b"m", b"d")),
        (rs, RequestStream(3, 5, None, b"x")),
        (pl, Payload(1, None, b"ok", complete=True, next=True)),
        (err, ErrorFrame(1, F.INVALID, b"bad")),
        (ka, Keepalive(True, 0, b"k")),
        (lease, Lease(30_000, 10)),
        (cancel, Cancel(3)),
        (push, MetadataPush(b"mm")),
        (to_request_n_frame(3, 5), RequestN(3, 5)),
    ]


def test_rsocket_py_encoder_agrees() -> None:
    for theirs, ours in _py_frames():
        wire = theirs.serialize()  # type: ignore[attr-defined]
        assert encode_frame(ours) == wire, ours
        assert decode_frame(wire) == ours
        # and their parser reads what we write
        parsed = rs_frame.parse_or_ignore(encode_frame(ours))
        assert type(parsed) is type(theirs)
        assert parsed.stream_id == ours.stream_id


def test_rsocket_py_composite_metadata_agrees() -> None:
    from rsocket.extensions.helpers import authenticate_simple, composite, route

    theirs = composite(route("events.append"), authenticate_simple("user", "pässword"))
    assert request_metadata("events.append", user="user", password="pässword") == theirs
