"""Refused messages: the error code, and what the server needs to reply."""

from __future__ import annotations

import uuid

import pytest

from polyport.protocols import errors as shared
from polyport.protocols.res01 import (
    ErrorCode,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Res01Error,
    decode_request,
    decode_response,
    encode_error_reply,
    encode_response,
)
from polyport.protocols.res01.frames import CommitResult

R = (b"peer", b"hop")
GUID = bytes(range(16))
TS = b"5245980530577387904"


def refuse(frames: list[bytes]) -> Res01Error:
    with pytest.raises(Res01Error) as info:
        decode_request(frames)
    return info.value


def test_error_hierarchy() -> None:
    err = refuse([])
    assert isinstance(err, ProtocolError)
    assert isinstance(err, ValueError)
    # A peer's bad message is a remote error, on Res01's and the shared base.
    assert isinstance(err, RemoteProtocolError)
    assert isinstance(err, shared.RemoteProtocolError)
    assert not isinstance(err, shared.LocalProtocolError)
    assert issubclass(LocalProtocolError, shared.LocalProtocolError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert not issubclass(LocalProtocolError, shared.RemoteProtocolError)


def test_canonical_code_follows_the_er_code() -> None:
    assert refuse([]).code == "malformed"
    assert refuse([b"", b"Res02", b"AC", b"r"]).code == "unsupported"
    assert refuse([b"", b"Res01", b"XX", b"r"]).code == "unsupported"
    # A caller may name a finer canonical code for the same ER code.
    err = Res01Error("too big", ErrorCode.MALFORMED, code="too_large", request_id=b"r")
    assert (err.er_code, err.code, err.request_id) == (1, "too_large", b"r")


def test_no_delimiter_answers_to_the_first_frame() -> None:
    err = refuse([b"peer", b"Res01", b"AC", b"r"])
    assert err.er_code == ErrorCode.MALFORMED
    assert err.routing == (b"peer",)
    assert err.request_id is None
    assert refuse([]).routing == ()


def test_missing_protocol_frame() -> None:
    err = refuse([*R, b""])
    assert (err.er_code, err.routing, err.request_id) == (1, R, None)


def test_unsupported_protocol() -> None:
    err = refuse([*R, b"", b"Res02", b"AC", b"r-9", b"c"])
    assert err.er_code == ErrorCode.UNSUPPORTED_PROTOCOL
    assert (err.routing, err.request_id, err.protocol) == (R, b"r-9", None)
    assert "Res02" in err.message
    # An empty protocol frame after the delimiter is a protocol, not routing.
    assert refuse([*R, b"", b"", b"AC"]).er_code == 2


def test_missing_command() -> None:
    err = refuse([*R, b"", b"Res01"])
    assert (err.er_code, err.protocol) == (1, "Res01")


def test_unsupported_command_keeps_request_id() -> None:
    err = refuse([*R, b"", b"RC0.1", b"XX", b"r-3", b"whatever"])
    assert err.er_code == ErrorCode.UNSUPPORTED_COMMAND
    assert (err.routing, err.request_id, err.protocol) == (R, b"r-3", "RC0.1")
    # A response command sent as a request is not a request.
    assert refuse([b"", b"Res01", b"CR", b"r"]).er_code == 3
    assert refuse([b"", b"Res01", b"\xff\xfe"]).er_code == 3


def test_missing_request_id() -> None:
    err = refuse([*R, b"", b"Res01", b"FE"])
    assert (err.er_code, err.request_id, err.protocol) == (1, None, "Res01")


# fmt: off
MALFORMED = {
    "non-numeric count": [b"FE", b"r", b"two"],
    "count too high": [b"FE", b"r", b"2", b"1", b"10"],
    "count too low": [b"FE", b"r", b"0", b"1", b"10"],
    "negative count": [b"FE", b"r", b"-1"],
    "absurd count": [b"FE", b"r", b"2147483647"],
    "count beyond int32": [b"FE", b"r", b"99999999999999999999"],
    "bad subscription id": [b"FE", b"r", b"1", b"x", b"10"],
    "suggested count beyond int32": [b"FE", b"r", b"1", b"1", b"2147483648"],
    "missing count": [b"FE", b"r"],
    "short guid": [b"AC", b"r", b"c", b"s", b"1", b"1", GUID[:15], TS, b"t", b"", b""],
    "bad timestamp": [b"AC", b"r", b"c", b"s", b"1", b"1", GUID, b"now", b"t", b"", b""],
    "timestamp past max": [
        b"AC", b"r", b"c", b"s", b"1", b"1", GUID, b"3155378976000000000", b"t", b"", b""
    ],
    "bad utf-8 body": [b"AC", b"r", b"c", b"s", b"1", b"1", GUID, TS, b"t", b"", b"\xff"],
    "bad expected version": [b"AC", b"r", b"c", b"s", b"1.0", b"0"],
    "event frames missing": [b"AC", b"r", b"c", b"s", b"1", b"1", GUID, TS, b"t", b""],
    "trailing frame": [b"AC", b"r", b"c", b"s", b"1", b"0", b"extra"],
    "rs count mismatch": [b"RS", b"r", b"sub", b"1", b"c", b"f"],
    "ps bad time": [b"PS", b"r", b"1", b"4", b""],
    "ss count mismatch": [b"SS", b"r", b"1", b"a", b"b", b"c"],
}


# fmt: on


@pytest.mark.parametrize("tail", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_bodies_keep_routing_and_request_id(tail: list[bytes]) -> None:
    err = refuse([*R, b"", b"Res01", *tail])
    assert err.er_code == ErrorCode.MALFORMED
    assert err.routing == R
    assert err.request_id == (tail[1] if len(tail) > 1 else None)
    assert err.protocol == "Res01"


def test_error_reply_for_a_malformed_request() -> None:
    err = refuse([*R, b"", b"RC0.1", b"FE", b"r-5", b"nope"])
    frames = encode_error_reply(err)
    assert frames[:6] == [*R, b"", b"RC0.1", b"r-5", b"ER"]
    assert frames[6] == b"1"
    assert b"count" in frames[7]


def test_error_reply_without_request_id_or_protocol() -> None:
    frames = encode_error_reply(refuse([*R, b"", b"JSON"]))
    assert frames[:7] == [*R, b"", b"Res01", b"", b"ER", b"2"]


def test_encode_response_rejects_empty_routing_frames() -> None:
    with pytest.raises(LocalProtocolError):
        encode_response([b""], CommitResult(b"r", uuid.UUID(int=0)))


def test_encode_rejects_unknown_protocol() -> None:
    with pytest.raises(LocalProtocolError):
        encode_response([], CommitResult(b"r", uuid.UUID(int=0), protocol="Res02"))


def refuse_response(frames: list[bytes]) -> Res01Error:
    with pytest.raises(Res01Error) as info:
        decode_response(frames)
    return info.value


def test_malformed_responses() -> None:
    assert refuse_response([b"Res01", b"r", b"CR", GUID]).er_code == 1  # no delimiter
    assert refuse_response([b""]).er_code == 1
    assert refuse_response([b"", b"Res9"]).er_code == 2
    assert refuse_response([b"", b"Res01"]).er_code == 1
    err = refuse_response([b"", b"Res01", b"r"])
    assert (err.er_code, err.request_id) == (1, b"r")
    assert refuse_response([b"", b"Res01", b"r", b"AC"]).er_code == 3
    err = refuse_response([b"", b"Res01", b"r", b"CR", GUID, b"x"])
    assert (err.er_code, err.request_id, err.protocol) == (1, b"r", "Res01")
    assert refuse_response([b"", b"Res01", b"r", b"ER", b"x", b"m"]).er_code == 1
    assert refuse_response([b"", b"Res01", b"r", b"SR", b"2", b"1"]).er_code == 1
