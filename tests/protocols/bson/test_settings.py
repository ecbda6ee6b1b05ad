"""The BSON Limits from the gateway settings, through the shared parser."""

from __future__ import annotations

import pytest

from polyport.protocols.bson.frames import DEFAULT_MAX_EVENT_SIZE
from polyport.protocols.bson.limits import Limits


def test_defaults_when_nothing_is_set() -> None:
    assert Limits.from_settings({}) == Limits()
    assert Limits().max_event_bytes == DEFAULT_MAX_EVENT_SIZE


def test_every_documented_key_is_read() -> None:
    got = Limits.from_settings(
        {
            "max_event_bytes": 2048,
            "bson_query_window": 3,
            "bson_flow_pause_bytes": "4000",  # environment values arrive as text
            "bson_flow_resume_bytes": 2000,
            "bson_max_frame_bytes": 65536,
            "bson_max_inflight_requests": 2,
            "bson_max_inflight_bytes": 1000,
            "bson_max_transactions": 5,
            "bson_max_tx_events": 6,
            "bson_max_tx_bytes": 7000,
            "bson_max_subscriptions": 8,
            "bson_max_queries": 9,
            "bson_subscription_buffer": 10,
            "query_window": 99,  # not a BSON key: ignored
        }
    )
    assert got == Limits(
        max_event_bytes=2048,
        query_window=3,
        flow_pause_bytes=4000,
        flow_resume_bytes=2000,
        max_frame_bytes=65536,
        max_inflight_requests=2,
        max_inflight_bytes=1000,
        max_transactions=5,
        max_tx_events=6,
        max_tx_bytes=7000,
        max_subscriptions=8,
        max_queries=9,
        subscription_buffer=10,
    )


def test_bson_key_wins_over_the_gateway_wide_one() -> None:
    got = Limits.from_settings({"max_event_bytes": 2048, "bson_max_event_bytes": 512})
    assert got.max_event_bytes == 512


@pytest.mark.parametrize("window", [0, -5])
def test_query_window_is_at_least_one(window: int) -> None:
    assert Limits.from_settings({"bson_query_window": window}).query_window == 1
    assert Limits(query_window=window).query_window == 1


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ValueError, match="bson_max_queries"):
        Limits.from_settings({"bson_max_queries": "lots"})
