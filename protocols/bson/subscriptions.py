"""SUBSCRIBE / UNSUBSCRIBE / ACKEV and RECEV delivery of one BSON connection.

Each granted subscription has a delivery task that sends RECEV frames as the
core hands over events.  Delivery pauses while the connection's ACKEV byte
window is full; the core's buffer behind it is bounded, so a paused
subscription falls back to catch-up reads instead of holding events.  For a
durable subscription, ACKEV also moves the group's acknowledged position.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import bson
from bson.binary import Binary

from polyport.core.binders import to_jsonable
from polyport.core.bodies import BSON, event_document, media_type
from polyport.core.commands import END, FromTime, FromVersion, Selector, Start
from polyport.core.commands import Subscribe as CoreSubscribe
from polyport.core.errors import Busy, Malformed, NotFound, PolyportError
from polyport.core.events import RecordedEvent
from polyport.core.groups import GroupMember
from polyport.core.matcher import compile_matcher
from polyport.core.subscriptions import Subscription
from polyport.protocols.bson.errors import (
    LocalProtocolError,
    ProtocolError,
    error_response,
    sub_error,
)
from polyport.protocols.bson.frames import AckEv, Frame, Recev, Response, SubResponse, Subscribe
from polyport.protocols.bson.replies import OK, done
from polyport.protocols.bson.state import State
from polyport.protocols.bson.wire import DECODE_OPTIONS
from polyport.protocols.errors import TOO_LARGE
from polyport.protocols.session import DELIVERY_BATCH

if TYPE_CHECKING:
    from polyport.protocols.bson.adapter import BsonSession


def recev_document(ev: RecordedEvent) -> dict[str, Any]:
    """The RECEV ``event`` document of a stored event (design brief, "Bodies
    across protocols", via core.bodies).  BSON bodies are decoded with the
    wire options so that dates outside Python's range survive the round
    trip instead of degrading to ``{"data": <bytes>}``."""
    if media_type(ev.content_type) == BSON:
        try:
            return dict(bson.decode(ev.body, codec_options=DECODE_OPTIONS))
        except Exception:  # noqa: BLE001 - an undecodable body is sent as the generic document
            pass
    return event_document(ev)


@dataclass(eq=False, slots=True)
class _Sub:
    sub_id: int
    source: Subscription | GroupMember | None = None
    task: asyncio.Task[None] | None = None
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    # Durable only: (position, RECEV bytes) delivered and not yet acknowledged,
    # oldest first, and bytes acknowledged beyond the last whole event.
    unacked: deque[tuple[int, int]] = field(default_factory=deque)
    ack_credit: int = 0
    closed: bool = False

    @property
    def durable(self) -> bool:
        return isinstance(self.source, GroupMember)

    def close(self) -> None:
        self.closed = True
        if self.task is not None:
            self.task.cancel()
        if self.source is not None:
            self.source.close()


class Subscriptions:
    """The subscriptions of one session, by the subID the server granted."""

    def __init__(self, session: BsonSession) -> None:
        self.session = session
        self._subs: dict[int, _Sub] = {}
        self._next_sub_id = 1

    # --- requests ----------------------------------------------------------------

    async def subscribe(self, frame: Subscribe) -> None:
        session = self.session
        limit = session.limits.max_subscriptions
        if len(self._subs) >= limit:
            exc = Busy(f"SUBSCRIBE: at most {limit} subscriptions")
            await session.reply(done(sub_error(exc)))
            return
        try:
            selector, start = self._selector(frame)
        except PolyportError as exc:
            await session.reply(done(sub_error(exc)))
            return
        sub = _Sub(self._next_sub_id)
        self._next_sub_id += 1
        self._subs[sub.sub_id] = sub
        command = CoreSubscribe(
            selector,
            start,
            durable=frame.durable_id,
            buffer_size=session.limits.subscription_buffer,
        )
        task = session.spawn(self._open(sub, command))
        await session.reply(task, after=lambda reply: self._start_delivery(sub, reply))

    def unsubscribe(self, sub_id: int) -> Response:
        sub = self._subs.pop(sub_id, None)
        if sub is None:
            return error_response(NotFound(f"UNSUBSCRIBE: no subscription with subID {sub_id}"))
        # Unacknowledged events of a durable subscription stay due: the next
        # subscriber with that durableID gets them.
        sub.close()
        return OK

    def ack(self, frame: AckEv) -> None:
        # The connection has already updated the byte window.
        sub = self._subs.get(frame.sub_id)
        if sub is None:
            return  # can cross an UNSUBSCRIBE
        if isinstance(sub.source, GroupMember) and sub.unacked:
            position = self._acked_position(sub, frame.num_bytes)
            if position is not None:
                sub.source.ack_through(position)
        if not self.session.conn.is_delivery_paused(sub.sub_id):
            sub.resume.set()

    def close_all(self) -> None:
        """Stop every delivery and release the core subscriptions."""
        for sub in self._subs.values():
            sub.close()
        self._subs.clear()

    # --- opening -----------------------------------------------------------------

    def _selector(self, frame: Subscribe) -> tuple[Selector, Start]:
        if not frame.stream_name:
            raise Malformed("SUBSCRIBE: 'streamName' must not be empty")
        if frame.start_seq is not None and frame.start_timestamp is not None:
            raise Malformed("SUBSCRIBE: give startSeq or startTimestamp, not both")
        start: Start = END
        if frame.start_seq is not None:
            if frame.start_seq < 0:
                raise Malformed(f"SUBSCRIBE: startSeq must be >= 0, got {frame.start_seq}")
            start = FromVersion(frame.start_seq + 1)  # seqNo = version - 1
        elif frame.start_timestamp is not None:
            try:
                when = datetime.fromtimestamp(frame.start_timestamp / 1000, UTC)
            except (OverflowError, OSError, ValueError):
                raise Malformed(
                    f"SUBSCRIBE: startTimestamp {frame.start_timestamp} is out of range"
                ) from None
            start = FromTime(when)
        matcher = None
        spec = None
        if frame.matcher is not None:
            predicate = compile_matcher(frame.matcher)  # Malformed names the bad part

            def matcher(ev: RecordedEvent) -> bool:
                return predicate(recev_document(ev))

            # The JSON-able form: durable subscriptions persist it.
            spec = to_jsonable(frame.matcher)
        selector = Selector(
            context=self.session.context,
            stream=frame.stream_name,
            types=frozenset({frame.event_type}) if frame.event_type is not None else frozenset(),
            matcher=matcher,
            matcher_spec=spec,
        )
        return selector, start

    async def _open(self, sub: _Sub, command: CoreSubscribe) -> Frame:
        try:
            if command.durable is not None and not command.durable:
                raise Malformed("SUBSCRIBE: 'durableID' must not be empty")
            source = await self.session.tenant.subscribe(command)
        except Exception as exc:  # noqa: BLE001 - sub_error translates any failure for the client
            self._subs.pop(sub.sub_id, None)
            return sub_error(exc)
        if sub.closed:  # unsubscribed or connection ending meanwhile
            source.close()
            return sub_error(NotFound(f"subscription {sub.sub_id} was closed"))
        sub.source = source
        return SubResponse(ok=True, sub_id=sub.sub_id)

    def _start_delivery(self, sub: _Sub, reply: Frame) -> None:
        if isinstance(reply, SubResponse) and reply.ok and not sub.closed:
            sub.task = self.session.spawn(self._deliver(sub))

    # --- delivery ----------------------------------------------------------------

    async def _deliver(self, sub: _Sub) -> None:
        session = self.session
        conn = session.conn
        source = sub.source
        assert source is not None
        # Events taken from the core buffer, not yet sent: a batch is taken at
        # once, then sent as the delivery window allows.  A group member takes
        # one at a time: its consumer's ack timeout runs from the hand-out.
        held: deque[RecordedEvent] = deque()
        batch = 1 if sub.durable else DELIVERY_BATCH
        while not sub.closed:
            while conn.is_delivery_paused(sub.sub_id):
                # Above the unacknowledged-bytes limit: wait for ACKEV.  The
                # core buffer behind us fills, then that subscription drops
                # back to catch-up reads: nothing else waits for us.
                sub.resume.clear()
                await sub.resume.wait()
            if not held:
                held.extend(await source.next_batch(batch))
                if not held or sub.closed or conn.state is not State.CONNECTED:
                    return
            chunks: list[bytes] = []
            while held and not conn.is_delivery_paused(sub.sub_id):
                ev = held.popleft()
                try:
                    data = self._recev_bytes(sub, ev)
                except LocalProtocolError as err:
                    # Only an event too large for any frame gets here; it
                    # cannot be skipped silently, so the connection ends with
                    # the reason (after what was encoded before it).
                    if chunks:
                        await session.out.send(b"".join(chunks))
                    self._subs.pop(sub.sub_id, None)
                    await session.fatal(
                        ProtocolError(
                            f"subscription {sub.sub_id}: event at position {ev.position} "
                            f"cannot be delivered: {err.message}",
                            code=err.code,
                        )
                    )
                    return
                if sub.durable:
                    sub.unacked.append((ev.position, len(data)))
                chunks.append(data)
            if chunks:
                session.ctx.stats.frames_out += len(chunks)
                await session.out.send(b"".join(chunks))

    def _recev_bytes(self, sub: _Sub, ev: RecordedEvent) -> bytes:
        def frame(doc: dict[str, Any]) -> Recev:
            # Positional (sub_id, stream_name, event_type, timestamp, seq_no,
            # event): one per event delivered.
            return Recev(sub.sub_id, ev.stream, ev.type, ev.recorded_at_ms, ev.version - 1, doc)

        conn = self.session.conn
        try:
            return conn.send(frame(recev_document(ev)))
        except LocalProtocolError as err:
            if err.code == TOO_LARGE:
                raise
            # A body document BSON cannot hold (integers beyond int64 in JSON,
            # non-string MessagePack keys, ...): the raw form of "Bodies across
            # protocols", the body as a string when it is UTF-8, else binary.
            try:
                raw: Any = ev.body.decode("utf-8")
            except UnicodeDecodeError:
                raw = Binary(ev.body)
            return conn.send(frame({"data": raw}))

    @staticmethod
    def _acked_position(sub: _Sub, num_bytes: int | None) -> int | None:
        """The last delivered event the ACKEV covers: all of them without
        ``bytes``; else as many whole RECEVs, oldest first, as the bytes pay for."""
        position = None
        if num_bytes is None:
            position = sub.unacked[-1][0]
            sub.unacked.clear()
            sub.ack_credit = 0
            return position
        sub.ack_credit += num_bytes
        while sub.unacked and sub.unacked[0][1] <= sub.ack_credit:
            position, size = sub.unacked.popleft()
            sub.ack_credit -= size
        if not sub.unacked:
            sub.ack_credit = 0
        return position
