"""Errors of the BSON frames codec.

``err_code`` is always a canonical error name (the ``code`` of
``core.errors``), because that is what goes into RESPONSE ``errCode``.
"""

from __future__ import annotations

from polyport.protocols.bson.frames import Response

# Canonical error names used by the codec (mirrors core.errors codes; a test
# keeps them in step without the codec importing the core).
ERR_MALFORMED = "malformed"
ERR_UNSUPPORTED = "unsupported"
ERR_UNAUTHENTICATED = "unauthenticated"
ERR_TOO_LARGE = "too_large"
ERR_BUSY = "busy"
ERR_NOT_FOUND = "not_found"


class ProtocolError(ValueError):
    """The peer (or, for :class:`LocalProtocolError`, we) broke the protocol.

    ``fatal`` errors end the connection: the server answers with
    :meth:`to_response` and closes.  Non-fatal ones (:class:`RequestError`)
    are answered with the same RESPONSE and the connection carries on.
    """

    def __init__(self, message: str, err_code: str = ERR_MALFORMED, *, fatal: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.err_code = err_code
        self.fatal = fatal

    def to_response(self) -> Response:
        return Response(ok=False, err_code=self.err_code, err_msg=self.message)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, err_code={self.err_code!r})"


class LocalProtocolError(ProtocolError):
    """Our own side tried to send something the protocol does not allow:
    a bug in the adapter or client, never the peer's fault."""


class RequestError(ProtocolError):
    """A well-formed request that cannot be honoured in the connection's
    current state (e.g. COMMITTX without STARTTX): answer RESPONSE ok=false,
    keep the connection."""

    def __init__(self, message: str, err_code: str = ERR_MALFORMED) -> None:
        super().__init__(message, err_code, fatal=False)
