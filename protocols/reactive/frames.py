"""The frames both ReactiveSocket versions define field for field.

REQUEST_N and CANCEL carry the same fields in the draft and in RSocket 1.0
(their layouts differ: that is each version's ``wire.py``), and a frame that
belongs to the connection is on stream 0 in both.  Each version's
``frames.py`` exports these under its own name.
"""

from __future__ import annotations

from dataclasses import dataclass

CONNECTION_STREAM_ID = 0


class ConnectionFrame:
    """A frame of the connection, not of a stream: always on stream 0."""

    __slots__ = ()

    @property
    def stream_id(self) -> int:
        return CONNECTION_STREAM_ID


@dataclass(frozen=True, slots=True)
class RequestN:
    stream_id: int
    n: int


@dataclass(frozen=True, slots=True)
class Cancel:
    stream_id: int
