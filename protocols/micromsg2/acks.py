"""Ack bookkeeping for the ``ack`` and ``batch-ack`` extensions (sans-IO).

Both extensions' EXTENSION frames carry the same payload: the u16 sequence
number of the newest MESSAGE acknowledged; every older unacknowledged MESSAGE
is acknowledged with it, across the 65535 -> 1 wrap.
"""

from __future__ import annotations

import struct

from polyport.protocols.micromsg2.errors import RemoteProtocolError, as_local
from polyport.protocols.micromsg2.frames import SEQ_FIRST, SEQ_LAST

ACK_PAYLOAD = struct.Struct(">H")


def next_seq(seq: int) -> int:
    return SEQ_FIRST if seq >= SEQ_LAST else seq + 1


def previous_seq(seq: int) -> int:
    return SEQ_LAST if seq <= SEQ_FIRST else seq - 1


def check_seq(seq: int) -> int:
    if not SEQ_FIRST <= seq <= SEQ_LAST:
        raise RemoteProtocolError(f"sequence number {seq} is outside 1..65535")
    return seq


def encode_ack_payload(seq: int) -> bytes:
    with as_local:
        return ACK_PAYLOAD.pack(check_seq(seq))


def decode_ack_payload(payload: bytes) -> int:
    if len(payload) != ACK_PAYLOAD.size:
        raise RemoteProtocolError(f"ack payload must be 2 bytes, got {len(payload)}")
    return check_seq(ACK_PAYLOAD.unpack(payload)[0])


class AckWindow:
    """The MESSAGE frames one side has sent and the other not yet acked.

    The sender keeps one for what it sends; the receiver keeps one for what it
    receives (``on_sent`` when a MESSAGE arrives, ``on_ack`` when it sends the
    ack), so both enforce the same numbering and window.  ``size`` None means
    no ack extension: numbering only, nothing is ever outstanding.  Violations
    raise RemoteProtocolError; the connection's ``send`` re-raises them as
    LocalProtocolError, since there the numbers are its own.
    """

    def __init__(self, size: int | None = None, *, first_seq: int = SEQ_FIRST) -> None:
        """``first_seq`` is the number of the first MESSAGE: 1 by the spec; any
        other value exists so tests can reach the 65535 -> 1 wrap quickly (both
        peers must then be told the same number)."""
        if size is not None and not 1 <= size <= SEQ_LAST - 1:
            raise ValueError(f"window size {size} is outside 1..{SEQ_LAST - 1}")
        if not SEQ_FIRST <= first_seq <= SEQ_LAST:
            raise ValueError(f"first sequence number {first_seq} is outside 1..{SEQ_LAST}")
        self.size = size
        self._next = first_seq
        # "Acked up to the number before the first" (65535 before 1, in the
        # wrap) makes the distance arithmetic need no special case.
        self._last_acked = previous_seq(first_seq)
        self._any_acked = False
        self._outstanding = 0

    @property
    def next_seq(self) -> int:
        return self._next

    @property
    def outstanding(self) -> int:
        return self._outstanding

    @property
    def last_acked(self) -> int | None:
        return self._last_acked if self._any_acked else None

    def can_send(self) -> bool:
        return self.size is None or self._outstanding < self.size

    def on_sent(self, seq: int) -> None:
        if seq != self._next:
            raise RemoteProtocolError(f"MESSAGE sequence number {seq}, expected {self._next}")
        if not self.can_send():
            raise RemoteProtocolError(
                f"MESSAGE {seq} exceeds the ack window: {self._outstanding} of "
                f"{self.size} messages are waiting for an ack"
            )
        self._next = next_seq(seq)
        if self.size is not None:
            self._outstanding += 1

    def on_ack(self, seq: int) -> tuple[int, ...]:
        """Acknowledge everything up to ``seq``; returns the numbers released.

        Repeating the last ack is harmless and releases nothing; an ack for a
        number that is not in flight is a protocol error.
        """
        if self.size is None:
            raise RemoteProtocolError("ack received but no ack extension was negotiated")
        check_seq(seq)
        if self._any_acked and seq == self._last_acked:
            return ()
        distance = (seq - self._last_acked) % SEQ_LAST
        if not 1 <= distance <= self._outstanding:
            raise RemoteProtocolError(
                f"ack for {seq} matches no MESSAGE in flight "
                f"(last acked {self.last_acked}, {self._outstanding} in flight)"
            )
        released = []
        current = self._last_acked
        for _ in range(distance):
            current = next_seq(current)
            released.append(current)
        self._last_acked = seq
        self._any_acked = True
        self._outstanding -= distance
        return tuple(released)
