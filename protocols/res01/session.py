"""The server side of a Res01 listener: every peer of its ZeroMQ ROUTER.

A ROUTER has no connection per peer to hang a session on, so one
:class:`Res01Session` serves a whole listener, as a byte-stream protocol's
session serves one connection, on the same :class:`SessionContext` (logins,
counters, log).  The gateway's ROUTER transport
(``gateway/transports/zmq_router.py``) owns the sockets: ZAP and CURVE, parts
received, replies sent with ``DONTWAIT``, a peer's TCP connection shut down.
It hands each whole message here (:meth:`Res01Session.message_received`) with
the endpoint it came in on, its connection's ZAP User-Id and the connection's
file descriptor, and sends what the session gives its :class:`Router`.  Here:

- each endpoint's sans-IO
  :class:`~polyport.protocols.res01.connection.ServerConnection` decodes a
  message and opens its request, and what it cannot decode or what is over
  ``max_request_bytes`` is answered at once (ER 1/2/3);
- every reply goes out through that connection, which checks it against the
  request (the right response command or ER, one EF per FE entry, nothing
  after the final reply), per peer;
- admission is bounded: at most ``res01_max_in_flight_writes`` AC and
  ``res01_max_in_flight_reads`` other requests, and a byte budget; beyond that
  the request is answered at once with ER 4 (writer busy) or ER 10 (reader
  busy) instead of being queued;
- an admitted request runs as a task of the session (:class:`SessionTasks`),
  so a slow commit for one client never holds up another client's fetch (an
  AC whose peer's tenant is known is queued on the writer at once instead,
  and answered from its outcome's callback: no task per append); the
  :class:`~polyport.protocols.res01.adapter.Res01Handler` yields its replies,
  served as the peer's :class:`~polyport.core.access.Tenant` (anonymous on a
  NULL endpoint, else the user ZAP logged in);
- per peer (routing id): its connection-table row, the TCP connection it
  came over and its login, in a :class:`PeerTable` bounded in number and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from polyport.core.access import Tenant
from polyport.core.commands import AppendResult
from polyport.core.errors import Unauthenticated
from polyport.protocols.connections import ADMIN_CLOSE, IDLE, Connection
from polyport.protocols.res01.adapter import Res01Handler, is_write
from polyport.protocols.res01.connection import (
    Exchange,
    MessageAssembler,
    Received,
    ServerConnection,
)
from polyport.protocols.res01.errors import (
    ErrorCode,
    LocalProtocolError,
    Res01Error,
    error_reply,
)
from polyport.protocols.res01.frames import PROTOCOL, AppendCommit, Error, Response
from polyport.protocols.res01.limits import Limits
from polyport.protocols.res01.peers import PeerState, PeerTable, Source
from polyport.protocols.session import (
    CURRENT_PEER,
    Peer,
    SessionContext,
    SessionTasks,
    register_connection,
    unregister_connection,
)

# On close: how long in-flight requests may finish.
CLOSE_GRACE = 5.0
# A logged-in peer's principal is looked up again after this long, so a
# change of the user's contexts reaches connections that stay open.
TENANT_TTL = 30.0
# A ROUTER cannot tell which peer a disconnect was: a peer silent this long
# (or the gateway's idle timeout, if shorter) is forgotten and leaves the
# connection table; so does every peer once no TCP connection is left.
PEER_FORGET_AFTER = 600.0


class Router(Protocol):
    """What the ROUTER transport does for the session."""

    async def send(self, endpoint: int, frames: list[bytes], *, wait: bool) -> bool:
        """Send one message (``frames[0]`` the peer's routing id) from
        ``endpoint``.  ``wait``: while the peer's queue is full, retry up to
        ``send_timeout``; otherwise drop it at once (the receive loop must
        never wait on one peer).  False when it was not sent."""

    def send_now(self, endpoint: int, frames: list[bytes]) -> bool | None:
        """:meth:`send` without awaiting: True when sent, False when it
        cannot be (the peer is gone), None while the peer's queue is full
        (then :meth:`send` with ``wait``)."""

    def source(self, fd: int) -> Source:
        """The TCP connection behind ``fd`` (a message's ZMQ_SRCFD), to
        :meth:`disconnect` later."""

    def disconnect(self, source: Source) -> bool:
        """Shut that TCP connection down; False when it cannot (not TCP, or
        the connection is gone)."""


class Res01Session:
    """Serves every peer of one Res01 listener; ``logins[i]``: whether
    endpoint ``i`` logs its peers in (ZAP PLAIN or CURVE) or serves them
    anonymously (NULL)."""

    def __init__(
        self, ctx: SessionContext, limits: Limits, router: Router, *, logins: Sequence[bool]
    ) -> None:
        self.ctx = ctx
        self.stats = ctx.stats
        self.log = ctx.log
        self.limits = limits
        self._router = router
        self._logins = tuple(logins)
        self.handler = Res01Handler(ctx.stats, ctx.log, limits)
        # Request/reply pairing per endpoint; the counters are admission.
        self.conns = [
            ServerConnection(max_request_bytes=limits.max_request_bytes) for _ in self._logins
        ]
        self._anonymous: Tenant | None = None
        # Per peer (routing identity): its connection-table row, and the
        # principal of a logged-in peer, looked up once a while rather than
        # per message.  The table forgets idle peers and bounds their number
        # (res01_max_peers); a forgotten peer leaves the connection table.
        idle = limits.idle_timeout
        self.peers: PeerTable[bytes, PeerState] = PeerTable(
            max_peers=limits.max_peers,
            idle_timeout=min(PEER_FORGET_AFTER, idle) if idle else PEER_FORGET_AFTER,
            on_forget=self._forgotten,
        )
        self._tasks = SessionTasks()
        # The writer's outcomes of the AC answered from a callback.
        self._commits: set[asyncio.Future[list[AppendResult]]] = set()
        self._writes = 0
        self._reads = 0
        self._bytes = 0

    @property
    def in_flight(self) -> tuple[int, int]:
        """(AC, other) requests being served now."""
        return self._writes, self._reads

    def assembler(self) -> MessageAssembler:
        """A receive loop's assembler of the parts of one message, within
        ``res01_max_message_parts`` and ``res01_max_request_bytes``."""
        limits = self.limits
        assert limits.max_request_bytes is not None
        return MessageAssembler(
            max_parts=limits.max_message_parts, max_bytes=limits.max_request_bytes
        )

    async def close(self) -> None:
        """Requests already admitted may finish for ``CLOSE_GRACE`` seconds
        (commits drained by the store still get their CR); then cancelled."""
        deadline = time.monotonic() + CLOSE_GRACE
        if self._commits:
            await asyncio.wait(set(self._commits), timeout=CLOSE_GRACE)
        await self._tasks.close(max(0.0, deadline - time.monotonic()))

    # --- receiving ----------------------------------------------------------

    async def message_received(
        self, endpoint: int, received: Received, user: str | None, fd: int = -1
    ) -> None:
        """A whole message arrived on ``endpoint``: ``user`` is the User-Id
        ZAP gave its connection, ``fd`` that connection's descriptor (-1:
        unknown)."""
        try:
            await self._dispatch(endpoint, received, user, fd)
        except Exception:  # a bug in one message must not end the loop
            self.log.exception("res01: dispatching a message failed")
            self.stats.error("internal")

    async def _dispatch(
        self, endpoint: int, received: Received, user: str | None, fd: int
    ) -> None:
        frames = received.frames
        # ZeroMQ hides the peer's address: the routing identity names it.  The
        # request task started below inherits this (error lines, metrics).
        identity = frames[0] if frames else b""
        row = self._peer_connection(identity, fd)  # the connection table's row
        row.bytes_in += received.size
        CURRENT_PEER.set(Peer(PROTOCOL, row.peer, row))
        self.stats.frames_in += 1
        self.stats.bytes_in += received.size
        conn = self.conns[endpoint]
        if received.error is not None:  # over max_message_parts / max_request_bytes
            self.stats.error(received.error.code)
            if received.error.request_id is not None:
                await self._send(endpoint, conn.refuse(received.error), wait=False)
            return
        try:
            exchange = conn.receive_message(frames)
        except Res01Error as exc:  # undecodable or over max_request_bytes
            self.stats.error(exc.code)
            await self._send(endpoint, conn.refuse(exc), wait=False)
            return
        write = is_write(exchange.request)
        refusal = self._admission(write, exchange.size)
        if refusal is not None:
            self.stats.error("busy")
            code = ErrorCode.STORAGE_WRITER_BUSY if write else ErrorCode.STORAGE_READER_BUSY
            await self._reply(
                endpoint, exchange, error_reply(exchange.request, code, refusal), wait=False
            )
            conn.abandon(exchange)  # answered, unless the ER itself was refused
            return
        if write:
            self._writes += 1
        else:
            self._reads += 1
        self._bytes += exchange.size
        if type(exchange.request) is AppendCommit:
            tenant = self._known_tenant(endpoint, exchange.routing[0], user)
            if tenant is not None:
                self._start_commit(endpoint, exchange, tenant)
                return
        self._tasks.spawn(self._serve(endpoint, exchange, write, user))

    def _admission(self, write: bool, size: int) -> str | None:
        """Why the request cannot be admitted now, or None."""
        if write and self._writes >= self.limits.max_in_flight_writes:
            return (
                f"storage writer busy: {self._writes} commits in progress; retry shortly "
                "(re-sending the same event ids is safe)"
            )
        if not write and self._reads >= self.limits.max_in_flight_reads:
            return f"storage reader busy: {self._reads} requests in progress; retry shortly"
        if self._bytes and self._bytes + size > self.limits.max_in_flight_bytes:
            return f"server busy: {self._bytes} bytes of requests in progress; retry shortly"
        return None

    def _known_tenant(self, endpoint: int, peer: bytes, user: str | None) -> Tenant | None:
        """The tenant of :meth:`_tenant` when it needs no lookup, else None."""
        if not self._logins[endpoint]:
            return self._anonymous
        if not user:
            return None
        state = self.peers.get(peer)
        cached = state.login if state is not None else None
        if cached is not None and cached[:2] == (endpoint, user) and cached[3] > time.monotonic():
            return cached[2]
        return None

    async def _tenant(self, endpoint: int, peer: bytes, user: str | None) -> Tenant:
        """The tenant a request of this peer is served as.  A PLAIN or CURVE
        peer is the user ZAP logged in; the principal (contexts may change)
        is looked up again after TENANT_TTL seconds, and whenever the routing
        id shows up with another user (a client may choose its routing id)."""
        known = self._known_tenant(endpoint, peer, user)
        if known is not None:
            return known
        if not self._logins[endpoint]:
            self._anonymous = await self.ctx.anonymous()
            return self._anonymous
        if not user:
            # Cannot happen on a PLAIN socket behind our ZAP handler: refuse
            # rather than guess.
            raise Unauthenticated("this endpoint requires a ZeroMQ PLAIN login")
        now = time.monotonic()
        # The peer's row (CURRENT_PEER) shows the user, and holds the tenant
        # to narrow, or the peer to forget, when the user's rights change
        # (gateway/process/rights.py).
        tenant = await self.ctx.tenant_for_user(user)
        state = self.peers.get(peer)  # unless forgotten meanwhile
        if state is not None:
            self.peers.set(peer, replace(state, login=(endpoint, user, tenant, now + TENANT_TTL)))
        return tenant

    async def _serve(
        self, endpoint: int, exchange: Exchange, write: bool, user: str | None
    ) -> None:
        request = exchange.request
        conn = self.conns[endpoint]
        try:
            try:
                tenant = await self._tenant(endpoint, exchange.routing[0], user)
            except Unauthenticated as exc:  # the user was removed since logging in
                self.stats.error(exc.code)
                reply = error_reply(request, ErrorCode.UNAUTHENTICATED, exc.message)
                await self._reply(endpoint, exchange, reply, wait=True)
                return
            # A held FE (fetch_wait) only while at most half the read slots
            # are busy: the others stay free for requests that need them.
            hold = self._reads <= self.limits.max_in_flight_reads // 2
            replies_of = self.handler.handle(request, tenant, hold=hold)
            async with contextlib.aclosing(replies_of) as replies:
                async for response in replies:
                    if not await self._reply(endpoint, exchange, response, wait=True):
                        break  # the peer is gone or not reading: stop producing
                else:
                    if conn.owed(exchange):
                        self.log.error(
                            "res01: %s ended with %d replies still due",
                            type(request).__name__,
                            conn.owed(exchange),
                        )
                        self.stats.error("internal")
        except asyncio.CancelledError:
            pass
        except Exception:
            self.log.exception("res01: serving %s failed", type(request).__name__)
            self.stats.error("internal")
        finally:
            self._finished(endpoint, exchange, write)

    def _finished(self, endpoint: int, exchange: Exchange, write: bool) -> None:
        """The request is over (answered, failed or its peer gone): it leaves
        its connection's table and the admission counters."""
        self.conns[endpoint].abandon(exchange)
        if write:
            self._writes -= 1
        else:
            self._reads -= 1
        self._bytes -= exchange.size

    # --- AC answered from the commit's callback ------------------------------

    def _start_commit(self, endpoint: int, exchange: Exchange, tenant: Tenant) -> None:
        """An AC whose tenant is known: queued on the writer at once, its CR
        or ER sent from the outcome's callback (a task and an async generator
        per append cost more than the rest of its path in the gateway)."""
        request = exchange.request
        assert isinstance(request, AppendCommit)
        try:
            outcome = self.handler.start_commit(request, tenant)
        # Refused before queuing (malformed, forbidden, busy); failure() logs
        # anything else as the bug it is, with its traceback.
        except Exception as exc:  # noqa: BLE001
            self._answer_commit(endpoint, exchange, self.handler.failure(request, exc))
            return
        self._commits.add(outcome)
        outcome.add_done_callback(functools.partial(self._committed, endpoint, exchange))

    def _committed(self, endpoint: int, exchange: Exchange,
                   outcome: asyncio.Future[list[AppendResult]]) -> None:
        self._commits.discard(outcome)
        if outcome.cancelled():  # the store is closing: nobody to answer for
            self._finished(endpoint, exchange, True)
            return
        request = exchange.request
        assert isinstance(request, AppendCommit)
        self._answer_commit(endpoint, exchange, self.handler.commit_reply(request, outcome))

    def _answer_commit(self, endpoint: int, exchange: Exchange, response: Response) -> None:
        """Send the AC's one reply now, or, while the peer's queue is full,
        from a task that retries up to ``send_timeout``."""
        try:
            frames, _ = self._encode(endpoint, exchange, response)
            if frames and frames[0]:
                sent = self._router.send_now(endpoint, frames)
                if sent is None:
                    self._tasks.spawn(self._send_then_finish(endpoint, exchange, frames))
                    return
                if sent:
                    self._sent(frames)
        except Exception:  # a callback's failure must not leak the request
            self.log.exception("res01: answering an AppendCommit failed")
            self.stats.error("internal")
        self._finished(endpoint, exchange, True)

    async def _send_then_finish(self, endpoint: int, exchange: Exchange,
                                frames: list[bytes]) -> None:
        try:
            await self._send(endpoint, frames, wait=True)
        finally:
            self._finished(endpoint, exchange, True)

    # --- sending ------------------------------------------------------------

    async def _reply(
        self, endpoint: int, exchange: Exchange, response: Response, *, wait: bool
    ) -> bool:
        """Send one reply; False when no more should follow (the peer is gone
        or not reading, or the request had to be ended with an ER)."""
        frames, more = self._encode(endpoint, exchange, response)
        if frames is None:
            return False
        return await self._send(endpoint, frames, wait=wait) and more

    def _encode(
        self, endpoint: int, exchange: Exchange, response: Response
    ) -> tuple[list[bytes] | None, bool]:
        """The reply's frames, checked against its request, and whether more
        replies may follow.  When it cannot go out (our bug: a value the wire
        cannot carry, …) an ER in its place, which is final; None when
        nothing more may go out."""
        conn = self.conns[endpoint]
        try:
            return conn.send(exchange, response), True
        except LocalProtocolError as exc:
            self.log.error("res01: cannot send %s: %s", type(response).__name__, exc)
            self.stats.error("internal")
            request = exchange.request
            substitute = Error(
                request.request_id,
                ErrorCode.UNEXPECTED,
                f"reply could not be encoded: {exc}",
                request.protocol,
            )
            try:
                return conn.send(exchange, substitute), False
            except LocalProtocolError:
                return None, False  # already answered: nothing more may go out

    async def _send(self, endpoint: int, frames: list[bytes], *, wait: bool) -> bool:
        """Send through the router and count what went out."""
        if not frames or not frames[0]:
            return False
        if not await self._router.send(endpoint, frames, wait=wait):
            return False
        self._sent(frames)
        return True

    def _sent(self, frames: list[bytes]) -> None:
        self.stats.frames_out += 1
        size = sum(len(f) for f in frames)
        self.stats.bytes_out += size
        known = self.peers.get(frames[0])
        if known is not None:
            known.row.bytes_out += size

    # --- peers --------------------------------------------------------------

    def _peer_connection(self, identity: bytes, fd: int = -1) -> Connection:
        """The peer's row in the connection table, registered on its first
        message; the peer is now the most recently seen."""
        state = self.peers.get(identity)
        if state is not None:
            self.peers.seen(identity)
            if fd != state.source[0]:  # the peer came back over a new connection
                self.peers.set(identity, replace(state, source=self._router.source(fd)))
            return state.row
        row = register_connection(
            self.stats, PROTOCOL, "zmq:" + (identity.hex() or "?"),
            lambda: self._close_peer(identity, ADMIN_CLOSE),
        )
        self.peers.set(identity, PeerState(row, source=self._router.source(fd)))
        return row

    def _close_peer(self, identity: bytes, reason: str) -> None:
        """Disconnect the peer's TCP connection and forget the peer (an
        admin close, or its user's rights revoked)."""
        state = self.peers.get(identity)
        if state is not None and not self._router.disconnect(state.source):
            self.log.info("res01: peer %s could not be disconnected (not over TCP, or its "
                          "connection is gone): forgotten only", state.row.peer)
        self._forget(identity, reason)

    def _forgotten(self, identity: bytes, state: PeerState | None) -> None:
        """The table dropped an idle peer (or the least recently seen, for room)."""
        if state is not None:
            unregister_connection(self.stats, state.row, IDLE)

    def _forget(self, identity: bytes, reason: str) -> None:
        """Drop a peer from the table: a ROUTER cannot close one peer, but its
        next message registers it afresh."""
        state = self.peers.pop(identity)
        if state is not None:
            unregister_connection(self.stats, state.row, reason)

    def forget_all(self, reason: str) -> None:
        """Every peer leaves the table (no TCP connection is left, or the
        listener closes)."""
        for identity in self.peers:
            self._forget(identity, reason)
