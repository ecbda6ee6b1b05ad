"""What every sans-IO connection keeps of its input between frames.

A byte-stream codec buffers what it received until a frame is complete;
what is left after decoding is the start of a frame whose end has not
arrived.  :class:`InputBuffer` is that buffer for every protocol, so the
transport can ask all of them the same question (``frame_timeout``: a frame
that has started must complete in time, however slowly its bytes trickle
in) without knowing any protocol's framing.
"""

from __future__ import annotations

from typing import SupportsIndex


class InputBuffer(bytearray):
    """Received bytes not yet decoded into frames (the codecs append with
    ``+=`` and drop what they decoded with ``del buffer[:n]``).

    ``taken`` counts the decodes that took bytes from the head: when it has
    moved since the transport last looked, whatever is buffered now is a
    frame that started after the last one completed, not the same slow one.
    """

    __slots__ = ("taken",)

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    def __delitem__(self, key: SupportsIndex | slice) -> None:
        before = len(self)
        super().__delitem__(key)
        if len(self) < before:
            self.taken += 1

    @property
    def partial_frame(self) -> bool:
        """Whether bytes of an incomplete frame are buffered."""
        return len(self) > 0
