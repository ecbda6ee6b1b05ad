"""EventStore: the one entry point protocol adapters call."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import asyncpg

from polyport.core import migrate, sql
from polyport.core.binders import BinderQuery, BinderService
from polyport.core.chain import ChainClient, CommitChain, Connect
from polyport.core.chain_wire import decode_rows, from_us
from polyport.core.chain_writer import ChainWriter
from polyport.core.commands import (
    Append,
    AppendBatch,
    AppendResult,
    FromBeginning,
    FromEnd,
    FromPosition,
    FromTime,
    FromVersion,
    Principal,
    ReadSegment,
    ReadStream,
    SegmentChunk,
    Selector,
    Start,
    Subscribe,
)
from polyport.core.db import Db
from polyport.core.errors import (
    Busy,
    Malformed,
    NotFound,
    PolyportError,
    StorageUnavailable,
    Timeout,
)
from polyport.core.events import RecordedEvent
from polyport.core.groups import ConsumerGroup, GroupMember
from polyport.core.health import (
    DEFAULT_STALE_AFTER,
    SCHEMA_CHECK_INTERVAL,
    Health,
    HealthSnapshot,
)
from polyport.core.limits import (
    DurableLimits,
    check_durable_name,
    check_name,
    check_selector,
    durable_principal_quota_exceeded,
    durable_quota_exceeded,
)
from polyport.core.locks import GroupLocks
from polyport.core.matcher import event_matcher
from polyport.core.migrate import asyncpg_dsn
from polyport.core.monitor import Monitor
from polyport.core.notify import Notifier, new_notify_group
from polyport.core.parking import ParkedEvent, Parking, SubscriptionSettings, start_from_json
from polyport.core.records import record_from_row
from polyport.core.segments import segment_chunk_from_live, segment_frame
from polyport.core.subscriptions import Subscription, Tailer
from polyport.core.users import UserService
from polyport.core.writer import Writer, WriterLimits

log = logging.getLogger("polyport.store")


@dataclass(frozen=True)
class StoreConfig:
    database_url: str
    pool_min: int = 2
    pool_max: int = 20
    poll_interval: float = 1.0
    # At most one NOTIFY per interval: under load it coalesces many commits
    # into one wake-up for other processes (in-process readers are woken
    # directly at commit).  Bounds their extra latency to this interval.
    notify_interval: float = 0.005
    writer: WriterLimits = field(default_factory=WriterLimits)
    # Bound on concurrent reads; more waiting than this and reads answer Busy.
    max_concurrent_reads: int = 16
    max_waiting_reads: int = 256
    read_timeout: float = 30.0
    allow_anonymous: bool = True
    # The only contexts an anonymous connection may use; the first is its default.
    anonymous_contexts: tuple[str, ...] = ("default",)
    run_binders: bool = True
    # Readiness (core.health): the schema revision is checked at start and
    # then this often, off the request path.
    schema_check_interval: float = SCHEMA_CHECK_INTERVAL
    # How to reach the commit chain of a multi-process gateway
    # (core/chain.py); None: this process's own writer commits.
    chain: Connect | None = None
    # Whether this process counts the chain's commits in its writer stats
    # (every worker hears of every commit; one of them counts).
    chain_counts_commits: bool = True
    # This process's writer is the commit chain the other workers feed
    # (core/chain.py, "hosted"): :attr:`EventStore.chain` serves them.
    hosts_chain: bool = False
    # The processes that hear of this one's commits without a NOTIFY
    # (core/notify.py): a gateway's workers fed by one commit chain.
    # None: a group of its own.
    notify_group: int | None = None
    # pg_stat_activity's name for this store's sessions (serving gateways use
    # migrate.GATEWAY_APPLICATION_NAME); None: the URL's own, if any.
    application_name: str | None = None
    # Durable names and how many a context may hold (core.limits).
    durable: DurableLimits = field(default_factory=DurableLimits)


@dataclass(frozen=True, slots=True)
class FetchSubscription:
    """A durable, fetch-style subscription (Res01): read from the checkpoint,
    then progress it explicitly."""

    id: int
    context: str
    name: str
    selector: Selector
    checkpoint: int


# Fetch subscriptions whose state a store keeps between FEs (a bound: a
# subscription it no longer knows takes the full path once, nothing worse).
MAX_KNOWN_FETCHES = 4096


@dataclass(slots=True)
class _KnownFetch:
    """What a store last knew of a fetch subscription it served: enough to
    take an FE's batch from memory and record it in the one round trip that
    checks this still holds (sql.FETCH_STATE_RECORDING)."""

    sub: FetchSubscription
    selector: str  # as stored (jsonb's text), for the statement to compare
    retries: bool  # max_retries set: every FE counts its attempt, the full path


def selector_to_json(selector: Selector) -> dict[str, Any]:
    return {
        "context": selector.context,
        "stream": selector.stream,
        "prefix": selector.prefix,
        "types": sorted(selector.types),
        "matcher": selector.matcher_spec,
    }


def selector_from_json(data: dict[str, Any]) -> Selector:
    spec = data.get("matcher")
    return Selector(
        context=data.get("context"),
        stream=data.get("stream"),
        prefix=data.get("prefix"),
        types=frozenset(data.get("types") or ()),
        matcher=event_matcher(spec) if spec else None,
        matcher_spec=spec,
    )


def durable_context(selector: Selector) -> str:
    """The context a durable subscription's name belongs to: names are scoped
    by context, so a durable subscription must name exactly one."""
    if selector.context is None:
        raise Malformed("a durable subscription or consumer group must name one context")
    return selector.context


async def _nothing_to_reset(_conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query (advisory unlock, CLOSE
    ALL, UNLISTEN, RESET ALL): one round trip saved on every pooled
    statement.  Pooled connections never carry session state: advisory locks
    (core.locks) and LISTEN (the tailer) use connections of their own, and
    nothing SETs session variables.  asyncpg still rolls back a transaction
    left open before calling this."""


def _subscription_row(row: Mapping[str, Any] | None, sub_id: int) -> Mapping[str, Any]:
    if row is None:
        raise NotFound(f"no subscription with id {sub_id}")
    return row


def _fetch_subscription(row: Mapping[str, Any]) -> FetchSubscription:
    """A subscription row (GET_SUBSCRIPTION_BY_ID, FETCH_STATE) as a FetchSubscription."""
    return FetchSubscription(row["id"], row["context"], row["name"],
                             selector_from_json(json.loads(row["selector"])), row["checkpoint"])


class EventStore:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._dsn = asyncpg_dsn(config.database_url)
        if config.application_name is not None:
            self._dsn = migrate.with_application_name(self._dsn, config.application_name)
        self._pool: asyncpg.Pool = None
        # Request paths query through _db (lost connections raised as
        # StorageUnavailable); the writer, tailer and locks own their retries.
        self._db: Db = None  # type: ignore[assignment]
        self.writer: Writer | ChainClient = None  # type: ignore[assignment]
        # The commit chain this store hosts for the other workers, if any.
        self.chain: CommitChain | None = None
        self.tailer: Tailer = None  # type: ignore[assignment]
        self.users: UserService = None  # type: ignore[assignment]
        self.binders: BinderService = None  # type: ignore[assignment]
        self.monitor: Monitor = None  # type: ignore[assignment]
        self.parking: Parking = None  # type: ignore[assignment]
        # Keyed by (context, name): group names are the context's own.
        self._groups: dict[tuple[str, str], ConsumerGroup] = {}
        # Failure counts of groups whose last member left, for the next group
        # with that key (a lone consumer that keeps crashing on an event must
        # reach max_retries too).  In this process only.
        self._kept_retries: dict[tuple[str, str], dict[int, int]] = {}
        self._group_locks = GroupLocks(self._dsn)
        self._reads = asyncio.Semaphore(config.max_concurrent_reads)
        self._waiting_reads = 0
        group = new_notify_group() if config.notify_group is None else config.notify_group
        # A chain client's own writer commits only while the chain is away:
        # its siblings hear of those commits by NOTIFY alone.
        self._notifier = Notifier(self._dsn, config.notify_interval, group,
                                  always=config.chain is not None)
        # The tailer polls at least every poll interval when idle.
        self._health = Health(stale_after=max(DEFAULT_STALE_AFTER, 3 * config.poll_interval))
        self._schema_task: asyncio.Task[None] | None = None
        self._schema_wake = asyncio.Event()
        # The schema revision as the newest check saw it (None until the
        # first), and this code's head: /status reads them from here.
        self.schema_revision: str | None = None
        self.schema_head: str = migrate.head_revision()
        self.started = False
        # Optional: called with each event handed to a subscriber or fetched
        # by a fetch-style subscription (delivery metrics).
        self.on_deliver: Callable[[Sequence[RecordedEvent]], None] | None = None
        # Optional, called in the caller's task (the gateway's per-connection
        # counters): events appended, a login, a subscription handed out.
        self.on_append: Callable[[int], None] | None = None
        self.on_login: Callable[[Principal], None] | None = None
        self.on_subscribe: Callable[[Subscription | GroupMember], None] | None = None
        self._handed_out: weakref.WeakSet[Subscription | GroupMember] = weakref.WeakSet()
        # What this store last knew of each fetch subscription it served,
        # for FEs that record their batch in the round trip that checks it.
        self._fetch_known: dict[int, _KnownFetch] = {}

    # --- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn, min_size=self.config.pool_min, max_size=self.config.pool_max,
                reset=_nothing_to_reset,
            )
        except (OSError, asyncpg.PostgresError) as exc:
            raise StorageUnavailable(
                f"cannot connect to PostgreSQL ({exc}); check --database-url and that the "
                "server is running"
            ) from exc
        self._db = Db(self._pool)
        self.tailer = Tailer(self._pool, self._dsn, self.config.poll_interval, self._health,
                             notify_group=self._notifier.group)
        self.tailer.on_schema_change = self._schema_wake.set
        await self.tailer.start()
        local: Writer
        if self.config.hosts_chain:
            local = ChainWriter(
                self._dsn, self.config.writer, on_commit=self._committed,
                on_wire_commit=self._wire_committed, wants_rows=self._rows_wanted,
                health=self._health, hosted=True)
            self.chain = CommitChain(self._dsn, writer=local)
        else:
            local = Writer(self._dsn, self.config.writer, on_commit=self._committed,
                           health=self._health)
        if self.config.chain is None:
            self.writer = local
        else:
            tailer = self.tailer
            self.writer = ChainClient(
                local, self.config.chain, self._chain_committed,
                lambda: tailer.feeding, counts_commits=self.config.chain_counts_commits)
        self.writer.start()
        self._notifier.start()
        # Readiness and /status know the schema from the start (the watcher
        # looks again at once, harmlessly, then every interval).
        await self._check_schema()
        self._schema_task = asyncio.create_task(self._watch_schema(), name="polyport-schema")
        self.users = UserService(
            self._db,
            allow_anonymous=self.config.allow_anonymous,
            anonymous_contexts=self.config.anonymous_contexts,
        )
        self.monitor = Monitor(self._pool)
        self.parking = Parking(self._db)
        self.binders = BinderService(self, run_projector=self.config.run_binders)
        await self.binders.start()
        self.started = True

    async def close(self) -> None:
        """Commit what was accepted, save checkpoints, release everything."""
        if not self.started:
            return
        self.started = False
        await self.writer.drain_and_stop()
        for group in list(self._groups.values()):
            await group.flush()
        await self.binders.stop()
        self._notifier.stop()
        if self._schema_task is not None:
            self._schema_task.cancel()
        await self.tailer.stop()
        await self._group_locks.close()
        await self._pool.close()

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def db(self) -> Db:
        return self._db

    @property
    def reads_waiting(self) -> int:
        """Reads waiting for (or holding) a read slot."""
        return self._waiting_reads

    # --- appends ------------------------------------------------------------

    async def append(self, command: Append) -> AppendResult:
        results = await self.writer.submit([command])
        self._appended([command])
        return results[0]

    def start_append(self, command: Append) -> asyncio.Future[list[AppendResult]]:
        """:meth:`append` without a coroutine: queued now (refusals raise
        here), the future gets the writer's outcome.  For a protocol that
        answers from a callback or its reply queue, which saves a task per
        append (docs/performance.md)."""
        fut = self.writer.enqueue([command])
        fut.add_done_callback(functools.partial(self._started_append_done, command))
        return fut

    def _started_append_done(self, command: Append,
                             fut: asyncio.Future[list[AppendResult]]) -> None:
        # The outcome is retrieved here: a caller whose connection closed
        # before it looked (a BSON reply queue ended by a fatal error) leaves
        # no "exception was never retrieved" behind.
        if not fut.cancelled() and fut.exception() is None:
            self._appended([command])

    async def append_batch(self, command: AppendBatch) -> list[AppendResult]:
        if not command.appends:
            raise Malformed("an append batch needs at least one append")
        results = await self.writer.submit(command.appends)
        self._appended(command.appends)
        return results

    def _appended(self, appends: list[Append] | tuple[Append, ...]) -> None:
        if self.on_append is not None:
            self.on_append(sum(len(a.events) for a in appends))

    def _committed(self, base: int, t0: datetime, rows: list[tuple[Any, ...]]) -> None:
        self._health.ok()
        self.tailer.committed(base, t0, rows)
        if self.chain is not None:
            self.chain.tell_peers(base, t0, rows)
        self._notifier.committed(base + len(rows))

    def _wire_committed(self, base: int, t0: int, n: int, rows: list[list[Any]] | None) -> None:
        """:meth:`_committed` for a batch the hosted chain planned from the
        wire form (core/chain_writer.py): ``t0`` in µs, the rows in the
        wire's layout when someone wanted them as it was planned."""
        self._chain_committed(base, from_us(t0), n, None if rows is None else decode_rows(rows))
        if self.chain is not None:
            self.chain.tell_peers_wire(base, t0, n, rows)
        self._notifier.committed(base + n)

    def _rows_wanted(self) -> bool:
        return self.tailer.feeding or (self.chain is not None and self.chain.rows_wanted())

    def _chain_committed(self, base: int, t0: datetime, n: int,
                         rows: list[tuple[Any, ...]] | None) -> None:
        """The commit chain committed ``n`` events at ``base + 1 …`` (it
        notifies other gateways itself)."""
        self._health.ok()
        if rows is not None:
            self.tailer.committed(base, t0, rows)
        else:
            self.tailer.notify(base + n)

    # --- health -------------------------------------------------------------

    def health(self) -> HealthSnapshot:
        """Database reachability and schema currency as the store last saw
        them (writer commits, tailer polls, the schema timer): no round trip."""
        return self._health.snapshot()

    async def _watch_schema(self) -> None:
        """The schema revision against this code's head: at once, then every
        ``schema_check_interval`` seconds (a migration run while serving, or
        a downgrade, shows up in readiness), and at once when a migration
        announces itself (sql.SCHEMA_CHANNEL)."""
        while True:
            await self._check_schema()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.schema_check_interval):
                    await self._schema_wake.wait()
            self._schema_wake.clear()

    async def _check_schema(self) -> None:
        head = self.schema_head
        try:
            # On the pool itself: core.db would translate the missing table.
            async with asyncio.timeout(5.0):
                current = await self._pool.fetchval(sql.SCHEMA_REVISION)
        except asyncpg.UndefinedTableError:
            self.schema_revision = None
            self._health.ok()
            self._health.schema(migrate.schema_behind(None, head))
        except Exception as exc:  # noqa: BLE001 - timeout, lost connection: the database's health
            self._health.failed("schema check", exc)
        else:
            self.schema_revision = current
            self._health.ok()
            problem = migrate.schema_behind(current, head)
            if problem != self._health.snapshot().schema_problem and self.started:
                if problem is None:
                    log.warning("schema back at %s: ready again", head)
                else:
                    log.warning("schema changed under the gateway, not ready: %s", problem)
            self._health.schema(problem)

    # --- reads --------------------------------------------------------------

    async def _read(self, query: str, *args: Any) -> list[asyncpg.Record]:
        if self._waiting_reads >= self.config.max_waiting_reads:
            raise Busy("too many reads waiting; retry shortly", reader=True)
        self._waiting_reads += 1
        try:
            async with self._reads:
                try:
                    async with asyncio.timeout(self.config.read_timeout):
                        rows: list[asyncpg.Record] = await self._db.fetch(query, *args)
                    return rows
                except TimeoutError:
                    raise Timeout(
                        f"read took longer than {self.config.read_timeout:.0f}s", reader=True
                    ) from None
        finally:
            self._waiting_reads -= 1

    def _check_stream(self, context: str, stream: str) -> None:
        check_name(context, "context", self.config.writer.events)
        check_name(stream, "stream name", self.config.writer.events)

    async def read_stream(self, command: ReadStream) -> list[RecordedEvent]:
        self._check_stream(command.context, command.stream)
        rows = await self._read(
            sql.READ_STREAM,
            command.context,
            command.stream,
            max(1, command.from_version),
            max(0, command.max_count),
        )
        return [record_from_row(r) for r in rows]

    async def read_all(self, after_position: int = 0, max_count: int = 1000) -> list[RecordedEvent]:
        rows = await self._read(sql.READ_ALL_AFTER, after_position, max_count)
        return [record_from_row(r) for r in rows]

    async def stream_state(self, context: str, stream: str) -> tuple[int, int] | None:
        """(last version, segment length in bytes), or None if the stream does not exist."""
        self._check_stream(context, stream)
        row = await self._stream_row(context, stream)
        if row["last_version"] is None:
            return None
        return row["last_version"], row["segment_length"]

    async def _stream_row(self, context: str, stream: str) -> asyncpg.Record:
        """sql.STREAM_STATE's row: the stream's state and the log head (the
        names checked by the caller)."""
        return (await self._read(sql.STREAM_STATE, context, stream))[0]

    async def read_segment(self, command: ReadSegment) -> SegmentChunk:
        """Bytes of the stream's segment view from ``offset``; at most
        ``max_bytes`` unless a single event is larger (then that event).

        A held read (``command.held``) whose offset the tailer's memory
        holds (Tailer.recent_segment) is answered from there, as its wait
        would be: the events after ``offset``, or at the tail the head the
        wait starts from.  No round trip."""
        tailer = self.tailer
        tailer.want_recent()
        self._check_stream(command.context, command.stream)
        if command.held and (recent := tailer.recent_segment(
                command.context, command.stream, command.offset)) is not None:
            if not recent:  # the stream's last event in memory ends at ``offset``
                return SegmentChunk(command.offset, b"", True, command.offset, command.offset,
                                    tailer.head)
            chunk = segment_chunk_from_live(command.offset, recent, command.max_bytes)
            if chunk is not None:
                return chunk
        state = await self._stream_row(command.context, command.stream)
        tail = state["segment_length"] or 0
        if command.offset < 0 or command.offset > tail:
            raise Malformed(f"offset {command.offset} is outside the segment (length {tail})")
        if command.offset == tail:
            return SegmentChunk(command.offset, b"", True, tail, tail, int(state["head"]))
        limit = max(1, min(1000, command.max_bytes // 64 + 1))
        rows = await self._read(
            sql.READ_SEGMENT_FROM, command.context, command.stream, command.offset, limit
        )
        out = bytearray()
        end = command.offset
        for r in rows:
            ev = record_from_row(r)
            framed = segment_frame(ev)
            start = command.offset - ev.segment_offset if ev.segment_offset < command.offset else 0
            piece = framed[start:]
            if out and len(out) + len(piece) > command.max_bytes:
                break
            out += piece
            end = ev.segment_offset + len(framed)
        return SegmentChunk(command.offset, bytes(out), end >= tail, end, tail)

    async def producer_ack_level(self, producer_id: uuid.UUID, context: str, stream: str) -> int:
        rows = await self._read(sql.GET_PRODUCER_CHECKPOINT, producer_id, context, stream)
        return int(rows[0]["ack_level"]) if rows else 0

    # --- subscriptions ------------------------------------------------------

    async def resolve_start(self, selector: Selector, start: Start) -> int:
        """The cursor (last position *not* to deliver) for a start point."""
        if isinstance(start, FromBeginning):
            return 0
        if isinstance(start, FromEnd):
            return int(await self._db.fetchval(sql.HEAD_POSITION))
        if isinstance(start, FromPosition):
            return max(0, start.position)
        if isinstance(start, FromTime):
            return int(await self._db.fetchval(sql.POSITION_BEFORE_TIME, start.time))
        if isinstance(start, FromVersion):
            if selector.stream is None or selector.context is None:
                raise Malformed("a start version needs an exact stream and context")
            pos = await self._db.fetchval(
                sql.POSITION_BEFORE_VERSION, selector.context, selector.stream, start.version
            )
            if pos is None:
                return int(await self._db.fetchval(sql.HEAD_POSITION))
            return int(pos)
        raise Malformed(f"unknown start {start!r}")

    def start_subscription(
        self, selector: Selector, cursor: int, *, buffer_size: int = 1000, credit: bool = False
    ) -> Subscription:
        """A running subscription from ``cursor``, not handed out: no delivery
        hook and not listed by :meth:`open_subscriptions` (a consumer group's
        feed; :meth:`subscribe` adds both for what clients get)."""
        sub = Subscription(self.tailer, selector, cursor, buffer_size, credit)
        sub.start()
        return sub

    async def subscribe(
        self, command: Subscribe, *, credit: bool = False, owner: str | None = None
    ) -> Subscription | GroupMember:
        """Catch-up then live.  With ``credit=True`` nothing is handed out
        beyond what :meth:`grant` allowed.  A durable name returns a group
        member, whose acks move the persistent checkpoint.  ``owner``
        (core.limits.durable_owner) is who creates a missing durable row, held
        to the per-principal quota; None: the operator's or core's own."""
        if command.durable is None:
            self._check_names(command.selector)
            cursor = await self.resolve_start(command.selector, command.start)
            sub = self.start_subscription(
                command.selector, cursor, buffer_size=command.buffer_size, credit=credit
            )
            sub.on_deliver = self.on_deliver
            self._handed_out.add(sub)
            if self.on_subscribe is not None:
                self.on_subscribe(sub)
            return sub
        context = durable_context(command.selector)
        await self._ensure_durable(context, command.durable, command.selector, command.start,
                                   owner=owner)
        key = (context, command.durable)
        group = self._groups.get(key)
        if group is None:
            group = ConsumerGroup(
                self, self._group_locks, context, command.durable, command.selector
            )
            group.retries.update(self._kept_retries.pop(key, {}))
            self._groups[key] = group
        member = GroupMember(group, command.buffer_size, credit)
        member.on_deliver = self.on_deliver
        self._handed_out.add(member)
        group.add(member)
        if self.on_subscribe is not None:
            self.on_subscribe(member)
        return member

    def open_subscriptions(self) -> list[Subscription | GroupMember]:
        """Subscriptions handed out by :meth:`subscribe` and not closed yet."""
        return [s for s in list(self._handed_out) if not s.closed]

    def consumer_counts(self) -> dict[tuple[str, str], int]:
        """Consumers attached in this process to each durable subscription
        that has any, by (context, name)."""
        return {key: len(g.members) for key, g in self._groups.items() if g.members}

    def forget_group(self, group: ConsumerGroup) -> None:
        """Called by a group whose last member left: the next subscriber with
        that name starts a new group from the saved checkpoint."""
        key = (group.context, group.name)
        if self._groups.get(key) is group:
            del self._groups[key]
            if group.retries:
                self._kept_retries[key] = dict(group.retries)

    def _check_names(self, selector: Selector, name: str | None = None) -> None:
        """Every name a subscription request carries, by core.limits' rules:
        checked here so that every protocol (and the admin API) gets them."""
        check_selector(selector, self.config.writer.events)
        if name is not None:
            check_durable_name(name, self.config.durable)

    async def _ensure_durable(
        self, context: str, name: str, selector: Selector, start: Start, *, quota: bool = True,
        owner: str | None = None,
    ) -> asyncpg.Record:
        """The row of ``name`` in ``context``, created when missing; a client's
        creation (``quota``) is refused past the context's durable quota."""
        self._check_names(selector, name)
        row = await self._db.fetchrow(sql.GET_SUBSCRIPTION, context, name)
        if row is None:
            cursor = await self.resolve_start(selector, start)
            row = await self._create_durable(context, name, selector, cursor, quota, owner)
            if row is None:  # created concurrently
                row = await self._db.fetchrow(sql.GET_SUBSCRIPTION, context, name)
        elif json.loads(row["selector"]) != selector_to_json(selector):
            await self._db.execute(
                sql.UPDATE_SUBSCRIPTION_SELECTOR, row["id"], json.dumps(selector_to_json(selector))
            )
        return row

    async def _create_durable(
        self, context: str, name: str, selector: Selector, cursor: int, quota: bool,
        owner: str | None,
    ) -> asyncpg.Record | None:
        limits = self.config.durable
        per_context = limits.max_per_context if quota else 0
        per_owner = limits.max_per_principal if quota and owner is not None else 0
        args = (context, name, json.dumps(selector_to_json(selector)), cursor, owner)
        if per_context <= 0 and per_owner <= 0:
            return await self._db.fetchrow(sql.CREATE_SUBSCRIPTION, *args)
        async with self._db.acquire() as conn, conn.transaction():
            # Count and insert under the context's lock, then the creator's:
            # two creations (in any process) cannot both see room for one.
            await conn.execute(sql.DURABLE_QUOTA_LOCK, context)
            if per_owner > 0:
                await conn.execute(sql.DURABLE_PRINCIPAL_LOCK, owner)
            if await conn.fetchval(sql.GET_SUBSCRIPTION, context, name) is not None:
                return None
            if per_context > 0:
                count = int(await conn.fetchval(sql.COUNT_CONTEXT_SUBSCRIPTIONS, context))
                if count >= per_context:
                    raise durable_quota_exceeded(context, count, limits)
            if per_owner > 0:
                assert owner is not None
                mine = int(await conn.fetchval(sql.COUNT_PRINCIPAL_SUBSCRIPTIONS, owner))
                if mine >= per_owner:
                    raise durable_principal_quota_exceeded(owner, mine, limits)
            row: asyncpg.Record | None = await conn.fetchrow(sql.CREATE_SUBSCRIPTION, *args)
            return row

    # --- persistent-subscription settings and parked events (core.parking) ---

    async def create_subscription(
        self, name: str, selector: Selector, settings: SubscriptionSettings
    ) -> bool:
        """Create the durable subscription ``name`` in the selector's context
        with ``settings`` (its checkpoint placed by ``settings.start``); False
        if it exists already."""
        context = durable_context(selector)
        if await self.subscription_id(context, name) is not None:
            return False
        # The operator's own creation: not held to the clients' quota.
        row = await self._ensure_durable(
            context, name, selector, start_from_json(settings.start), quota=False
        )
        await self.parking.set_settings(int(row["id"]), settings)
        return True

    async def update_subscription(
        self, context: str, name: str, changes: dict[str, Any]
    ) -> None:
        """Change some settings of ``name`` in ``context``; the group owning
        it (here at once, in other processes within a few seconds) applies them."""
        sub_id, settings = await self.parking.settings(context, name)
        await self.parking.set_settings(sub_id, settings.merged(changes))
        self.poke_group(context, name)

    async def parked_events(self, context: str, name: str) -> list[ParkedEvent]:
        sub_id, _ = await self.parking.settings(context, name)
        return await self.parking.parked(sub_id)

    async def replay_parked(self, context: str, name: str) -> int:
        """Mark the parked events of ``name`` in ``context`` for delivery
        again; how many."""
        sub_id, _ = await self.parking.settings(context, name)
        count = await self.parking.request_replay(sub_id)
        self.poke_group(context, name)
        return count

    def poke_group(self, context: str, name: str) -> None:
        group = self._groups.get((context, name))
        if group is not None:
            group.poke()

    async def durable_checkpoint(self, context: str, name: str) -> int:
        """The saved checkpoint of the durable subscription ``name`` in ``context``."""
        row = await self._db.fetchrow(sql.GET_SUBSCRIPTION, context, name)
        if row is None:
            raise NotFound(f"no durable subscription named {name!r} in context {context!r}")
        return int(row["checkpoint"])

    async def advance_checkpoint(self, context: str, name: str, position: int) -> None:
        """Move the checkpoint of ``name`` in ``context`` forward to
        ``position`` (never back)."""
        await self._db.execute(sql.ADVANCE_CHECKPOINT, context, name, position)

    # --- fetch-style durable subscriptions (pull) ---------------------------

    async def register_fetch_subscription(
        self, name: str, selector: Selector, start: Start, *, owner: str | None = None
    ) -> FetchSubscription:
        """Idempotent: the same name in the selector's context returns the
        existing subscription.  ``owner``: as for :meth:`subscribe`."""
        row = await self._ensure_durable(durable_context(selector), name, selector, start,
                                         owner=owner)
        return FetchSubscription(
            row["id"], row["context"], row["name"], selector, row["checkpoint"]
        )

    async def get_fetch_subscription(self, sub_id: int) -> FetchSubscription:
        row = await self._db.fetchrow(sql.GET_SUBSCRIPTION_BY_ID, sub_id)
        return _fetch_subscription(_subscription_row(row, sub_id))

    async def fetch(
        self, sub_id: int, suggested_count: int, *, extend_same_time: bool = True,
        wait: float = 0.0, allowed: Callable[[FetchSubscription], None] | None = None,
    ) -> list[RecordedEvent]:
        """Up to ``suggested_count`` events after the checkpoint (more when
        later events share the last one's recorded time).  Fetching again
        without progressing returns the same batch.  Parked events marked
        for replay come first, as a batch of their own (oldest first).

        With nothing to return, a held fetch (``wait`` > 0) waits up to that
        many seconds for a commit and fetches again, so a client polling in
        a loop gets a new event when it is committed, not on its next poll.

        ``allowed`` sees the subscription before anything is read or
        recorded, and raises to refuse it (a tenant's ownership check)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            # Read before the fetch: a commit during it moves the head past.
            seen = self.tailer.head
            out = await self._fetch_once(sub_id, suggested_count, extend_same_time, allowed)
            left = deadline - loop.time()
            if out or left <= 0 or not await self.tailer.wait_beyond(seen, left):
                return out

    async def _fetch_once(
        self, sub_id: int, suggested_count: int, extend_same_time: bool,
        allowed: Callable[[FetchSubscription], None] | None = None,
    ) -> list[RecordedEvent]:
        # An FE/PS loop pays every round trip once per cycle.  One for the
        # subscription, its settings, the head and whether a replay is due,
        # and one to record the batch; a store that knows the subscription
        # from its last FE or PS does both in one (_fetch_known_batch).
        want = max(1, suggested_count)
        tailer = self.tailer
        tailer.want_recent()
        known = self._fetch_known.get(sub_id)
        row: Mapping[str, Any] | None = None
        if known is not None and not known.retries and _allows(allowed, known.sub):
            try:
                got = await self._fetch_known_batch(known, want, extend_same_time)
            except NotFound:
                self._fetch_known.pop(sub_id, None)
                raise
            if isinstance(got, list):
                return got
            row = got
        if row is None:
            row = _subscription_row(await self._db.fetchrow(sql.FETCH_STATE, sub_id), sub_id)
        sub = _fetch_subscription(row)
        if allowed is not None:
            allowed(sub)
        settings = SubscriptionSettings.from_json(json.loads(row["settings"]))
        self._know_fetch(sub, row["selector"], settings.max_retries is not None)
        out: list[RecordedEvent] = []
        # One extra round's worth so extend_same_time can see past ``want``.
        replayed = (await self.parking.fetch_replay_due(sub.id, sub.checkpoint, want + 500)
                    if row["replay_due"] else [])
        if replayed:
            _fill_batch(out, replayed, want, extend_same_time)
        elif (recent := tailer.recent_selected(sub.selector, sub.checkpoint,
                                               int(row["head"]))) is not None:
            # What committed since the last read, from the tailer's memory:
            # the events the read below returns, one round trip fewer.
            _fill_batch(out, recent, want, extend_same_time)
        else:
            head = int(row["head"])
            cursor = sub.checkpoint
            while cursor < head:
                events, last_row, exhausted = await tailer.read_selected(
                    sub.selector, cursor, head, 500
                )
                if _fill_batch(out, events, want, extend_same_time) or exhausted:
                    break
                cursor = last_row
        if out and await self._park_refetched(sub, out, settings):
            return await self._fetch_once(sub_id, suggested_count, extend_same_time, allowed)
        if out:
            await self._db.execute(
                sql.RECORD_FETCH, sub_id, out[-1].position, out[-1].recorded_at
            )
            if self.on_deliver is not None:
                self.on_deliver(out)
        return out

    async def _fetch_known_batch(
        self, known: _KnownFetch, want: int, extend_same_time: bool,
    ) -> list[RecordedEvent] | Mapping[str, Any] | None:
        """An FE in one round trip: the batch from the tailer's memory after
        the checkpoint this store last knew, recorded by a statement that
        also reads the subscription and writes only if what was known still
        holds (FETCH_STATE_RECORDING).  Returns the batch; or the row read
        (nothing recorded: the caller fetches from it, as from FETCH_STATE);
        or None when memory had nothing to offer (the caller reads the
        state as before).  The caller has asked the ownership rule of the
        known subscription: its context never changes and the statement
        checks the selector, so the rule's answer holds for the row."""
        sub = known.sub
        tailer = self.tailer
        recent = tailer.recent_selected(sub.selector, sub.checkpoint, tailer.head)
        if recent is None:
            return None
        out: list[RecordedEvent] = []
        _fill_batch(out, recent, want, extend_same_time)
        if not out:
            return None
        row = _subscription_row(await self._db.fetchrow(
            sql.FETCH_STATE_RECORDING, sub.id, sub.checkpoint, known.selector,
            out[-1].position, out[-1].recorded_at), sub.id)
        if not row["recorded"]:
            return row
        if self.on_deliver is not None:
            self.on_deliver(out)
        return out

    def _know_fetch(self, sub: FetchSubscription, selector: str, retries: bool) -> None:
        known = self._fetch_known
        if sub.id not in known and len(known) >= MAX_KNOWN_FETCHES:
            del known[next(iter(known))]  # the oldest: a bound, not a policy
        known[sub.id] = _KnownFetch(sub, selector, retries)

    def _knew_checkpoint(self, sub_id: int, checkpoint: int | None) -> None:
        """The checkpoint this store moved (a PS, a seek); None: unknown."""
        known = self._fetch_known.get(sub_id)
        if known is None:
            return
        if checkpoint is None:
            del self._fetch_known[sub_id]
        else:
            known.sub = replace(known.sub, checkpoint=checkpoint)

    async def _park_refetched(self, sub: FetchSubscription, batch: list[RecordedEvent],
                              settings: SubscriptionSettings) -> bool:
        """A fetch subscription's retry: the same batch fetched again without
        progress.  Past ``max_retries`` the batch is parked and the checkpoint
        moves past it (True: fetch the next batch instead)."""
        if settings.max_retries is None:
            return False
        fetches = await self.parking.count_fetch_attempt(sub.id, batch[-1].position)
        if fetches <= settings.max_retries + 1:  # the first fetch is no retry
            return False
        for ev in batch:
            await self.parking.park(sub.id, ev.position, fetches - 1, "fetched again")
        if batch[-1].position <= sub.checkpoint:
            # A replayed batch: the checkpoint is already past it and must
            # not move back; parking it again is all there is to do.
            await self._db.execute(sql.CLEAR_FETCH, sub.id)
        else:
            await self._db.execute(sql.SET_CHECKPOINT, sub.id, batch[-1].position)
        await self.parking.reset_fetch_attempts(sub.id)
        self._knew_checkpoint(sub.id, None)
        log.info("subscription %s: parked %d events (positions %d-%d) fetched %d times "
                 "without progress", sub.name, len(batch), batch[0].position,
                 batch[-1].position, fetches)
        return True

    async def progress(self, sub_id: int, last_event_time: datetime, *,
                       contexts: frozenset[str] | None = None,
                       allowed: Callable[[FetchSubscription], None] | None = None) -> bool:
        """Move the checkpoint past the last fetched batch if ``last_event_time``
        names it; otherwise nothing changes (idempotent).  A batch of replayed
        parked events is unparked instead (the checkpoint never moves back).
        Returns whether the batch was accepted.  ``contexts``: only a
        subscription (and selector) of these contexts moves (None: any);
        ``allowed``: when nothing moved, the same rule as a check that
        raises, on the row read to tell why (as :meth:`fetch`)."""
        listed = None if contexts is None else sorted(contexts)
        row = await self._db.fetchrow(sql.PROGRESS_FETCHED, sub_id, last_event_time, listed)
        if row is not None:
            self._knew_checkpoint(sub_id, int(row["checkpoint"]))
        else:
            sub = await self.get_fetch_subscription(sub_id)  # NotFound, rather than False
            if allowed is not None:
                allowed(sub)
        return row is not None

    async def seek(self, sub_id: int, start: Start) -> int:
        sub = await self.get_fetch_subscription(sub_id)
        cursor = await self.resolve_start(sub.selector, start)
        await self._db.execute(sql.SET_CHECKPOINT, sub_id, cursor)
        self._knew_checkpoint(sub_id, cursor)
        return cursor

    async def subscription_id(self, context: str, name: str) -> int | None:
        check_name(context, "context", self.config.writer.events)
        check_durable_name(name, self.config.durable)
        row = await self._db.fetchrow(sql.GET_SUBSCRIPTION, context, name)
        return None if row is None else int(row["id"])

    async def list_subscriptions(self) -> list[dict[str, Any]]:
        rows = await self._db.fetch(sql.LIST_SUBSCRIPTIONS)
        persistent = await self.parking.state()
        none = (SubscriptionSettings(), 0)
        return [
            {
                "id": r["id"],
                "context": r["context"],
                "name": r["name"],
                "selector": json.loads(r["selector"]),
                "checkpoint": r["checkpoint"],
                "lag_events": r["last_position"] - r["checkpoint"],
                "updated_at": r["updated_at"].isoformat(),
                "settings": persistent.get(r["id"], none)[0].as_json(),
                "parked": persistent.get(r["id"], none)[1],
            }
            for r in rows
        ]

    async def delete_subscription(self, context: str, name: str) -> bool:
        return await self._db.fetchval(sql.DELETE_SUBSCRIPTION, context, name) is not None

    # --- auth and queries ---------------------------------------------------

    async def authenticate(self, user: str | None, password: str | None) -> Principal:
        principal = await self.users.authenticate(user, password)
        if self.on_login is not None:
            self.on_login(principal)
        return principal

    async def query(self, binder: str, matcher: dict[str, Any]) -> BinderQuery:
        """Matching documents of a binder: ``.count`` now, then ``async for``."""
        return await self.binders.query(binder, matcher)


def _allows(allowed: Callable[[FetchSubscription], None] | None,
            sub: FetchSubscription) -> bool:
    """Whether the ownership rule lets ``sub`` be fetched.  A refusal on
    what a store remembers is not the answer: the row may have changed, and
    the full path asks the rule again on it (and raises)."""
    if allowed is None:
        return True
    try:
        allowed(sub)
    except PolyportError:
        return False
    return True


def _fill_batch(
    out: list[RecordedEvent], events: Iterable[RecordedEvent], want: int, extend_same_time: bool
) -> bool:
    """Append ``events`` to a fetch batch until it holds ``want`` (and, with
    ``extend_same_time``, the events sharing the last one's recorded time);
    True once the batch is full."""
    for ev in events:
        if len(out) >= want and (not extend_same_time or ev.recorded_at != out[-1].recorded_at):
            return True
        out.append(ev)
    return False
