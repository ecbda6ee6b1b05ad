"""The adapter's limits from the gateway's settings."""

from __future__ import annotations

import dataclasses

import pytest

from polyport.protocols.reactivesocket.limits import Limits


def test_nothing_set_gives_the_defaults() -> None:
    assert Limits.from_settings({}) == Limits()


def test_every_limit_has_its_reactivesocket_key_and_text_is_converted() -> None:
    defaults = Limits()
    for f in dataclasses.fields(Limits):
        wanted = getattr(defaults, f.name) + 1
        got = Limits.from_settings({f"reactivesocket_{f.name}": str(wanted)})
        assert getattr(got, f.name) == wanted, f.name
        assert type(getattr(got, f.name)) is type(getattr(defaults, f.name)), f.name


def test_gateway_wide_body_limit_and_idle_timeout_apply_unless_overridden() -> None:
    settings = {"max_event_bytes": 4096, "idle_timeout": "2.5", "read_page": 7}
    got = Limits.from_settings(settings)
    assert (got.max_event_bytes, got.idle_timeout) == (4096, 2.5)
    assert got.read_page == Limits().read_page  # only the two are shared
    got = Limits.from_settings({"idle_timeout": 9, "reactivesocket_idle_timeout": 1})
    assert got.idle_timeout == 1.0


@pytest.mark.parametrize(
    "settings,text",
    [
        ({"reactivesocket_read_page": 0}, "reactivesocket_read_page must be at least 1"),
        ({"reactivesocket_max_fnf_inflight": "0"}, "reactivesocket_max_fnf_inflight"),
        ({"reactivesocket_max_frame_size": 11}, "max_frame_size must be at least 12"),
        ({"reactivesocket_max_fragment": 0}, "reactivesocket_max_fragment"),
        ({"idle_timeout": -1}, "reactivesocket_idle_timeout must not be negative"),
        ({"reactivesocket_max_streams": "many"}, "reactivesocket_max_streams: expected int"),
    ],
)
def test_bad_settings_name_the_key(settings: dict[str, object], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        Limits.from_settings(settings)


def test_zero_idle_timeout_and_none_mean_never() -> None:
    assert Limits.from_settings({"idle_timeout": 0}).idle_timeout == 0.0
    assert Limits(idle_timeout=None).idle_timeout is None
