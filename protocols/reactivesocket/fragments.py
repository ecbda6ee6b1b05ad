"""B/E fragmentation: splitting a frame that is too big, and putting received
fragments back together.

The spec fragments RESPONSEs; polyport extends the same B (begin) / E (end)
flags to the four request frames (docs/protocols/reactivesocket.md).  Which
sequences of flags are legal is the state tables' business (``state.py``);
this module only carries the bytes: :func:`fragment` cuts a whole frame into
pieces, :class:`Reassembly` collects the pieces of one stream's message until
its last one arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from polyport.protocols.reactivesocket.errors import LocalProtocolError
from polyport.protocols.reactivesocket.frames import Request, Response


def fragment(frame: Response | Request, max_fragment: int) -> list[Response | Request]:
    """Split a whole RESPONSE or request into fragments carrying at most
    ``max_fragment`` data bytes each.  A frame that fits comes back whole.

    The first fragment has B, the last E, the ones between neither; a
    RESPONSE's C goes on the last fragment only.  Request continuations repeat
    the frame type (and the Initial Request N of REQUEST_STREAM/REQUEST_SUB).
    """
    if max_fragment < 1:
        raise LocalProtocolError("max_fragment must be at least 1 byte")
    data = frame.data
    if len(data) <= max_fragment:
        return [frame]
    chunks = [data[i : i + max_fragment] for i in range(0, len(data), max_fragment)]
    last = len(chunks) - 1
    out: list[Response | Request] = []
    for i, chunk in enumerate(chunks):
        begin, end = i == 0, i == last
        if isinstance(frame, Response):
            out.append(
                replace(frame, data=chunk, begin=begin, end=end, complete=frame.complete and end)
            )
        else:
            out.append(replace(frame, data=chunk, begin=begin, end=end))
    return out


@dataclass(slots=True)
class Reassembly:
    """The fragments of one message received so far on one stream (a request
    on the responder, a RESPONSE on the requester).  Empty between messages."""

    # A request's first fragment: its type and Initial Request N make the
    # whole request (continuations repeat them, but the first one counts).
    first: Request | None = None
    parts: list[bytes] = field(default_factory=list)
    size: int = 0

    def begin(self, data: bytes, first: Request | None = None) -> None:
        self.first, self.parts, self.size = first, [data], len(data)

    def add(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)

    def finish(self, data: bytes) -> bytes:
        """The whole message, ``data`` being its last fragment; empties the buffer."""
        whole = b"".join([*self.parts, data])
        self.clear()
        return whole

    def clear(self) -> None:
        self.first, self.parts, self.size = None, [], 0
