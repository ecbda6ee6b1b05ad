"""The listener's bounds from the gateway's settings: keys, defaults, derived values."""

from __future__ import annotations

import dataclasses

import pytest

from polyport.protocols.res01 import ErrorCode
from polyport.protocols.res01.connection import MessageAssembler
from polyport.protocols.res01.limits import Limits


def test_defaults() -> None:
    limits = Limits.from_settings({})
    assert limits == Limits()
    assert (limits.max_in_flight_writes, limits.max_in_flight_reads) == (4096, 64)
    assert limits.max_in_flight_bytes == 64 << 20
    assert limits.max_event_bytes == 1 << 20
    assert limits.max_request_bytes == 16 << 20
    assert limits.max_frame_bytes == (1 << 20) + 4096
    assert (limits.read_timeout, limits.send_timeout) == (30.0, 10.0)
    assert (limits.max_fetch_count, limits.max_fetch_bytes) == (1000, 8 << 20)


def test_every_setting_key_as_documented() -> None:
    limits = Limits.from_settings(
        {
            "res01_max_in_flight_writes": 1,
            "res01_max_in_flight_reads": "2",
            "res01_max_in_flight_bytes": 3,
            "res01_max_request_bytes": "4",
            "max_event_bytes": 5,
            "read_timeout": "0.5",
            "res01_max_fetch_count": 6,
            "res01_max_fetch_bytes": 7,
            "res01_send_timeout": 8,
        }
    )
    assert limits == Limits(
        max_in_flight_writes=1,
        max_in_flight_reads=2,
        max_in_flight_bytes=3,
        max_request_bytes=4,
        max_event_bytes=5,
        read_timeout=0.5,
        max_fetch_count=6,
        max_fetch_bytes=7,
        send_timeout=8.0,
    )


def test_shared_keys_are_read_without_the_prefix_only() -> None:
    # max_event_bytes and read_timeout have always been the gateway-wide keys;
    # no res01_ spelling of them appeared along the way.
    limits = Limits.from_settings({"res01_max_event_bytes": 5, "res01_read_timeout": 1})
    assert (limits.max_event_bytes, limits.read_timeout) == (1 << 20, 30.0)


def test_derived_from_max_event_bytes() -> None:
    big = Limits.from_settings({"max_event_bytes": 10 << 20})
    assert big.max_frame_bytes == (10 << 20) + 4096
    assert big.max_request_bytes == 20 << 20  # twice the largest event
    small = Limits.from_settings({"max_event_bytes": 1000})
    assert small.max_frame_bytes == 5096
    assert small.max_request_bytes == 16 << 20
    # Set explicitly, the request limit is taken as it is.
    assert Limits.from_settings({"max_event_bytes": 10 << 20, "res01_max_request_bytes": 99}) == (
        Limits(max_event_bytes=10 << 20, max_request_bytes=99)
    )


def test_frame_limit_is_not_a_setting() -> None:
    assert Limits.from_settings({"res01_max_frame_bytes": 1}).max_frame_bytes == (1 << 20) + 4096
    with pytest.raises(TypeError):
        Limits(max_frame_bytes=1)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Limits().max_event_bytes = 1  # type: ignore[misc]


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ValueError, match="res01_max_in_flight_reads"):
        Limits.from_settings({"res01_max_in_flight_reads": "many"})


def test_message_parts_setting() -> None:
    assert Limits.from_settings({}).max_message_parts == 65536
    assert Limits.from_settings({"res01_max_message_parts": "10"}).max_message_parts == 10


def _request(rid: bytes, extra_parts: int, part: bytes = b"x") -> list[bytes]:
    head = [b"peer", b"", b"Res01", b"AC", rid, b"ctx", b"stream", b"\x00" * 8]
    return head + [part] * extra_parts


def test_assembler_passes_a_message_within_the_limits_whole() -> None:
    assembler = MessageAssembler(max_parts=100, max_bytes=1000)
    frames = _request(b"r1", 10)
    results = [assembler.add(f, i < len(frames) - 1) for i, f in enumerate(frames)]
    assert results[:-1] == [None] * (len(frames) - 1)
    last = results[-1]
    assert last is not None and last.error is None
    assert (last.frames, last.parts, last.size) == (frames, len(frames), sum(map(len, frames)))


@pytest.mark.parametrize(
    ("extra", "part", "message"),
    [(5000, b"x", "5008 parts exceeds the limit of 100 parts"),
     (50, b"y" * 100, "exceeds the limit of 1000 bytes")],
)
def test_assembler_keeps_no_more_than_the_limits_of_an_oversized_message(
    extra: int, part: bytes, message: str
) -> None:
    # Thousands of parts each under MAXMSGSIZE: once past the limit nothing
    # more of the message is kept, and it is refused with its request id.
    assembler = MessageAssembler(max_parts=100, max_bytes=1000)
    frames = _request(b"r2", extra, part)
    most_kept = 0
    received = None
    for i, f in enumerate(frames):
        received = assembler.add(f, i < len(frames) - 1)
        most_kept = max(most_kept, assembler.kept)
    assert received is not None and received.error is not None
    assert most_kept <= 100 and sum(map(len, received.frames)) <= 1000
    assert (received.parts, received.size) == (len(frames), sum(map(len, frames)))
    err = received.error
    assert message in err.message and err.code == "too_large"
    assert (err.routing, err.request_id, err.protocol) == ((b"peer",), b"r2", "Res01")
    assert err.er_code == ErrorCode.MALFORMED
    # The next message starts afresh.
    ok = _request(b"r3", 1)
    for i, f in enumerate(ok):
        received = assembler.add(f, i < len(ok) - 1)
    assert received is not None and received.error is None and received.frames == ok

