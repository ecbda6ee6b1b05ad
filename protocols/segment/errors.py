"""Errors of the segment-wire codec, on the shared classes of
:mod:`polyport.protocols.errors`, and the error replies that report them.

Raise :class:`RemoteProtocolError` for what the peer did and
:class:`LocalProtocolError` for what this side tried to send; peer-error
handlers catch only the former, so our own bugs are not blamed on the peer.
"""

from __future__ import annotations

from polyport.protocols import errors as shared
from polyport.protocols.errors import FORBIDDEN, MALFORMED, NOT_FOUND, UNAUTHENTICATED
from polyport.protocols.segment.frames import (
    AUTH_FAILED,
    ERROR_MESSAGE,
    MAX_STRING_BYTES,
    NO_SUCH_SEGMENT,
    AuthFailed,
    ErrorMessage,
    ErrorReply,
    NoSuchSegment,
)

# Canonical error names with a reply type of their own; every other name
# travels in ERROR_MESSAGE.
REPLY_TYPE_BY_CODE: dict[str, int] = {
    NOT_FOUND: NO_SUCH_SEGMENT,
    UNAUTHENTICATED: AUTH_FAILED,
    FORBIDDEN: AUTH_FAILED,
}


class ProtocolError(shared.ProtocolError):
    """Base of the segment-wire errors; ``segment`` names the segment the
    failing message was about (may be empty).

    ``reply()`` is the error message to send before closing the connection:
    after a RemoteProtocolError the stream position is unknown, so the
    connection cannot be resumed.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = MALFORMED,
        segment: str = "",
    ) -> None:
        super().__init__(message, code=code)
        self.segment = segment

    @property
    def reply_type(self) -> int:
        return REPLY_TYPE_BY_CODE.get(self.code, ERROR_MESSAGE)

    def reply(self) -> ErrorReply:
        return error_reply(self.code, self.message, segment=self.segment)


class RemoteProtocolError(ProtocolError, shared.RemoteProtocolError):
    """The peer broke the protocol (malformed bytes or an illegal sequence)."""


class LocalProtocolError(ProtocolError, shared.LocalProtocolError):
    """This side tried to send something the protocol does not allow (a bug in
    the caller, not in the peer)."""


def _fit(text: str) -> str:
    # Error texts may quote peer data: lone surrogates cannot be encoded, and a
    # wire string holds at most 65535 bytes (a code point takes up to 6).
    text = text.encode("utf-8", "replace").decode("utf-8")
    limit = MAX_STRING_BYTES // 6
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_reply(code: str, message: str, *, segment: str = "") -> ErrorReply:
    """The reply for a canonical error: not_found -> NO_SUCH_SEGMENT,
    unauthenticated / forbidden -> AUTH_FAILED, anything else -> ERROR_MESSAGE
    carrying the canonical name."""
    reply_type = REPLY_TYPE_BY_CODE.get(code, ERROR_MESSAGE)
    segment, message = _fit(segment), _fit(message)
    if reply_type == NO_SUCH_SEGMENT:
        return NoSuchSegment(segment=segment, message=message)
    if reply_type == AUTH_FAILED:
        return AuthFailed(segment=segment, message=message)
    return ErrorMessage(segment=segment, code=_fit(code), message=message)
