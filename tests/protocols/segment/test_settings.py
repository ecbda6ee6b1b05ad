"""Segment's listener settings through the shared settings reader."""

from __future__ import annotations

from polyport.protocols.segment.frames import DEFAULT_MAX_BLOCK_SIZE, MAX_WIRE_LENGTH
from polyport.protocols.segment.limits import (
    DEFAULT_MAX_REPLY_BYTES,
    DEFAULT_READ_WAIT,
    MAX_REPLY_BYTES_LIMIT,
    Limits,
)


def _limits(**settings: object) -> Limits:
    return Limits.from_settings(settings)


def test_defaults() -> None:
    limits = _limits()
    assert limits == Limits()
    assert limits.max_message_size == 1 << 20
    assert limits.max_block_size == DEFAULT_MAX_BLOCK_SIZE
    assert limits.read_wait == DEFAULT_READ_WAIT
    assert limits.max_reply_bytes == DEFAULT_MAX_REPLY_BYTES
    assert limits.idle_timeout == 300.0


def test_every_key_and_its_meaning() -> None:
    limits = _limits(
        max_event_bytes="4096",
        segment_max_block_bytes="65536",
        segment_read_wait="0.25",
        segment_max_reply_bytes=1000,
        idle_timeout=7,
    )
    assert limits == Limits(
        max_message_size=4096,
        max_block_size=65536,
        read_wait=0.25,
        max_reply_bytes=1000,
        idle_timeout=7.0,
    )


def test_out_of_range_values_are_clamped() -> None:
    # max_event_bytes is gateway-wide: segment takes what its wire can carry.
    assert _limits(max_event_bytes=1 << 30).max_message_size == MAX_WIRE_LENGTH
    assert _limits(max_event_bytes=0).max_message_size == 1
    assert _limits(segment_read_wait=-1).read_wait == 0.0
    assert _limits(segment_max_reply_bytes=1 << 30).max_reply_bytes == MAX_REPLY_BYTES_LIMIT
    assert _limits(segment_max_reply_bytes=0).max_reply_bytes == 1
    assert _limits(idle_timeout=0).idle_timeout is None
    # Built directly, the same rules hold.
    assert Limits(max_message_size=1 << 30).max_message_size == MAX_WIRE_LENGTH


def test_only_the_documented_keys_are_read() -> None:
    assert _limits(
        segment_max_message_size=5, segment_max_block_size=5, segment_idle_timeout=5
    ) == Limits()
