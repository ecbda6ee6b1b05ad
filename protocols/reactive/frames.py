"""The frames both ReactiveSocket versions define field for field.

REQUEST_N and CANCEL carry the same fields in the draft and in RSocket 1.0
(their layouts differ: that is each version's ``wire.py``), and a frame that
belongs to the connection is on stream 0 in both.  Each version's
``frames.py`` exports these under its own name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

CONNECTION_STREAM_ID = 0


def frame_names(namespace: Mapping[str, object]) -> dict[int, str]:
    """``{type code: spec name}`` from a frames module's ``TYPE_<NAME>``
    constants (RESERVED names no frame)."""
    return {
        code: name.removeprefix("TYPE_")
        for name, code in namespace.items()
        if name.startswith("TYPE_") and name != "TYPE_RESERVED" and isinstance(code, int)
    }


class ConnectionFrame:
    """A frame of the connection, not of a stream: always on stream 0."""

    __slots__ = ()

    @property
    def stream_id(self) -> int:
        return CONNECTION_STREAM_ID


@dataclass(frozen=True, slots=True)
class StreamFrame:
    """A frame of one stream (ERROR also of the connection, on stream 0)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class CreditedRequest(StreamFrame):
    """A request whose stream answers with up to ``initial_n`` items before
    REQUEST_N grants more."""

    initial_n: int


@dataclass(frozen=True, slots=True)
class UnknownFrame:
    """A frame type the codec does not know.  Connections drop it when
    ``ignore`` is set and fail the connection otherwise; each version adds
    what it keeps of the frame and names its I (ignore) flag."""

    ignore_flag: ClassVar[int] = 0

    frame_type: int
    flags: int
    stream_id: int

    @property
    def ignore(self) -> bool:
        return bool(self.flags & self.ignore_flag)


@dataclass(frozen=True, slots=True)
class RequestN(StreamFrame):
    n: int


@dataclass(frozen=True, slots=True)
class Cancel(StreamFrame):
    """Ends a stream from the requester's side."""
