"""The ReactiveSocket draft's limits: the family's :class:`StreamLimits` with
the draft's frame sizes and its idle timeout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from polyport.protocols.reactive.limits import StreamLimits
from polyport.protocols.reactivesocket.frames import (
    DEFAULT_MAX_FRAGMENT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    HEADER_SIZE,
    PROTOCOL,
)


@dataclass(frozen=True, slots=True)
class Limits(StreamLimits):
    """Per-connection limits (``protocols/reactive/limits.py``).  Every one
    can be set in the gateway config's extra settings as
    ``reactivesocket_<name>``; the body limit and the idle timeout fall back
    to the gateway-wide ``max_event_bytes`` and ``idle_timeout``."""

    protocol: ClassVar[str] = PROTOCOL
    shared_settings: ClassVar[tuple[str, ...]] = ("max_event_bytes", "idle_timeout")
    # An idle_timeout of 0 means never, like None.
    least: ClassVar[dict[str, int]] = {
        "max_frame_size": HEADER_SIZE,
        "max_message_size": 0,
        "max_fragment": 1,
        "max_streams": 1,
        "max_reassembly_bytes": 0,
        "max_fnf_inflight": 1,
        "max_response_bytes": 0,
        "read_page": 1,
        "default_read_max": 1,
        "subscription_buffer": 0,
        "max_event_bytes": 0,
    }

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_fragment: int = DEFAULT_MAX_FRAGMENT
    # A connection with no live stream and no input for this long is closed
    # (a subscriber that only receives is never idle).  None = never.
    idle_timeout: float | None = 300.0

    def _check(self) -> None:
        if self.idle_timeout is not None and self.idle_timeout < 0:
            raise ValueError(f"{PROTOCOL}_idle_timeout must not be negative: {self.idle_timeout}")
