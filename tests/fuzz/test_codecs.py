"""Hypothesis-driven fuzzing of every codec's server-side sans-IO object.

The generators are bench/fuzz.py's (``python -m bench fuzz`` runs them far
longer): random bytes, mutated valid client input and valid input cut into
random chunks.  A server connection may only raise its codec's documented
RemoteProtocolError family, and no call may take a second."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz import CODECS, SLOW_SECONDS, Codec, generate, run_one

_IDS = [c.name for c in CODECS]


@pytest.mark.parametrize("codec", CODECS, ids=_IDS)
def test_valid_input_is_accepted(codec: Codec) -> None:
    """The seeds are valid, so mutations start from input the codec takes:
    whole, and cut into single bytes, a server connection decodes each to
    exactly the frames the client encoded."""
    for seed, frames in codec.cases():
        assert frames, codec.name
        assert codec.feed(seed) == frames, codec.name
        if codec.stream:
            assert codec.feed([bytes([b]) for b in b"".join(seed)]) == frames, codec.name


@pytest.mark.parametrize("codec", CODECS, ids=_IDS)
def test_server_raises_only_protocol_errors(codec: Codec) -> None:
    seeds = codec.seeds()

    @settings(
        max_examples=300,
        deadline=int(SLOW_SECONDS * 1000),
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(st.randoms(use_true_random=False))
    def fuzz(rng: random.Random) -> None:
        outcome = run_one(codec, generate(codec, rng, seeds))
        if outcome.crash is not None:
            raise outcome.crash
        assert outcome.seconds < SLOW_SECONDS

    fuzz()


def test_a_crash_is_reported_not_raised() -> None:
    """run_one tells an undocumented exception from a protocol error."""

    class Documented(Exception):
        pass

    def feed(data: list[bytes]) -> None:
        if data == [b"bad"]:
            raise KeyError("a bug")
        raise Documented("refused")

    codec = Codec("toy", lambda: [[b"ok"]], feed, Documented)
    assert isinstance(run_one(codec, [b"bad"]).crash, KeyError)
    assert run_one(codec, [b"ok"]).crash is None
