"""Group commit: one writer task per process takes every append waiting at that
moment into one transaction.

Inside the transaction the head row is locked first (all processes do the
same), so positions are gapless and follow commit order.  Each append's
expected-version and idempotency checks run against the state as the batch
has built it so far: an append that fails its check fails alone; an
``AppendBatch`` succeeds or fails as a whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg

from core import sql
from core.commands import Append, AppendResult, AnyVersion, ExactVersion, NoStream
from core.errors import (
    Busy,
    Malformed,
    PolyportError,
    StorageUnavailable,
    Timeout,
    TooLarge,
    WrongExpectedVersion,
)
from core.events import RecordedEvent
from core.records import record_from_row

log = logging.getLogger("polyport.writer")

ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class WriterLimits:
    max_pending_events: int = 50_000
    max_batch_events: int = 10_000
    max_batch_bytes: int = 32 << 20
    max_event_bytes: int = 16 << 20
    commit_timeout: float = 30.0
    slow_commit_seconds: float = 1.0


@dataclass
class _Pending:
    appends: tuple[Append, ...]
    future: asyncio.Future[list[AppendResult]]
    events: int
    size: int


@dataclass
class _StreamState:
    last_version: int
    segment_length: int
    exists: bool


@dataclass
class WriterStats:
    commits: int = 0
    events: int = 0
    last_batch_size: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=256))


class Writer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        dsn: str,
        limits: WriterLimits | None = None,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        self.limits = limits or WriterLimits()
        self._queue: deque[_Pending] = deque()
        self._queued_events = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._on_commit = on_commit
        self.stats = WriterStats()
        # The writer's own connection: taking one from the pool per commit
        # costs a reset round trip each time.
        self._conn: asyncpg.Connection | None = None

    @property
    def queue_depth(self) -> int:
        return self._queued_events

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="polyport-writer")

    async def drain_and_stop(self) -> None:
        """Commit everything already accepted, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self.close()

    async def submit(self, appends: Sequence[Append]) -> list[AppendResult]:
        if self._closing:
            raise StorageUnavailable("the store is shutting down; retry against a running gateway")
        n = sum(len(a.events) for a in appends)
        size = 0
        for a in appends:
            if not a.stream:
                raise Malformed("stream name must not be empty")
            for e in a.events:
                if len(e.body) > self.limits.max_event_bytes:
                    raise TooLarge(
                        f"event body of {len(e.body)} bytes exceeds the limit of "
                        f"{self.limits.max_event_bytes} bytes"
                    )
                size += len(e.body)
        if self._queued_events + n > self.limits.max_pending_events and self._queue:
            raise Busy(
                f"writer queue full ({self._queued_events} events waiting); retry shortly"
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[AppendResult]] = loop.create_future()
        self._queue.append(_Pending(tuple(appends), fut, n, size))
        self._queued_events += n
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.limits.commit_timeout)
        except TimeoutError:
            raise Timeout(
                f"append not confirmed within {self.limits.commit_timeout:.0f}s; it may still "
                "commit: retry with the same event ids (retries are idempotent)"
            ) from None

    # --- the writer loop ------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._take_batch()
            started = time.monotonic()
            try:
                try:
                    await self._commit(batch, check_ids=False)
                except asyncpg.UniqueViolationError as exc:
                    if exc.constraint_name != "events_event_id_key":
                        raise
                    # A re-sent event id: redo the batch with the idempotency lookup.
                    await self._commit(batch, check_ids=True)
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
                if self._conn is not None and not self._conn.is_closed():
                    if isinstance(exc, OSError | asyncpg.InterfaceError):
                        self._conn.terminate()
                        self._conn = None
                log.error("append transaction failed: %s", exc)
                err = StorageUnavailable(f"storage error, nothing from this commit was stored: {exc}")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)
                await asyncio.sleep(0.05)
            except Exception as exc:  # never let the writer die: fail the batch, go on
                log.exception("append batch failed")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(StorageUnavailable(f"internal error: {exc}"))
            elapsed = time.monotonic() - started
            if elapsed > self.limits.slow_commit_seconds:
                log.warning(
                    "slow commit: %.2fs for %d events", elapsed, sum(p.events for p in batch)
                )

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        events = size = 0
        while self._queue:
            p = self._queue[0]
            if batch and (
                events + p.events > self.limits.max_batch_events
                or size + p.size > self.limits.max_batch_bytes
            ):
                break
            self._queue.popleft()
            self._queued_events -= p.events
            if p.future.cancelled():
                continue
            batch.append(p)
            events += p.events
            size += p.size
        return batch

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self._dsn)
        return self._conn

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()

    async def _commit(self, batch: list[_Pending], *, check_ids: bool) -> None:
        """Commit one batch.  Without ``check_ids`` re-sent event ids are not
        looked up first (the common case costs nothing); the unique index
        catches them and the caller retries with the lookup."""
        keys = sorted({(a.context, a.stream) for p in batch for a in p.appends})
        ids = [e.event_id for p in batch for a in p.appends for e in a.events]
        commit_id = uuid.uuid4()
        conn = await self._connection()
        async with conn.transaction():
            head = await conn.fetchrow(sql.LOCK_HEAD)
            position: int = head["last_position"]
            last_time: datetime = head["last_recorded_at"]
            now: datetime = head["now"]
            state: dict[tuple[str, str], _StreamState] = {
                k: _StreamState(0, 0, False) for k in keys
            }
            for r in await conn.fetch(
                sql.STREAM_STATES, [k[0] for k in keys], [k[1] for k in keys]
            ):
                state[(r["context"], r["stream"])] = _StreamState(
                    r["last_version"], r["segment_length"], True
                )
            existing: dict[uuid.UUID, RecordedEvent] = {}
            if ids and check_ids:
                for r in await conn.fetch(sql.EXISTING_EVENT_IDS, ids):
                    existing[r["event_id"]] = record_from_row(r)

            rows: list[tuple[object, ...]] = []
            outcomes: list[list[AppendResult] | PolyportError] = []
            checkpoints: list[tuple[uuid.UUID, str, str, int]] = []
            touched: set[tuple[str, str]] = set()
            for p in batch:
                trial = {
                    k: _StreamState(v.last_version, v.segment_length, v.exists)
                    for k, v in state.items()
                }
                trial_rows: list[tuple[object, ...]] = []
                results: list[AppendResult] = []
                trial_pos, trial_time = position, last_time
                added: list[uuid.UUID] = []
                error: PolyportError | None = None
                for a in p.appends:
                    st = trial[(a.context, a.stream)]
                    done = _idempotent_result(a, existing, commit_id)
                    if isinstance(done, PolyportError):
                        error = done
                        break
                    if done is not None:
                        results.append(done)
                        continue
                    mismatch = _check_expected(a, st.last_version)
                    if mismatch is not None:
                        error = mismatch
                        break
                    trial_time = max(trial_time + ONE_MICROSECOND, now)
                    first_version, first_pos = st.last_version + 1, trial_pos + 1
                    for e in a.events:
                        trial_pos += 1
                        st.last_version += 1
                        trial_rows.append(
                            (
                                trial_pos,
                                e.event_id,
                                a.context,
                                a.stream,
                                st.last_version,
                                e.type,
                                json.dumps(dict(e.headers)),
                                e.body,
                                e.content_type,
                                e.client_time,
                                trial_time,
                                a.origin,
                                st.segment_length,
                            )
                        )
                        existing[e.event_id] = _placeholder(
                            a, e.event_id, st.last_version, trial_pos, trial_time
                        )
                        added.append(e.event_id)
                        st.segment_length += e.segment_size
                        trial_time = trial_time + ONE_MICROSECOND
                    trial_time -= ONE_MICROSECOND
                    results.append(
                        AppendResult(
                            context=a.context,
                            stream=a.stream,
                            first_version=first_version,
                            last_version=st.last_version,
                            first_position=first_pos,
                            last_position=trial_pos,
                            recorded_at=trial_time,
                            commit_id=commit_id,
                        )
                    )
                if error is not None:
                    for event_id in added:
                        del existing[event_id]
                    outcomes.append(error)
                    continue
                state = trial
                position, last_time = trial_pos, trial_time
                rows.extend(trial_rows)
                for a in p.appends:
                    touched.add((a.context, a.stream))
                    if a.producer_checkpoint is not None:
                        checkpoints.append(
                            (
                                a.producer_checkpoint.producer_id,
                                a.context,
                                a.stream,
                                a.producer_checkpoint.ack_level,
                            )
                        )
                outcomes.append(results)

            if rows:
                await conn.copy_records_to_table("events", records=rows, columns=sql.EVENT_COLUMNS)
                t = sorted(touched)
                await conn.execute(
                    sql.UPSERT_STREAMS,
                    [k[0] for k in t],
                    [k[1] for k in t],
                    [state[k].last_version for k in t],
                    [state[k].segment_length for k in t],
                    now,
                )
                await conn.execute(sql.UPDATE_HEAD, position, last_time)
            for cp in checkpoints:
                await conn.execute(sql.UPSERT_PRODUCER_CHECKPOINT, *cp)

        self.stats.commits += 1
        self.stats.events += len(rows)
        self.stats.last_batch_size = len(rows)
        self.stats.batch_sizes.append(len(rows))
        for p, outcome in zip(batch, outcomes, strict=True):
            if p.future.done():
                continue
            if isinstance(outcome, PolyportError):
                p.future.set_exception(outcome)
            else:
                p.future.set_result(outcome)
        if rows and self._on_commit is not None:
            self._on_commit(position)


_PLACEHOLDER = "\x00pending"


def _placeholder(
    a: Append, event_id: uuid.UUID, version: int, position: int, recorded_at: datetime
) -> RecordedEvent:
    """Stands for an event written earlier in this same batch, so a duplicate
    append later in the batch is recognised as idempotent."""
    return RecordedEvent(
        position=position,
        event_id=event_id,
        context=a.context,
        stream=a.stream,
        version=version,
        type="",
        headers={},
        body=b"",
        content_type="",
        client_time=None,
        recorded_at=recorded_at,
        origin=_PLACEHOLDER,
        segment_offset=0,
    )


def _check_expected(a: Append, current: int) -> WrongExpectedVersion | None:
    exp = a.expected
    if isinstance(exp, AnyVersion):
        return None
    if isinstance(exp, NoStream):
        if current == 0:
            return None
        return WrongExpectedVersion(
            f"stream {a.stream!r} already exists (last version {current})",
            current_version=current,
        )
    if isinstance(exp, ExactVersion):
        if exp.next_version == current + 1:
            return None
        return WrongExpectedVersion(
            f"stream {a.stream!r}: expected the first new event to be version "
            f"{exp.next_version}, but the next version is {current + 1}",
            current_version=current,
        )
    raise Malformed(f"unknown expected version {exp!r}")


def _idempotent_result(
    a: Append, existing: dict[uuid.UUID, RecordedEvent], commit_id: uuid.UUID
) -> AppendResult | PolyportError | None:
    """None: nothing appended before.  A result: all appended before, in order.
    An error: some ids already used (here or in another stream)."""
    if not a.events:
        return None
    found = [existing.get(e.event_id) for e in a.events]
    if all(f is None for f in found):
        return None
    if any(f is None for f in found):
        return WrongExpectedVersion(
            "some of these event ids were already appended and others were not; "
            "re-send exactly the original append"
        )
    recs = [f for f in found if f is not None]
    if any(r.context != a.context or r.stream != a.stream for r in recs):
        return WrongExpectedVersion(
            f"event id {recs[0].event_id} was already appended to another stream"
        )
    return AppendResult(
        context=a.context,
        stream=a.stream,
        first_version=recs[0].version,
        last_version=recs[-1].version,
        first_position=recs[0].position,
        last_position=recs[-1].position,
        recorded_at=recs[-1].recorded_at,
        commit_id=commit_id,
        idempotent=True,
    )
