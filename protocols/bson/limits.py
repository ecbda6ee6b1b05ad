"""The BSON frames protocol's per-connection limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from polyport.protocols.bson.frames import (
    DEFAULT_FLOW_PAUSE_BYTES,
    DEFAULT_FLOW_RESUME_BYTES,
    DEFAULT_MAX_EVENT_SIZE,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_UNACKED_QUERY_RESULTS,
    MIB,
    PROTOCOL,
)
from polyport.protocols.settings import ProtocolLimits


@dataclass(frozen=True, slots=True)
class Limits(ProtocolLimits):
    """Per-connection limits, from the gateway settings (``gw.settings``):
    each field ``<name>`` is read from the setting ``bson_<name>``;
    ``max_event_bytes`` falls back on the gateway-wide one."""

    protocol: ClassVar[str] = PROTOCOL
    shared_settings: ClassVar[tuple[str, ...]] = ("max_event_bytes",)

    max_event_bytes: int = DEFAULT_MAX_EVENT_SIZE
    query_window: int = DEFAULT_MAX_UNACKED_QUERY_RESULTS
    flow_pause_bytes: int = DEFAULT_FLOW_PAUSE_BYTES
    flow_resume_bytes: int = DEFAULT_FLOW_RESUME_BYTES
    max_frame_bytes: int = DEFAULT_MAX_FRAME_SIZE
    # Requests whose reply has not been sent yet, and the event bytes they hold.
    max_inflight_requests: int = 1024
    max_inflight_bytes: int = 16 * MIB
    max_transactions: int = 64
    max_tx_events: int = 10_000
    # Event bytes buffered in all open transactions of one connection.
    max_tx_bytes: int = 32 * MIB
    max_subscriptions: int = 256
    max_queries: int = 16
    # Events the core buffers per subscription before it falls back to catch-up.
    subscription_buffer: int = 64

    def __post_init__(self) -> None:
        # A window of 0 would never let a QUERYRESULT out.
        if self.query_window < 1:
            object.__setattr__(self, "query_window", 1)
