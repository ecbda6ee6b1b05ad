"""Res01 error codes and exceptions, on the shared base of ``protocols/errors.py``.

- :class:`RemoteProtocolError`: the peer broke the protocol (a message that
  cannot be decoded, a reply that answers nothing we asked).
- :class:`Res01Error`: the remote error of a message that cannot be decoded
  (or is too large); it carries what a ROUTER needs to answer it with ER.
- :class:`LocalProtocolError`: our own side tried to send something the
  protocol does not allow (a bug, never the peer's fault).

``code`` is the canonical error name, as for every protocol; the ER code of
the spec's table is ``er_code`` (:class:`ErrorCode`).  :func:`error_code`
maps the core's canonical errors to ER codes and :func:`error_reply` builds
the ER reply.
"""

from __future__ import annotations

from enum import IntEnum

from polyport.core import errors as core
from polyport.protocols import errors as shared
from polyport.protocols.errors import MALFORMED, UNSUPPORTED
from polyport.protocols.res01.frames import Error, Request


class ErrorCode(IntEnum):
    """The error codes of the spec's table (and two of ours beyond it), sent
    as decimal text in ER replies."""

    UNEXPECTED = -1
    MALFORMED = 1
    UNSUPPORTED_PROTOCOL = 2
    UNSUPPORTED_COMMAND = 3
    STORAGE_WRITER_BUSY = 4
    STORAGE_WRITER_TIMEOUT = 5
    CONCURRENCY = 6
    EVENT_STORAGE = 7
    EVENT_NOT_FOUND = 8
    STORAGE_READER_TIMEOUT = 9
    STORAGE_READER_BUSY = 10
    # Not in the spec's table, which stops at 10: the first free codes, so a
    # client can tell "log in" and "not yours" from a server fault (-1).
    UNAUTHENTICATED = 11
    FORBIDDEN = 12


# The ER codes a refused message can get → canonical names (the listener's
# error counters, and ``code`` of :class:`Res01Error`).
_CANONICAL: dict[int, str] = {
    ErrorCode.MALFORMED: MALFORMED,
    ErrorCode.UNSUPPORTED_PROTOCOL: UNSUPPORTED,
    ErrorCode.UNSUPPORTED_COMMAND: UNSUPPORTED,
}


class ProtocolError(shared.ProtocolError):
    """Base of Res01's protocol errors.  ``request_id`` names the request the
    error is about, when there is one (a client fails that request)."""

    def __init__(
        self, message: str, *, code: str = MALFORMED, request_id: bytes | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.request_id = request_id


class RemoteProtocolError(ProtocolError, shared.RemoteProtocolError):
    """The peer broke the protocol."""


class LocalProtocolError(ProtocolError, shared.LocalProtocolError):
    """This side tried to send something the protocol does not allow."""


class Res01Error(RemoteProtocolError):
    """A Res01 message that cannot be decoded (or is over the size limit).

    ``er_code`` is the ER code to answer with (1 malformed, 2 unsupported
    protocol, 3 unsupported command); ``code`` the matching canonical name
    unless given.  A ROUTER server must still answer a request it could not
    decode, so the exception carries what was readable: ``routing`` (the
    frames before the empty delimiter), ``request_id`` (None when the message
    stopped before it) and ``protocol`` (the client's protocol frame when it
    is one we accept, else None).
    """

    def __init__(
        self,
        message: str,
        er_code: int = ErrorCode.MALFORMED,
        *,
        code: str | None = None,
        routing: tuple[bytes, ...] = (),
        request_id: bytes | None = None,
        protocol: str | None = None,
    ) -> None:
        er_code = int(er_code)
        super().__init__(
            message, code=code or _CANONICAL.get(er_code, MALFORMED), request_id=request_id
        )
        self.er_code = er_code
        self.routing = routing
        self.protocol = protocol

    def __repr__(self) -> str:
        return f"Res01Error({self.message!r}, er_code={self.er_code}, code={self.code!r})"


# --- canonical error -> ER reply -------------------------------------------------


def error_code(exc: core.PolyportError, *, write: bool) -> int:
    """Canonical error → ER code.  Busy and timeout take the writer's or the
    reader's code from the request's kind (AC is the writer's)."""
    if isinstance(exc, core.WrongExpectedVersion):
        return ErrorCode.CONCURRENCY
    if isinstance(exc, core.NotFound):
        return ErrorCode.EVENT_NOT_FOUND
    if isinstance(exc, core.Malformed | core.TooLarge):
        return ErrorCode.MALFORMED
    if isinstance(exc, core.Unsupported):
        return ErrorCode.UNSUPPORTED_COMMAND
    if isinstance(exc, core.Busy):
        return ErrorCode.STORAGE_WRITER_BUSY if write else ErrorCode.STORAGE_READER_BUSY
    if isinstance(exc, core.Timeout):
        return ErrorCode.STORAGE_WRITER_TIMEOUT if write else ErrorCode.STORAGE_READER_TIMEOUT
    if isinstance(exc, core.StorageUnavailable):
        return ErrorCode.EVENT_STORAGE
    if isinstance(exc, core.Unauthenticated):
        return ErrorCode.UNAUTHENTICATED
    if isinstance(exc, core.Forbidden):
        return ErrorCode.FORBIDDEN
    return ErrorCode.UNEXPECTED


def error_reply(request: Request, code: int, message: str) -> Error:
    return Error(request.request_id, int(code), message, request.protocol)
