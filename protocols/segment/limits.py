"""The segment wire's per-listener limits and settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from polyport.protocols.segment.frames import DEFAULT_MAX_BLOCK_SIZE, MAX_WIRE_LENGTH, PROTOCOL
from polyport.protocols.settings import ProtocolLimits

DEFAULT_READ_WAIT = 2.0
DEFAULT_MAX_REPLY_BYTES = 1 << 20

# A SegmentRead reply holds a segment name, offset and flags besides its data;
# its data stays well inside the wire's 2^24 limit.
MAX_REPLY_BYTES_LIMIT = MAX_WIRE_LENGTH - (1 << 17)


@dataclass(frozen=True, slots=True)
class Limits(ProtocolLimits):
    """Per-listener settings, read once from the gateway settings with
    ``Limits.from_settings(settings)``.

    Keys: the gateway-wide ``max_event_bytes`` and ``idle_timeout``, and
    ``segment_max_block_bytes``, ``segment_read_wait``,
    ``segment_max_reply_bytes`` (config ``extra``).  Out-of-range values are
    clamped, not refused.
    """

    protocol: ClassVar[str] = PROTOCOL

    # Bounds an EVENT message; never above what the wire can carry.
    max_message_size: int = field(default=1 << 20, metadata={"setting": "max_event_bytes"})
    max_block_size: int = field(
        default=DEFAULT_MAX_BLOCK_SIZE, metadata={"setting": "segment_max_block_bytes"}
    )
    # How long a read at the tail waits for new data.
    read_wait: float = DEFAULT_READ_WAIT
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES
    # The transport's read-idle timeout; 0 turns it off.
    idle_timeout: float | None = field(default=300.0, metadata={"setting": "idle_timeout"})

    def __post_init__(self) -> None:
        clamp = object.__setattr__  # frozen: derived values are set this way
        clamp(self, "max_message_size", max(1, min(self.max_message_size, MAX_WIRE_LENGTH)))
        clamp(self, "read_wait", max(0.0, self.read_wait))
        clamp(self, "max_reply_bytes", max(1, min(self.max_reply_bytes, MAX_REPLY_BYTES_LIMIT)))
        if not self.idle_timeout:
            clamp(self, "idle_timeout", None)
