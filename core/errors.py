"""The canonical error set.

Every protocol maps these to its own error form; the table lives in
``docs/errors.md``.  ``code`` is the stable canonical name that appears on the
wire where a protocol carries a textual code (BSON ``errCode``,
ReactiveSocket ERROR data).
"""

from __future__ import annotations

import secrets


class PolyportError(Exception):
    """Base of every error the core reports to a protocol adapter."""

    code: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class WrongExpectedVersion(PolyportError):
    code = "wrong_expected_version"

    def __init__(self, message: str, *, current_version: int = 0) -> None:
        super().__init__(message)
        self.current_version = current_version


class NotFound(PolyportError):
    code = "not_found"


class Unauthenticated(PolyportError):
    code = "unauthenticated"


class Forbidden(PolyportError):
    code = "forbidden"


class Malformed(PolyportError):
    code = "malformed"


class Unprocessable(Malformed):
    """Well-formed, but the values contradict each other (a user's default
    context that is not one of its contexts): the wire's "malformed", and
    HTTP 422 on the admin API."""


class Unsupported(PolyportError):
    code = "unsupported"


class TooLarge(PolyportError):
    code = "too_large"


class Busy(PolyportError):
    """A bounded queue is full: the caller may retry later."""

    code = "busy"

    def __init__(self, message: str, *, reader: bool = False) -> None:
        super().__init__(message)
        self.reader = reader


class Timeout(PolyportError):
    """The operation did not finish in time; for appends the outcome is unknown
    to the caller, so retrying with the same event ids is the safe next step."""

    code = "timeout"

    def __init__(self, message: str, *, reader: bool = False) -> None:
        super().__init__(message)
        self.reader = reader


class StorageUnavailable(PolyportError):
    code = "storage_unavailable"


class StatementRefused(StorageUnavailable):
    """The database refused a statement on a healthy connection (core.db's
    translation of the driver's error, its ``__cause__``); ``sqlstate`` says
    why.  The same canonical code as a lost connection, but no outage: a
    retry of the same statement gets the same answer."""

    def __init__(self, message: str, *, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class Internal(PolyportError):
    code = "internal"


ALL_ERRORS: tuple[type[PolyportError], ...] = (
    WrongExpectedVersion,
    NotFound,
    Unauthenticated,
    Forbidden,
    Malformed,
    Unsupported,
    TooLarge,
    Busy,
    Timeout,
    StorageUnavailable,
    Internal,
)

ERROR_BY_CODE: dict[str, type[PolyportError]] = {e.code: e for e in ALL_ERRORS}


def new_error_id() -> str:
    """A short id that ties what a client is told about an unexpected
    failure to the log line that has the details: clients get the canonical
    message and the id, never the exception's own text (it may name files,
    hosts, SQL or data of other tenants)."""
    return secrets.token_hex(4)
