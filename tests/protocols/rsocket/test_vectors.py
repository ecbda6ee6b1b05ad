"""Byte-exact RSocket 1.0 frames, written from the spec's layouts
(rsocket/rsocket Protocol.md and Extensions/).  They need nothing but
polyport; the cross-check against rsocket-py's own encoder and parser is
test_rsocket_py_codec.py."""

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
    Entry,
    decode_auth,
    decode_composite,
    decode_routing,
    encode_bearer_auth,
    read_metadata,
    request_metadata,
)
from polyport.protocols.rsocket.wire import decode_frame, encode_frame, encode_tcp_frame

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


@pytest.mark.parametrize(("name", "frame", "wire"), VECTORS, ids=[v[0] for v in VECTORS])
def test_vectors_encode_and_decode(name: str, frame: F.Frame, wire: bytes) -> None:
    assert encode_frame(frame) == wire
    assert decode_frame(wire) == frame
    # TCP: a 24-bit length in front, not counting itself.
    assert encode_tcp_frame(frame) == len(wire).to_bytes(3, "big") + wire


def test_payload_with_follows_and_complete_ignores_follows() -> None:
    # "A PAYLOAD with both F and C flags set, implicitly ignores the F flag."
    assert decode_frame(H("00000001 28e0 6f6b")) == Payload(1, None, b"ok", False, True, True)


def test_reserved_bits_are_not_interpreted() -> None:
    assert decode_frame(H("80000003 2000 80000005")) == RequestN(3, 5)


def test_composite_metadata_vectors() -> None:
    # routing: well-known id 0x7E | u24 length | tags (u8 length + UTF-8);
    # authentication: 0x7C | u24 length | 0x80 (simple) | u16 user length | user | password
    wire = H("fe 00000e 0d") + b"events.append" + H("fc 000005 80 0001") + b"up"
    assert request_metadata("events.append", user="u", password="p") == wire
    entries = decode_composite(wire)
    assert [e.mime_type for e in entries] == [
        "message/x.rsocket.routing.v0", "message/x.rsocket.authentication.v0"]
    assert decode_routing(entries[0].content) == ["events.append"]
    auth = decode_auth(entries[1].content)
    assert (auth.auth_type, auth.user, auth.password) == ("simple", "u", "p")
    meta = read_metadata(wire, COMPOSITE)
    assert meta.route == "events.append" and meta.credentials == auth
    # A custom MIME type: length - 1, then its name.
    assert decode_composite(H("02") + b"a/b" + H("000001 78")) == [Entry("a/b", b"x")]
    assert decode_auth(encode_bearer_auth("tok")).token == b"tok"
