"""rsocket-py (the ``rsocket`` package from PyPI) and polyport's RSocket codec
agree: frames encoded by one decode to the same thing in the other.  Only this
module needs rsocket-py; the hand-written vectors in test_vectors.py do not."""

from __future__ import annotations

import pytest

from polyport.protocols.rsocket import frames as F
from polyport.protocols.rsocket.frames import (
    Cancel,
    ErrorFrame,
    Ext,
    Keepalive,
    Lease,
    MetadataPush,
    Payload,
    RequestChannel,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    Resume,
    ResumeOk,
    Setup,
)
from polyport.protocols.rsocket.metadata import (
    COMPOSITE,
    request_metadata,
)
from polyport.protocols.rsocket.wire import decode_frame, encode_frame

H = bytes.fromhex
COMPOSITE_MIME = b"message/x.rsocket.composite-metadata.v0"
assert len(COMPOSITE_MIME) == 0x27

VECTORS: list[tuple[str, F.Frame, bytes]] = [
    # stream 0 | type 1 << 10 | version 1.0 | keepalive 500 | lifetime 30000 | mimes
    ("setup", Setup(500, 30_000, COMPOSITE, "application/json"),
     H("00000000 0400 0001 0000 000001f4 00007530 27") + COMPOSITE_MIME
     + H("10") + b"application/json"),
    # M | L | R flags, resume token, metadata with its 24-bit length, data
    ("setup-all-flags",
     Setup(1, 2, "a", "b", metadata=b"md", data=b"d", lease=True, resume_token=b"tk"),
     H("00000000 05c0 0001 0000 00000001 00000002 0002") + b"tk"
     + H("01") + b"a" + H("01") + b"b" + H("000002") + b"md" + b"d"),
    ("lease", Lease(30_000, 10), H("00000000 0800 00007530 0000000a")),
    ("lease-metadata", Lease(1, 1, b"m"), H("00000000 0900 00000001 00000001 6d")),
    ("keepalive-respond", Keepalive(True, 0, b"k"), H("00000000 0c80 0000000000000000 6b")),
    ("keepalive", Keepalive(False, 5), H("00000000 0c00 0000000000000005")),
    ("request-response", RequestResponse(1, b"m", b"d"), H("00000001 1100 000001 6d 64")),
    ("request-response-follows", RequestResponse(1, None, b"d", follows=True),
     H("00000001 1080 64")),
    ("fnf", RequestFnf(5, None, b"x"), H("00000005 1400 78")),
    ("request-stream", RequestStream(3, 5, None, b"x"), H("00000003 1800 00000005 78")),
    ("request-channel", RequestChannel(7, 1, complete=True), H("00000007 1c40 00000001")),
    ("request-n", RequestN(3, 5), H("00000003 2000 00000005")),
    ("cancel", Cancel(3), H("00000003 2400")),
    ("payload-next-complete", Payload(1, None, b"ok", complete=True, next=True),
     H("00000001 2860 6f6b")),
    ("payload-complete", Payload(1, complete=True), H("00000001 2840")),
    ("payload-next-follows-metadata", Payload(1, b"", b"d", follows=True, next=True),
     H("00000001 29a0 000000 64")),
    ("error", ErrorFrame(1, F.APPLICATION_ERROR, b"e"), H("00000001 2c00 00000201 65")),
    ("error-setup", ErrorFrame(0, F.REJECTED_SETUP, b""), H("00000000 2c00 00000003")),
    ("metadata-push", MetadataPush(b"mm"), H("00000000 3100 6d6d")),
    ("resume", Resume(b"t", 1, 2), H("00000000 3400 0001 0000 0001 74")
     + H("0000000000000001 0000000000000002")),
    ("resume-ok", ResumeOk(9), H("00000000 3800 0000000000000009")),
    ("ext", Ext(1, 7, None, b"x", ignore=True), H("00000001 fe00 00000007 78")),
    ("max-stream-id", Cancel(0x7FFF_FFFF), H("7fffffff 2400")),
]


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
