"""The open connections of a gateway, every transport alike.

A gateway transport (asyncio TCP, WebSocket, the Res01 ROUTER per peer)
registers each connection in the gateway's :class:`ConnectionTable` with a way
to close it; the connection's task carries it in
:data:`~protocols.session.CURRENT_PEER`, so the store's hooks (a login, an
append, a delivery, a subscription) count on the right row without the
adapters passing it along.  ``GET /admin/connections`` lists the table and
``DELETE /admin/connections/{id}`` closes one.  Each closed connection gets one
INFO line with its totals and why it ended.
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from polyport.core.commands import Selector

log = logging.getLogger("polyport.connections")

# Why a connection ended, as the close line and the admin API spell it.
PEER_CLOSED = "peer closed"
IDLE = "idle"
# A frame the peer started was not complete within frame_timeout.
FRAME_TIMEOUT = "frame timeout"
ADMIN_CLOSE = "admin close"
SHUTDOWN = "shutdown"
SERVER_CLOSED = "closed by server"
RIGHTS_REVOKED = "rights revoked"
INTERNAL = "internal error"


class _Closable(Protocol):
    # What it reads (re-checked when the user's rights change).
    selector: Selector

    @property
    def closed(self) -> bool: ...


@dataclass(eq=False)
class Connection:
    """One open connection and its running totals (mutated by its transport
    and the store hooks; read by the admin API)."""

    id: int
    protocol: str
    peer: str
    since: datetime
    user: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    events_in: int = 0
    events_out: int = 0
    # The last canonical error code sent to it (a protocol error that made the
    # server close it names the reason).
    last_error: str | None = None
    # Set by whoever closes it before the transport notices (admin, shutdown).
    close_reason: str | None = None
    closer: Callable[[], None] | None = field(default=None, repr=False)
    subscriptions: weakref.WeakSet[_Closable] = field(default_factory=weakref.WeakSet,
                                                      repr=False)
    # The Tenants it logged in as (core.access): narrowed, or the connection
    # closed, when the user's rights change (gateway/process/rights.py).
    tenants: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet, repr=False)
    # The session's way to end it in its protocol's error form (code,
    # message) when those rights are revoked; None: the transport just closes.
    revoker: Callable[[str, str], Awaitable[None]] | None = field(default=None, repr=False)
    started: float = field(default_factory=time.monotonic, repr=False)

    @property
    def subscription_count(self) -> int:
        return sum(1 for s in list(self.subscriptions) if not s.closed)

    def server_closed_reason(self) -> str:
        """Why the server ended it, when it did so on its own."""
        if self.close_reason is not None:
            return self.close_reason
        if self.last_error is not None:
            return f"protocol error {self.last_error}"
        return SERVER_CLOSED

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "protocol": self.protocol,
            "peer": self.peer,
            "user": self.user,
            "since": self.since.isoformat(),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "events_in": self.events_in,
            "events_out": self.events_out,
            "subscriptions": self.subscription_count,
        }


class ConnectionTable:
    def __init__(self, worker: int = 0, workers: int = 1) -> None:
        """``worker`` of ``workers`` gateway processes: ids are unique across
        them (``id % workers`` is the worker holding it), so the admin API
        can list and close every worker's connections by one id."""
        self._ids = itertools.count(workers + worker, workers)
        self._open: dict[int, Connection] = {}

    def __len__(self) -> int:
        return len(self._open)

    def open(
        self, protocol: str, peer: str, closer: Callable[[], None] | None = None
    ) -> Connection:
        conn = Connection(next(self._ids), protocol, peer, datetime.now(UTC), closer=closer)
        self._open[conn.id] = conn
        return conn

    def get(self, conn_id: int) -> Connection | None:
        return self._open.get(conn_id)

    def list(
        self, *, protocol: str | None = None, user: str | None = None, address: str | None = None
    ) -> list[Connection]:
        """Open connections, oldest first; ``address`` matches a part of the peer."""
        return [
            c for c in self._open.values()
            if (protocol is None or c.protocol == protocol)
            and (user is None or c.user == user)
            and (address is None or address in c.peer)
        ]

    def close(self, conn_id: int, reason: str = ADMIN_CLOSE) -> bool:
        """Ask the transport to close it; False if there is no such connection."""
        conn = self._open.get(conn_id)
        if conn is None:
            return False
        conn.close_reason = reason
        if conn.closer is not None:
            conn.closer()
        else:
            self.closed(conn, reason)
        return True

    def closed(self, conn: Connection, reason: str) -> None:
        """The transport is done with it: forget it and write its line."""
        if self._open.pop(conn.id, None) is None:
            return
        reason = conn.close_reason or reason
        log.info(
            "%s: connection %d from %s closed (%s): user %s, %.1fs, bytes in/out %d/%d, "
            "events in/out %d/%d",
            conn.protocol, conn.id, conn.peer, reason, conn.user or "-",
            time.monotonic() - conn.started, conn.bytes_in, conn.bytes_out,
            conn.events_in, conn.events_out,
            extra={"protocol": conn.protocol, "peer": conn.peer, "user": conn.user,
                   "reason": reason},
        )
