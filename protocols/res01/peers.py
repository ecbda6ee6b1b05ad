"""The Res01 peers a session keeps state for, bounded in number and time.

ZeroMQ hides connections behind routing ids, and a ROUTER never learns that
a peer has gone for good (a client may also pick a new routing id per
request).  Per-peer state (a logged-in peer's principal) is therefore kept
in a table that forgets a routing id unseen for ``idle_timeout`` seconds and
keeps at most ``max_peers`` of them, the least recently seen going first.  A
forgotten peer is not refused: its state is built again on its next message.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from polyport.core.access import Tenant
    from polyport.protocols.connections import Connection

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PeerTable(Generic[K, V]):
    """Peers by key (endpoint, routing id), least recently seen first."""

    def __init__(
        self,
        *,
        max_peers: int,
        idle_timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
        on_forget: Callable[[K, V | None], None] | None = None,
    ) -> None:
        if max_peers < 1:
            raise ValueError("max_peers must be at least 1")
        self.max_peers = max_peers
        self.idle_timeout = idle_timeout
        self._clock = clock
        # Told about every peer dropped for idleness or room (not pop()).
        self._on_forget = on_forget
        # key -> (last seen, state); moved to the end whenever seen, so the
        # front is always the next to expire.
        self._peers: OrderedDict[K, tuple[float, V | None]] = OrderedDict()
        # Peers dropped for idleness or for room (for /status and tests).
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, key: object) -> bool:
        return key in self._peers

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._peers))

    def pop(self, key: K) -> V | None:
        """Drop ``key`` now (its state, or None)."""
        entry = self._peers.pop(key, None)
        return None if entry is None else entry[1]

    def seen(self, key: K) -> None:
        """A message from ``key`` arrived: it is tracked (with no state if it
        is new) and is now the most recently seen; idle peers, and the least
        recently seen beyond ``max_peers``, are forgotten."""
        now = self._clock()
        entry = self._peers.pop(key, None)
        self._peers[key] = (now, None if entry is None else entry[1])
        self._expire(now)

    def get(self, key: K) -> V | None:
        entry = self._peers.get(key)
        return None if entry is None else entry[1]

    def set(self, key: K, state: V) -> None:
        """Keep ``state`` for ``key`` (seen now)."""
        self._peers.pop(key, None)
        now = self._clock()
        self._peers[key] = (now, state)
        self._expire(now)

    def _expire(self, now: float) -> None:
        # Amortised O(1): each peer is forgotten once.
        peers = self._peers
        while len(peers) > self.max_peers:
            self._forget(*peers.popitem(last=False))
        if self.idle_timeout is None:
            return
        oldest = now - self.idle_timeout
        while peers:
            first = next(iter(peers.values()))
            if first[0] >= oldest:
                break
            self._forget(*peers.popitem(last=False))

    def _forget(self, key: K, entry: tuple[float, V | None]) -> None:
        self.forgotten += 1
        if self._on_forget is not None:
            self._on_forget(key, entry[1])


# (file descriptor, remote address) of the TCP connection a peer's latest
# message came over, as the transport found it; (-1, None) when unknown (not
# TCP).  Only the transport reads it: to disconnect that peer.
Source = tuple[int, object]
NO_SOURCE: Source = (-1, None)


@dataclass(frozen=True)
class PeerState:
    """What the session keeps per Res01 peer (routing id)."""

    row: Connection  # its connection-table row
    source: Source = NO_SOURCE
    # (endpoint index, user, tenant, expires) of a logged-in peer.
    login: tuple[int, str, Tenant, float] | None = None
