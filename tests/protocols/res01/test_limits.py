"""The listener's bounds from the gateway's settings: keys, defaults, derived values."""

from __future__ import annotations

import dataclasses

import pytest

from polyport.protocols.res01.adapter import Res01Limits, limits_from


def test_defaults() -> None:
    limits = limits_from({})
    assert limits == Res01Limits()
    assert (limits.max_in_flight_writes, limits.max_in_flight_reads) == (128, 64)
    assert limits.max_in_flight_bytes == 64 << 20
    assert limits.max_event_bytes == 1 << 20
    assert limits.max_request_bytes == 16 << 20
    assert limits.max_frame_bytes == (1 << 20) + 4096
    assert (limits.read_timeout, limits.send_timeout) == (30.0, 10.0)
    assert (limits.max_fetch_count, limits.max_fetch_bytes) == (1000, 8 << 20)


def test_every_setting_key_as_documented() -> None:
    limits = limits_from(
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
    assert limits == Res01Limits(
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
    limits = limits_from({"res01_max_event_bytes": 5, "res01_read_timeout": 1})
    assert (limits.max_event_bytes, limits.read_timeout) == (1 << 20, 30.0)


def test_derived_from_max_event_bytes() -> None:
    big = limits_from({"max_event_bytes": 10 << 20})
    assert big.max_frame_bytes == (10 << 20) + 4096
    assert big.max_request_bytes == 20 << 20  # twice the largest event
    small = limits_from({"max_event_bytes": 1000})
    assert small.max_frame_bytes == 5096
    assert small.max_request_bytes == 16 << 20
    # Set explicitly, the request limit is taken as it is.
    assert limits_from({"max_event_bytes": 10 << 20, "res01_max_request_bytes": 99}) == (
        Res01Limits(max_event_bytes=10 << 20, max_request_bytes=99)
    )


def test_frame_limit_is_not_a_setting() -> None:
    assert limits_from({"res01_max_frame_bytes": 1}).max_frame_bytes == (1 << 20) + 4096
    with pytest.raises(TypeError):
        Res01Limits(max_frame_bytes=1)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Res01Limits().max_event_bytes = 1  # type: ignore[misc]


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ValueError, match="res01_max_in_flight_reads"):
        limits_from({"res01_max_in_flight_reads": "many"})
