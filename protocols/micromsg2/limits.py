"""MicroMsg2's per-listener limits and settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from polyport.protocols.micromsg2.errors import RemoteProtocolError
from polyport.protocols.micromsg2.frames import PROTOCOL, SEQ_FIRST, SEQ_LAST
from polyport.protocols.micromsg2.negotiation import parse_extensions
from polyport.protocols.settings import ProtocolLimits


@dataclass(frozen=True)
class Limits(ProtocolLimits):
    """Per-listener settings, read once from the gateway settings with
    ``Limits.from_settings(settings)``.

    ``max_payload`` and ``idle_timeout`` are the gateway-wide ``max_event_bytes``
    and ``idle_timeout`` (MicroMsg2 has no keys of its own for them);
    ``micromsg2_initial_seq`` and ``micromsg2_required_extensions`` are its own.
    """

    protocol: ClassVar[str] = PROTOCOL

    # The largest MESSAGE payload accepted (also bounds COMMAND payloads).
    max_payload: int = field(default=1 << 20, metadata={"setting": "max_event_bytes"})
    # Payload bytes of client MESSAGEs handed to the store and not yet
    # committed, per connection; past it the socket is not read until
    # commits catch up (backpressure, like MAX_PENDING_MESSAGES).  One run of
    # MESSAGEs alone is always admitted.
    max_pending_bytes: int = 8 << 20
    # Handshake deadline and idle close; 0 turns both off.
    idle_timeout: float | None = field(default=300.0, metadata={"setting": "idle_timeout"})
    # Tests only: the first sequence number the server sends (the spec says 1).
    initial_seq: int = SEQ_FIRST
    # ``"json;pubsub"`` (the handshake's list grammar: names only are kept) or a
    # list of extension specs.  Typed Sequence so the settings reader passes
    # the text through whole: its generic comma split would cut a spec's
    # ``key=value,key=value`` properties apart.  A tuple after __post_init__.
    required_extensions: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not self.idle_timeout:
            object.__setattr__(self, "idle_timeout", None)
        if not SEQ_FIRST <= self.initial_seq <= SEQ_LAST:
            raise ValueError(
                f"{PROTOCOL}_initial_seq must be an integer 1..65535, got {self.initial_seq!r}"
            )
        raw = self.required_extensions or ()
        if isinstance(raw, str):
            try:
                names = tuple(spec.name for spec in parse_extensions(raw))
            except RemoteProtocolError as exc:
                raise ValueError(f"{PROTOCOL}_required_extensions: {exc.message}") from None
        else:
            names = tuple(str(x) for x in raw)
        object.__setattr__(self, "required_extensions", names)
