"""RSocket 1.0's limits: the family's :class:`StreamLimits` with RSocket's
frame sizes, the SETUP deadline and the LEASE it grants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from polyport.protocols.reactive.limits import StreamLimits
from polyport.protocols.rsocket.frames import (
    DEFAULT_MAX_FRAGMENT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_U31,
    PROTOCOL,
)


@dataclass(frozen=True, slots=True)
class Limits(StreamLimits):
    """Per-connection limits (``protocols/reactive/limits.py``); each is the
    gateway setting ``rsocket_<name>`` (``max_event_bytes`` falls back to the
    gateway-wide setting)."""

    protocol: ClassVar[str] = PROTOCOL
    least: ClassVar[dict[str, int]] = dict.fromkeys(
        ("max_streams", "max_fnf_inflight", "read_page", "default_read_max",
         "subscription_buffer", "max_fragment", "lease_ttl_ms", "lease_requests"),
        1,
    )

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_fragment: int = DEFAULT_MAX_FRAGMENT
    # A connection that sends no SETUP for this long is closed.
    setup_timeout: float = 30.0
    # The LEASE granted to clients that ask for one (SETUP with L), renewed
    # every half TTL.
    lease_ttl_ms: int = 30_000
    lease_requests: int = 10_000

    def _check(self) -> None:
        if self.lease_ttl_ms > MAX_U31 or self.lease_requests > MAX_U31:
            raise ValueError("rsocket_lease_ttl_ms and rsocket_lease_requests fit 31 bits")
        if self.setup_timeout <= 0:
            raise ValueError("rsocket_setup_timeout must be positive")
