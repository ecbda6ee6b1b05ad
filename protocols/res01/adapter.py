"""Res01 requests ⇄ canonical core commands.

The listener's session (``session.py``) takes a request from its
:class:`~polyport.protocols.res01.connection.ServerConnection`, admits it
(in-flight limits) and runs :meth:`Res01Handler.handle` in a task of its own;
every :class:`Response` the handler yields goes back through the connection
(which checks it answers the request) to the request's routing frames.  The
handler reaches storage only through the :class:`core.access.Tenant` of the
request's principal.

Mapping and decisions: ``docs/protocols/res01.md``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from typing import TypeVar

from polyport.core import bodies
from polyport.core.access import Tenant
from polyport.core.aio import settled
from polyport.core.commands import (
    ANY,
    NO_STREAM,
    Append,
    AppendResult,
    ExactVersion,
    Expected,
    FromTime,
    Selector,
)
from polyport.core.errors import (
    Forbidden,
    Malformed,
    NotFound,
    PolyportError,
    Timeout,
    Unsupported,
    new_error_id,
)
from polyport.core.events import EventData, RecordedEvent, event_data
from polyport.core.limits import check_body_size, check_text, check_unique_ids
from polyport.protocols.res01.errors import ErrorCode, error_code, error_reply
from polyport.protocols.res01.frames import (
    EXPECTED_VERSION_ANY,
    EXPECTED_VERSION_NEW_STREAM,
    FILTER_ALL,
    PROTOCOL,
    AppendCommit,
    CommitResult,
    Error,
    EventsFetched,
    FetchedEvent,
    FetchEvents,
    ProgressSubscriptions,
    RegisterSubscriptions,
    Request,
    Response,
    SetSubscription,
    SubscribeResult,
    SubscriptionProgressed,
    SubscriptionSet,
)
from polyport.protocols.res01.limits import Limits
from polyport.protocols.session import ListenerStats

ORIGIN = PROTOCOL

# Headers text that is not a JSON object is kept whole under this one header,
# and given back verbatim (see docs: "Headers").
RAW_HEADERS_KEY = "res01.headers"

# Subscription names are shared with every protocol's durable subscriptions;
# the prefix keeps Res01's (SubscriberId, Context, Filter) names apart.
SUBSCRIPTION_NAME_PREFIX = "res01:"
# Names live in a unique btree index, whose entries must stay well under a
# page; longer identities are refused as malformed rather than failing in SQL.
MAX_SUBSCRIPTION_NAME_BYTES = 1024

_T = TypeVar("_T")

# --- values -------------------------------------------------------------------


def is_write(request: Request) -> bool:
    """AC goes to the storage writer; everything else is reader work."""
    return isinstance(request, AppendCommit)


def expected_version(value: int) -> Expected:
    """ExpectedVersion = the version the first new event gets."""
    if value == EXPECTED_VERSION_ANY:
        return ANY
    if value == EXPECTED_VERSION_NEW_STREAM:
        return NO_STREAM
    if value > 1:
        return ExactVersion(value)
    raise Malformed(
        f"AppendCommit: expected version {value} is not valid "
        "(-1 = any, 1 = new stream, n > 1 = the version of the first new event)"
    )


def _compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def headers_from_text(text: str) -> dict[str, str]:
    """Res01 headers text → header map.

    A JSON object becomes the map (string values as they are, other values as
    their JSON text); an empty string means no headers; anything else is kept
    whole as the single header ``res01.headers``.
    """
    if text in ("", "{}"):  # the common cases, without a JSON parse
        return {}
    try:
        value = bodies.loads_json(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        return {RAW_HEADERS_KEY: text}
    out: dict[str, str] = {}
    for key, item in value.items():
        out[key] = item if isinstance(item, str) else _compact_json(item)
    return out


def headers_to_text(headers: Mapping[str, str]) -> str:
    """Header map → Res01 headers text: a JSON object, or the text a Res01
    client sent when it was not one."""
    if len(headers) == 1 and RAW_HEADERS_KEY in headers:
        return headers[RAW_HEADERS_KEY]
    return _compact_json(dict(headers))


def body_content_type(body: bytes) -> str:
    """``application/json`` when the body parses as JSON, else ``text/plain``."""
    try:
        return bodies.guess_text_content_type(body)
    except RecursionError:  # deeply nested: not JSON we could use anyway
        return bodies.TEXT


def to_append(request: AppendCommit, max_event_bytes: int | None = None) -> Append:
    """AC → core Append (validated; raises Malformed or TooLarge)."""
    if not request.context:
        raise Malformed("AppendCommit: context must not be empty")
    if not request.stream:
        raise Malformed("AppendCommit: stream must not be empty")
    if not request.events:
        raise Malformed("AppendCommit: a commit needs at least one event")
    check_text(request.context, "AppendCommit context")
    check_text(request.stream, "AppendCommit stream")
    expected = expected_version(request.expected_version)
    check_unique_ids((e.event_id for e in request.events), "one AppendCommit")
    events: list[EventData] = []
    for i, e in enumerate(request.events):
        check_text(e.type, f"AppendCommit event {i} type")
        headers = headers_from_text(e.headers)
        for key, value in headers.items():
            check_text(key, f"AppendCommit event {i} header name")
            check_text(value, f"AppendCommit event {i} header {key!r}")
        body = e.body.encode("utf-8")
        if max_event_bytes is not None:
            check_body_size(len(body), max_event_bytes, f"AppendCommit event {i}: body")
        events.append(
            event_data(e.type, body, e.event_id, body_content_type(body), headers, e.timestamp)
        )
    return Append(
        context=request.context,
        stream=request.stream,
        events=tuple(events),
        expected=expected,
        origin=ORIGIN,
    )


def normalized_filter(filter_: str) -> str:
    """``""`` and ``"*"`` both mean every stream: one subscription, not two."""
    return "*" if filter_ in FILTER_ALL else filter_


def selector_for(context: str, filter_: str) -> Selector:
    return Selector(context=context, prefix=None if filter_ in FILTER_ALL else filter_)


def subscription_name(subscriber_id: str, context: str, filter_: str) -> str:
    """The durable subscription's name for (SubscriberId, Context, Filter)."""
    check_text(subscriber_id, "subscriber id")
    check_text(context, "subscription context")
    check_text(filter_, "subscription filter")
    if not context:
        raise Malformed("subscription context must not be empty")
    name = SUBSCRIPTION_NAME_PREFIX + _compact_json(
        [subscriber_id, context, normalized_filter(filter_)]
    )
    if len(name.encode("utf-8")) > MAX_SUBSCRIPTION_NAME_BYTES:
        raise Malformed(
            "subscriber id, context and filter together are too long "
            f"(at most {MAX_SUBSCRIPTION_NAME_BYTES} bytes)"
        )
    return name




def fetched_event(ev: RecordedEvent) -> FetchedEvent:
    """A stored event as EF's 8 frames: Sequence = stream version, Timestamp =
    server time (never decreasing with position), body as text."""
    return FetchedEvent(
        event_id=ev.event_id,
        stream=ev.stream,
        context=ev.context,
        sequence=ev.version,
        timestamp=ev.recorded_at,
        type=ev.type,
        headers=headers_to_text(ev.headers),
        body=bodies.body_json_text(ev.content_type, ev.body),
    )


def _prefix_within(events: list[RecordedEvent], budget: int) -> int:
    """How many leading events fit ``budget`` body bytes (at least one)."""
    total = 0
    for i, ev in enumerate(events):
        total += len(ev.body) + len(ev.type) + len(ev.stream)
        if total > budget:
            return max(1, i)
    return len(events)


# --- the handler --------------------------------------------------------------


class Res01Handler:
    """Serves decoded requests for one principal at a time.  Stateless per
    peer: every Res01 request is complete in itself, durable state lives in
    Postgres, and who may do what is the :class:`~polyport.core.access.Tenant`
    each request is served with (the session has it from the peer's ZAP
    login, or the anonymous principal)."""

    def __init__(
        self,
        stats: ListenerStats,
        log: logging.Logger,
        limits: Limits,
    ) -> None:
        self.stats = stats
        self.log = log
        self.limits = limits

    async def handle(
        self, request: Request, tenant: Tenant, *, hold: bool = True
    ) -> AsyncGenerator[Response, None]:
        """The replies to one request: one response, or one EF per FE entry.
        Failures become a single ER (after any EF already yielded).  ``hold``:
        an empty one-subscription FE may wait ``fetch_wait`` for a commit."""
        try:
            if isinstance(request, AppendCommit):
                yield await self._commit(request, tenant)
            elif isinstance(request, RegisterSubscriptions):
                yield await self._register(request, tenant)
            elif isinstance(request, FetchEvents):
                async for reply in self._fetch(request, tenant, hold):
                    yield reply
            elif isinstance(request, ProgressSubscriptions):
                yield await self._progress(request, tenant)
            elif isinstance(request, SetSubscription):
                yield await self._set(request, tenant)
            else:  # the codec only produces the five requests above
                raise Unsupported(f"unsupported request {type(request).__name__}")
        except Exception as exc:  # noqa: BLE001 - failure() logs a bug with its traceback
            yield self.failure(request, exc)

    def failure(self, request: Request, exc: Exception) -> Error:
        """The ER that ends ``request`` failed with ``exc``: the canonical
        error's code, or UNEXPECTED with an error id for anything else (a bug:
        logged with its traceback)."""
        if isinstance(exc, PolyportError):
            self.stats.error(exc.code, exc.message)
            return error_reply(request, error_code(exc, write=is_write(request)), exc.message)
        self.stats.error("internal")
        eid = new_error_id()
        self.log.error("res01: %s failed (error id %s)", type(request).__name__, eid,
                       exc_info=exc)
        return error_reply(request, ErrorCode.UNEXPECTED,
                           f"unexpected error (error id {eid}); the gateway's log has the "
                           "details")

    def start_commit(
        self, request: AppendCommit, tenant: Tenant
    ) -> asyncio.Future[list[AppendResult]]:
        """An AC queued on the writer now (what cannot be appended raises
        here); :meth:`commit_reply` turns the outcome into its reply.  The
        session answers from the outcome's callback: no task and no
        generator per append (docs/performance.md, session 14)."""
        return tenant.start_append(to_append(request, self.limits.max_event_bytes))

    def commit_reply(
        self, request: AppendCommit, outcome: asyncio.Future[list[AppendResult]]
    ) -> Response:
        """CR once the commit is confirmed, else the ER of its failure.  The
        outcome must be done and not cancelled."""
        exc = outcome.exception()
        if exc is not None:
            return self.failure(request, exc if isinstance(exc, Exception) else
                                RuntimeError(repr(exc)))
        return CommitResult(request.request_id, outcome.result()[0].commit_id, request.protocol)

    async def _read(self, work: Awaitable[_T]) -> _T:
        """Storage work of a reader request, under the reader timeout."""
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                return await work
        except TimeoutError:
            raise Timeout(
                f"storage read took longer than {self.limits.read_timeout:g}s", reader=True
            ) from None

    async def _commit(self, request: AppendCommit, tenant: Tenant) -> Response:
        # Acknowledged only once the core confirmed the commit.
        outcome = self.start_commit(request, tenant)
        await settled(outcome)
        return self.commit_reply(request, outcome)

    async def _register(
        self, request: RegisterSubscriptions, tenant: Tenant
    ) -> SubscribeResult:
        # Validate every definition, and the principal's right to each
        # context, before creating any: a bad entry must not leave the others
        # half-registered.
        defs = [
            (subscription_name(request.subscriber_id, d.context, d.filter), d)
            for d in request.subscriptions
        ]
        for _name, d in defs:
            tenant.check(d.context)
        ids: list[int] = []
        for name, d in defs:
            sub = await self._read(
                tenant.register_fetch_subscription(
                    name, selector_for(d.context, d.filter), FromTime(d.start_time)
                )
            )
            ids.append(sub.id)
        return SubscribeResult(request.request_id, tuple(ids), request.protocol)

    async def _check_ids(self, ids: list[int], tenant: Tenant) -> None:
        """NotFound for the first unknown id, Forbidden for the first id of a
        context the principal may not use, before anything is done.

        With one id there is nothing to do first: the tenant's fetch or
        progress checks that id before it touches anything, and the same
        error comes back.  (A FE/PS loop on one subscription is the common
        case, and every read of the row is a round trip of the cycle.)"""
        unique = list(dict.fromkeys(ids))
        if len(unique) < 2:
            return
        for sub_id in unique:
            await self._read(tenant.fetch_subscription(sub_id))

    async def _fetch(
        self, request: FetchEvents, tenant: Tenant, hold: bool
    ) -> AsyncIterator[EventsFetched]:
        for entry in request.entries:
            if entry.suggested_count < 1:
                raise Malformed(
                    f"FetchEvents: suggested count {entry.suggested_count} for subscription "
                    f"{entry.subscription_id} must be at least 1"
                )
        await self._check_ids([e.subscription_id for e in request.entries], tenant)
        # Held only with one entry: a wait on one subscription would delay
        # the EFs of the others.
        wait = self.limits.fetch_wait if hold and len(request.entries) == 1 else 0.0
        # One EF at a time: the next batch is read only after the previous one
        # went out, so a request holds at most one batch in memory.
        for entry in request.entries:
            count = min(entry.suggested_count, self.limits.max_fetch_count)
            events = await self._read(tenant.fetch(entry.subscription_id, count, wait=wait))
            fits = _prefix_within(events, self.limits.max_fetch_bytes)
            if fits < len(events):
                # Fetch again with the smaller count, so the batch the store
                # recorded (what PS must name) is the batch we send.
                events = await self._read(tenant.fetch(entry.subscription_id, fits))
            yield EventsFetched(
                request.request_id,
                entry.subscription_id,
                tuple(fetched_event(ev) for ev in events),
                request.protocol,
            )

    async def _progress(
        self, request: ProgressSubscriptions, tenant: Tenant
    ) -> SubscriptionProgressed:
        ids = [e.subscription_id for e in request.entries]
        await self._check_ids(ids, tenant)
        for entry in request.entries:
            # False when LastEventTime does not name the fetched batch: the
            # spec's idempotency, not an error.
            await self._read(tenant.progress(entry.subscription_id, entry.last_event_time))
        return SubscriptionProgressed(request.request_id, tuple(ids), request.protocol)

    async def _set(self, request: SetSubscription, tenant: Tenant) -> SubscriptionSet:
        results: list[str] = []
        for entry in request.entries:
            try:
                name = subscription_name(entry.subscriber_id, entry.context, entry.filter)
                sub_id = await self._read(tenant.fetch_subscription_id(entry.context, name))
                if sub_id is None:
                    raise NotFound(
                        f"no subscription for subscriber {entry.subscriber_id!r}, context "
                        f"{entry.context!r}, filter {entry.filter!r}"
                    )
                await self._read(tenant.seek(sub_id, FromTime(entry.set_to)))
                results.append("")
            except (Malformed, NotFound, Forbidden) as exc:
                # Per-entry failures are ST's own form (a context the
                # principal may not use is one entry's failure, as a missing
                # subscription is); storage trouble is not about one entry
                # and fails the request (ER) instead.
                self.stats.error(exc.code, exc.message)
                results.append(exc.message)
        return SubscriptionSet(request.request_id, tuple(results), request.protocol)
