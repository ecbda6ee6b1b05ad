"""The error classes every protocol package builds on, in the manner of h11.

- :class:`RemoteProtocolError`: the peer broke the protocol (bad bytes, an
  illegal sequence).  The connection owner answers in the protocol's error form
  and, where the protocol says so, closes.
- :class:`LocalProtocolError`: our own side tried to send something the
  protocol forbids.  That is a bug in the adapter or client, never the peer's
  fault, so it must not be caught where peer errors are.

Both are siblings under :class:`ProtocolError`; ``except RemoteProtocolError``
never swallows our own bugs.  ``code`` is a canonical error name (the ``code``
of ``polyport.core.errors``) so every adapter maps it to its wire form the same
way; the protocol packages do not import the core.
"""

from __future__ import annotations

MALFORMED = "malformed"
UNSUPPORTED = "unsupported"
UNAUTHENTICATED = "unauthenticated"
FORBIDDEN = "forbidden"
TOO_LARGE = "too_large"
BUSY = "busy"
NOT_FOUND = "not_found"
# A deadline the peer missed (a handshake, a frame left incomplete).
TIMEOUT = "timeout"


class ProtocolError(ValueError):
    """Base of a protocol's errors: a message for humans and a canonical code."""

    def __init__(self, message: str, *, code: str = MALFORMED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol."""


class LocalProtocolError(ProtocolError):
    """This side tried to send something the protocol does not allow."""
