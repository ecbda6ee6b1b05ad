"""MicroMsg2's listener settings through the shared settings reader."""

from __future__ import annotations

import pytest

from polyport.protocols.micromsg2.limits import Limits


def _limits(**settings: object) -> Limits:
    return Limits.from_settings(settings)


def test_defaults() -> None:
    limits = _limits()
    assert limits == Limits()
    assert (limits.max_payload, limits.idle_timeout) == (1 << 20, 300.0)
    assert (limits.initial_seq, limits.required_extensions) == (1, ())


def test_every_key_and_its_meaning() -> None:
    limits = _limits(
        max_event_bytes="5000",
        idle_timeout=12,
        micromsg2_initial_seq="65530",
        micromsg2_required_extensions="json;batch-ack:max-count=5",
    )
    assert limits.max_payload == 5000
    assert limits.idle_timeout == 12.0
    assert limits.initial_seq == 65530
    # The text form is the handshake's list grammar; only the names are kept.
    assert limits.required_extensions == ("json", "batch-ack")


def test_required_extensions_forms() -> None:
    # A comma inside a spec's properties does not split the list.
    assert _limits(micromsg2_required_extensions="x:a=1,b=2;json").required_extensions == (
        "x",
        "json",
    )
    # A list keeps each spec as written, properties included.
    listed = _limits(micromsg2_required_extensions=["json", "batch-ack:max-count=5"])
    assert listed.required_extensions == ("json", "batch-ack:max-count=5")
    assert _limits(micromsg2_required_extensions="").required_extensions == ()
    with pytest.raises(ValueError, match=r"micromsg2_required_extensions: .*FIELD"):
        _limits(micromsg2_required_extensions="JSON!")


def test_idle_timeout_zero_turns_the_watchdog_off() -> None:
    assert _limits(idle_timeout=0).idle_timeout is None
    assert _limits(idle_timeout="0").idle_timeout is None


def test_only_the_documented_keys_are_read() -> None:
    # max_payload and idle_timeout have gateway-wide keys only.
    assert _limits(micromsg2_max_payload=5, micromsg2_idle_timeout=5) == Limits()


@pytest.mark.parametrize("bad", [0, 65536, -1, "abc"])
def test_initial_seq_is_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="micromsg2_initial_seq"):
        _limits(micromsg2_initial_seq=bad)
