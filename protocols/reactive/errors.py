"""Errors of the ReactiveSocket draft, on the shared ``protocols/errors.py``,
here because the event service's schema (:mod:`.payloads`), which RSocket 1.0
serves too, raises :class:`PayloadError`.  ``protocols/reactivesocket/errors.py``
exports them with the draft's canonical-code mapping.

``code`` is a canonical error name (see ``core/errors.py``) so the adapter can
put it straight into ERROR data ``{code, message}``.  Catch
:class:`RemoteProtocolError` for the peer's faults: our own
:class:`LocalProtocolError` bugs must not be answered as if the peer erred.
"""

from __future__ import annotations

from typing import Any

from polyport.protocols import errors as shared
from polyport.protocols.errors import MALFORMED

__all__ = [
    "LocalProtocolError",
    "PayloadError",
    "ProtocolError",
    "RemoteProtocolError",
]


class ProtocolError(shared.ProtocolError):
    """Base of the package's errors.  ``stream_id`` is where the fault
    belongs (0: the connection); ``frames`` holds the frames ``receive_data``
    decoded, in the same call, before a connection fault."""

    def __init__(
        self,
        message: str,
        *,
        code: str = MALFORMED,
        stream_id: int = 0,
        frames: list[Any] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.stream_id = stream_id
        self.frames: list[Any] = frames if frames is not None else []


class RemoteProtocolError(ProtocolError, shared.RemoteProtocolError):
    """The peer broke the protocol.

    Raised by ``receive_data`` (and the wire decoder) for connection-level
    faults: the adapter sends ERROR on ``stream_id`` 0
    (``conn.send_error(0, e.code, e.message)``) and closes.  Payload validation
    (``payloads.py``) raises the subclass :class:`PayloadError`, which concerns
    one request only.
    """


class LocalProtocolError(ProtocolError, shared.LocalProtocolError):
    """We (the caller of ``send``) tried something the protocol forbids, e.g. a
    RESPONSE beyond the requester's credits.  A bug in the caller, not the peer."""


class PayloadError(RemoteProtocolError):
    """A MessagePack payload from the peer does not match the schema.  The
    adapter answers with ERROR on the request's stream; the connection stays up."""
