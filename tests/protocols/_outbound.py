"""An Outbound for driving protocol sessions without a socket."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RecordingOutbound:
    """Keeps what a session sends and whether it closed the connection."""

    peer: str = "test"
    sent: list[bytes] = field(default_factory=list)
    closed: bool = False
    # Whether the session reported its handshake (login) complete.
    handshaken: bool = False

    async def send(self, data: bytes) -> None:
        self.sent.append(data)

    def try_send(self, data: bytes) -> bool:
        self.sent.append(data)
        return True

    def close(self) -> None:
        self.closed = True

    def handshake_done(self) -> None:
        self.handshaken = True
