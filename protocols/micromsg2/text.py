"""Text rules shared by handshakes, commands, properties and filters."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote_plus

from polyport.protocols.micromsg2.errors import RemoteProtocolError

# FIELD in the spec is lower-case ASCII letters, digits and '-', but the spec's
# own examples use upper case ("extensionName1") and '_' ("first_name"), so
# both are read (and written) too.  Names still compare case-sensitively.
_FIELD = re.compile(r"[A-Za-z0-9_-]+")


def check_field(value: str, what: str) -> str:
    if not _FIELD.fullmatch(value):
        raise RemoteProtocolError(
            f"{what} {value!r} is not a FIELD (ASCII letters, digits, '-', '_')"
        )
    return value


def url_encode(text: str) -> str:
    # Only letters, digits and "_.-" stay as they are, so encoded text never
    # contains a separator of any MicroMsg2 grammar (; , : = < > ! ~ & +); '~'
    # is unreserved in RFC 3986 but is a filter operator here.
    return quote(text, safe="").replace("~", "%7E")


def url_decode(text: str, what: str) -> str:
    # '+' is decoded as a space: .NET's HttpUtility.UrlEncode writes spaces that
    # way, and Uri.EscapeDataString never leaves a raw '+', so both read right.
    try:
        return unquote_plus(text, errors="strict")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"{what}: percent-encoding is not valid UTF-8") from exc


def decode_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"{what} is not valid UTF-8") from exc
