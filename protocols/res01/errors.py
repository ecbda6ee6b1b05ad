"""Res01 error codes and the exception raised for malformed input."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """The error codes of the spec's table, sent as decimal text in ER replies."""

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


class ProtocolError(ValueError):
    """Input that does not follow the protocol."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Res01Error(ProtocolError):
    """A Res01 message that cannot be decoded.

    ``code`` is the ER code to answer with (1 malformed, 2 unsupported
    protocol, 3 unsupported command).  A ROUTER server must still answer a
    request it could not decode, so the exception carries what was readable:
    ``routing`` (the frames before the empty delimiter), ``request_id`` (None
    when the message stopped before it) and ``protocol`` (the client's
    protocol frame when it is one we accept, else None).
    """

    def __init__(
        self,
        message: str,
        code: int = ErrorCode.MALFORMED,
        *,
        routing: tuple[bytes, ...] = (),
        request_id: bytes | None = None,
        protocol: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = int(code)
        self.routing = routing
        self.request_id = request_id
        self.protocol = protocol

    def __repr__(self) -> str:
        return f"Res01Error({self.message!r}, code={self.code})"
