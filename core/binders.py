"""Binders: named collections of JSON documents kept current from the log.

A binder projects the events of one context whose stream starts with a prefix
(optionally only some types) into one document per stream (key = stream name),
folding each event body with ``merge`` (shallow merge of the body document) or
``replace``.  The projector runs in every gateway process; ``FOR UPDATE SKIP
LOCKED`` on the binder row lets exactly one of them advance a binder at a time,
and the documents and the binder's position change in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
from bson import json_util

from polyport.core import sql
from polyport.core.aio import wait_event
from polyport.core.bodies import event_document
from polyport.core.commands import Selector
from polyport.core.db import Db
from polyport.core.errors import Malformed, NotFound
from polyport.core.events import RecordedEvent
from polyport.core.logs import RateLimitedLog
from polyport.core.matcher import compile_matcher
from polyport.core.records import record_from_row

if TYPE_CHECKING:
    from polyport.core.store import EventStore

log = logging.getLogger("polyport.binders")
# Per binder: a poison event tends to come with others like it.
_failures_log = RateLimitedLog(log)

FOLDS = ("merge", "replace")
PROJECT_BATCH = 1000
MIN_ROUND_INTERVAL = 0.05
# How long a round may use the binder list the last one read.  Each round
# (one per MIN_ROUND_INTERVAL under load, in every process) read it anew: a
# query every 50 ms in every worker, 2.5 % of a forwarding worker's samples
# under W1 with no binder defined.  A binder this process creates, rebuilds
# or drops is listed again at once; one another process creates (a CLI
# command, another gateway) is taken up within this interval, and its own
# creator's projector starts on it at once.
LIST_INTERVAL = 1.0
QUERY_PAGE = 500

_JSON_OPTS = json_util.JSONOptions(json_mode=json_util.JSONMode.RELAXED)
# A NUL character as JSON writes it (an even run of backslashes before it
# escapes themselves, not the NUL): jsonb refuses it.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True, slots=True)
class BinderFailure:
    """An event a binder could not fold, and skipped."""

    position: int
    error: str
    recorded_at: datetime | str

    def as_json(self) -> dict[str, Any]:
        at = self.recorded_at
        return {
            "position": self.position,
            "error": self.error,
            "recorded_at": at.isoformat() if isinstance(at, datetime) else at,
        }


@dataclass(frozen=True, slots=True)
class BinderSpec:
    name: str
    context: str
    stream_prefix: str
    types: tuple[str, ...] | None
    fold: str
    position: int = 0
    documents: int = 0
    # Events skipped because they could not be folded: how many, latest first.
    failures: int = 0
    recent_failures: tuple[BinderFailure, ...] = ()

    @property
    def definition(self) -> tuple[str, str, tuple[str, ...] | None, str]:
        """What the binder projects, without its progress: equal definitions
        give equal documents."""
        return self.context, self.stream_prefix, self.types, self.fold

    @property
    def selector(self) -> Selector:
        return Selector(
            context=self.context,
            prefix=self.stream_prefix,
            types=frozenset(self.types or ()),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "context": self.context,
            "stream_prefix": self.stream_prefix,
            "types": list(self.types) if self.types is not None else None,
            "fold": self.fold,
            "position": self.position,
            "documents": self.documents,
            "failures": {
                "count": self.failures,
                "recent": [f.as_json() for f in self.recent_failures],
            },
        }


def spec_from_row(row: asyncpg.Record) -> BinderSpec:
    recent = row.get("recent_failures")
    return BinderSpec(
        name=row["name"],
        context=row["context"],
        stream_prefix=row["stream_prefix"],
        types=tuple(row["types"]) if row["types"] is not None else None,
        fold=row["fold"],
        position=row["position"],
        documents=row.get("documents", 0),
        failures=row.get("failures", 0),
        recent_failures=tuple(
            BinderFailure(f["position"], f["error"], f["recorded_at"])
            for f in (json.loads(recent) if recent else ())
        ),
    )


def fold_document(
    fold: str, current: dict[str, Any] | None, body: dict[str, Any]
) -> dict[str, Any]:
    """The pure fold, shared by the live projector and the Spark rebuild."""
    if fold == "replace" or current is None:
        return dict(body)
    return {**current, **body}


def to_jsonable(doc: dict[str, Any]) -> dict[str, Any]:
    """BSON-only values (dates, binaries, ObjectIds) as relaxed Extended JSON."""
    out: dict[str, Any] = json.loads(json_util.dumps(doc, json_options=_JSON_OPTS))
    return out


def foldable_body(ev: RecordedEvent) -> dict[str, Any]:
    """An event's body as a binder folds it.  Raises when it cannot be: a
    body nested too deep for the encoder (``RecursionError``), or one holding
    a NUL character, which PostgreSQL jsonb cannot store (it would fail the
    whole batch's write)."""
    out = to_jsonable(event_document(ev))
    if _JSON_NUL.search(json.dumps(out)):
        raise ValueError("the body holds a NUL character, which a binder (jsonb) cannot store")
    return out


class BinderQuery:
    """Matching documents, counted when the query ran, then streamed in pages."""

    def __init__(self, service: BinderService, binder: str, keys: list[str]):
        self._service = service
        self.binder = binder
        self._keys = keys

    @property
    def count(self) -> int:
        return len(self._keys)

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for i in range(0, len(self._keys), QUERY_PAGE):
            page = self._keys[i : i + QUERY_PAGE]
            rows = await self._service._db.fetch(sql.GET_BINDER_DOCUMENTS, self.binder, page)
            docs = {r["key"]: json.loads(r["document"]) for r in rows}
            for key in page:
                if key in docs:
                    yield {"_id": key, **docs[key]}


class BinderService:
    def __init__(self, store: EventStore, *, run_projector: bool = True) -> None:
        self._store = store
        self._db: Db = store.db
        self._run_projector = run_projector
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # The projector's binder names and when it read them (None: read anew).
        self._names: tuple[str, ...] | None = None
        self._listed_at = 0.0

    async def start(self) -> None:
        if not self._run_projector:
            return
        self._store.tailer.on_advance.append(lambda _pos: self._wake.set())
        self._task = asyncio.create_task(self._projector(), name="polyport-binders")
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- admin ----------------------------------------------------------------

    async def create(
        self,
        name: str,
        *,
        context: str,
        stream_prefix: str = "",
        types: list[str] | None = None,
        fold: str = "merge",
    ) -> BinderSpec:
        if not name:
            raise Malformed("binder name must not be empty")
        if fold not in FOLDS:
            raise Malformed(f"fold must be one of {', '.join(FOLDS)}, not {fold!r}")
        made = await self._db.fetchval(
            sql.CREATE_BINDER, name, context, stream_prefix, types or None, fold
        )
        if made is None:
            raise Malformed(f"binder {name!r} already exists")
        self._relist()
        return await self.get(name)

    async def get(self, name: str) -> BinderSpec:
        row = await self._db.fetchrow(sql.GET_BINDER, name)
        if row is None:
            raise NotFound(f"no binder named {name!r}")
        return spec_from_row(row)

    async def list(self) -> list[BinderSpec]:
        return [spec_from_row(r) for r in await self._db.fetch(sql.LIST_BINDERS)]

    async def drop(self, name: str) -> None:
        async with self._db.acquire() as conn, conn.transaction():
            await conn.execute(sql.CLEAR_BINDER_DOCUMENTS, name)
            await conn.execute(sql.CLEAR_BINDER_ERRORS, name)
            if await conn.fetchval(sql.DROP_BINDER, name) is None:
                raise NotFound(f"no binder named {name!r}")
        self._names = None

    async def rebuild(self, name: str) -> None:
        """Recompute from the whole log (the projector refills it)."""
        async with self._db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(sql.GET_BINDER, name)
            if row is None:
                raise NotFound(f"no binder named {name!r}")
            await conn.execute(sql.CLEAR_BINDER_DOCUMENTS, name)
            # The log is folded again from the start: what fails will fail again.
            await conn.execute(sql.CLEAR_BINDER_ERRORS, name)
            await conn.execute(sql.SET_BINDER_POSITION, name, 0)
        self._relist()

    def _relist(self) -> None:
        """Read the binder list at the next round, and run that round."""
        self._names = None
        self._wake.set()

    async def wait_caught_up(self, name: str, position: int, timeout: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while (await self.get(name)).position < position:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"binder {name} did not reach position {position}")
            self._wake.set()
            await asyncio.sleep(0.05)

    # --- queries --------------------------------------------------------------

    async def query(self, name: str, matcher: dict[str, Any]) -> BinderQuery:
        await self.get(name)
        predicate = compile_matcher(matcher)
        keys: list[str] = []
        after = ""
        while True:
            rows = await self._db.fetch(sql.SCAN_BINDER_DOCUMENTS, name, after, QUERY_PAGE)
            for r in rows:
                doc = json.loads(r["document"])
                if predicate({"_id": r["key"], **doc}):
                    keys.append(r["key"])
            if len(rows) < QUERY_PAGE:
                break
            after = rows[-1]["key"]
        return BinderQuery(self, name, keys)

    # --- projector ------------------------------------------------------------

    async def _projector(self) -> None:
        while True:
            await wait_event(self._wake, self._store.config.poll_interval * 5)
            # Every commit wakes the projector; under load one round per
            # commit batch cost a binder-list query each (even with no
            # binder defined).  Rounds at most every MIN_ROUND_INTERVAL:
            # projections are eventual anyway.
            await asyncio.sleep(MIN_ROUND_INTERVAL)
            self._wake.clear()
            try:
                names = await self._binder_names()
            except Exception as exc:  # noqa: BLE001 - the projection loop must not die; it retries
                _failures_log.warning("list", "binder projection failed (%s); retrying", exc)
                await asyncio.sleep(1.0)
                self._wake.set()
                continue
            failed = False
            for name in names:
                # One binder's trouble (say, the database refusing its write)
                # must not hold up the binders after it.
                try:
                    while await self.project_once(name):
                        pass
                except Exception as exc:  # noqa: BLE001 - one binder must not stop the rest
                    failed = True
                    _failures_log.warning(
                        ("batch", name), "binder %s: projection failed (%s); retrying", name, exc
                    )
            if failed:
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _binder_names(self) -> tuple[str, ...]:
        now = asyncio.get_running_loop().time()
        if self._names is None or now - self._listed_at >= LIST_INTERVAL:
            self._names = tuple(spec.name for spec in await self.list())
            self._listed_at = now
        return self._names

    async def project_once(self, name: str) -> bool:
        """Apply the next batch of events to one binder; True if more may follow."""
        async with self._db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(sql.LOCK_BINDER, name)
            if row is None:
                return False  # dropped, or another process is on it
            spec = spec_from_row(row)
            head: int = await conn.fetchval(sql.HEAD_POSITION)
            sel = spec.selector
            read = sql.selected_read(
                spec.position, head, PROJECT_BATCH, sel.context, None, sel.prefix or None,
                sel.types,
            )
            rows = await conn.fetch(read.statement, *read.args)
            if not rows:
                if read.upper > spec.position:
                    await conn.execute(sql.SET_BINDER_POSITION, name, read.upper)
                return read.upper < head
            events = [record_from_row(r) for r in rows]
            keys = sorted({e.stream for e in events})
            current = {
                r["key"]: json.loads(r["document"])
                for r in await conn.fetch(sql.GET_BINDER_DOCUMENTS, name, keys)
            }
            last_pos: dict[str, int] = {}
            failures: list[tuple[str, int, str]] = []
            for e in events:
                try:
                    body = foldable_body(e)
                except Exception as exc:  # noqa: BLE001 - poison: record it, skip it, go on
                    error = f"{type(exc).__name__}: {exc}"[:1000]
                    failures.append((name, e.position, error))
                    _failures_log.warning(
                        ("event", name), "binder %s skipped the event at position %d: %s",
                        name, e.position, error,
                    )
                    continue
                current[e.stream] = fold_document(spec.fold, current.get(e.stream), body)
                last_pos[e.stream] = e.position
            changed = sorted(last_pos)
            if changed:
                await conn.execute(
                    sql.UPSERT_BINDER_DOCUMENTS,
                    name,
                    changed,
                    [json.dumps(current[k]) for k in changed],
                    [last_pos[k] for k in changed],
                )
            if failures:
                await conn.executemany(sql.RECORD_BINDER_ERROR, failures)
            full = len(rows) == PROJECT_BATCH
            new_position = events[-1].position if full else read.upper
            more = full or read.upper < head
            await conn.execute(sql.SET_BINDER_POSITION, name, new_position)
            return more
