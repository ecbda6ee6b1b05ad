"""Errors of the MicroMsg2 codec, on the shared classes of
:mod:`polyport.protocols.errors`.

``code`` is the canonical error name (spelled by the shared constants) for the
ERROR frame the connection owner sends before disconnecting (see
``Error.from_code``).

Raise :class:`RemoteProtocolError` for what the peer sent (bad bytes, an
illegal frame, a failed negotiation) and :class:`LocalProtocolError` for what
this side tried to send; peer-error handlers catch only the former, so our own
bugs are not blamed on the peer.  The parsing helpers (``text``, ``filters``,
``negotiation``, ``acks``, ``pubsub``) check values that travel both ways and
raise RemoteProtocolError, the common case; code that checks this side's own
output runs them under ``as_local``.
"""

from __future__ import annotations

from types import TracebackType

from polyport.protocols import errors as shared
from polyport.protocols.micromsg2.frames import Error


class ProtocolError(shared.ProtocolError):
    """Base of the MicroMsg2 errors."""


class RemoteProtocolError(ProtocolError, shared.RemoteProtocolError):
    """The peer broke the protocol: malformed bytes, an illegal frame sequence
    or a failed negotiation.  ``receive_data`` closes the connection."""


class LocalProtocolError(ProtocolError, shared.LocalProtocolError):
    """This side tried to send something the protocol does not allow (or to
    use the connection in a state that does not allow it): a bug in the caller,
    never the peer's fault.  ``send`` leaves the connection as it was."""


class _AsLocal:
    """``with as_local:``: within the block the data checked is this side's
    own, so a shared check that raises RemoteProtocolError is re-raised as
    LocalProtocolError.  A class rather than a generator: ``send`` uses it on
    every frame."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, RemoteProtocolError):
            raise LocalProtocolError(exc.message, code=exc.code) from exc


as_local = _AsLocal()


def error_frame(exc: shared.ProtocolError) -> Error:
    """The ERROR frame that reports ``exc`` to the peer: the canonical code
    in front of the message (``<code>: <text>``, :meth:`Error.from_code`)."""
    return Error.from_code(exc.code, exc.message)
