"""Segment wire adapter: segment-wire requests <-> canonical core commands.

One :class:`SegmentSession` per TCP connection.  The sans-IO
:class:`~protocols.segment.connection.ServerConnection` turns bytes into
SetupAppend / BlockEvents / ReadSegment / KeepAlive; this module maps them:

Every storage call goes through a :class:`~polyport.core.access.Tenant`: the
optional credentials at the end of SetupAppend and ReadSegment log in (absent
or empty = anonymous), and the tenant refuses contexts the principal may not
use (AUTH_FAILED).

- SetupAppend(cid, "<context>/<stream>") -> ``tenant.producer_ack_level`` ->
  AppendSetup(ack level).
- BlockEvents -> one ``Append`` of the events after the ack level, with a
  ``ProducerCheckpoint`` so the new ack level commits in the same transaction
  -> DataAppended after the commit.
- ReadSegment -> ``tenant.read_segment`` -> one SegmentRead; at the tail the
  read waits (bounded) for new data first.
- KeepAlive -> the same KeepAlive back.

Appends and setups run in order on one worker task per connection (a block
is acknowledged only after everything before it is stored, so acks never
leave a gap); reads run on a second task so a read waiting at the tail never
delays appends.  Both queues are bounded: when they are full ``data_received``
waits, and the transport stops reading the socket.

Decisions are documented in ``docs/protocols/segment.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from polyport.core.access import Tenant
from polyport.core.commands import (
    Append,
    FromPosition,
    ProducerCheckpoint,
    SegmentChunk,
    Selector,
    Subscribe,
)
from polyport.core.commands import ReadSegment as CoreReadSegment
from polyport.core.errors import (
    Busy,
    Internal,
    Malformed,
    NotFound,
    PolyportError,
    WrongExpectedVersion,
)
from polyport.core.events import EventData, event_data
from polyport.core.segments import segment_chunk_from_live
from polyport.protocols.budgets import BudgetAccount
from polyport.protocols.errors import TIMEOUT
from polyport.protocols.errors import RemoteProtocolError as SharedRemoteProtocolError
from polyport.protocols.segment.connection import ServerConnection, ServerInput
from polyport.protocols.segment.errors import LocalProtocolError, RemoteProtocolError, error_reply
from polyport.protocols.segment.frames import (
    PROTOCOL,
    AppendSetup,
    DataAppended,
    ErrorReply,
    KeepAlive,
    ReadSegment,
    ReplyFrame,
    SegmentRead,
    SetupAppend,
    split_credentials,
)
from polyport.protocols.segment.limits import Limits
from polyport.protocols.segment.state import BlockEvents
from polyport.protocols.segment.wire import split_segment_name
from polyport.protocols.session import (
    ByteStreamSession,
    ListenerStats,
    Outbound,
    SessionContext,
    SessionTasks,
)

# Segment data carries no type or content type of its own.
EVENT_TYPE = "segment-event"
CONTENT_TYPE = "application/octet-stream"

# Complete blocks (and setups) waiting for the append worker, in EVENT-framed
# bytes; one block is always admitted so a block up to max_block_size fits.
MAX_QUEUED_APPEND_BYTES = 8 << 20
MAX_QUEUED_READS = 16
# Consecutive queued blocks of one ConnectionId are stored as one Append (one
# transaction, one ack); this caps that Append.
MAX_COALESCE_EVENTS = 10_000
MAX_COALESCE_BYTES = 8 << 20
# The core answers Busy when its writer queue is full; an append is retried
# for this long before the connection fails with ``busy``.
BUSY_RETRY_SECONDS = 10.0
# Appends a tail read's live wait takes in at once (a burst that woke it);
# more than these overflow to a read of the database.
LIVE_READ_EVENTS = 64

AppenderKey = tuple[uuid.UUID, str, str]  # (ConnectionId, context, stream)


def event_id_base(key: AppenderKey) -> int:
    cid, context, stream = key
    digest = hashlib.sha1(cid.bytes + f"{context}/{stream}".encode(), usedforsecurity=False)
    return int.from_bytes(digest.digest()[:16], "big")


def event_id(key: AppenderKey, offset: int, base: int | None = None) -> uuid.UUID:
    """Deterministic event id of the event a ConnectionId wrote at ``offset``.

    The ack level already drops resent data; the id is a second line of
    defence: should two connections ever race with the same ConnectionId (for
    instance across gateway processes), the core's idempotency turns a
    duplicate into a no-op or an error instead of a second copy.  A hash of the
    key XOR the offset: unique per key, and cheap per event (uuid5 per event
    cost more than the rest of the adapter)."""
    if base is None:
        base = event_id_base(key)
    return uuid.UUID(int=base ^ offset)


class AppenderRegistry:
    """Per listener: which session currently owns each (ConnectionId, segment),
    and one lock per key so a SetupAppend reads the ack level only after any
    append of the same key in this process has finished."""

    def __init__(self) -> None:
        self._owners: dict[AppenderKey, SegmentSession] = {}
        self._locks: dict[AppenderKey, tuple[asyncio.Lock, int]] = {}
        # In-flight commits outlive their connection (see SegmentSession):
        # held here while they run, never cancelled.
        self.background = SessionTasks()

    @contextlib.asynccontextmanager
    async def locked(self, key: AppenderKey) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def claim(self, key: AppenderKey, session: SegmentSession) -> None:
        self._owners[key] = session

    def owner(self, key: AppenderKey) -> SegmentSession | None:
        return self._owners.get(key)

    def release(self, key: AppenderKey, session: SegmentSession) -> None:
        if self._owners.get(key) is session:
            del self._owners[key]

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = self.background.spawn(coro)
        task.add_done_callback(self._settled)
        return task

    @staticmethod
    def _settled(task: asyncio.Task[Any]) -> None:
        # Its connection may be gone; the error was reported there if it was not.
        if not task.cancelled():
            task.exception()


@dataclass(slots=True)
class _Appender:
    key: AppenderKey
    segment: str
    ack_level: int
    # Who set it up: its appends go through this tenant.
    tenant: Tenant
    id_base: int = 0

    def __post_init__(self) -> None:
        self.id_base = event_id_base(self.key)


@dataclass(frozen=True, slots=True)
class _Fatal:
    """Queued after the requests that preceded a protocol error, so they are
    still answered before the error reply and the close."""

    reply: ErrorReply
    code: str


_AppendItem = SetupAppend | BlockEvents | _Fatal


@dataclass(slots=True)
class _AppendQueue:
    """FIFO of setups and blocks, bounded by EVENT-framed bytes."""

    limit: int
    items: deque[tuple[_AppendItem, int]] = field(default_factory=deque)
    size: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    space: asyncio.Event = field(default_factory=asyncio.Event)

    async def put(self, item: _AppendItem, cost: int) -> None:
        while self.items and self.size + cost > self.limit:
            self.space.clear()
            await self.space.wait()
        self.items.append((item, cost))
        self.size += cost
        self.ready.set()

    async def get(self) -> _AppendItem:
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        return self._pop()

    def peek(self) -> _AppendItem | None:
        return self.items[0][0] if self.items else None

    def _pop(self) -> _AppendItem:
        item, cost = self.items.popleft()
        self.size -= cost
        self.space.set()
        return item

    def pop(self) -> _AppendItem:
        return self._pop()


def _block_cost(block: BlockEvents) -> int:
    return block.end_offset - block.offset + 64


class SegmentSession(ByteStreamSession[Limits, ServerConnection]):
    """The server side of one segment-wire connection (a StreamSession)."""

    limits_type = Limits
    peer_fault = RemoteProtocolError

    def __init__(
        self,
        ctx: SessionContext,
        out: Outbound,
        registry: AppenderRegistry,
        limits: Limits | None = None,
        input_budget: BudgetAccount | None = None,
    ) -> None:
        self._registry = registry
        super().__init__(ctx, out, limits, input_budget)

    def _connection(self) -> ServerConnection:
        return ServerConnection(
            self.limits.max_message_size, max_block_size=self.limits.max_block_size
        )

    def _init_state(self) -> None:
        # Logins of this connection by credentials string ("" = anonymous):
        # a client sends the same credentials with every request.
        self._tenants: dict[str, Tenant] = {}
        self._stats: ListenerStats = self.ctx.stats
        self._log = self.ctx.log
        self._appends = _AppendQueue(limit=MAX_QUEUED_APPEND_BYTES)
        self._reads: asyncio.Queue[ReadSegment] = asyncio.Queue(maxsize=MAX_QUEUED_READS)
        self._appenders: dict[uuid.UUID, _Appender] = {}
        # The append and read workers (in self._tasks), each started with its
        # first request.
        self._append_task: asyncio.Task[None] | None = None
        self._read_task: asyncio.Task[None] | None = None

    # --- StreamSession ------------------------------------------------------

    async def _undecodable(self, exc: SharedRemoteProtocolError) -> None:
        # The byte stream cannot be resynchronised: answer what came
        # before (already queued), then the error, then close.
        fault = cast(RemoteProtocolError, exc)  # a peer_fault
        self._log.debug("segment: %s from %s: %s", fault.code, self.out.peer, fault.message)
        await self._fail_after_queued(fault.reply(), fault.code)

    async def _received(self, inputs: list[ServerInput]) -> None:
        if inputs:  # segment has no login: its first valid request ends the handshake
            self.out.handshake_done()
        for item in inputs:
            self._stats.frames_in += 1
            if isinstance(item, KeepAlive):
                await self._send(KeepAlive(item.data))
            elif isinstance(item, ReadSegment):
                self._ensure_read_worker()
                await self._reads.put(item)
            elif isinstance(item, BlockEvents):
                self._ensure_append_worker()
                await self._appends.put(item, _block_cost(item))
            else:
                self._ensure_append_worker()
                await self._appends.put(item, 64)

    async def frame_timed_out(self, message: str) -> None:
        if self.closing:
            return
        # As a codec fault: the replies already due, then the error, then close.
        await self._fail_after_queued(error_reply(TIMEOUT, message), TIMEOUT)

    async def _fail_after_queued(self, reply: ErrorReply, code: str) -> None:
        """Read no more; the append worker answers what is queued, then sends
        ``reply`` and closes."""
        self.closing = True
        self._ensure_append_worker()
        await self._appends.put(_Fatal(reply, code), 0)

    async def connection_lost(self) -> None:
        self.closing = True
        if self.conn.budget is not None:
            self.conn.budget.close()
        await self._tasks.close()
        # An append already handed to the core is not cancelled (it runs in a
        # registry task holding its key's lock), so a reconnecting writer
        # reads the ack level only after it settled.
        for appender in self._appenders.values():
            self._registry.release(appender.key, self)
        self._appenders.clear()

    # --- plumbing -------------------------------------------------------------

    def _ensure_append_worker(self) -> None:
        if self._append_task is None:
            self._append_task = self._tasks.spawn(
                self._append_worker(), name=f"segment-append {self.out.peer}"
            )

    def _ensure_read_worker(self) -> None:
        if self._read_task is None:
            self._read_task = self._tasks.spawn(
                self._read_worker(), name=f"segment-read {self.out.peer}"
            )

    async def _send(self, reply: ReplyFrame) -> None:
        data = self.conn.send(reply)
        self._stats.frames_out += 1
        await self.out.send(data)

    async def _fail(self, reply: ErrorReply, code: str) -> None:
        """Error reply, then close: used wherever the client's view of its
        appends may no longer match the server's (it resends after
        reconnecting)."""
        self.closing = True
        self._stats.error(code, getattr(reply, "message", None))
        try:
            await self._send(reply)
        except LocalProtocolError:
            # An error reply may always be sent; failing here is our bug.  The
            # connection is closed all the same.
            self._log.exception("segment: cannot send the error reply to %s", self.out.peer)
        self.out.close()

    async def _revoked(self, code: str, message: str) -> None:
        """The user's rights were revoked while connected: AUTH_FAILED, then close."""
        await self._fail(error_reply(code, message), code)

    async def _tenant_for(self, credentials: str, context: str) -> Tenant:
        """The tenant of a request's credentials (anonymous when empty),
        checked for ``context`` before anything is read or stored."""
        tenant = self._tenants.get(credentials)
        if tenant is None:
            user, password = split_credentials(credentials)
            tenant = await self.ctx.authenticate(user, password)
            self._tenants[credentials] = tenant
        tenant.check(context)
        return tenant

    # --- appends ------------------------------------------------------------------

    async def _append_worker(self) -> None:
        while True:
            item = await self._appends.get()
            if isinstance(item, _Fatal):
                await self._fail(item.reply, item.code)
                return
            segment = item.segment
            try:
                if isinstance(item, SetupAppend):
                    await self._setup(item)
                else:
                    await self._store_blocks(self._coalesce(item))
            except RemoteProtocolError as exc:
                await self._fail(exc.reply(), exc.code)
                return
            except PolyportError as exc:
                self._log.info("segment append on %r failed: %s", segment, exc.message)
                await self._fail(error_reply(exc.code, exc.message, segment=segment), exc.code)
                return
            except Exception as exc:  # noqa: BLE001 - the connection fails, never silently
                # Our own bug (a LocalProtocolError, or anything unexpected),
                # not the client's: logged as such and answered ``internal``,
                # never with the code a peer fault would get.  Were this task
                # to end quietly, the client would wait for acks forever.
                self._log.exception("segment: append on %r failed", segment)
                code = Internal.code
                detail = (exc.message if isinstance(exc, LocalProtocolError)
                          else f"append failed: {exc}")
                await self._fail(error_reply(code, detail, segment=segment), code)
                return

    async def _setup(self, frame: SetupAppend) -> None:
        context, stream = split_segment_name(frame.segment)
        tenant = await self._tenant_for(frame.credentials, context)
        key: AppenderKey = (frame.connection_id, context, stream)
        async with self._registry.locked(key):
            ack = await tenant.producer_ack_level(frame.connection_id, context, stream)
            # A newer SetupAppend fences older connections of the same key.
            self._registry.claim(key, self)
        previous = self._appenders.get(frame.connection_id)
        if previous is not None and previous.key != key:
            self._registry.release(previous.key, self)
        self._appenders[frame.connection_id] = _Appender(key, frame.segment, ack, tenant)
        if self.conn.segment_of(frame.connection_id) != frame.segment:
            return  # a later SetupAppend for this cid (other segment) supersedes this one
        # The same SetupAppend sent twice before our reply: the first reply
        # already set the appender up with this ack level.
        with contextlib.suppress(LocalProtocolError):
            await self._send(AppendSetup(frame.segment, frame.connection_id, ack))

    def _coalesce(self, first: BlockEvents) -> list[BlockEvents]:
        """``first`` plus the blocks of the same ConnectionId queued right
        behind it: stored as one Append, they cost one commit and one ack."""
        blocks = [first]
        events, size = len(first.events), first.end_offset - first.offset
        while True:
            nxt = self._appends.peek()
            if (
                not isinstance(nxt, BlockEvents)
                or nxt.connection_id != first.connection_id
                or nxt.offset != blocks[-1].end_offset
                or events + len(nxt.events) > MAX_COALESCE_EVENTS
                or size + (nxt.end_offset - nxt.offset) > MAX_COALESCE_BYTES
            ):
                return blocks
            self._appends.pop()
            blocks.append(nxt)
            events += len(nxt.events)
            size += nxt.end_offset - nxt.offset

    async def _store_blocks(self, blocks: list[BlockEvents]) -> None:
        cid = blocks[0].connection_id
        appender = self._appenders.get(cid)
        if appender is None:  # the codec only emits blocks of set-up cids
            raise RemoteProtocolError(f"append block for ConnectionId {cid} before its SetupAppend")
        # The commit runs in a registry task: if this connection drops while
        # the core is committing, the commit still completes (and releases the
        # key's lock) before a reconnecting writer reads its ack level.
        task = self._registry.spawn(self._locked_append(appender, blocks))
        ack = await asyncio.shield(task)
        appender.ack_level = ack
        await self._send(DataAppended(cid, ack))

    async def _locked_append(self, appender: _Appender, blocks: list[BlockEvents]) -> int:
        key = appender.key
        context, stream = key[1], key[2]
        async with self._registry.locked(key):
            if self._registry.owner(key) is not self:
                raise WrongExpectedVersion(
                    f"ConnectionId {key[0]} was set up again for {appender.segment!r} on "
                    "another connection; this connection no longer appends for it"
                )
            ack = appender.ack_level
            events: list[EventData] = []
            for block in blocks:
                kept = block.events_after(ack)  # drops resent data at or below the ack level
                offsets = block.event_offsets()[len(block.events) - len(kept) :]
                events.extend(
                    event_data(EVENT_TYPE, data, event_id(key, offset, appender.id_base),
                               CONTENT_TYPE)
                    for offset, data in zip(offsets, kept, strict=True)
                )
            end = blocks[-1].end_offset
            if not events:
                return max(ack, end)
            command = Append(
                context=context,
                stream=stream,
                events=tuple(events),
                origin=PROTOCOL,
                producer_checkpoint=ProducerCheckpoint(key[0], end),
            )
            await self._append(appender.tenant, command)
            appender.ack_level = end
            return end

    async def _append(self, tenant: Tenant, command: Append) -> None:
        deadline = time.monotonic() + BUSY_RETRY_SECONDS
        delay = 0.01
        while True:
            try:
                await tenant.append(command)
                return
            except Busy:
                # Nothing was queued: waiting keeps the writer's data in its
                # socket (backpressure) instead of failing the connection.
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    # --- reads ------------------------------------------------------------------------

    async def _read_worker(self) -> None:
        while True:
            request = await self._reads.get()
            try:
                reply: ReplyFrame = await self._read(request)
            except RemoteProtocolError as exc:
                self._stats.error(exc.code, exc.message)
                reply = exc.reply()
            except PolyportError as exc:
                # A failed read leaves the connection usable: reads carry no
                # state, so only this request is answered with the error.
                self._stats.error(exc.code, exc.message)
                reply = error_reply(exc.code, exc.message, segment=request.segment)
            except Exception as exc:  # noqa: BLE001 - one read fails, never the read task
                # Were this task to end, every later read on the connection
                # would wait forever with the connection still open.
                self._stats.error(Internal.code)
                self._log.exception("segment: read of %r failed", request.segment)
                reply = error_reply(Internal.code, f"read failed: {exc}", segment=request.segment)
            await self._send(reply)

    async def _read(self, request: ReadSegment) -> SegmentRead:
        context, stream = split_segment_name(request.segment)
        tenant = await self._tenant_for(request.credentials, context)
        limit = self.limits.max_reply_bytes
        budget = min(request.suggested_length, limit) if request.suggested_length > 0 else limit
        waits = self.limits.read_wait > 0
        chunk = await self._read_chunk(tenant, request, context, stream, budget,
                                       held=waits)
        if not chunk.data and waits:
            chunk = await self._wait_for_data(tenant, request, context, stream, budget, chunk)
        data, at_tail = chunk.data, chunk.at_tail
        if len(data) > budget:
            # The core returns a whole event even when it is larger than asked;
            # the rest is read from the next offset.
            data, at_tail = data[:budget], False
        return SegmentRead(
            segment=request.segment,
            offset=request.offset,
            at_tail=at_tail,
            end_of_segment=False,  # streams are never sealed
            data=data,
        )

    async def _read_chunk(
        self, tenant: Tenant, request: ReadSegment, context: str, stream: str, budget: int,
        *, held: bool = False,
    ) -> SegmentChunk:
        try:
            chunk = await tenant.read_segment(CoreReadSegment(
                context, stream, request.offset, max_bytes=budget,
                held=held))
        except Malformed:
            if await tenant.stream_state(context, stream) is None:
                raise self._no_such_segment(request.segment) from None
            raise
        # Every event occupies at least 8 bytes: an empty segment is a stream
        # that does not exist.
        if chunk.tail_offset == 0:
            raise self._no_such_segment(request.segment)
        return chunk

    @staticmethod
    def _no_such_segment(segment: str) -> NotFound:
        return NotFound(f"segment {segment!r} does not exist (no event was ever appended to it)")

    async def _wait_for_data(
        self, tenant: Tenant, request: ReadSegment, context: str, stream: str, budget: int,
        at_tail: SegmentChunk,
    ) -> SegmentChunk:
        """At the tail (``at_tail``, the empty read): wait up to
        ``read_wait`` seconds for an append to the stream.  The subscription
        starts at the log head that read saw, so no append can slip in
        between the read and the wait."""
        head = at_tail.head_position
        assert head is not None, "the store names the head of every empty read"
        sub = await tenant.subscribe(
            Subscribe(Selector(context=context, stream=stream), start=FromPosition(head),
                      buffer_size=LIVE_READ_EVENTS)
        )
        try:
            events = await sub.next_batch(LIVE_READ_EVENTS, timeout=self.limits.read_wait)
            # The append that woke the wait is in hand: answered from it, not
            # by reading it back (two round trips on W3's critical path).
            live = segment_chunk_from_live(request.offset, events, budget)
            if live is not None:
                return live
            return await self._read_chunk(tenant, request, context, stream, budget)
        finally:
            sub.close()
