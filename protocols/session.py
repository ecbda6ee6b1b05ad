"""The seam between gateway transports and protocol adapters.

A gateway transport (asyncio TCP, WebSocket) owns the socket; it feeds received
bytes to a :class:`StreamSession` and gives it an :class:`Outbound` to write
with.  ``Outbound.send`` waits while the peer is slow to read, which is the
backpressure path: a session that awaits it never buffers without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from polyport.core.access import Tenant
from polyport.core.errors import Unauthenticated
from polyport.protocols.budgets import BudgetAccount
from polyport.protocols.connections import Connection, ConnectionTable
from polyport.protocols.errors import RemoteProtocolError
from polyport.protocols.framing import InputBuffer
from polyport.protocols.settings import ProtocolLimits

if TYPE_CHECKING:
    from polyport.core.commands import Principal
    from polyport.core.store import EventStore

T = TypeVar("T")


class Outbound(Protocol):
    peer: str

    async def send(self, data: bytes) -> None:
        """Write ``data``; returns once the transport buffer is below its
        high-water mark."""

    def try_send(self, data: bytes) -> bool:
        """:meth:`send` where it would not wait, for a caller that is not a
        coroutine (a commit's callback): True when taken, False when it
        must be awaited instead (above the high-water mark, or a transport
        whose every send may wait)."""

    def close(self) -> None:
        """Flush what was sent, then close the connection."""

    @property
    def closed(self) -> bool: ...

    def handshake_done(self) -> None:
        """The protocol's handshake or login completed: the transport no
        longer closes the connection at its handshake deadline
        (``handshake_timeout``)."""


class StreamSession(Protocol):
    """One connection's protocol session.  A listener's factory makes each
    as ``Session(ctx, out, …, limits=None, input_budget=None)``: ``limits``
    the package's ``Limits`` (read once per listener; by default
    ``Limits.from_settings(ctx.settings)``), ``input_budget`` the
    connection's account in the gateway's budget for input not yet whole,
    released when the connection is lost."""

    async def data_received(self, data: bytes) -> None:
        """Handle bytes from the peer.  The transport does not read more until
        this returns, so long-running work belongs in a task of the session."""

    async def connection_lost(self) -> None:
        """The connection is gone: cancel tasks, release subscriptions."""

    @property
    def input_buffer(self) -> InputBuffer | None:
        """What its codec holds of a frame not yet complete (None: the
        session keeps no partial input); the transport's ``frame_timeout``
        watches it."""

    async def frame_timed_out(self, message: str) -> None:
        """A frame the peer started did not complete within ``frame_timeout``:
        send the protocol's error form (code ``timeout``, ``message``) where
        it has one, stop reading, and close ``Outbound``.  The transport
        closes the connection anyway shortly after."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Who the current connection (or request) is from.  A gateway transport
    sets :data:`CURRENT_PEER` in the task that serves a connection; tasks the
    session starts inherit it, so error counting and delivery metrics know the
    peer and protocol without the adapters passing them along."""

    protocol: str
    address: str
    # Its row in the gateway's connection table (None outside a connection).
    connection: Connection | None = None
    # The polyport user a verified TLS client certificate names (the
    # transport checked it against the client CA); None without one.
    certificate_user: str | None = None
    # The source address without its port, where ``address`` has one: what
    # the failed-login throttle counts (a new connection per guess comes
    # from a new port, not a new host).
    host: str | None = None

    @property
    def login_source(self) -> str:
        return self.host or self.address


CURRENT_PEER: ContextVar[Peer | None] = ContextVar("polyport_peer", default=None)

error_log = logging.getLogger("polyport.errors")

# Outcomes a client asked for (a concurrency check, a missing stream): counted,
# logged only at debug level.
ROUTINE_CODES = frozenset({"wrong_expected_version", "not_found"})
# The server's own trouble: warnings.
SERVER_CODES = frozenset({"internal", "storage_unavailable", "timeout"})
AUTH_CODES = frozenset({"unauthenticated", "forbidden"})
# At most this many error lines per listener and second; the rest are counted
# and summarised in the next line that is written.
ERROR_LINES_PER_SECOND = 20

# Events a subscription's delivery takes at once (what is buffered, within
# any credits): one encoding pass and one socket write for them all, where
# one each was most of a catch-up's gateway CPU (docs/performance.md).
DELIVERY_BATCH = 256


@dataclass
class ListenerStats:
    """Counters one listener keeps; ``/status`` and ``/metrics`` read them.

    :meth:`error` also writes one log line per error (with the peer from
    :data:`CURRENT_PEER`), rate-limited per listener.
    """

    protocol: str
    connections_total: int = 0
    connections_open: int = 0
    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    # Connections refused because ``max_connections`` were open (None = no limit).
    connections_refused: int = 0
    max_connections: int | None = None
    # Connections from one source address at once (None = no limit); more are
    # refused and counted in connections_refused.
    max_connections_per_address: int | None = None
    # A send that cannot drain for this long closes the connection (a peer
    # that stopped reading); None = wait for ever.
    write_timeout: float | None = None
    # A connection that has not completed its protocol's handshake (called
    # Outbound.handshake_done) this long after it was accepted is closed;
    # None = no deadline.
    handshake_timeout: float | None = None
    # A frame the peer has started must be complete this long after its first
    # byte arrived (None = no bound): a peer trickling bytes does not hold a
    # connection past it, as the idle timeout (which every byte restarts) would.
    frame_timeout: float | None = None
    # WebSocket ping interval; a peer that does not answer with a pong is
    # closed (None = no pings).
    websocket_heartbeat: float | None = None
    # Bind with SO_REUSEPORT: several gateway processes (workers) listen on
    # the same port and the kernel spreads connections over them.
    reuse_port: bool = False
    # Open connections per source address, TCP and WebSocket together.
    by_address: Counter[str] = field(default_factory=Counter, repr=False)
    # The gateway's table of open connections, where transports register.
    connections: ConnectionTable | None = None
    _log_window: float = field(default=0.0, repr=False)
    _log_lines: int = field(default=0, repr=False)
    _log_suppressed: int = field(default=0, repr=False)

    def error(self, code: str, message: str | None = None) -> None:
        """Count an error reply or close with canonical ``code``; ``message``
        is what the client was told (in the log line too)."""
        self.errors[code] += 1
        peer = CURRENT_PEER.get()
        if peer is not None and peer.connection is not None:
            peer.connection.last_error = code
        self._log_error(code, message)

    def admit(self, host: str) -> str | None:
        """Count a new connection from source address ``host`` as open, or
        why it is refused (``max_connections``, ``max_connections_per_address``;
        counted in ``connections_refused``).  An admitted connection is
        released with :meth:`release`."""
        limit = self.max_connections
        if limit is not None and self.connections_open >= limit:
            self.connections_refused += 1
            return f"{self.connections_open} connections open (max_connections {limit})"
        per_address = self.max_connections_per_address
        if per_address is not None and self.by_address[host] >= per_address:
            self.connections_refused += 1
            return (
                f"{self.by_address[host]} connections open from that address "
                f"(max_connections_per_address {per_address})"
            )
        self.by_address[host] += 1
        self.connections_total += 1
        self.connections_open += 1
        return None

    def release(self, host: str) -> None:
        """An admitted connection from ``host`` closed."""
        self.connections_open -= 1
        self.by_address[host] -= 1
        if self.by_address[host] <= 0:
            del self.by_address[host]

    def _log_error(self, code: str, message: str | None) -> None:
        if code in ROUTINE_CODES:
            level = logging.DEBUG
        elif code in SERVER_CODES or code in AUTH_CODES:
            level = logging.WARNING
        else:
            level = logging.INFO
        if not error_log.isEnabledFor(level):
            return
        now = time.monotonic()
        if now - self._log_window >= 1.0:
            self._log_window, self._log_lines = now, 0
        if self._log_lines >= ERROR_LINES_PER_SECOND:
            self._log_suppressed += 1
            return
        self._log_lines += 1
        peer = CURRENT_PEER.get()
        where = peer.address if peer is not None else "-"
        more = ""
        if self._log_suppressed:
            more = f" ({self._log_suppressed} similar lines suppressed)"
            self._log_suppressed = 0
        if code in AUTH_CODES:
            what = "auth failure"
        elif code in SERVER_CODES:
            what = "server error"
        else:
            what = "protocol error"
        told = f" ({message})" if message else ""
        error_log.log(
            level, "%s: %s from %s: %s%s%s", self.protocol, what, where, code, told, more,
            extra={"protocol": self.protocol, "peer": where, "code": code,
                   "reason": message},
        )


def logged_in(tenant: Tenant | None, first: str) -> Tenant:
    """A session's tenant once its connection has logged in; before that,
    :class:`Unauthenticated` saying what comes ``first``."""
    if tenant is None:
        raise Unauthenticated(first)
    return tenant


def register_connection(
    stats: ListenerStats, protocol: str, peer: str, closer: Callable[[], None]
) -> Connection:
    """A row in the gateway's connection table (a detached one when the
    listener runs without a gateway, as in some tests)."""
    if stats.connections is None:
        return Connection(0, protocol, peer, datetime.now(UTC), closer=closer)
    return stats.connections.open(protocol, peer, closer)


def unregister_connection(stats: ListenerStats, conn: Connection, reason: str | None) -> None:
    """``reason`` None: the server side ended it (a protocol error, or an admin close)."""
    if stats.connections is not None:
        stats.connections.closed(conn, reason or conn.server_closed_reason())


class SessionTasks:
    """The tasks a session starts (a request served on its own, …): each is
    held while it runs, and :meth:`close` ends those still running when the
    session ends."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self, grace: float = 0.0) -> None:
        """Give the running tasks ``grace`` seconds to finish, then cancel
        the others and wait until they have ended."""
        pending = set(self._tasks)
        if pending and grace > 0:
            _, pending = await asyncio.wait(pending, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


class ServerCodec(Protocol):
    """What a byte-stream session needs of its sans-IO server connection."""

    budget: BudgetAccount | None

    @property
    def input_buffer(self) -> InputBuffer: ...

    def receive_data(self, data: bytes) -> Any: ...


LimitsT = TypeVar("LimitsT", bound=ProtocolLimits)
CodecT = TypeVar("CodecT", bound=ServerCodec)


class ByteStreamSession(Generic[LimitsT, CodecT]):
    """The part every session over a byte stream does alike (BSON, MicroMsg2,
    segment and both ReactiveSocket versions; each a :class:`StreamSession`).

    Made as ``Session(ctx, out, limits=None, input_budget=None)``, it keeps
    its context and outbound side, its package's ``Limits`` (``LimitsT``,
    built by ``limits_type`` unless given) and its sans-IO server connection
    (``CodecT``, made by ``_connection``), whose input not yet
    whole is charged to ``input_budget``; it owns the tasks it starts in one
    :class:`SessionTasks`; its user's revoked rights end it (``_revoked``).
    ``data_received`` reads nothing once the session is ``closing``, decodes
    the bytes and hands what they finish to ``_received``, or the peer's
    fault in them (``peer_fault``, the package's ``RemoteProtocolError``) to
    ``_undecodable``; anything else the codec raises (our own bug) goes up to
    the transport.
    """

    # The package's limits class and the peer's decoding faults.
    limits_type: type[LimitsT]
    peer_fault: ClassVar[type[RemoteProtocolError]] = RemoteProtocolError

    def __init__(
        self, ctx: SessionContext, out: Outbound, limits: LimitsT | None = None,
        input_budget: BudgetAccount | None = None,
    ) -> None:
        self.ctx = ctx
        ctx.on_revoke(self._revoked)
        self.out = out
        self.limits = limits or self.limits_type.from_settings(ctx.settings)
        self.conn = self._connection()
        self.conn.budget = input_budget
        # Every task the session starts: ended when the connection is lost.
        self._tasks = SessionTasks()
        # Set once the connection is ending: read no more, start nothing new.
        self.closing = False
        self._init_state()

    # --- what each protocol adds --------------------------------------------------

    def _connection(self) -> CodecT:
        """The package's sans-IO server connection, for ``self.limits``."""
        raise NotImplementedError

    def _init_state(self) -> None:
        """The protocol's own state of a new connection."""

    async def _revoked(self, code: str, message: str) -> None:
        """The user's rights were revoked while connected: the protocol's
        error form, then close."""
        raise NotImplementedError

    def _input_arrived(self) -> None:
        """Bytes arrived, before they are decoded (a session that watches for
        idle connections notes the time)."""

    async def _undecodable(self, exc: RemoteProtocolError) -> None:
        """The peer's bytes broke the protocol (``exc``, a ``peer_fault``)."""
        raise NotImplementedError

    async def _received(self, received: Any) -> None:
        """What the bytes finished (the codec's ``receive_data``)."""
        raise NotImplementedError

    # --- StreamSession ----------------------------------------------------------------

    @property
    def input_buffer(self) -> InputBuffer:
        return self.conn.input_buffer

    async def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self._input_arrived()
        try:
            received = self.conn.receive_data(data)
        except self.peer_fault as exc:
            await self._undecodable(exc)
            return
        await self._received(received)


class SessionContext:
    """What every protocol session gets from the gateway.

    Not the event store: a session logs in (or asks for anonymous access)
    here and gets a :class:`~polyport.core.access.Tenant`, the store as that
    principal may use it, and reaches storage only through it.  The store
    itself stays private to this object, which only the gateway builds.
    """

    __slots__ = ("_store", "log", "settings", "stats")

    def __init__(
        self,
        store: EventStore,
        *,
        stats: ListenerStats,
        settings: dict[str, Any],
        log: logging.Logger,
    ) -> None:
        self._store = store
        self.stats = stats
        self.settings = settings
        self.log = log

    async def login(self, user: str, password: str | None) -> Tenant:
        """The tenant of a user who gave a password.  The connection's
        address (:data:`CURRENT_PEER`) feeds the failed-login throttle."""
        peer = CURRENT_PEER.get()
        principal = await self._store.users.authenticate(
            user, password, peer=peer.login_source if peer is not None else None
        )
        return self._tenant(principal)

    async def anonymous(self) -> Tenant:
        """The anonymous tenant (only its configured contexts);
        :class:`Unauthenticated` when anonymous access is off."""
        return self._tenant(await self._store.users.authenticate(None, None))

    async def authenticate(self, user: str | None, password: str | None) -> Tenant:
        """A login when the client names a user; else, when the connection
        came with a verified client certificate naming a user, that user (no
        password: the certificate is the proof); else anonymous.  How every
        protocol with optional credentials treats them."""
        if user:
            return await self.login(user, password)
        peer = CURRENT_PEER.get()
        if peer is not None and peer.certificate_user:
            return await self.tenant_for_user(peer.certificate_user)
        return await self.anonymous()

    async def tenant_for_user(self, name: str) -> Tenant:
        """The tenant of a user who proved who they are another way (a client
        certificate, a CURVE key): no password is checked here."""
        return self._tenant(await self._store.users.principal_for(name))

    def on_revoke(self, handler: Callable[[str, str], Awaitable[None]]) -> None:
        """How the current connection ends when its user's rights are
        revoked while it is open (gateway/process/rights.py): ``handler(code,
        message)`` sends the protocol's error form, then closes.  Sessions
        call this when they are made, in the connection's task."""
        peer = CURRENT_PEER.get()
        if peer is not None and peer.connection is not None:
            peer.connection.revoker = handler

    def _tenant(self, principal: Principal) -> Tenant:
        # The gateway's hook: the connection table shows who logged in.
        if self._store.on_login is not None:
            self._store.on_login(principal)
        tenant = Tenant(self._store, principal)
        peer = CURRENT_PEER.get()
        if peer is not None and peer.connection is not None and principal.user is not None:
            peer.connection.tenants.add(tenant)
        return tenant

