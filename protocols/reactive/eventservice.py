"""The event service the ReactiveSocket draft and RSocket 1.0 both offer.

Both protocols take the same requests (the draft's MessagePack schema:
append, read, query, subscribe; ``protocols/reactive/payloads.py``) and
answer from the same store; only framing, routing and data encoding differ.
These functions are the part between a decoded request and the core's
commands, written once for both adapters.  Storage is reached only through
the connection's :class:`~polyport.core.access.Tenant`, which checks every
context against the principal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from polyport.core.access import Tenant
from polyport.core.commands import (
    ANY,
    BEGINNING,
    END,
    NO_STREAM,
    Append,
    ExactVersion,
    Expected,
    FromPosition,
    FromTime,
    FromVersion,
    ReadStream,
    Selector,
    Start,
    Subscribe,
)
from polyport.core.events import DEFAULT_CONTENT_TYPE, RecordedEvent, event_data, new_event_id
from polyport.core.groups import GroupMember
from polyport.core.limits import check_body_size
from polyport.core.subscriptions import Subscription
from polyport.protocols.reactive.payloads import (
    AppendRequest,
    EventMap,
    QueryRequest,
    ReadRequest,
    StartAt,
    SubscribeRequest,
)


@dataclass(eq=False)
class StreamWork:
    """What runs for one live stream of a connection."""

    stream_id: int
    task: asyncio.Task[None] | None = None
    # Set on REQUEST_N: a stream waiting for credits resumes.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    sub: Subscription | GroupMember | None = None

    def stop(self) -> None:
        if self.sub is not None:
            self.sub.close()
        if self.task is not None and not self.task.done():
            self.task.cancel()


def event_map(ev: RecordedEvent) -> EventMap:
    """A recorded event as the schema's event map: the body as stored, with
    its content type (both protocols are byte consumers)."""
    # Positional (the fields' order): once per event sent, and keywords cost
    # twice as much in a frozen dataclass.
    return EventMap(
        ev.event_id, ev.context, ev.stream, ev.version, ev.position, ev.type, ev.headers,
        ev.body, ev.content_type, ev.recorded_at_ms,
    )


def expected_from(expected_version: int | None) -> Expected:
    """``expected_version`` is the stream's current last version: absent = no
    check, 0 = the stream must not exist, n = the first new event gets n + 1."""
    if expected_version is None:
        return ANY
    if expected_version == 0:
        return NO_STREAM
    return ExactVersion(expected_version + 1)


def start_from(start: StartAt | None) -> Start:
    """Where a subscription starts; the client not saying means the end."""
    if start is None or start.kind == "end":
        return END
    if start.kind == "beginning":
        return BEGINNING
    assert start.value is not None
    if start.kind == "position":
        return FromPosition(start.value)
    if start.kind == "version":
        return FromVersion(start.value)
    return FromTime(datetime.fromtimestamp(start.value / 1000, tz=UTC))


def append_command(
    context: str, request: AppendRequest, *, max_event_bytes: int, origin: str
) -> Append:
    events = []
    for i, e in enumerate(request.events):
        check_body_size(len(e.body), max_event_bytes, f"events[{i}]: body")
        events.append(
            event_data(
                e.type, e.body, e.id if e.id is not None else new_event_id(),
                e.content_type or DEFAULT_CONTENT_TYPE, e.headers,
            )
        )
    return Append(
        context, request.stream, tuple(events), expected_from(request.expected_version),
        origin=origin,
    )


async def read_events(
    tenant: Tenant,
    context: str,
    request: ReadRequest,
    *,
    default_max: int,
    page: int,
    max_bytes: int,
) -> list[RecordedEvent]:
    """Up to ``max`` events from ``from_version``, stopping early once the
    bodies pass ``max_bytes`` (always at least one event; the client reads
    on from the last version + 1)."""
    wanted = request.max if request.max is not None else default_max
    out: list[RecordedEvent] = []
    size = 0
    version = request.from_version
    while len(out) < wanted:
        count = min(page, wanted - len(out))
        batch = await tenant.read_stream(ReadStream(context, request.stream, version, count))
        for ev in batch:
            if out and size + len(ev.body) > max_bytes:
                return out
            out.append(ev)
            size += len(ev.body)
        if len(batch) < count:
            break
        version = batch[-1].version + 1
    return out


async def finite_read(
    tenant: Tenant, context: str, request: ReadRequest, *, page: int
) -> AsyncIterator[RecordedEvent]:
    """The events of a streamed read: from ``from_version`` up to the
    stream's last version when the request came ("finite"), at most ``max``."""
    state = await tenant.stream_state(context, request.stream)
    end = state[0] if state is not None else 0
    remaining = request.max
    version = request.from_version
    while version <= end and (remaining is None or remaining > 0):
        count = min(page, end - version + 1)
        if remaining is not None:
            count = min(count, remaining)
        batch = await tenant.read_stream(ReadStream(context, request.stream, version, count))
        if not batch:
            return
        for ev in batch:
            if ev.version > end:
                return
            yield ev
            version = ev.version + 1
            if remaining is not None:
                remaining -= 1
        if len(batch) < count:
            return


def subscribe_command(context: str, request: SubscribeRequest, *, buffer_size: int) -> Subscribe:
    selector = Selector(
        context=context,
        stream=request.stream,
        prefix=request.prefix,
        types=frozenset(request.types),
    )
    # A group name is the context's own (the core keys groups by (context,
    # name)), so it goes to the core as the client spelled it.
    durable = request.group or None
    return Subscribe(selector, start_from(request.start), durable=durable, buffer_size=buffer_size)


async def query_documents(tenant: Tenant, request: QueryRequest) -> list[object]:
    """A binder's matching documents (Forbidden unless the principal may
    use the binder's context: :meth:`Tenant.query` checks)."""
    result = await tenant.query(request.binder, dict(request.matcher))
    return [doc async for doc in result]
