"""Errors of the RSocket codec, on the shared classes of ``protocols/errors.py``.

:class:`RemoteProtocolError` (the peer broke the protocol) and
:class:`LocalProtocolError` (our side tried something forbidden) are siblings
under :class:`ProtocolError`.  A remote error carries the RSocket error code
the connection owner sends on stream 0 before it closes (``error_code``) and
the frames decoded, in the same call, before the fault (``frames``).

ERROR data is UTF-8 text ``<canonical code>: <message>``: rsocket-py and
rsocket-js hand ERROR data to the application as a string, and the canonical
name in front lets a client tell ``wrong_expected_version`` from
``not_found`` whatever the RSocket code.  The mapping both ways is here:
:func:`stream_error_code` (canonical -> RSocket code), :func:`error_text` /
:func:`parse_error_text` and :func:`error_frame`.
"""

from __future__ import annotations

from typing import Any

from polyport.protocols import errors as shared
from polyport.protocols.errors import (
    BUSY,
    FORBIDDEN,
    MALFORMED,
    NOT_FOUND,
    TOO_LARGE,
    UNAUTHENTICATED,
    UNSUPPORTED,
    ProtocolError,
)
from polyport.protocols.rsocket.frames import (
    APPLICATION_ERROR,
    CONNECTION_ERROR,
    INVALID,
    REJECTED,
    ErrorFrame,
)

__all__ = [
    "BUSY",
    "FORBIDDEN",
    "MALFORMED",
    "NOT_FOUND",
    "TOO_LARGE",
    "UNAUTHENTICATED",
    "UNSUPPORTED",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "error_frame",
    "error_text",
    "parse_error_text",
    "stream_error_code",
]


class RemoteProtocolError(shared.RemoteProtocolError):
    """The peer broke the protocol at connection level: send ERROR
    ``error_code`` on stream 0 with :func:`error_text` data, then close."""

    def __init__(
        self,
        message: str,
        *,
        code: str = MALFORMED,
        error_code: int = CONNECTION_ERROR,
        frames: list[Any] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.error_code = error_code
        self.frames: list[Any] = frames if frames is not None else []


class LocalProtocolError(shared.LocalProtocolError):
    """We (the caller of ``send``) tried something RSocket forbids, e.g. a
    PAYLOAD beyond the requester's credits: a bug in the caller, not the
    peer."""


# The RSocket code of a stream ERROR for each canonical error: a request the
# server cannot make sense of is INVALID; one it could serve but will not take
# now is REJECTED (guaranteed unprocessed); the rest are the application's
# onError.
_STREAM_CODES = {
    MALFORMED: INVALID,
    UNSUPPORTED: INVALID,
    TOO_LARGE: INVALID,
    BUSY: REJECTED,
}


def stream_error_code(code: str) -> int:
    return _STREAM_CODES.get(code, APPLICATION_ERROR)


def error_text(code: str, message: str) -> bytes:
    """ERROR data: ``<canonical code>: <message>`` in UTF-8."""
    return f"{code}: {message}".encode("utf-8", "replace")


def parse_error_text(data: bytes) -> tuple[str, str]:
    """``(canonical code, message)`` of ERROR data; text without a code (from
    another server) comes back as ``("internal", text)``."""
    text = data.decode("utf-8", "replace")
    code, sep, message = text.partition(": ")
    if sep and code and code.replace("_", "").isalpha() and code.islower():
        return code, message
    return "internal", text


def error_frame(
    stream_id: int, code: str, message: str, rsocket_code: int | None = None
) -> ErrorFrame:
    """ERROR with ``<code>: <message>`` data; the RSocket code follows the
    canonical one unless given."""
    if rsocket_code is None:
        rsocket_code = CONNECTION_ERROR if stream_id == 0 else stream_error_code(code)
    return ErrorFrame(stream_id, rsocket_code, error_text(code, message))
