"""Errors of the ReactiveSocket package and its canonical-code <-> wire mapping.

The error classes are written once in ``protocols/reactive/errors.py`` (the
event service's schema, which RSocket 1.0 serves too, raises
:class:`PayloadError`); the draft carries every error as ERROR data
``{code, message}`` in MessagePack, ``code`` being a canonical error name
(see ``core/errors.py``), so the mapping is the identity on the names and
the wire form is :func:`encode_error_data` / :func:`decode_error_data`.
Catch :class:`RemoteProtocolError` for the peer's faults: our own
:class:`LocalProtocolError` bugs must not be answered as if the peer erred.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyport.protocols.errors import BUSY, MALFORMED, TOO_LARGE, UNSUPPORTED
from polyport.protocols.reactive.errors import (
    LocalProtocolError,
    PayloadError,
    ProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.reactive.payloads import pack, read_map, required_str
from polyport.protocols.reactivesocket.frames import ErrorFrame

__all__ = [
    "BUSY",
    "CANONICAL_ERROR_CODES",
    "MALFORMED",
    "TOO_LARGE",
    "UNSUPPORTED",
    "ErrorData",
    "LocalProtocolError",
    "PayloadError",
    "ProtocolError",
    "RemoteProtocolError",
    "decode_error_data",
    "encode_error_data",
    "error_frame",
]

# The codes ERROR data may carry: the canonical names, as they are.
CANONICAL_ERROR_CODES = frozenset(
    {
        "wrong_expected_version",
        "not_found",
        "unauthenticated",
        "forbidden",
        "malformed",
        "unsupported",
        "too_large",
        "busy",
        "timeout",
        "storage_unavailable",
        "internal",
    }
)


@dataclass(frozen=True, slots=True)
class ErrorData:
    code: str
    message: str


def encode_error_data(code: str, message: str) -> bytes:
    if code not in CANONICAL_ERROR_CODES:
        raise ValueError(f"not a canonical error code: {code!r}")
    return pack({"code": code, "message": message})


def decode_error_data(data: bytes) -> ErrorData:
    """Unknown codes are kept as they are (a newer server may add some)."""
    what = "ERROR data"
    obj = read_map(data, what)
    return ErrorData(
        code=required_str(obj, "code", what),
        message=required_str(obj, "message", what, empty_ok=True),
    )


def error_frame(stream_id: int, code: str, message: str) -> ErrorFrame:
    """ERROR with the service's ``{code, message}`` data."""
    return ErrorFrame(stream_id, encode_error_data(code, message))
