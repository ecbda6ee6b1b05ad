"""The per-connection limits both ReactiveSocket versions take, built one way.

Each version's ``Limits`` (its ``limits.py``) subclasses :class:`StreamLimits`:
it names its settings prefix, gives the frame-size defaults of its wire
format, the least working value of each limit and any limits of its own.
Every field is the gateway setting ``<protocol>_<name>``, read by
``Limits.from_settings`` (:class:`~polyport.protocols.settings.ProtocolLimits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from polyport.protocols.reactive.connection import ConnectionLimits
from polyport.protocols.settings import ProtocolLimits


@dataclass(frozen=True, slots=True)
class StreamLimits(ProtocolLimits):
    # The fields that fall back to the gateway-wide setting of the same name.
    shared_settings: ClassVar[tuple[str, ...]] = ("max_event_bytes",)
    # The smallest value of each limit that works: checked when the object is
    # made, so that a bad setting stops the gateway at start rather than
    # failing (a read with read_page 0) or hanging (no fire-and-forget slot)
    # on every connection.
    least: ClassVar[Mapping[str, int]] = {}

    # The version's wire format gives these defaults.
    max_frame_size: int = 0
    max_message_size: int = 0
    max_fragment: int = 1
    # Live request-response / request-stream (and draft REQUEST_SUB) streams
    # on one connection.
    max_streams: int = 256
    # Bytes of fragmented requests held for all streams of one connection
    # (each stream is also within max_message_size); past it a stream's
    # request gets ERROR too_large.  One request alone always fits.
    max_reassembly_bytes: int = 32 * 1024 * 1024
    # Fire-and-forget appends in flight; more pause reading the socket.
    max_fnf_inflight: int = 64
    # A read answer (request-response) stops adding events past this many
    # body bytes (always at least one event); a query answer above it fails
    # with too_large.  Below the client's default reassembly limit (16 MiB).
    max_response_bytes: int = 8 * 1024 * 1024
    # Events fetched per database read of a streamed read / read.
    read_page: int = 100
    # Default `max` of a request-response read.
    default_read_max: int = 1000
    # Events a subscription buffers ahead of the credits.
    subscription_buffer: int = 128
    # Body limit of appended events (the gateway's max_event_bytes).
    max_event_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name, least in self.least.items():
            value = getattr(self, name)
            if value < least:
                raise ValueError(
                    f"{self.protocol}_{name} must be at least {least}, not {value}"
                )
        self._check()

    def _check(self) -> None:
        """The version's own checks (dataclasses with slots take no
        zero-argument ``super()``, so this is a hook, not an override)."""

    def connection_args(self) -> ConnectionLimits:
        """The limits the sans-IO server connection enforces itself."""
        return {
            "max_frame_size": self.max_frame_size,
            "max_message_size": self.max_message_size,
            "max_fragment": self.max_fragment,
            "max_streams": self.max_streams,
            "max_reassembly_bytes": self.max_reassembly_bytes,
        }
