"""The bounds of a Res01 listener and its requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from polyport.protocols.res01.frames import PROTOCOL
from polyport.protocols.settings import ProtocolLimits

# Max request size unless set (or twice max_event_bytes, when that is more).
DEFAULT_MAX_REQUEST_BYTES = 16 << 20
# Frame limit over max_event_bytes, for the frames around a body.
FRAME_SLACK_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Limits(ProtocolLimits):
    """Bounds of the Res01 listener; ``Limits.from_settings`` reads the
    gateway's.

    Each field is the setting ``res01_<field>`` unless its metadata names the
    gateway-wide key it has always been read from.
    """

    protocol: ClassVar[str] = PROTOCOL

    # Requests served at once, per kind; beyond them: ER 4 (AC) / ER 10 (others).
    # Writes are really bounded by the writer's own budget (max_pending_events
    # and _bytes, also ER 4 when full) and the byte budget below; this cap
    # only bounds tasks.  At 128 it refused pipelined clients (one ER 4 per
    # commit beyond 128 in flight) long before the writer was busy.
    max_in_flight_writes: int = 4096
    max_in_flight_reads: int = 64
    # Bytes of admitted requests held at once (a big AC counts its size);
    # beyond it new requests get the busy code too.  One request is always
    # admitted when nothing is in flight, so a single large message can pass.
    max_in_flight_bytes: int = 64 << 20
    # Largest whole request (all frames); bigger ones get ER 1.  None (the
    # default) = max(16 MiB, 2 × max_event_bytes), set in __post_init__.
    max_request_bytes: int | None = None
    # Largest number of parts (frames, routing included) of one message;
    # more: ER 1 (too_large).  An AC takes 5 per event, so this allows about
    # 13,000 events in one commit.  Checked, like max_request_bytes, as the
    # parts arrive: the rest of an oversized message is dropped unkept.
    max_message_parts: int = 65536
    # Largest event body (the gateway's max_event_bytes); bigger: ER 1.
    max_event_bytes: int = field(default=1 << 20, metadata={"setting": "max_event_bytes"})
    # Storage work of a reader request (RS, FE, PS, SS) longer than this: ER 9.
    # The gateway's read_timeout, also the store's.
    read_timeout: float = field(default=30.0, metadata={"setting": "read_timeout"})
    # SuggestedCount is capped here, and an EF batch whose bodies add up to
    # more than max_fetch_bytes is fetched again shorter: EF messages stay a
    # bounded size (at least one event is always returned).
    max_fetch_count: int = 1000
    max_fetch_bytes: int = 8 << 20
    # An FE of one subscription that finds nothing waits up to this many
    # seconds for a commit before answering (a held fetch, or long poll), so
    # a client fetching in a loop gets events as they are committed instead
    # of on its next poll.  0 answers at once.  Capped at half read_timeout.
    # Held only while at most half the read slots are busy (the session
    # decides), so waiting fetches never keep other reads out.
    fetch_wait: float = 0.5
    # Peers (routing ids) the session keeps state for: one unseen for
    # idle_timeout (the gateway's; 0 = never) is forgotten, and past max_peers
    # the least recently seen is (protocols/res01/peers.py).  A forgotten
    # peer is served as a new one on its next message.
    max_peers: int = 10_000
    idle_timeout: float | None = field(default=300.0, metadata={"setting": "idle_timeout"})
    # A reply the peer does not take (its queue at the high-water mark) for
    # this long is dropped.
    send_timeout: float = 10.0
    # Largest single frame (ZMQ_MAXMSGSIZE, checked per frame by libzmq: a
    # peer that sends more is disconnected, there is no message to answer).
    # Derived, not a setting: max_event_bytes + 4 KiB of slack, so the frame of
    # a body slightly too large still gets an ER 1 "too large" instead of a
    # disconnect.
    max_frame_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_frame_bytes", self.max_event_bytes + FRAME_SLACK_BYTES)
        object.__setattr__(self, "max_peers", max(1, self.max_peers))
        object.__setattr__(
            self, "fetch_wait", min(max(0.0, self.fetch_wait), self.read_timeout / 2)
        )
        if not self.idle_timeout:
            object.__setattr__(self, "idle_timeout", None)
        if self.max_request_bytes is None:
            # A request must at least hold one event of the largest size.
            derived = max(DEFAULT_MAX_REQUEST_BYTES, 2 * self.max_event_bytes)
            object.__setattr__(self, "max_request_bytes", derived)
