"""The commit chain: one writer that every worker of ``serve --workers N``
feeds, instead of one writer per worker taking turns on the head row.

Why.  Every commit serialises on the ``log_head`` row, whose lock is held
through COMMIT and its WAL flush.  N writers in N processes take turns, one
flush each, with batches 1/N the size: measured on 16 cores, W1 fell below
one worker's rate past two workers (issue 26, docs/architecture.md).  One
writer fed by every worker makes one batch of what all of them have waiting:
the head row is taken once per commit whatever the worker count, and
PostgreSQL's CPU per event falls as batches grow instead of rising.

Two halves, both without sockets of their own (the gateway connects them
over a unix socket in the supervisor's run directory):

- :class:`CommitChain` runs in the chain process: a
  :class:`~core.chain_writer.ChainWriter` (the group commit of a single
  process, which also plans from the workers' wire form), a
  :class:`~core.notify.Notifier` for other gateways, and one
  :meth:`CommitChain.serve` per connected worker.  Each commit goes back to
  every worker in commit order: the rows to a worker whose tailer has live
  subscribers (it fans them out from memory, as a single process does), the
  new head position alone to the others.
- :class:`ChainClient` runs in each worker in place of its writer, with the
  same ``submit``.  The appends a worker collects in one event-loop turn
  travel as one write.  While the chain is unreachable the worker commits
  through its own :class:`~core.writer.Writer` (the head row orders both),
  so losing the chain process costs latency, never an acknowledged event:
  the units it had not answered are handed to that local writer in the
  order they were sent, and re-sent event ids are idempotent, so a unit the
  chain committed just before it died is answered with what was recorded.
  The worker goes back to the chain only once its local writer is idle,
  so an append never overtakes one sent before it.

The messages between them are core/chain_wire.py's.  The chain's writer
plans the common batch straight from the form the workers send
(core/chain_writer.py), in the chain process as in a worker hosting the
chain (whose own appends it encodes the same way as it queues them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import msgpack

from polyport.core.chain_wire import (
    APPEND,
    COMMIT,
    FEED,
    RESULT,
    decode_append,
    decode_failure,
    decode_results,
    decode_rows,
    encode_append,
    encode_failure,
    encode_results,
    encode_rows,
    from_us,
    unpacker,
    us,
)
from polyport.core.chain_writer import ChainWriter
from polyport.core.commands import Append, AppendResult
from polyport.core.errors import PolyportError, StorageUnavailable
from polyport.core.health import Health
from polyport.core.notify import Notifier, new_notify_group
from polyport.core.writer import (
    CommitObservation,
    Writer,
    WriterLimits,
    WriterStats,
    admit,
    unconfirmed,
)

log = logging.getLogger("polyport.chain")

# A worker that stops reading is dropped past this much unsent output (it
# reconnects, and hands what it had in flight to its own writer).
MAX_PEER_BACKLOG = 256 << 20
RECONNECT_MIN = 0.05
RECONNECT_MAX = 1.0

# How a worker reaches the chain: ``loop.create_unix_connection(factory,
# path)`` with the path filled in (gateway/process/workers.chain_connector).
Connect = Callable[[Callable[[], asyncio.Protocol]],
                   Awaitable[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]]


class _Outbox:
    """Messages to one peer, packed together as one MessagePack array and
    written once per event-loop turn: one write (and one wake-up of the
    peer) for everything a turn produced.  A commit's COMMIT message and
    its units' results are put in the turn that commits it (the writer
    tells the chain of each outcome synchronously, Writer.enqueue's
    ``on_settle``), so they travel together."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self._pack = msgpack.Packer().pack
        self._messages: list[list[Any]] = []
        self._scheduled = False

    def put(self, message: list[Any]) -> None:
        self._messages.append(message)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        messages, self._messages = self._messages, []
        if messages and not self.transport.is_closing():
            self.transport.write(self._pack(messages))

    def backlog(self) -> int:
        return self.transport.get_write_buffer_size()


class _Messages(asyncio.Protocol):
    """One end of a chain connection: each read is unpacked and its messages
    handed to :meth:`received` as they arrive, with no stream buffer, reader
    task or future in between (waking a reader task per read cost 4-7 µs
    per forwarded event, docs/performance.md, session 25).  ``lost``
    completes when the connection ends.  An unreadable message ends it; the
    other side's end of input closes this side too."""

    def __init__(self) -> None:
        self._unpack = unpacker()
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def received(self, messages: list[list[Any]]) -> None:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        unpack = self._unpack
        try:
            unpack.feed(data)
            for messages in unpack:
                self.received(messages)
        except (msgpack.UnpackException, ValueError) as exc:
            log.warning("commit chain connection failed: %s", exc)
            assert self.transport is not None
            self.transport.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.warning("commit chain connection failed: %s", exc)
        if not self.lost.done():
            self.lost.set_result(None)


# --- the chain process's side ----------------------------------------------------------


class _Peer(_Messages):
    """A worker's connection to the chain, on the chain's side."""

    def __init__(self, chain: CommitChain) -> None:
        super().__init__()
        self.chain = chain
        self.out: _Outbox
        self.wants_rows = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.out = _Outbox(self.transport)
        self.chain._peers.add(self)

    def received(self, messages: list[list[Any]]) -> None:
        append = self.chain._append
        for msg in messages:
            if msg[0] == APPEND:
                append(self, msg[1], msg[2], (msg[3], msg[4]))
            elif msg[0] == FEED:
                self.wants_rows = bool(msg[1])
        if self.out.backlog() > MAX_PEER_BACKLOG:
            log.warning("a worker stopped reading the commit chain's replies; "
                        "dropping its connection")
            self.out.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.chain._left_by(self)

    def settled(self, uid: int, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            self.out.put(encode_failure(
                uid, StorageUnavailable("the commit chain stopped before this append")))
            return
        exc = fut.exception()
        if exc is None:
            results = fut.result()
            # Already in the wire's form when the batch was planned from it.
            if results and isinstance(results[0], AppendResult):
                results = encode_results(results)
            self.out.put([RESULT, uid, results])
        elif isinstance(exc, PolyportError):
            self.out.put(encode_failure(uid, exc))
        else:
            self.out.put(encode_failure(uid, StorageUnavailable(str(exc))))


class CommitChain:
    """The one writer of a multi-process gateway (see the module docstring)."""

    def __init__(self, dsn: str, limits: WriterLimits | None = None,
                 notify_interval: float = 0.005, *, writer: Writer | None = None,
                 notify_group: int | None = None) -> None:
        self.health = Health()
        self._peers: set[_Peer] = set()
        self._left = asyncio.Event()  # set when the last worker has left
        self.writer: Writer
        if writer is None:
            self.writer = ChainWriter(
                dsn, limits, on_commit=self._committed, on_wire_commit=self._committed_wire,
                wants_rows=self.rows_wanted, health=self.health)
            # The workers' tailers listen in ``notify_group``: they hear of
            # every commit from this chain instead.
            self._notifier: Notifier | None = Notifier(
                dsn, notify_interval,
                new_notify_group() if notify_group is None else notify_group)
        else:
            # Hosted by a worker: its store owns the writer and notifies,
            # and calls :meth:`tell_peers` / :meth:`tell_peers_wire` from
            # its own commit callbacks.
            self.writer = writer
            self._notifier = None

    @property
    def peers(self) -> int:
        return len(self._peers)

    def start(self) -> None:
        self.writer.start()
        if self._notifier is not None:
            self._notifier.start()

    async def drain_and_stop(self) -> None:
        await self.writer.drain_and_stop()
        if self._notifier is not None:
            self._notifier.stop()

    async def peers_gone(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the workers to close their
        connections: stopping together, they drain their appends through
        the chain and then close."""
        if self._peers:
            self._left = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._left.wait()

    def disconnect(self, *, abort: bool = False) -> None:
        """Close every worker's connection: they commit on their own until
        a chain is back (a hosting worker stopping or restarting).
        ``abort``: drop what was not sent yet, as a chain that dies does."""
        for peer in list(self._peers):
            if abort:
                peer.out.transport.abort()
            else:
                peer.out.transport.close()

    def protocol(self) -> asyncio.Protocol:
        """The protocol of one worker's connection: the factory the chain's
        unix server takes (``loop.create_unix_server(chain.protocol, path)``)."""
        return _Peer(self)

    def _left_by(self, peer: _Peer) -> None:
        self._peers.discard(peer)
        if not self._peers:
            self._left.set()

    def _append(self, peer: _Peer, uid: int, appends: list[Any],
                checked: tuple[int, int]) -> None:
        try:
            # The worker checked the limits (a process of the same gateway,
            # with the same configuration): not again here, on the one core
            # every commit goes through.
            on_settle = functools.partial(peer.settled, uid)
            if isinstance(self.writer, ChainWriter):
                self.writer.enqueue_wire(appends, checked, on_settle)
            else:
                self.writer.enqueue([decode_append(a) for a in appends], checked, own=False,
                                    on_settle=on_settle)
        except PolyportError as exc:
            peer.out.put(encode_failure(uid, exc))

    def _committed(self, base: int, t0: datetime, rows: list[tuple[Any, ...]]) -> None:
        """Every worker hears of every commit, in commit order, before the
        commit's appenders get their results (those are settled after this).
        For a batch planned from the wire form: :meth:`_committed_wire`."""
        self.health.ok()
        self.tell_peers(base, t0, rows)
        if self._notifier is not None:
            self._notifier.committed(base + len(rows))

    def _committed_wire(self, base: int, t0: int, n: int, rows: list[list[Any]] | None) -> None:
        """:meth:`_committed` for a batch planned from the wire: ``t0`` in
        µs, the rows already in the wire's layout when a worker wanted them
        as the batch was planned."""
        self.health.ok()
        self.tell_peers_wire(base, t0, n, rows)
        if self._notifier is not None:
            self._notifier.committed(base + n)

    def rows_wanted(self) -> bool:
        """Whether a worker wants the rows of commits (its tailer feeds
        live subscribers)."""
        return any(peer.wants_rows for peer in self._peers)

    def tell_peers_wire(self, base: int, t0: int, n: int, rows: list[list[Any]] | None) -> None:
        """:meth:`tell_peers` for a commit planned from the wire form."""
        self._tell(base, t0, n, rows, None)

    def tell_peers(self, base: int, t0: datetime, rows: list[tuple[Any, ...]]) -> None:
        self._tell(base, us(t0), len(rows), None, rows)

    def _tell(self, base: int, t0: int, n: int, encoded: list[list[Any]] | None,
              rows: list[tuple[Any, ...]] | None) -> None:
        # The writer's running totals ride on every commit: the worker that
        # counts commits shows them in /metrics (a refusal is followed by
        # the commit that retried it).
        st = self.writer.stats
        planned, refused = st.planned_commits, st.planned_refused
        head = [COMMIT, base, t0, n, None, planned, refused]
        full: list[Any] | None = None
        for peer in self._peers:
            if peer.wants_rows:
                if full is None:
                    if encoded is None and rows is not None:
                        encoded = encode_rows(rows)
                    # None: this worker asked for rows after the batch was
                    # planned; its tailer reads this commit back instead.
                    full = head if encoded is None else [
                        COMMIT, base, t0, n, encoded, planned, refused]
                peer.out.put(full)
            else:
                peer.out.put(head)


# --- a worker's side --------------------------------------------------------------------


@dataclass(slots=True)
class _Unit:
    appends: tuple[Append, ...]
    future: asyncio.Future[list[AppendResult]]
    events: int
    cost: int
    queued_at: float
    deadline: float


class _ChainConnection(_Messages):
    """A worker's connection to the chain, on the worker's side."""

    def __init__(self, client: ChainClient) -> None:
        super().__init__()
        self._client = client

    def received(self, messages: list[list[Any]]) -> None:
        self._client._received(messages)


# (base position, first recorded_at, event count, the rows or None)
OnCommit = Callable[[int, datetime, int, list[tuple[Any, ...]] | None], None]


class ChainClient:
    """A worker's writer when a commit chain runs: the same ``submit`` as
    :class:`~core.writer.Writer`, answered by the chain, or by ``local``
    while the chain is unreachable."""

    def __init__(self, local: Writer, connect: Connect, on_commit: OnCommit,
                 wants_rows: Callable[[], bool], *, counts_commits: bool = True) -> None:
        self.local = local
        self.limits = local.limits
        self._connect = connect
        self._on_commit = on_commit
        self._wants_rows = wants_rows
        # Several workers see every commit: one of them counts them.
        self._counts_commits = counts_commits
        self._stats = WriterStats()
        # The chain writer's running totals as last heard on this connection.
        self._chain_planned = (0, 0)
        self._units: dict[int, _Unit] = {}
        self._next_uid = 0
        self._events = 0
        self._bytes = 0
        self._out: _Outbox | None = None
        self._sent_want: bool | None = None
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._observer: Callable[[CommitObservation], None] | None = None
        self.connected = asyncio.Event()

    # --- what the store and telemetry read ---------------------------------------------

    @property
    def observer(self) -> Callable[[CommitObservation], None] | None:
        return self._observer

    @observer.setter
    def observer(self, fn: Callable[[CommitObservation], None] | None) -> None:
        self._observer = fn
        self.local.observer = fn

    @property
    def stats(self) -> WriterStats:
        """The chain's commits (counted by the one worker with
        ``counts_commits``) and this worker's own, made while the chain was
        away."""
        own, chain = self.local.stats, self._stats
        merged = WriterStats(own.commits + chain.commits, own.events + chain.events,
                             chain.last_batch_size or own.last_batch_size)
        merged.batch_sizes.extend(chain.batch_sizes or own.batch_sizes)
        merged.planned_commits = own.planned_commits + chain.planned_commits
        merged.planned_refused = own.planned_refused + chain.planned_refused
        return merged

    @property
    def queue_depth(self) -> int:
        return self._events + self.local.queue_depth

    @property
    def queued_bytes(self) -> int:
        return self._bytes + self.local.queued_bytes

    @property
    def appends_in_flight(self) -> int:
        """Units sent to the chain and not answered yet, and the local
        writer's own."""
        return len(self._units) + self.local.appends_in_flight

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.local.start()
        self._task = asyncio.create_task(self._run(), name="polyport-chain-client")
        self._expiry = asyncio.create_task(self._expire(), name="polyport-chain-timeouts")

    async def drain_and_stop(self) -> None:
        """Wait for the chain's answers to what was sent (bounded), then stop."""
        self._closing = True
        pending = [u.future for u in self._units.values()]
        if pending:
            await asyncio.wait(pending, timeout=self.limits.commit_timeout + 5)
        if self._out is not None and self._task is not None:
            # Ends the connection rather than resetting it: the chain keeps
            # sending every commit's news, and closing with those unread
            # would reset it (a warning in the chain's log at every stop).
            # The chain closes its side on this end of input; the reader
            # task then sees the end and stops.
            with contextlib.suppress(OSError, RuntimeError):
                self._out.transport.write_eof()
            await asyncio.wait([self._task], timeout=1.0)
        for task in (self._task, self._expiry):
            if task is not None:
                task.cancel()
        if self._out is not None:
            self._out.transport.close()
        self._lost()  # anything still unanswered goes to the local writer
        await self.local.drain_and_stop()

    async def _run(self) -> None:
        delay = RECONNECT_MIN
        while not self._closing:
            try:
                _, proto = await self._connect(functools.partial(_ChainConnection, self))
            except OSError as exc:
                log.debug("commit chain not reachable: %s", exc)
                await asyncio.sleep(delay)
                delay = min(RECONNECT_MAX, delay * 2)
                continue
            proto = cast(_ChainConnection, proto)
            assert proto.transport is not None
            delay = RECONNECT_MIN
            self._out = _Outbox(proto.transport)
            self._sent_want = None
            self._feed()
            self.connected.set()
            log.info("appends go through the commit chain")
            try:
                await proto.lost
            finally:
                proto.transport.close()
                self.connected.clear()
                self._lost()
            if not self._closing:
                log.warning("the commit chain went away; this worker commits on its own "
                            "until it is back")

    def _received(self, messages: list[list[Any]]) -> None:
        """What the chain sent in one write: commits' news and results."""
        origins: list[str] = []
        sizes: list[int] = []
        waits: list[float] = []
        oks: list[bool] = []
        now = time.monotonic()
        units = self._units
        for msg in messages:
            kind = msg[0]
            if kind == COMMIT:
                self._commit(msg[1], msg[2], msg[3], msg[4])
                if len(msg) > 6:
                    self._planned_totals(msg[5], msg[6])
                continue
            unit = units.pop(msg[1], None)
            if unit is None:
                continue
            self._events -= unit.events
            self._bytes -= unit.cost
            ok = kind == RESULT
            if not unit.future.done():
                if ok:
                    unit.future.set_result(decode_results(unit.appends, msg[2]))
                else:
                    unit.future.set_exception(decode_failure(msg[2], msg[3], msg[4]))
            origins.append(unit.appends[0].origin if unit.appends else "core")
            sizes.append(unit.events)
            waits.append(now - unit.queued_at)
            oks.append(ok)
        if origins and self._observer is not None:
            try:
                self._observer(CommitObservation(0, 0.0, origins, sizes, waits, oks,
                                                 commit=False))
            except Exception:  # metrics never fail an append
                log.exception("commit observer failed")
        self._feed()

    def _commit(self, base: int, t0: int, n: int, rows: list[Any] | None) -> None:
        if self._counts_commits:
            st = self._stats
            st.commits += 1
            st.events += n
            st.last_batch_size = n
            st.batch_sizes.append(n)
        try:
            self._on_commit(base, from_us(t0), n, None if rows is None else decode_rows(rows))
        except Exception:  # the commit stands; the tailer reads it back
            log.exception("handling a commit of the chain failed")

    def _planned_totals(self, planned: int, refused: int) -> None:
        """The chain writer's running totals of commits at planned positions
        and refusals: what grew since the last commit is added here, so the
        counters only rise, across a new chain process too (its totals
        start again from zero, on a new connection)."""
        if not self._counts_commits:
            return
        last_planned, last_refused = self._chain_planned
        st = self._stats
        st.planned_commits += planned - last_planned
        st.planned_refused += refused - last_refused
        self._chain_planned = (planned, refused)

    def _feed(self) -> None:
        want = self._wants_rows()
        if want != self._sent_want and self._out is not None:
            self._sent_want = want
            self._out.put([FEED, want])

    def _lost(self) -> None:
        """The chain's connection is gone: its unanswered units go to the
        local writer, oldest first (a unit it committed is found there by
        its event ids and answered with what was recorded)."""
        self._out = None
        # The next chain's totals start from its own zero.
        self._chain_planned = (0, 0)
        units = list(self._units.values())
        self._units.clear()
        self._events = self._bytes = 0
        for unit in units:
            if unit.future.done():
                continue
            try:
                local = self.local.enqueue(unit.appends)
            except PolyportError as exc:
                unit.future.set_exception(exc)
                continue
            local.add_done_callback(functools.partial(_pass_on, dst=unit.future))

    async def _expire(self) -> None:
        """Fail units the chain has not answered in time: it may be stuck
        rather than gone.  Their outcome is unknown."""
        interval = min(1.0, self.limits.commit_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for uid, unit in list(self._units.items()):
                if now > unit.deadline:
                    del self._units[uid]
                    self._events -= unit.events
                    self._bytes -= unit.cost
                    if not unit.future.done():
                        unit.future.set_exception(unconfirmed(self.limits))

    # --- appends ------------------------------------------------------------------------

    async def submit(self, appends: Sequence[Append]) -> list[AppendResult]:
        return await self.enqueue(appends)

    def enqueue(self, appends: Sequence[Append]) -> asyncio.Future[list[AppendResult]]:
        """Send ``appends`` as one unit without awaiting, as
        :meth:`~core.writer.Writer.enqueue`: refusals raise at once, the
        future gets the outcome."""
        if self._closing:
            raise StorageUnavailable("the store is shutting down; retry against a running gateway")
        out = self._out
        if out is None or not self.local.idle:
            # The chain is away, or the local writer still holds appends
            # from while it was: those must commit first.
            return self.local.enqueue(appends)
        limits = self.limits
        n, size, cost = admit(appends, limits, self._events, self._bytes)
        fut: asyncio.Future[list[AppendResult]] = out.loop.create_future()
        uid = self._next_uid
        self._next_uid += 1
        now = time.monotonic()
        # The chain's writer times out at commit_timeout; this bound is for
        # a chain that no longer answers at all.
        self._units[uid] = _Unit(tuple(appends), fut, n, cost, now,
                                 now + limits.commit_timeout + 5)
        self._events += n
        self._bytes += cost
        out.put([APPEND, uid, [encode_append(a) for a in appends], size, cost])
        return fut


def _pass_on(src: asyncio.Future[list[AppendResult]], *,
             dst: asyncio.Future[list[AppendResult]]) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.set_exception(StorageUnavailable("the store shut down before this append committed"))
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())
