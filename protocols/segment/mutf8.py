"""Java's modified UTF-8 (``DataOutput.writeUTF`` without the length prefix).

It differs from UTF-8 in two ways: U+0000 is written as the two bytes C0 80
(so encoded text never holds a zero byte), and characters above U+FFFF are
written as their UTF-16 surrogate pair, each surrogate encoded on its own in
three bytes (six bytes in all, never the four-byte UTF-8 form).

Decoding is strict where Java is lenient: overlong forms (other than C0 80),
four-byte forms, raw zero bytes and unpaired surrogates are rejected, so every
accepted byte string has exactly one decoding and re-encodes to itself.
"""

from __future__ import annotations

import re

from polyport.protocols.segment.errors import RemoteProtocolError

_SUPPLEMENTARY = re.compile("[\U00010000-\U0010ffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Lead bytes F0..FF start four-byte (or invalid) UTF-8 forms.
_FOUR_BYTE_LEAD = re.compile(b"[\xf0-\xff]")


def _as_surrogate_pair(match: re.Match[str]) -> str:
    code = ord(match.group()) - 0x10000
    return chr(0xD800 + (code >> 10)) + chr(0xDC00 + (code & 0x3FF))


def encode(text: str) -> bytes:
    """Modified UTF-8 bytes of ``text``; ValueError for an unpaired surrogate."""
    if text.isascii() and "\x00" not in text:
        return text.encode("ascii")
    if _SURROGATE.search(text):
        raise ValueError("string holds an unpaired surrogate; it has no modified UTF-8 form")
    units = _SUPPLEMENTARY.sub(_as_surrogate_pair, text)
    # surrogatepass writes each surrogate as its own three-byte sequence.
    return units.encode("utf-8", "surrogatepass").replace(b"\x00", b"\xc0\x80")


def decode(data: bytes) -> str:
    """The text of modified UTF-8 ``data``; RemoteProtocolError when invalid."""
    if data.isascii():
        if b"\x00" in data:
            raise RemoteProtocolError("modified UTF-8 holds a zero byte (U+0000 must be C0 80)")
        return data.decode("ascii")
    if b"\x00" in data:
        raise RemoteProtocolError("modified UTF-8 holds a zero byte (U+0000 must be C0 80)")
    if _FOUR_BYTE_LEAD.search(data):
        raise RemoteProtocolError(
            "modified UTF-8 holds a four-byte form (supplementary characters must be "
            "surrogate pairs)"
        )
    # C0 is never a continuation byte, so every C0 80 here is an encoded NUL;
    # a stray C0 elsewhere stays invalid for the strict decoder below.
    try:
        text = data.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(
            f"invalid modified UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    if _SURROGATE.search(text):
        # Strict UTF-16 decoding joins each high+low pair and rejects the rest.
        try:
            text = text.encode("utf-16-be", "surrogatepass").decode("utf-16-be")
        except UnicodeDecodeError:
            raise RemoteProtocolError("modified UTF-8 holds an unpaired surrogate") from None
    return text
