"""Errors of the segment-wire codec and the error replies that report them."""

from __future__ import annotations

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

# Canonical error names (core/errors.py ``code``) with a reply type of their
# own; every other name travels in ERROR_MESSAGE.
REPLY_TYPE_BY_CODE: dict[str, int] = {
    "not_found": NO_SUCH_SEGMENT,
    "unauthenticated": AUTH_FAILED,
    "forbidden": AUTH_FAILED,
}


class ProtocolError(ValueError):
    """The peer broke the protocol (malformed bytes or an illegal sequence).

    ``reply()`` is the error message to send before closing the connection:
    after a ProtocolError the stream position is unknown, so the connection
    cannot be resumed.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "malformed",
        segment: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.segment = segment

    @property
    def reply_type(self) -> int:
        return REPLY_TYPE_BY_CODE.get(self.code, ERROR_MESSAGE)

    def reply(self) -> ErrorReply:
        return error_reply(self.code, self.message, segment=self.segment)


class LocalProtocolError(ProtocolError):
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
