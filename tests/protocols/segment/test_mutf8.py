"""Java modified UTF-8: vectors, strictness, and a round trip against a
straightforward re-implementation of ``DataOutputStream.writeUTF``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyport.protocols.segment import mutf8
from polyport.protocols.segment.errors import ProtocolError


def java_write_utf(text: str) -> bytes:
    """writeUTF's loop over UTF-16 code units, without the length prefix."""
    units = text.encode("utf-16-be")
    out = bytearray()
    for i in range(0, len(units), 2):
        c = int.from_bytes(units[i : i + 2], "big")
        if 0x0001 <= c <= 0x007F:
            out.append(c)
        elif c <= 0x07FF:
            out += bytes([0xC0 | (c >> 6), 0x80 | (c & 0x3F)])
        else:
            out += bytes([0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)])
    return bytes(out)


@pytest.mark.parametrize(
    ("text", "hexdata"),
    [
        ("", ""),
        ("abc", "616263"),
        ("\x00", "c080"),
        ("a\x00b", "61c08062"),
        ("é", "c3a9"),
        ("\u07ff", "dfbf"),
        ("€", "e282ac"),
        ("\uffff", "efbfbf"),
        ("\U00010000", "eda080edb080"),
        ("\U0001f600", "eda0bdedb880"),
        ("\U0010ffff", "edafbfedbfbf"),
    ],
)
def test_vectors(text: str, hexdata: str) -> None:
    assert mutf8.encode(text) == bytes.fromhex(hexdata)
    assert mutf8.decode(bytes.fromhex(hexdata)) == text


@pytest.mark.parametrize(
    "hexdata",
    [
        "00",  # raw NUL
        "6100",
        "f09f9880",  # four-byte UTF-8 form of U+1F600
        "c1a1",  # overlong 'a'
        "e08080",  # overlong three-byte NUL
        "c0",  # truncated
        "e282",
        "80",  # lone continuation
        "eda0bd",  # lone high surrogate
        "edb880",  # lone low surrogate
        "edb880eda0bd",  # pair in the wrong order
        "eda0bd61",
        "ff",
        "c0c080",
    ],
)
def test_rejects(hexdata: str) -> None:
    with pytest.raises(ProtocolError):
        mutf8.decode(bytes.fromhex(hexdata))


def test_encode_rejects_unpaired_surrogate() -> None:
    with pytest.raises(ValueError, match="surrogate"):
        mutf8.encode("a\ud800")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_matches_java(text: str) -> None:
    encoded = mutf8.encode(text)
    assert encoded == java_write_utf(text)
    assert b"\x00" not in encoded
    assert mutf8.decode(encoded) == text


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_random_bytes_decode_or_protocol_error(data: bytes) -> None:
    try:
        text = mutf8.decode(data)
    except ProtocolError:
        return
    # Strict decoding: an accepted byte string is the one encoding of its text.
    assert mutf8.encode(text) == data
