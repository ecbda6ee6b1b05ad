"""Hypothesis strategies for MicroMsg2 frames."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import strategies as st

from polyport.protocols.micromsg2 import (
    Command,
    Error,
    Extension,
    ExtensionSpec,
    Handshake,
    Message,
)
from polyport.protocols.micromsg2.filters import INT64_MAX, INT64_MIN

FIELD_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"

fields = st.text(FIELD_ALPHABET, min_size=1, max_size=12)
short_text = st.text(max_size=20)

property_values = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.datetimes(
        timezones=st.just(UTC), min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)
    ),
    short_text,
)
property_maps = st.dictionaries(st.text(min_size=1, max_size=10), property_values, max_size=5)

payloads = st.binary(max_size=600)  # crosses the 255-byte LARGE_PAYLOAD boundary

messages = st.builds(
    Message,
    seq=st.integers(0, 65535),
    destination=st.text(max_size=40),
    payload=payloads,
    properties=property_maps,
)
commands = st.builds(Command, name=fields, args=st.dictionaries(fields, short_text, max_size=4))
errors = st.builds(Error, message=st.text(max_size=300))


def extensions(ids: st.SearchStrategy[int] = st.integers(0, 255)) -> st.SearchStrategy[Extension]:
    return st.builds(Extension, ext_id=ids, payload=payloads)


wire_frames = st.one_of(messages, commands, extensions(), errors)

extension_specs = st.builds(
    ExtensionSpec, name=fields, properties=st.dictionaries(fields, short_text, max_size=3)
)
handshakes = st.builds(
    Handshake,
    identity=st.text(max_size=30),
    required=st.lists(extension_specs, max_size=4).map(tuple),
    optional=st.lists(extension_specs, max_size=4).map(tuple),
    major=st.integers(0, 255),
    minor=st.integers(0, 255),
    flags=st.integers(0, 255),
)
