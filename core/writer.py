"""Group commit: one writer task per process takes every append waiting at that
moment into one transaction.

Every transaction moves the head row, and becomes visible only after the one
before it (it either takes the head row first, or, at planned positions,
waits for the commit before and checks the head is where that one left it),
so positions are gapless and follow commit order.  Each append's
expected-version and idempotency checks run against the state as the batch
has built it so far: an append that fails its check fails alone; an
``AppendBatch`` succeeds or fails as a whole.  Those decisions are
:mod:`core.planner`'s (no I/O); this module queues, batches and writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from polyport.core import sql
from polyport.core.aio import Wakeup
from polyport.core.chain_wire import from_us, us
from polyport.core.commands import Append, AppendResult
from polyport.core.errors import (
    Busy,
    Malformed,
    PolyportError,
    StorageUnavailable,
    Timeout,
)
from polyport.core.events import RecordedEvent, new_event_id
from polyport.core.health import Health
from polyport.core.limits import EventLimits, check_appends
from polyport.core.planner import ONE_MICROSECOND, EventKey, Plan, StreamState, plan_batch
from polyport.core.records import record_from_row
from polyport.core.retry import Outage, connection_lost, reconnecting

log = logging.getLogger("polyport.writer")

# Seconds of moving the head first after a commit at planned positions found
# it moved (Writer._head_moved), doubling up to the maximum while it recurs.
PLANNED_BACKOFF = 1.0
PLANNED_BACKOFF_MAX = 60.0
# Times a checked commit is redone after a deadlock before its appends fail.
CHECKED_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class WriterLimits:
    max_pending_events: int = 50_000
    # Bytes of bodies, headers and names accepted but not yet sent to the
    # database: with the event bound alone, 50,000 events of 1 MiB each
    # could queue 50 GB.
    max_pending_bytes: int = 256 << 20
    max_batch_events: int = 10_000
    max_batch_bytes: int = 32 << 20
    max_event_bytes: int = 16 << 20
    cached_streams: int = 100_000
    # Batches in flight at once, each on its own connection.  With 2, the
    # next batch is planned and encoded while the previous one is in the
    # database; the head row still makes them commit one after another.
    pipeline_depth: int = 2
    # Commit at planned positions (sql.APPEND_AT) whenever this writer knows
    # where the head stands: the events of consecutive commits are inserted
    # in parallel and only the head's move and the WAL flush are serialised.
    # Off: every fast commit moves the head first (sql.FAST_APPEND).
    planned_positions: bool = True
    commit_timeout: float = 30.0
    slow_commit_seconds: float = 1.0
    events: EventLimits = field(default_factory=EventLimits)


@dataclass(slots=True)
class Pending:
    appends: tuple[Append, ...]
    # Its outcome: a list of AppendResult, or for a unit queued in its wire
    # form, those results encoded for the wire (core/chain_writer.py).
    future: asyncio.Future[Any]
    events: int
    size: int
    deadline: float
    queued_at: float = 0.0
    # Bytes held for it until sent (bodies, headers, names): max_pending_bytes.
    cost: int = 0
    # False: another worker's unit, queued by the commit chain this writer
    # hosts; that worker reports it in its own metrics.
    own: bool = True
    # Told of the outcome in the same event-loop turn as the future is
    # settled, once (see Writer.enqueue).
    on_settle: Callable[[asyncio.Future[Any]], None] | None = None
    told: bool = False
    # The unit in the commit chain's wire form (core/chain_wire.py), which
    # core/chain_writer.py plans from; None once the writer's usual paths
    # need its Appends.  A unit another worker sent has no Appends (empty
    # ``appends``) until then.
    wire: list[Any] | None = None

    def tell(self, fut: asyncio.Future[Any]) -> None:
        if not self.told and self.on_settle is not None:
            self.told = True
            self.on_settle(fut)


@dataclass(frozen=True, slots=True)
class CommitObservation:
    """What one pass of the writer did; handed to ``Writer.observer``.

    The submitted units it settled (each an Append or an AppendBatch) are
    the lists' entries, one per unit in every list: columns rather than an
    object per unit, which with the observer's per-unit work was 3 % of a
    worker's W1 samples."""

    events: int  # events written by this commit
    seconds: float  # time spent committing
    origins: list[str]  # each unit's protocol
    sizes: list[int]  # its events
    waits: list[float]  # seconds from its submission to its outcome
    ok: list[bool]  # whether it succeeded
    # False: appends answered by the commit chain (core/chain.py), whose
    # commits this process did not make (events and seconds are 0 then).
    commit: bool = True


@dataclass
class WriterStats:
    commits: int = 0
    events: int = 0
    last_batch_size: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=256))
    # Commits made at planned positions (sql.APPEND_AT), and those refused
    # because the head was not where the commit before was to leave it.
    planned_commits: int = 0
    planned_refused: int = 0


@dataclass(slots=True)
class FastPlan:
    """A batch planned for the fast path: its one statement (less the
    commit's token, drawn when it is sent), the arguments of the same batch
    at planned positions (:func:`at_args`), the stream states it leaves
    (remembered while it commits), and what settles its units once it has
    (a :class:`~core.planner.Plan`, or a subclass's own)."""

    statement: str
    args: list[Any]
    # n, document, bodies, then new streams' contexts and names and the
    # producer checkpoints' four columns, each None when there are none.
    parts: list[Any]
    after: dict[tuple[str, str], StreamState]
    plan: Any


# Where the head stands after a commit: (last position, last recorded_at in
# microseconds since the epoch, the commit's token).
Head = tuple[int, int, uuid.UUID]


def fast_statement(
    n: int, document: str, bodies: bytes, new: Sequence[tuple[str, str]],
    cp_producers: list[Any], cp_contexts: list[str], cp_streams: list[str],
    cp_levels: list[int],
) -> tuple[str, list[Any], list[Any]]:
    """The fast path's statement and arguments (core/sql.py, _fast_append),
    and the parts that :func:`at_args` makes sql.APPEND_AT's from: ``n`` rows
    in ``document``, their ``bodies``, the streams they create and the
    producer checkpoints they move, one per (producer, stream)."""
    args: list[Any] = [n, document, bodies]
    parts: list[Any] = [n, document, bodies]
    if new:
        new_contexts, new_streams = [k[0] for k in new], [k[1] for k in new]
        args += [new_contexts, new_streams]
        parts += [new_contexts, new_streams]
    else:
        parts += [None, None]
    if cp_producers:
        args += [cp_producers, cp_contexts, cp_streams, cp_levels]
        parts += [cp_producers, cp_contexts, cp_streams, cp_levels]
    else:
        parts += [None, None, None, None]
    return _FAST_APPEND[bool(new), bool(cp_producers)], args, parts


def ticket(token: uuid.UUID) -> int:
    """A commit's advisory lock key (sql.APPEND_AT): its token's first 64 bits."""
    return int.from_bytes(token.bytes[:8], "big", signed=True)


def at_args(parts: list[Any], base: int, t0: datetime, after: uuid.UUID,
            this: uuid.UUID) -> list[Any]:
    """sql.APPEND_AT's arguments: the batch at positions ``base`` + 1..., its
    first event recorded at ``t0``, following the commit ``after``."""
    return [*parts[:3], base, t0, after, this, ticket(this), ticket(after), *parts[3:]]


class Writer:
    def __init__(
        self,
        dsn: str,
        limits: WriterLimits | None = None,
        # Told of each commit that wrote events: (base position, first
        # recorded_at, the rows as planned), in commit order.
        on_commit: Callable[[int, datetime, list[tuple[Any, ...]]], None] | None = None,
        health: Health | None = None,
    ) -> None:
        self._dsn = dsn
        self.limits = limits or WriterLimits()
        self._queue: deque[Pending] = deque()
        # Events accepted but not yet sent to the database: the queue plus
        # batches planned while their predecessor commits.  max_pending_events
        # bounds this.
        self._waiting_events = 0
        # The same units' bytes (see Pending.cost); max_pending_bytes bounds it.
        self._waiting_bytes = 0
        self._wake = Wakeup()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._inflight: dict[int, list[Pending]] = {}
        # The (context, stream) keys of each slot's batch while it commits on
        # the fast path; None while it takes the checked path.
        self._inflight_keys: dict[int, set[tuple[str, str]] | None] = {}
        # Outcomes of a batch, settled only after the next batch may go to
        # the database, so waking the appenders never delays the next commit.
        self._settle: dict[int, list[tuple[Pending, list[Any] | PolyportError]]] = {}
        self._last_done: asyncio.Future[None] | None = None
        self._closing = False
        self._on_commit = on_commit
        self.stats = WriterStats()
        self._outage = Outage("writer", log, health)
        # Optional: called after every commit (metrics); must not block.
        self.observer: Callable[[CommitObservation], None] | None = None
        # The writer's own connections, one per batch in flight: taking one
        # from the pool per commit costs a reset round trip each time.
        self._conns: list[asyncpg.Connection | None] = [None] * self.limits.pipeline_depth
        self._free_slots: deque[int] = deque(range(self.limits.pipeline_depth))
        # Whether the slot's current attempt sent anything to the database:
        # a connection lost before that stored nothing; after it, the commit's
        # outcome is unknown until checked (_resolve).
        self._statement_sent: list[bool] = [False] * self.limits.pipeline_depth
        # Last known state of recently written streams, for the fast path.
        # Another process can only move a stream past what is cached (events
        # are never deleted), which the database's unique index refuses.  The
        # cache can be *ahead* of the database only through this writer's own
        # optimistic entries for a batch that then failed: every failure
        # forgets the cache and bumps the epoch, and a batch planned under an
        # older epoch takes the checked path instead of the fast one.
        self._streams: OrderedDict[tuple[str, str], StreamState] = OrderedDict()
        self._cache_epoch = 0
        # Where the head will stand after the last batch planned for the fast
        # path (a future: known at once for a commit at planned positions,
        # when its statement returns for one that moves the head first), or
        # None when that is not known (no commit yet, the checked path, or
        # after a failure): the next batch then moves the head first.
        self._head: asyncio.Future[Head | None] | None = None
        # Commits at planned positions resume at this time (time.monotonic())
        # after one found the head moved by another process (_head_moved).
        self._planned_after = 0.0
        self._backoff = PLANNED_BACKOFF
        self._refused_at = -1e9

    @property
    def queue_depth(self) -> int:
        return self._waiting_events

    @property
    def queued_bytes(self) -> int:
        """Bytes held for appends accepted but not yet sent (max_pending_bytes)."""
        return self._waiting_bytes

    @property
    def appends_in_flight(self) -> int:
        """Append requests accepted and not yet answered: queued, or in a
        batch that is committing."""
        return len(self._queue) + sum(len(b) for b in self._inflight.values())

    def start(self) -> None:
        # Kept: asyncio.get_running_loop() costs a getpid() system call per
        # call on Python 3.11, once per append here.
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="polyport-writer")
        self._expiry = asyncio.create_task(self._expire(), name="polyport-writer-timeouts")

    async def _expire(self) -> None:
        """Fail appends not confirmed by their deadline.  A queued one was
        never sent (and now never will be: _take_batch skips it), so nothing
        was stored; a committing one's outcome is unknown."""
        interval = min(1.0, self.limits.commit_timeout / 4)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for p in self._queue:
                if now > p.deadline and not p.future.done():
                    p.future.set_exception(
                        Timeout(
                            f"append not sent within {self.limits.commit_timeout:.0f}s "
                            "(queued behind a slow or unreachable database); nothing was "
                            "stored: resending is safe"
                        )
                    )
            for p in (q for b in self._inflight.values() for q in b):
                if now > p.deadline and not p.future.done():
                    p.future.set_exception(unconfirmed(self.limits))

    async def drain_and_stop(self) -> None:
        """Commit everything already accepted, then stop."""
        self._closing = True
        self._wake.set()
        abandoned = False
        if self._task is not None:
            # Bounded: a commit stuck on a lock must not hang shutdown forever.
            # What is abandoned was never acknowledged, so nothing is lost.
            try:
                async with asyncio.timeout(self.limits.commit_timeout + 5):
                    await asyncio.shield(self._task)
            except TimeoutError:
                log.error("writer did not drain in time; %d queued events were not "
                          "committed and their clients got storage_unavailable",
                          self._waiting_events)
                self._task.cancel()
                abandoned = True
                err = StorageUnavailable("the store shut down before this append committed")
                for p in (*self._queue, *(q for b in self._inflight.values() for q in b)):
                    if not p.future.done():
                        p.future.set_exception(err)
        if self._expiry is not None:
            self._expiry.cancel()
        if abandoned:
            for conn in self._conns:
                if conn is not None and not conn.is_closed():
                    conn.terminate()
        else:
            await self.close()

    async def submit(self, appends: Sequence[Append]) -> list[AppendResult]:
        return await self.enqueue(appends)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in flight: every append submitted so
        far has its outcome."""
        return not self._queue and not self._inflight

    def enqueue(
        self, appends: Sequence[Append], checked: tuple[int, int] | None = None,
        *, own: bool = True,
        on_settle: Callable[[asyncio.Future[list[AppendResult]]], None] | None = None,
    ) -> asyncio.Future[list[AppendResult]]:
        """Queue ``appends`` as one unit without awaiting: the future gets the
        outcome.  Refusals (limits, a full queue, shutdown) raise at once.
        The commit chain (core/chain.py) queues a worker's units this way,
        one callback each instead of one task each, passing as ``checked``
        the (size, cost) the worker's own :func:`check_appends` returned.

        ``on_settle`` is called once with the settled future: when a commit
        settles it, in that same turn, right after the commit's
        ``on_commit`` (a done-callback would run a turn later, after
        whatever the loop had ready, on a busy worker hosting the chain);
        otherwise (a failure, an expiry) as the future's done-callback."""
        self._refuse_if_closing()
        n, size, cost = admit(appends, self.limits, self._waiting_events,
                              self._waiting_bytes, checked)
        return self._queue_unit(tuple(appends), n, size, cost, own, on_settle,
                                self._wire_form(appends))

    def _refuse_if_closing(self) -> None:
        if self._closing:
            raise StorageUnavailable("the store is shutting down; retry against a running gateway")

    def _wire_form(self, appends: Sequence[Append]) -> list[Any] | None:
        """What a unit of ``appends`` keeps besides them (Pending.wire):
        nothing here; core/chain_writer.py's hosted writer encodes them."""
        return None

    def _queue_unit(
        self, appends: tuple[Append, ...], n: int, size: int, cost: int, own: bool,
        on_settle: Callable[[asyncio.Future[Any]], None] | None, wire: list[Any] | None,
    ) -> asyncio.Future[Any]:
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        deadline = loop.time() + self.limits.commit_timeout
        pending = Pending(appends, fut, n, size, deadline, time.monotonic(), cost, own,
                           on_settle, False, wire)
        if on_settle is not None:
            fut.add_done_callback(pending.tell)
        self._queue.append(pending)
        self._waiting_events += n
        self._waiting_bytes += cost
        self._wake.set()
        # The deadline is enforced by _expire(): one timer for all waiters is
        # much cheaper than a wait_for() per append.
        return fut

    # --- the writer loop ------------------------------------------------------

    async def _run(self) -> None:
        """Take batches and commit them, with up to ``pipeline_depth`` commits
        in flight on separate connections: while PostgreSQL executes one, this
        process plans the next.  The head-row lock still orders the commits."""
        running: set[asyncio.Task[None]] = set()
        loop = self._loop
        assert loop is not None  # set by start(), which started this task
        while True:
            if not self._queue or not self._free_slots:
                if self._closing and not self._queue and not running:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            # With every slot free, share the queue out so that the batches
            # overlap (plan one while the other commits) instead of one big
            # batch leaving the other slot idle.
            batch = self._take_batch(len(self._free_slots))
            if not batch:
                continue
            slot = self._free_slots.popleft()
            # Batches reach the database in the order they were taken: each
            # waits for its predecessor before its first statement, so a later
            # batch's fallback can never overtake an earlier batch.  Only a
            # batch that shares no stream with any batch in flight is sent at
            # once (see _commit): it waits in PostgreSQL on the head row lock
            # instead of in this process's event loop.
            previous = self._last_done
            self._last_done = loop.create_future()
            task = loop.create_task(
                self._commit_batch(batch, slot, previous, self._last_done)
            )
            running.add(task)
            task.add_done_callback(lambda t: self._finished(running, t))

    def _finished(self, running: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
        # Wake the loop again once the task is out of ``running``: the wake
        # in _commit_batch comes before this callback, and a closing writer
        # that looked then saw the task still running and slept for good.
        running.discard(task)
        self._wake.set()

    async def _commit_batch(
        self,
        batch: list[Pending],
        slot: int,
        previous: asyncio.Future[None] | None,
        done_future: asyncio.Future[None],
    ) -> None:
        self._inflight[slot] = batch
        self._settle[slot] = []
        events = sum(p.events for p in batch)
        cost = sum(p.cost for p in batch)
        _when_done(previous, lambda: self._sent(events, cost))
        started = time.monotonic()
        written = self.stats.events
        try:
            await self._commit_or_isolate(batch, slot, previous)
        finally:
            # The next batch may go to the database now; then wake this one's
            # appenders (their callbacks queue behind the next batch's send).
            # "Done" means this batch and every earlier one: a batch sent
            # ahead can finish before its predecessor, and the batch after it,
            # planned on the predecessor's expected stream states, must still
            # wait for the predecessor.
            _when_done(previous, lambda: done_future.set_result(None))
            for p, outcome in self._settle.pop(slot):
                fut = p.future
                if fut.done():
                    continue
                if p.on_settle is not None:
                    # Told just below, in this turn.  Its done-callback (the
                    # catch-all for outcomes settled elsewhere) would only cost
                    # a callback on the loop, one per unit the chain commits,
                    # that finds it told.
                    fut.remove_done_callback(p.tell)
                if isinstance(outcome, PolyportError):
                    fut.set_exception(outcome)
                else:
                    fut.set_result(outcome)
                p.tell(fut)
            del self._inflight[slot]
            self._inflight_keys.pop(slot, None)
            self._free_slots.append(slot)
            self._wake.set()
        done = time.monotonic()
        elapsed = done - started
        if elapsed > self.limits.slow_commit_seconds:
            log.warning("slow commit: %.2fs for %d events", elapsed, sum(p.events for p in batch))
        if self.observer is not None:
            self._observe(batch, self.stats.events - written, elapsed, done)

    def _sent(self, events: int, cost: int) -> None:
        self._waiting_events -= events
        self._waiting_bytes -= cost

    def _observe(self, batch: list[Pending], events: int, elapsed: float, done: float) -> None:
        assert self.observer is not None
        origins: list[str] = []
        sizes: list[int] = []
        waits: list[float] = []
        ok: list[bool] = []
        for p in batch:
            if p.own:
                f = p.future
                origins.append(p.appends[0].origin if p.appends else "core")
                sizes.append(p.events)
                waits.append(done - p.queued_at)
                ok.append(f.done() and not f.cancelled() and f.exception() is None)
        try:
            self.observer(CommitObservation(events, elapsed, origins, sizes, waits, ok))
        except Exception:  # metrics must never stop the writer
            log.exception("commit observer failed")

    async def _commit_or_isolate(
        self, batch: list[Pending], slot: int, previous: asyncio.Future[None] | None = None
    ) -> None:
        """Commit a batch; if the database refuses it for a reason other than a
        lost connection, commit each unit alone so one bad append cannot fail
        its neighbours."""
        if not await self._attempt(batch, slot, previous, may_isolate=True):
            return
        log.warning("group commit refused; retrying its %d appends one by one", len(batch))
        for p in batch:
            if not p.future.done():
                await self._attempt([p], slot, None, may_isolate=False)

    async def _attempt(
        self,
        batch: list[Pending],
        slot: int,
        previous: asyncio.Future[None] | None,
        *,
        may_isolate: bool,
    ) -> bool:
        """One commit of ``batch``, every outcome settled; True when the
        database refused the group as a whole and its units should be tried
        one by one."""
        self._statement_sent[slot] = False
        try:
            await self._commit(batch, slot, previous)
            return False
        except Exception as exc:  # noqa: BLE001 - every failure settles the batch's units
            if not connection_lost(exc):
                if may_isolate and len(batch) > 1 and isinstance(exc, asyncpg.PostgresError):
                    log.warning("group commit refused: %s", exc)
                    self._forget_streams()
                    return True
                self._fail(batch, exc, slot)
                return False
            self._drop_connection(slot)
            if not self._statement_sent[slot]:
                # Lost before anything was sent: certainly not stored.
                self._fail(batch, exc, slot)
                await asyncio.sleep(0.05)  # the database is away: do not spin
                return False
            lost = exc
        await self._resolve(batch, slot, lost)
        return False

    async def _resolve(self, batch: list[Pending], slot: int, lost: BaseException) -> None:
        """The connection went away after the transaction was sent: it may
        have committed.  Find out by the batch's event ids, waiting for the
        database until the earliest deadline among the batch's appends.

        Stored: the batch is run again on the checked path, which finds
        every id and answers each append with what was recorded (writing
        nothing new: a batch commits whole or not at all).  Not stored: the
        appends fail, and the message says so; resending is then safe."""
        self._materialize(batch)
        self._forget_streams()
        contexts, ids = _event_keys(batch)
        keys = {(a.context, a.stream) for p in batch for a in p.appends}
        loop = asyncio.get_running_loop()
        log.warning("commit outcome unknown (%s: %s); checking whether its %d events were "
                    "stored", type(lost).__name__, lost, len(ids))
        while not all(p.future.done() for p in batch):
            stored = False
            left = min(p.deadline for p in batch if not p.future.done()) - loop.time()
            try:
                async for attempt in reconnecting(self._outage, within=max(0.0, left)):
                    with attempt:
                        try:
                            conn = await self._connection(slot)
                            stored = bool(ids) and bool(
                                await conn.fetchval(sql.ANY_EVENT_ID_STORED, contexts, ids)
                            )
                            if stored or not ids:
                                await self._commit_checked(batch, keys, slot)
                        except BaseException:
                            self._drop_connection(slot)
                            raise
            except Exception as exc:  # noqa: BLE001 - every failure settles the batch's units
                if connection_lost(exc):
                    self._fail_unknown(batch, exc)
                else:
                    self._fail(batch, exc, slot)
                return
            self._outage.recovered()
            if not stored and ids:
                log.warning("commit outcome resolved: not stored (%d events)", len(ids))
                err = StorageUnavailable(
                    f"the connection to the database was lost during the commit ({lost}); "
                    "checked: nothing from this commit was stored, so resending is safe"
                )
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)
            return

    def _fail_unknown(self, batch: list[Pending], exc: BaseException) -> None:
        err = Timeout(
            "outcome unknown: the connection to the database was lost during the commit "
            f"and the database stayed unreachable for {self.limits.commit_timeout:.0f}s "
            f"({exc}); the append may or may not be stored: resend it with the same event "
            "ids (such resends are idempotent; see docs/errors.md)"
        )
        for p in batch:
            if not p.future.done():
                p.future.set_exception(err)

    def _forget_streams(self) -> None:
        self._streams.clear()
        self._cache_epoch += 1
        # Batches already planned at positions after a failed one fail in
        # PostgreSQL; the next one moves the head first.
        self._head = None

    def _fail(self, batch: list[Pending], exc: BaseException, slot: int) -> None:
        """Settle ``batch`` with a failure known to have stored nothing."""
        self._forget_streams()
        err: PolyportError
        if isinstance(exc, asyncpg.DataError):
            err = Malformed(f"the database rejected this append's data: {exc}")
        elif isinstance(exc, PolyportError):
            err = exc
        elif isinstance(exc, asyncpg.PostgresError) or connection_lost(exc):
            log.error("append transaction failed: %s", exc)
            err = StorageUnavailable(f"storage error, nothing from this commit was stored: {exc}")
        else:
            log.error("append batch failed", exc_info=exc)
            err = StorageUnavailable(f"internal error, nothing from this commit was stored: {exc}")
        if connection_lost(exc):
            self._outage.failed(exc)
        for p in batch:
            if not p.future.done():
                p.future.set_exception(err)

    def _drop_connection(self, slot: int) -> None:
        """Forget a slot's connection after it failed in a way that may have
        left it unusable (the next commit opens a fresh one)."""
        conn = self._conns[slot]
        self._conns[slot] = None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    def _take_batch(self, share: int = 1) -> list[Pending]:
        """Take up to 1/``share`` of the queued events (at least one unit),
        within the batch limits."""
        batch: list[Pending] = []
        events = size = 0
        max_events = self.limits.max_batch_events
        if share > 1:
            queued = sum(p.events for p in self._queue)
            max_events = min(max_events, -(-queued // share))
        while self._queue:
            p = self._queue[0]
            if batch and (
                events + p.events > max_events
                or size + p.size > self.limits.max_batch_bytes
            ):
                break
            self._queue.popleft()
            if p.future.done():  # cancelled, or expired while queued
                self._sent(p.events, p.cost)
                continue
            batch.append(p)
            events += p.events
            size += p.size
        return batch

    async def _connection(self, slot: int) -> asyncpg.Connection:
        conn = self._conns[slot]
        if conn is None or conn.is_closed():
            conn = self._conns[slot] = await asyncpg.connect(
                self._dsn, timeout=min(10.0, self.limits.commit_timeout)
            )
        return conn

    async def close(self) -> None:
        for conn in self._conns:
            if conn is not None and not conn.is_closed():
                await conn.close()

    # --- committing -------------------------------------------------------------

    async def _commit(
        self, batch: list[Pending], slot: int, previous: asyncio.Future[None] | None = None
    ) -> None:
        """Fast path first: plan against the cached stream states and write
        everything in one statement that also checks those states.  Anything
        unusual (a failed check, a re-sent event id, a stale cache) is redone
        on the authoritative path, which reads fresh state under the head lock."""
        keys = self._batch_keys(batch)
        epoch = self._cache_epoch
        fast = self._plan_fast(batch, keys)
        # At planned positions when the batch before it on the fast path
        # tells where the head will stand and is still in flight: this commit
        # inserts while that one is in PostgreSQL, waits for it there, and
        # fails if it failed.  With nothing in flight there is nothing to
        # overlap, and moving the head first is the cheaper statement (one
        # event per commit: 95-145 against 145-170 us of PostgreSQL's CPU,
        # docs/performance.md, session 21).
        after = self._head
        mine: asyncio.Future[Head | None] | None = None
        if fast is not None:
            assert self._loop is not None  # set by start(), which runs _commit
            mine = self._loop.create_future()
        self._head = mine
        planned = (
            mine is not None and after is not None and self.limits.planned_positions
            and previous is not None and not previous.done()
            and time.monotonic() >= self._planned_after
        )
        # Sent ahead of its predecessor's outcome only when every batch in
        # flight is on the fast path and touches none of its streams: then
        # its plan rests on committed state alone, whatever happens to the
        # others, and the head row lock in PostgreSQL queues it behind them.
        # This takes the event loop's latency (a busy gateway's ready queue)
        # out of the gap between two commits.  The price: when a
        # predecessor's fast path fails in the database and is redone, this
        # batch's events (other streams only) take earlier positions.  Every
        # stream keeps its order, and so do appends sent after another's ack.
        ahead = (
            fast is not None
            and not planned
            and previous is not None
            and not previous.done()
            and all(
                k is not None and keys.isdisjoint(k)
                for s, k in self._inflight_keys.items()
                if s != slot
            )
        )
        self._inflight_keys[slot] = keys if fast is not None else None
        if fast is not None:
            assert mine is not None
            # Optimistic: the next batch, planned while this one is in flight,
            # builds on it.  If this one fails, the epoch moves on and the
            # next one takes the checked path.
            for k, st in fast.after.items():
                self._remember(k, st)
            try:
                if await self._try_fast(batch, fast, slot, epoch, mine,
                                        after if planned else None,
                                        None if ahead else previous):
                    return
            finally:
                if not mine.done():
                    mine.set_result(None)
        if previous is not None:
            await previous
        for attempt in range(CHECKED_ATTEMPTS):
            try:
                await self._commit_checked(batch, keys, slot)
                return
            except asyncpg.TransactionRollbackError as exc:
                # A deadlock with a commit at planned positions of another
                # process (see _head_moved); rolled back, so it can be redone.
                if attempt == CHECKED_ATTEMPTS - 1:
                    raise
                log.info("checked commit rolled back, redoing it: %s", exc)

    async def _try_fast(
        self, batch: list[Pending], fast: FastPlan, slot: int, epoch: int,
        mine: asyncio.Future[Head | None], after: asyncio.Future[Head | None] | None,
        previous: asyncio.Future[None] | None,
    ) -> bool:
        """The fast path, at planned positions following ``after`` if given,
        else moving the head first once ``previous`` is done: True when the
        batch committed, False when it is for the checked path."""
        try:
            if after is not None:
                written = await self._write_at(fast, slot, after, mine, epoch)
            else:
                written = await self._write_fast(fast, slot, previous, epoch, mine)
        except asyncpg.UniqueViolationError as exc:
            # A re-sent event id, or a stream another process moved on; at
            # planned positions also a position another process took.
            if after is not None and exc.constraint_name == "events_pkey":
                self.stats.planned_refused += 1
                self._head_moved(exc, epoch)
            self._forget_streams()
            return False
        except asyncpg.TransactionRollbackError as exc:
            # Nothing stored.  At planned positions: the commit before failed,
            # or another process committed in between.  Or two commits in
            # flight met on one row: a deadlock, which only commits at planned
            # positions can make (the others take the head row first).
            if after is not None:
                self.stats.planned_refused += 1
                self._head_moved(exc, epoch)
            self._forget_streams()
            return False
        except asyncpg.PostgresError:
            self._forget_streams()
            raise
        if written is None:
            return False
        if after is not None and previous is not None:
            # Settled in commit order: the commit before has committed (this
            # one waited for it in PostgreSQL), but its reply, on another
            # connection, can be handled after this one's.  Told out of
            # order, tailers would read back what they could fan out from
            # memory.
            await previous
        self._finish_fast(batch, fast, *written, slot)
        return True

    def _head_moved(self, exc: BaseException, epoch: int) -> None:
        """A commit at planned positions was refused.  Unless this writer
        already knows why (a failure before it: its cache was forgotten
        since), another process may be committing on the same database, and
        each planned commit would be inserted in vain and could meet one of
        its commits on a row (a deadlock PostgreSQL ends after
        deadlock_timeout): move the head first for a while, longer each time
        it happens again soon."""
        if self._cache_epoch != epoch:
            return
        now = time.monotonic()
        if now - self._refused_at < 4 * self._backoff:
            self._backoff = min(2 * self._backoff, PLANNED_BACKOFF_MAX)
        else:
            self._backoff = PLANNED_BACKOFF
        self._refused_at = now
        self._planned_after = now + self._backoff
        log.info("commit at planned positions refused, moving the head first for %.0fs: %s",
                 self._backoff, exc)

    def _batch_keys(self, batch: list[Pending]) -> set[tuple[str, str]]:
        return {(a.context, a.stream) for p in batch for a in p.appends}

    def _materialize(self, batch: list[Pending]) -> None:
        """Give every unit of ``batch`` its Appends (see Pending.wire)."""

    def _plan_fast(self, batch: list[Pending], keys: set[tuple[str, str]]) -> FastPlan | None:
        """The fast path's statement for ``batch``, planned against the
        cached stream states; None when the batch needs the checked path."""
        plan = plan_batch(batch, {k: self._streams.get(k) or StreamState() for k in keys}, {})
        if not plan.rows or plan.any_failed:
            return None
        rows = plan.rows
        bodies: list[bytes] = []
        offset = 0
        doc: list[list[Any]] = []
        for r in rows:
            body = r[6]
            size = len(body)
            bodies.append(body)
            # orjson writes the event id (a UUID) and the client time (an
            # aware datetime, RFC 3339) in forms the statement's casts read.
            # The order is the statement's (core/sql.py, _fast_append).
            doc.append([r[0], r[4], r[5], r[7], r[8], r[9], r[1], r[2], r[3], r[10],
                        offset, size])
            offset += size
        # Planned as new from the cache; one that exists after all conflicts
        # harmlessly here (and its events' versions do not, see FAST_APPEND).
        new = plan.new_streams()
        cps = plan.checkpoints
        return FastPlan(
            *fast_statement(len(rows), orjson.dumps(doc).decode(), b"".join(bodies), new,
                            [c[0] for c in cps], [c[1] for c in cps], [c[2] for c in cps],
                            [c[3] for c in cps]),
            {k: plan.after[k] for k in plan.touched}, plan)

    async def _write_fast(
        self, fast: FastPlan, slot: int, previous: asyncio.Future[None] | None, epoch: int,
        mine: asyncio.Future[Head | None],
    ) -> tuple[int, datetime] | None:
        """Moving the head first: (base position, first recorded_at), or None
        if the plan was made against cache entries that a failure has since
        withdrawn."""
        # Planning ran while the previous batch was in the database.
        if previous is not None:
            await previous
        if self._cache_epoch != epoch:
            return None
        conn = await self._connection(slot)
        self._statement_sent[slot] = True
        this = new_event_id()
        row = await conn.fetchrow(fast.statement, *fast.args, this)
        base: int = row["base"]
        t0: datetime = row["t0"]
        n = fast.parts[0]
        mine.set_result((base + n, us(t0) + n - 1, this))
        return base, t0

    async def _write_at(
        self, fast: FastPlan, slot: int, after: asyncio.Future[Head | None],
        mine: asyncio.Future[Head | None], epoch: int,
    ) -> tuple[int, datetime] | None:
        """At planned positions, following the batch before, which may still
        be in flight: (base position, first recorded_at), or None when that
        batch did not commit as planned (this one's plan may rest on it)."""
        head = await after
        if head is None or self._cache_epoch != epoch:
            return None
        base, last_us, token = head
        n = fast.parts[0]
        # Strictly after the commit before, and from this process's clock
        # rather than the database's: the events are inserted before this
        # commit knows when the one before it ends.
        t0_us = max(last_us + 1, time.time_ns() // 1000)
        this = new_event_id()
        mine.set_result((base + n, t0_us + n - 1, this))
        t0 = from_us(t0_us)
        conn = await self._connection(slot)
        self._statement_sent[slot] = True
        await conn.execute(sql.APPEND_AT, *at_args(fast.parts, base, t0, token, this))
        self.stats.planned_commits += 1
        return base, t0

    def _finish_fast(
        self, batch: list[Pending], fast: FastPlan, base: int, t0: datetime, slot: int
    ) -> None:
        assert isinstance(fast.plan, Plan)
        self._finish(batch, fast.plan, base, t0, slot)

    async def _commit_checked(
        self, batch: list[Pending], keys: set[tuple[str, str]], slot: int
    ) -> None:
        self._materialize(batch)
        contexts, ids = _event_keys(batch)
        conn = await self._connection(slot)
        self._statement_sent[slot] = True
        async with conn.transaction():
            head = await conn.fetchrow(sql.LOCK_HEAD)
            state = {k: StreamState() for k in keys}
            ks = sorted(keys)
            for r in await conn.fetch(sql.STREAM_STATES, [k[0] for k in ks], [k[1] for k in ks]):
                state[(r["context"], r["stream"])] = StreamState(
                    r["last_version"], r["segment_length"]
                )
            existing: dict[EventKey, RecordedEvent] = {}
            if ids:
                for r in await conn.fetch(sql.EXISTING_EVENT_IDS, contexts, ids):
                    existing[(r["context"], r["event_id"])] = record_from_row(r)
            plan = plan_batch(batch, state, existing)
            base: int = head["last_position"]
            t0: datetime = max(head["last_recorded_at"] + ONE_MICROSECOND, head["now"])
            if plan.rows:
                n = len(plan.rows)
                records = [
                    (base + i + 1, *r[:5], json.dumps(r[5]), *r[6:9],
                     t0 + i * ONE_MICROSECOND, r[9], r[10])
                    for i, r in enumerate(plan.rows)
                ]
                await conn.copy_records_to_table(
                    "events", records=records, columns=sql.EVENT_COLUMNS
                )
                new = plan.new_streams()
                if new:
                    await conn.execute(
                        sql.INSERT_STREAMS, [k[0] for k in new], [k[1] for k in new], head["now"]
                    )
                await conn.execute(
                    sql.UPDATE_HEAD, base + n, t0 + (n - 1) * ONE_MICROSECOND
                )
            for cp in plan.checkpoints:
                await conn.execute(sql.UPSERT_PRODUCER_CHECKPOINT, *cp)
        # Fresh from the database, as this commit left them.
        for k, before in state.items():
            st = plan.after.get(k, before)
            if st.last_version:
                self._remember(k, st)
        self._finish(batch, plan, base, t0, slot)

    def _remember(self, key: tuple[str, str], st: StreamState) -> None:
        self._streams[key] = st
        self._streams.move_to_end(key)
        while len(self._streams) > self.limits.cached_streams:
            self._streams.popitem(last=False)

    def _count_commit(self, n: int) -> None:
        stats = self.stats
        stats.commits += 1
        stats.events += n
        stats.last_batch_size = n
        stats.batch_sizes.append(n)

    def _finish(
        self, batch: list[Pending], plan: Plan, base: int, t0: datetime, slot: int
    ) -> None:
        n = len(plan.rows)
        self._count_commit(n)
        settle = self._settle[slot]
        for p, outcome in zip(batch, plan.outcomes, strict=True):
            if p.future.done():
                continue
            if isinstance(outcome, PolyportError):
                settle.append((p, outcome))
            else:
                settle.append((p, [r.resolve(base, t0) for r in outcome]))
        if n and self._on_commit is not None:
            self._on_commit(base, t0, plan.rows)


def admit(
    appends: Sequence[Append], limits: WriterLimits, waiting_events: int, waiting_bytes: int,
    checked: tuple[int, int] | None = None,
) -> tuple[int, int, int]:
    """(events, body bytes, cost) of a submission that the limits and a queue
    holding ``waiting_events`` / ``waiting_bytes`` admit; else Malformed,
    TooLarge or Busy.  ``checked``: (size, cost) from an earlier
    :func:`check_appends` of the same appends.  Both bounds apply only to a
    queue that holds something: one append within the per-event limits is
    always admitted on its own."""
    n = sum(len(a.events) for a in appends)
    size, cost = checked or check_appends(appends, limits.events, limits.max_event_bytes)
    check_room(limits, waiting_events, waiting_bytes, n, cost)
    return n, size, cost


def check_room(limits: WriterLimits, waiting_events: int, waiting_bytes: int, n: int,
               cost: int) -> None:
    """Busy unless a queue holding ``waiting_events`` / ``waiting_bytes``
    has room for ``n`` more events costing ``cost`` bytes."""
    if waiting_events and waiting_events + n > limits.max_pending_events:
        raise Busy(f"writer queue full ({waiting_events} events waiting); retry shortly")
    if waiting_bytes and waiting_bytes + cost > limits.max_pending_bytes:
        raise Busy(f"writer queue full ({waiting_bytes} bytes waiting, max_pending_bytes "
                   f"{limits.max_pending_bytes}); retry shortly")


def unconfirmed(limits: WriterLimits) -> Timeout:
    """An append sent for commit but not confirmed in time: its outcome is
    unknown to the client."""
    return Timeout(
        f"append not confirmed within {limits.commit_timeout:.0f}s; outcome unknown: it may "
        "still commit. Resend with the same event ids (such resends are idempotent; see "
        "docs/errors.md)"
    )


def _event_keys(batch: list[Pending]) -> tuple[list[str], list[uuid.UUID]]:
    """The batch's (context, event id) pairs as two parallel lists."""
    contexts: list[str] = []
    ids: list[uuid.UUID] = []
    for p in batch:
        for a in p.appends:
            contexts.extend(a.context for _ in a.events)
            ids.extend(e.event_id for e in a.events)
    return contexts, ids


def _when_done(previous: asyncio.Future[None] | None, then: Callable[[], None]) -> None:
    """``then()`` once the previous batch is done: now if it already is (or
    there is none), else from its done callback."""
    if previous is None or previous.done():
        then()
    else:
        previous.add_done_callback(lambda _: then())


_FAST_APPEND = {
    (False, False): sql.FAST_APPEND,
    (True, False): sql.FAST_APPEND_NEW_STREAMS,
    (False, True): sql.FAST_APPEND_CHECKPOINTS,
    (True, True): sql.FAST_APPEND_NEW_STREAMS_CHECKPOINTS,
}


