"""Errors of the ReactiveSocket codec.

``code`` is a canonical error name (see ``core/errors.py``) so the adapter can
put it straight into ERROR data ``{code, message}``.
"""

from __future__ import annotations

from typing import Any

MALFORMED = "malformed"
UNSUPPORTED = "unsupported"
TOO_LARGE = "too_large"


class ProtocolError(ValueError):
    """The peer broke the protocol.

    Raised by ``receive_data`` for connection-level faults: the adapter sends
    ERROR on ``stream_id`` 0 (``conn.send_error(0, e.code, e.message)``) and
    closes.  ``frames`` holds the frames decoded, in the same call, before the
    fault.  Payload validation (``payloads.py``) raises the subclass
    :class:`PayloadError`, which concerns one request only.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = MALFORMED,
        stream_id: int = 0,
        frames: list[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.stream_id = stream_id
        self.frames: list[Any] = frames if frames is not None else []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class LocalProtocolError(ProtocolError):
    """We (the caller of ``send``) tried something the protocol forbids, e.g. a
    RESPONSE beyond the requester's credits.  A bug in the caller, not the peer."""


class PayloadError(ProtocolError):
    """A MessagePack payload does not match the schema.  The adapter answers
    with ERROR on the request's stream; the connection stays up."""
