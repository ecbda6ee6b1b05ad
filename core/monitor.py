"""What the gateway reports about the store (``/status``, ``/metrics``,
``/readyz``, ``polyport status``), read from the database as plain data.

The gateway never holds the pool or writes SQL; it asks here.  These reads
bypass the store's read slots (:meth:`EventStore._read`): they are small,
callers bound them with their own timeouts, and a store whose reads are all
busy must still be able to say so.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from polyport.core import sql
from polyport.core.commands import Selector
from polyport.core.db import Db


@dataclass(frozen=True, slots=True)
class PoolStats:
    size: int
    idle: int
    min: int
    max: int


@dataclass(frozen=True, slots=True)
class LogHead:
    position: int
    # The last event's time; the head row's creation time while the log is empty.
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class DurableCheckpoint:
    """A durable subscription's saved checkpoint and the log head at the
    same moment."""

    name: str
    selector: dict[str, Any]  # as stored (see core.store.selector_to_json)
    checkpoint: int
    head: int


@dataclass(frozen=True, slots=True)
class SelectedCount:
    events: int
    oldest: datetime | None  # recorded_at of the first of them; None if none


@dataclass(frozen=True, slots=True)
class HourlyVolume:
    hour: datetime
    events: int
    bytes: int


@dataclass(frozen=True, slots=True)
class RecentVolume:
    events: int
    bytes: int
    last_hour: datetime | None


class Monitor:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        # Reads through Db: the gateway's handlers see core's errors.
        self._db = Db(pool)

    def pool_stats(self) -> PoolStats:
        p = self._pool
        return PoolStats(p.get_size(), p.get_idle_size(), p.get_min_size(), p.get_max_size())

    async def ping(self) -> None:
        """One round trip to the database; raises if it is unreachable."""
        await self._db.fetchval(sql.PING)

    async def log_head(self) -> LogHead:
        row = await self._db.fetchrow(sql.LOG_HEAD)
        assert row is not None  # the one head row, made by the first migration
        return LogHead(int(row["last_position"]), row["last_recorded_at"])

    async def streams_estimate(self) -> int:
        return int(await self._db.fetchval(sql.STREAMS_ESTIMATE) or 0)

    async def streams_count(self, exact_up_to: int = 100_000) -> tuple[int, bool]:
        """(number of streams, whether exact): counted up to ``exact_up_to``,
        PostgreSQL's estimate beyond."""
        n = int(await self._db.fetchval(sql.STREAMS_COUNT_UP_TO, exact_up_to + 1))
        if n <= exact_up_to:
            return n, True
        return max(n, await self.streams_estimate()), False

    async def durable_checkpoints(self) -> list[DurableCheckpoint]:
        """Every durable subscription, by name."""
        rows = await self._db.fetch(sql.DURABLE_CHECKPOINTS)
        return [
            DurableCheckpoint(
                r["name"], json.loads(r["selector"]), int(r["checkpoint"]), int(r["last_position"])
            )
            for r in rows
        ]

    async def recorded_at(self, position: int) -> datetime | None:
        """The time of the event at ``position``; None if there is none."""
        found: datetime | None = await self._db.fetchval(sql.RECORDED_AT, position)
        return found

    async def recorded_at_many(self, positions: Collection[int]) -> dict[int, datetime]:
        """Times of the events at ``positions`` (positions without one are left out)."""
        rows = await self._db.fetch(sql.RECORDED_AT_MANY, list(positions))
        return {r["position"]: r["recorded_at"] for r in rows}

    async def count_selected(
        self, selector: Selector, after: int, upto: int, limit: int
    ) -> SelectedCount:
        """Events in positions (``after``, ``upto``] that the selector's
        indexable parts pick (its matcher is not applied), at most ``limit``."""
        row = await self._db.fetchrow(
            sql.COUNT_SELECTED,
            after,
            upto,
            *sql.selected_params(selector.context, selector.stream, selector.prefix,
                                 selector.types),
            limit,
        )
        if row is None:
            return SelectedCount(0, None)
        return SelectedCount(int(row["n"]), row["oldest"])

    async def has_event_stats(self) -> bool:
        """Whether the pipeline's ``event_stats`` table exists."""
        return bool(await self._db.fetchval(sql.EVENT_STATS_EXISTS))

    async def event_stats_hourly(self) -> list[HourlyVolume]:
        """Events and bytes per hour over the last 48 hours that have statistics."""
        rows = await self._db.fetch(sql.EVENT_STATS_HOURLY)
        return [HourlyVolume(r["hour"], int(r["events"]), int(r["bytes"])) for r in rows]

    async def event_stats_24h(self) -> RecentVolume:
        row = await self._db.fetchrow(sql.EVENT_STATS_24H)
        assert row is not None  # an aggregate: always one row
        return RecentVolume(int(row["events"]), int(row["bytes"]), row["last_hour"])
