"""Persistent-subscription settings and parked events (EventStoreDB's sense).

A durable subscription (a consumer group's checkpoint row) may carry settings
an operator set: where a new subscription starts, how many events may be in
flight at once, how many times an event may be retried, and how long a
consumer may hold an event unacknowledged.  An event that fails more than
``max_retries`` times (given back by a consumer that left without
acknowledging it, negatively acknowledged, or held past ``message_timeout``)
is *parked*: recorded in ``parked_events`` and stepped over, so one poison
event no longer holds its group's checkpoint back forever.  ``replay-parked``
marks the parked events of a subscription; the group that owns it hands them
out again and deletes each row once it is acknowledged.  A fetch-style (Res01)
subscription's FE returns them as a batch before new events, and the PS that
names that batch deletes them.

Empty settings keep the behaviour durable subscriptions always had: no
in-flight limit, no timeout, unlimited retries (nothing is ever parked).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from polyport.core import sql
from polyport.core.commands import BEGINNING, END, FromPosition, FromTime, Start
from polyport.core.db import Db
from polyport.core.errors import Malformed, NotFound
from polyport.core.events import RecordedEvent
from polyport.core.records import record_from_row

# Listing parked events: at most this many rows per call.
PARKED_LIST_LIMIT = 1000
# Replayed events loaded per round; the rest follow in later rounds.
REPLAY_BATCH = 500


@dataclass(frozen=True, slots=True)
class SubscriptionSettings:
    """What an operator may set on a persistent subscription (None = no limit).

    ``start`` is JSON: ``"beginning"``, ``"end"``, ``{"position": n}`` or
    ``{"time": "<RFC 3339>"}``; it places the checkpoint of a subscription
    being created and is kept for the record afterwards (an update never
    moves an existing checkpoint: that is what ``reset`` does).
    """

    start: Any = None
    max_in_flight: int | None = None
    max_retries: int | None = None
    message_timeout: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "max_in_flight": self.max_in_flight,
            "max_retries": self.max_retries,
            "message_timeout": self.message_timeout,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SubscriptionSettings:
        data = data or {}
        settings = cls(
            start=data.get("start"),
            max_in_flight=_opt_int(data.get("max_in_flight")),
            max_retries=_opt_int(data.get("max_retries")),
            message_timeout=_opt_float(data.get("message_timeout")),
        )
        settings.check()
        return settings

    def merged(self, changes: dict[str, Any]) -> SubscriptionSettings:
        """These settings with the keys present in ``changes`` replaced
        (a key given as None clears that limit)."""
        known = {k: v for k, v in changes.items() if k in self.as_json()}
        return SubscriptionSettings.from_json({**self.as_json(), **known})

    def check(self) -> None:
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise Malformed("max_in_flight must be at least 1")
        if self.max_retries is not None and self.max_retries < 0:
            raise Malformed("max_retries must not be negative")
        if self.message_timeout is not None and not self.message_timeout > 0:
            raise Malformed("message_timeout must be positive (seconds)")
        if self.start is not None:
            start_from_json(self.start)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def start_from_json(value: Any) -> Start:
    """A settings ``start`` as the core's start point."""
    if value is None or value == "end":
        return END
    if value == "beginning":
        return BEGINNING
    if isinstance(value, dict) and set(value) == {"position"}:
        return FromPosition(int(value["position"]))
    if isinstance(value, dict) and set(value) == {"time"}:
        try:
            return FromTime(datetime.fromisoformat(str(value["time"]).replace("Z", "+00:00")))
        except ValueError:
            raise Malformed(f"start time {value['time']!r} is not an ISO 8601 date-time") from None
    raise Malformed(
        'start must be "beginning", "end", {"position": n} or {"time": "<date-time>"}'
    )


@dataclass(frozen=True, slots=True)
class ParkedEvent:
    position: int
    context: str
    stream: str
    version: int
    type: str
    retries: int
    reason: str
    parked_at: datetime
    replay: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "position": self.position, "context": self.context, "stream": self.stream,
            "version": self.version, "type": self.type, "retries": self.retries,
            "reason": self.reason, "parked_at": self.parked_at.isoformat(),
            "replay": self.replay,
        }


class Parking:
    """The database side of settings and parked events."""

    def __init__(self, db: Db) -> None:
        self._db = db

    async def settings(self, context: str, name: str) -> tuple[int, SubscriptionSettings]:
        """(subscription id, settings) of the durable subscription ``name``
        in ``context``."""
        row = await self._db.fetchrow(sql.SUBSCRIPTION_SETTINGS, context, name)
        if row is None:
            raise NotFound(f"no subscription named {name!r} in context {context!r}")
        return int(row["id"]), SubscriptionSettings.from_json(json.loads(row["settings"]))

    async def set_settings(self, sub_id: int, settings: SubscriptionSettings) -> None:
        await self._db.execute(
            sql.SET_SUBSCRIPTION_SETTINGS, sub_id, json.dumps(settings.as_json())
        )

    async def state(self) -> dict[int, tuple[SubscriptionSettings, int]]:
        """Settings and parked count of every subscription, by id."""
        rows = await self._db.fetch(sql.PERSISTENT_STATE)
        return {
            int(r["id"]): (SubscriptionSettings.from_json(json.loads(r["settings"])),
                           int(r["parked"]))
            for r in rows
        }

    async def parked_counts(self) -> dict[tuple[str, str], int]:
        """Parked events by subscription (context, name), those with any."""
        rows = await self._db.fetch(sql.PARKED_BY_NAME)
        return {(r["context"], r["name"]): int(r["parked"]) for r in rows}

    async def park(self, sub_id: int, position: int, retries: int, reason: str) -> None:
        await self._db.execute(sql.PARK_EVENT, sub_id, position, retries, reason)

    async def unpark(self, sub_id: int, position: int) -> None:
        await self._db.execute(sql.UNPARK_EVENT, sub_id, position)

    async def parked(self, sub_id: int, limit: int = PARKED_LIST_LIMIT) -> list[ParkedEvent]:
        rows = await self._db.fetch(sql.LIST_PARKED, sub_id, limit)
        return [
            ParkedEvent(
                position=r["position"], context=r["context"], stream=r["stream"],
                version=r["version"], type=r["type"], retries=r["retries"],
                reason=r["reason"], parked_at=r["parked_at"], replay=r["replay"],
            )
            for r in rows
        ]

    async def request_replay(self, sub_id: int) -> int:
        """Mark every parked event of the subscription for replay; how many."""
        status = await self._db.execute(sql.REQUEST_REPLAY, sub_id)
        return int(status.split()[-1])

    async def replay_due(self, sub_id: int, limit: int = REPLAY_BATCH) -> list[RecordedEvent]:
        rows = await self._db.fetch(sql.REPLAY_DUE, sub_id, limit)
        return [record_from_row(r) for r in rows]

    async def fetch_replay_due(
        self, sub_id: int, checkpoint: int, limit: int = REPLAY_BATCH
    ) -> list[RecordedEvent]:
        """A fetch subscription's replay-marked events at or before its
        checkpoint, oldest first."""
        rows = await self._db.fetch(sql.FETCH_REPLAY_DUE, sub_id, checkpoint, limit)
        return [record_from_row(r) for r in rows]

    async def count_fetch_attempt(self, sub_id: int, batch_end: int) -> int:
        """One more fetch of the batch ending at ``batch_end``: how many so far."""
        return int(await self._db.fetchval(sql.COUNT_FETCH_ATTEMPT, sub_id, batch_end))

    async def reset_fetch_attempts(self, sub_id: int) -> None:
        await self._db.execute(sql.RESET_FETCH_ATTEMPTS, sub_id)
