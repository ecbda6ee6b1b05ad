"""Errors of the BSON frames protocol, on the shared classes of
:mod:`polyport.protocols.errors`.

``code`` is always a canonical error name (the ``code`` of ``core.errors``,
spelled by the shared constants), because that is what goes into RESPONSE
``errCode``.  Raise :class:`RemoteProtocolError` (or :class:`RequestError`)
for what the peer did, :class:`LocalProtocolError` for what we tried to send;
peer-error handlers catch only the former, so our own bugs are not blamed on
the peer.  :func:`error_response` and :func:`sub_error` are the
canonical-code -> wire mapping: RESPONSE (or SUBRESPONSE) ok=false with the
canonical code as ``errCode``.
"""

from __future__ import annotations

import logging

from polyport.core.errors import PolyportError
from polyport.protocols import errors as shared
from polyport.protocols.bson.frames import Response, SubResponse
from polyport.protocols.errors import MALFORMED


class ProtocolError(shared.ProtocolError):
    """Base of the BSON errors: a shared :class:`~polyport.protocols.errors.ProtocolError`
    that also knows its RESPONSE and whether it ends the connection.

    ``fatal`` errors end the connection: the server answers with
    :meth:`to_response` and closes.  Non-fatal ones (:class:`RequestError`)
    are answered with the same RESPONSE and the connection carries on.
    """

    def __init__(self, message: str, *, code: str = MALFORMED, fatal: bool = True) -> None:
        super().__init__(message, code=code)
        self.fatal = fatal

    def to_response(self) -> Response:
        return Response(ok=False, err_code=self.code, err_msg=self.message)


class RemoteProtocolError(ProtocolError, shared.RemoteProtocolError):
    """The peer broke the protocol (bad bytes, a frame not allowed now)."""


class LocalProtocolError(ProtocolError, shared.LocalProtocolError):
    """Our own side tried to send something the protocol does not allow:
    a bug in the adapter or client, never the peer's fault."""


class RequestError(RemoteProtocolError):
    """A well-formed request that cannot be honoured in the connection's
    current state (e.g. COMMITTX without STARTTX): answer RESPONSE ok=false,
    keep the connection."""

    def __init__(self, message: str, *, code: str = MALFORMED) -> None:
        super().__init__(message, code=code, fatal=False)


# --- canonical error -> RESPONSE ---------------------------------------------------

log = logging.getLogger("polyport.bson")


def error_response(exc: BaseException) -> Response:
    """The RESPONSE ok=false for a failed request.  Only core errors and the
    peer's faults carry their own code; anything else (our own
    LocalProtocolError included) is logged and answered as ``internal``."""
    if isinstance(exc, PolyportError):
        return Response(ok=False, err_code=exc.code, err_msg=exc.message)
    if isinstance(exc, RemoteProtocolError):
        return exc.to_response()
    log.error("unexpected error in the BSON adapter", exc_info=exc)
    return Response(ok=False, err_code="internal", err_msg=f"internal error: {exc}")


def sub_error(exc: BaseException) -> SubResponse:
    """A failed SUBSCRIBE is answered by SUBRESPONSE ok=false."""
    r = error_response(exc)
    return SubResponse(ok=False, err_code=r.err_code, err_msg=r.err_msg)
