"""The one exception the MicroMsg2 codec raises."""

from __future__ import annotations

# Canonical error names (the ``code`` attributes of core/errors.py) that the
# codec itself can produce; the adapter passes them through to ERROR frames.
MALFORMED = "malformed"
UNSUPPORTED = "unsupported"
TOO_LARGE = "too_large"


class ProtocolError(ValueError):
    """Malformed bytes, an illegal frame sequence or a failed negotiation.

    ``code`` is the canonical error name for the ERROR frame the connection
    owner sends before disconnecting (see ``Error.from_code``).
    """

    def __init__(self, message: str, *, code: str = MALFORMED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
