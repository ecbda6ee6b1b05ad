"""MicroMsg2 adapter: frames ⇄ canonical commands, one session per TCP connection.

    handshake  -> ServerConnection negotiation; x-auth (or anonymous) -> store.authenticate
    MESSAGE    -> Append to the destination's stream in the principal's default context;
                  with ack/batch-ack the server acks it only after the commit
    subscribe  -> topic/<s>: a plain Subscription from END (every subscriber gets
                  everything); queue/<s>: a consumer-group member (each event to one)
    deliveries -> MESSAGE frames, never more unacknowledged than the ack window
    ack        -> GroupMember.ack for queue deliveries

Failures: anything the codec cannot parse or allow from the peer
(RemoteProtocolError: bad bytes, bad command, bad destination, bad filter), a
failed authentication and a failed append are answered with one ERROR frame
and the connection is closed.  A well-formed ``subscribe``/``unsubscribe``
that fails (not subscribed, too many subscriptions, storage trouble) gets an
ERROR frame and the connection stays open.  A LocalProtocolError is our own
bug and is not answered as the peer's fault.  Details and the reasons are in
docs/protocols/micromsg2.md.
"""

from __future__ import annotations

import asyncio
import functools
import re
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from polyport.core.access import Tenant
from polyport.core.aio import settled
from polyport.core.bodies import JSON, OCTETS, body_json_text, loads_json
from polyport.core.commands import (
    ANY,
    END,
    Append,
    AppendBatch,
    Principal,
    Selector,
    build_append,
)
from polyport.core.commands import Subscribe as CoreSubscribe
from polyport.core.errors import Busy, NotFound, PolyportError
from polyport.core.events import (
    DEFAULT_CONTEXT,
    EventData,
    RecordedEvent,
    event_data,
    new_event_id,
)
from polyport.core.groups import GroupMember
from polyport.core.subscriptions import Subscription
from polyport.protocols.errors import TIMEOUT, UNSUPPORTED
from polyport.protocols.errors import RemoteProtocolError as SharedRemoteProtocolError
from polyport.protocols.micromsg2.connection import ServerConnection
from polyport.protocols.micromsg2.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.micromsg2.filters import INT64_MAX, INT64_MIN, Filter
from polyport.protocols.micromsg2.frames import (
    EXT_JSON,
    EXT_PUBSUB,
    PROTOCOL,
    SERVER_EXTENSIONS,
    Ack,
    Command,
    Error,
    Extension,
    Frame,
    Handshake,
    Message,
    PropertyValue,
)
from polyport.protocols.micromsg2.limits import Limits
from polyport.protocols.micromsg2.negotiation import Negotiated
from polyport.protocols.micromsg2.pubsub import (
    QUEUE,
    Destination,
    Subscribe,
    Unsubscribe,
    parse_pubsub_command,
)
from polyport.protocols.micromsg2.state import State
from polyport.protocols.session import ByteStreamSession, SessionTasks, logged_in

SERVER_IDENTITY = "polyport"

# Event type for a MESSAGE without a ``type`` property.
DEFAULT_EVENT_TYPE = "message"
TYPE_PROPERTY = "type"

# Per-connection bounds.  Client MESSAGEs being appended beyond this (or beyond
# Limits.max_pending_bytes of payload) stop the reading of the socket
# (TCP backpressure); with an ack extension the window usually binds first.
MAX_PENDING_MESSAGES = 1024
# A full writer queue (Busy) is waited out, not reported: the append is retried
# with the same event ids (idempotent) for up to this long.
BUSY_RETRY_SECONDS = 30.0
MAX_SUBSCRIPTIONS = 64
# Without an ack extension a queue member is granted this many events ahead of
# what has been written to the socket, so the group spreads events over the
# consumers instead of piling them on the first one.
QUEUE_CREDIT_WITHOUT_ACKS = 16
SUBSCRIPTION_BUFFER = 1000

# --- properties <-> headers -----------------------------------------------------------

# Header values are plain text, so every protocol reads them naturally: Text as
# it is, Number in decimal, Date as ISO 8601 UTC.  On the way out, a header
# value written exactly in one of those two forms becomes a Number or Date
# property again; everything else is Text.
_CANONICAL_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,18})")
_CANONICAL_DATE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{6})?Z"
)


def format_header_date(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


def property_to_header(value: PropertyValue) -> str:
    if isinstance(value, datetime):
        return format_header_date(value)
    if isinstance(value, int):
        return str(value)
    return value


def header_to_property(text: str) -> PropertyValue:
    if _CANONICAL_INT.fullmatch(text) and text != "-0":
        number = int(text)
        if INT64_MIN <= number <= INT64_MAX:
            return number
    if _CANONICAL_DATE.fullmatch(text):
        try:
            return datetime.fromisoformat(text)
        except ValueError:  # e.g. month 13: stays text
            pass
    return text


def message_to_event(message: Message, *, json_negotiated: bool,
                     context: str = DEFAULT_CONTEXT) -> EventData:
    """A client MESSAGE as an event: property ``type`` is the event type, every
    other property a header; the body is JSON when ``json`` was negotiated and
    the payload parses, else opaque bytes."""
    headers = {name: property_to_header(value) for name, value in message.properties.items()}
    event_type = headers.pop(TYPE_PROPERTY, "") or DEFAULT_EVENT_TYPE
    content_type = OCTETS
    if json_negotiated:
        try:
            loads_json(message.payload)
            content_type = JSON
        except (ValueError, UnicodeDecodeError, RecursionError):
            pass
    return event_data(event_type, message.payload, message_event_id(message, context),
                      content_type, headers)


# Any text is a message id; one that is not a UUID is mapped to one by name
# (UUID v5 in a namespace of the connection's context, itself derived from
# this one), so the same id always gives the same event id in one context
# and unrelated ones in two.
MESSAGE_ID_NAMESPACE = uuid.UUID("3f0b6a52-5d0e-4f4e-9a43-7c1f0a9b2d61")
MESSAGE_ID_PROPERTIES = ("message-id", "id")


def message_event_id(message: Message, context: str = DEFAULT_CONTEXT) -> uuid.UUID:
    """The event id of a MESSAGE in ``context``: its ``message-id`` (else
    ``id``) property when present, so that a resent message is stored once;
    otherwise fresh (such a message is not safe to resend: docs/errors.md)."""
    for name in MESSAGE_ID_PROPERTIES:
        value = message.properties.get(name)
        if value is None:
            continue
        text = str(value)
        try:
            return uuid.UUID(text)
        except ValueError:
            return uuid.uuid5(uuid.uuid5(MESSAGE_ID_NAMESPACE, context), text)
    return new_event_id()


def event_properties(ev: RecordedEvent) -> dict[str, PropertyValue]:
    """What a subscriber sees (and what filters test): the headers, typed back
    where they look like a number or date we wrote, plus ``type``.  A header
    with an empty name cannot be a property and is left out."""
    props: dict[str, PropertyValue] = {
        name: header_to_property(value) for name, value in ev.headers.items() if name
    }
    props[TYPE_PROPERTY] = ev.type
    return props


def event_payload(ev: RecordedEvent, *, json_negotiated: bool) -> bytes:
    """With ``json`` the body as JSON text (BSON / MessagePack documents become
    relaxed Extended JSON, every BSON date included); without it, the stored
    bytes."""
    if not json_negotiated:
        return ev.body
    return body_json_text(ev.content_type, ev.body).encode("utf-8")


def filter_selector(context: str, stream: str, flt: Filter | None) -> Selector:
    if flt is None or not flt.conditions:
        return Selector(context=context, stream=stream)

    def matcher(ev: RecordedEvent) -> bool:
        return flt(event_properties(ev))

    return Selector(context=context, stream=stream, matcher=matcher)


def queue_group_name(context: str, destination: Destination, flt: Filter | None) -> str:
    """Every consumer of one queue (same context, destination and filter)
    shares this durable name, hence one consumer group and one checkpoint."""
    name = f"micromsg2:{context}:{destination}"
    if flt is not None and flt.conditions:
        name += f";filter={flt}"
    return name


# --- the session ----------------------------------------------------------------------


def _pass_outcome(outcome: asyncio.Future[None], source: asyncio.Future[Any]) -> None:
    """``source``'s end, as a run's outcome (its result is not wanted)."""
    if outcome.done():
        return
    if source.cancelled():
        outcome.cancel()
    elif (exc := source.exception()) is not None:
        outcome.set_exception(exc)
    else:
        outcome.set_result(None)


@dataclass(eq=False)
class _PendingRun:
    """Consecutive client MESSAGEs submitted to the store together."""

    first_seq: int
    last_seq: int
    count: int
    size: int  # payload bytes
    future: asyncio.Future[None]

    def describe(self) -> str:
        if self.count == 1:
            return f"MESSAGE {self.first_seq} was"
        return f"MESSAGEs {self.first_seq}..{self.last_seq} were"


@dataclass(eq=False)
class _Sub:
    destination: Destination
    filter_text: str
    handle: Subscription | GroupMember
    task: asyncio.Task[None] | None = None
    is_queue: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_queue = isinstance(self.handle, GroupMember)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.handle.close()


class MicroMsg2Session(ByteStreamSession[Limits, ServerConnection]):
    """Implements protocols.session.StreamSession for one client connection."""

    limits_type = Limits
    peer_fault = RemoteProtocolError

    def _connection(self) -> ServerConnection:
        return ServerConnection(
            SERVER_IDENTITY,
            SERVER_EXTENSIONS,
            self.limits.required_extensions,
            max_payload=self.limits.max_payload,
            first_outbound_seq=self.limits.initial_seq,
        )

    def _init_state(self) -> None:
        # The store as the x-auth (or anonymous) principal may use it.
        self._tenant: Tenant | None = None
        self._stats = self.ctx.stats
        self._log = self.ctx.log
        self._loop = asyncio.get_running_loop()
        self.principal: Principal | None = None
        self.context = ""
        self._json = False
        self._acks = False
        self._subs: list[_Sub] = []
        # Runs of client MESSAGEs being appended, in arrival order.
        self._appends: deque[_PendingRun] = deque()
        # Acks go out from each run's done callback (_confirm); a task of the
        # session's, the confirmer, takes over while an ack must wait for the
        # socket to drain or a failure must be sent, then hands back.
        self._confirmer: asyncio.Task[None] | None = None
        self._pending_messages = 0
        self._pending_bytes = 0
        self._append_room = asyncio.Event()
        # self._tasks (ByteStreamSession's) holds the confirmer, the watchdog and
        # each subscription's pump.
        # Appends handed to the store: never cancelled, left to finish when the
        # connection is lost (they may commit; the client resends what was
        # not acked).
        self._commits = SessionTasks()
        # Queue deliveries waiting for the client's ack: seq -> (member, position).
        self._inflight: dict[int, tuple[GroupMember, int]] = {}
        self._window_open = asyncio.Event()
        self._last_activity = self._loop.time()
        self._started = self._last_activity
        # Called once the connection is gone (the listener's session registry).
        self.on_close: Callable[[MicroMsg2Session], None] | None = None
        if self.limits.idle_timeout:
            self._tasks.spawn(self._watch_idle(self.limits.idle_timeout))

    # --- introspection (status, tests) ----------------------------------------------

    @property
    def subscription_count(self) -> int:
        return len(self._subs)

    @property
    def negotiated(self) -> Negotiated | None:
        return self.conn.negotiated

    # --- StreamSession ----------------------------------------------------------------

    def _input_arrived(self) -> None:
        self._last_activity = self._loop.time()

    async def _undecodable(self, exc: SharedRemoteProtocolError) -> None:
        await self._fail(exc.code, exc.message)

    async def _received(self, frames: list[Frame]) -> None:
        self._stats.frames_in += len(frames)
        run: list[Message] = []
        try:
            for frame in frames:
                if self.closing:
                    return
                # Consecutive MESSAGEs go to the store as one submission (one
                # commit, far fewer tasks); anything else first flushes them, so
                # frames still take effect in the order they were sent.
                if isinstance(frame, Message):
                    run.append(frame)
                    continue
                if run:
                    await self._append_run(run)
                    run = []
                await self._handle(frame)
            if run and not self.closing:
                await self._append_run(run)
        except RemoteProtocolError as exc:
            # Only the peer's faults: a LocalProtocolError is our bug and goes
            # up to the transport, which logs it and closes the connection.
            await self._fail(exc.code, exc.message)
        except PolyportError as exc:
            await self._fail(exc.code, exc.message)

    async def frame_timed_out(self, message: str) -> None:
        await self._fail(TIMEOUT, message)

    async def connection_lost(self) -> None:
        self.closing = True
        if self.conn.budget is not None:
            self.conn.budget.close()
        if self.on_close is not None:
            self.on_close(self)
        self._window_open.set()
        self._append_room.set()
        for sub in self._subs:
            sub.close()
        self._subs.clear()
        self._inflight.clear()
        await self._tasks.close()
        # Appends already handed to the store (self._commits) are left to
        # finish: they may commit, but the client can no longer be told (it
        # resends what was not acked).

    # --- frames -----------------------------------------------------------------------

    async def _handle(self, frame: Frame) -> None:
        if isinstance(frame, Handshake):
            # Frames of one read are all decoded before any is handled, so the
            # connection's state may already be past this frame: which
            # handshake it is follows from whether the reply was sent.
            if self.conn.state is State.CLOSED:
                # A later frame of the same read (the peer's ERROR) ended the
                # handshake; that frame closes the connection when handled.
                return
            if self.conn.negotiated is None:  # the hello: answer it
                await self._send(self.conn.reply_frame())
            else:  # the final handshake: the connection is open
                await self._opened()
        elif isinstance(frame, Message):
            await self._append_run([frame])
        elif isinstance(frame, Command):
            await self._command(frame)
        elif isinstance(frame, Ack):
            self._on_acked(frame.acked)
        elif isinstance(frame, Extension):
            negotiated = self.conn.negotiated
            ext = negotiated.by_index(frame.ext_id) if negotiated else None
            name = ext.name if ext else str(frame.ext_id)
            raise RemoteProtocolError(
                f"EXTENSION frames are not defined for extension {name!r}", code=UNSUPPORTED
            )
        elif isinstance(frame, Error):
            # The peer gives up (e.g. it lacks an extension the server requires).
            # Not counted in the listener's errors: those are the server's own.
            self._log.info("micromsg2: %s sent ERROR %r; closing", self.out.peer, frame.message)
            self.closing = True
            self.out.close()

    @property
    def tenant(self) -> Tenant:
        """The store as the connection's principal may use it (once open)."""
        return logged_in(self._tenant, "the handshake has not completed")

    async def _opened(self) -> None:
        negotiated = self.conn.negotiated
        assert negotiated is not None
        user, password = negotiated.credentials or (None, None)
        tenant = await self.ctx.authenticate(user, password)
        # The connection acts in the principal's default context, checked
        # like any other (a user may have been given a default it may not use).
        self.context = tenant.context()
        self._tenant = tenant
        self.principal = tenant.principal
        self.out.handshake_done()
        self._json = negotiated.has(EXT_JSON)
        self._acks = negotiated.ack_window is not None

    # --- appends ----------------------------------------------------------------------

    async def _append_run(self, messages: list[Message]) -> None:
        """Append consecutive client MESSAGEs: adjacent ones to the same stream
        as one Append, several streams as one AppendBatch.  A bad destination
        stops the run there: the MESSAGEs before it are still appended."""
        grouped: list[tuple[str, list[EventData]]] = []
        bad: RemoteProtocolError | None = None
        taken = 0
        for message in messages:
            try:
                stream = Destination.parse(message.destination).stream
            except RemoteProtocolError as exc:
                bad = exc
                break
            event = message_to_event(message, json_negotiated=self._json,
                                     context=self.context)
            if grouped and grouped[-1][0] == stream:
                grouped[-1][1].append(event)
            else:
                grouped.append((stream, [event]))
            taken += 1
        if taken:
            appends = tuple(
                build_append(self.context, stream, tuple(events), ANY, PROTOCOL, None)
                for stream, events in grouped
            )
            size = sum(len(m.payload) for m in messages[:taken])
            while self._no_room(size) and not self.closing:
                self._append_room.clear()
                await self._append_room.wait()
            if self.closing:
                return
            self._pending_messages += taken
            self._pending_bytes += size
            # Queued now (or by a task, which starts in creation order), so
            # runs reach the writer (and commit) in the order the client
            # sent them.
            future = self._start_run(appends)
            pending = _PendingRun(messages[0].seq, messages[taken - 1].seq, taken, size, future)
            future.add_done_callback(lambda f: self._append_done(pending))
            self._appends.append(pending)
        if bad is not None:
            raise bad

    def _start_run(self, appends: tuple[Append, ...]) -> asyncio.Future[None]:
        """A run's outcome.  A run of one stream (W1's every MESSAGE) goes
        to the store's queue at once, its outcome passed on by a callback:
        a task per run was ~10 % of the gateway's W1 samples.  A batch, or a
        run the writer is too busy to take, goes through the retrying task."""
        if len(appends) == 1:
            try:
                queued = self.tenant.start_append(appends[0])
            except Busy:
                pass  # the task below waits for room
            except PolyportError as exc:
                failed: asyncio.Future[None] = self._loop.create_future()
                failed.set_exception(exc)
                return failed
            else:
                outcome: asyncio.Future[None] = self._loop.create_future()
                queued.add_done_callback(functools.partial(self._run_settled, appends, outcome))
                return outcome
        return self._commits.spawn(self._store_appends(appends))

    def _run_settled(self, appends: tuple[Append, ...], outcome: asyncio.Future[None],
                     queued: asyncio.Future[Any]) -> None:
        if not outcome.done() and not queued.cancelled() \
                and isinstance(queued.exception(), Busy):
            # Refused when its commit came (a chain's full queue): retried
            # as a run that could not be queued at first.
            retry = self._commits.spawn(self._store_appends(appends))
            retry.add_done_callback(functools.partial(_pass_outcome, outcome))
            return
        _pass_outcome(outcome, queued)

    async def _store_appends(self, appends: tuple[Append, ...]) -> None:
        delay = 0.01
        deadline = self._loop.time() + BUSY_RETRY_SECONDS
        while True:
            try:
                if len(appends) == 1:
                    await self.tenant.append(appends[0])
                else:
                    await self.tenant.append_batch(AppendBatch(appends))
                return
            except Busy:
                if self._loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _no_room(self, size: int) -> bool:
        """Must a run of ``size`` payload bytes wait for earlier appends?"""
        if self._pending_messages >= MAX_PENDING_MESSAGES:
            return True
        pending = self._pending_bytes
        return pending > 0 and pending + size > self.limits.max_pending_bytes

    def _append_done(self, pending: _PendingRun) -> None:
        self._pending_messages -= pending.count
        self._pending_bytes -= pending.size
        self._append_room.set()
        if not pending.future.cancelled():
            pending.future.exception()  # retrieved here so a closed session logs nothing
        self._confirm()

    # The client's MESSAGEs are acked in order, each only after its commit;
    # a failed append ends the connection (MicroMsg2 has no per-message
    # refusal, and the client's window would never reopen).  Acks are sent
    # from the runs' done callbacks: a confirming task woken by an event and
    # again by each run cost two task steps per MESSAGE.

    def _confirm(self) -> None:
        """Ack the runs settled at the head; hand over to the confirmer task
        when the ack must wait for the socket or a failure must be sent."""
        # Runs exist only once the connection is open (they need the tenant).
        if self.closing or self._confirmer is not None:
            return
        try:
            data, failure = self._settled_runs()
            if failure is not None or (data is not None and not self.out.try_send(data)):
                self._confirmer = self._tasks.spawn(self._confirm_appends(data, failure))
        except Exception:  # noqa: BLE001 - logged; the connection ends
            # A callback has no caller to report to: say so and end this
            # connection rather than leave the client's window closed.
            self._log.exception("micromsg2: acking %s failed", self.out.peer)
            self.closing = True
            self.out.close()

    def _settled_runs(self) -> tuple[bytes | None, tuple[str, str] | None]:
        """Takes the settled runs off the head: the ACK frame's bytes for
        the last stored one (None: none, or acks are off), and the failure
        of the first that was not stored (code, message), if any."""
        last: int | None = None
        failure: tuple[str, str] | None = None
        while self._appends and self._appends[0].future.done():
            pending = self._appends.popleft()
            future = pending.future
            exc = None if future.cancelled() else future.exception()
            if future.cancelled() or exc is not None:
                code = exc.code if isinstance(exc, PolyportError) else "internal"
                detail = exc.message if isinstance(exc, PolyportError) else repr(exc)
                failure = (code, f"{pending.describe()} not stored: {detail}")
                break
            last = pending.last_seq
        if last is None or not self._acks or self.out.closed:
            return None, failure
        return self._frame_bytes(Ack(last)), failure

    async def _confirm_appends(self, data: bytes | None,
                               failure: tuple[str, str] | None) -> None:
        """The confirmer: sends ``data`` (an ACK), waiting for the socket to
        drain, or the failure; then goes on as :meth:`_confirm` does,
        awaiting each run, until none is left; then runs confirm again."""
        while True:
            if data is not None:
                await self.out.send(data)
            if failure is not None:
                await self._fail(*failure)
                return  # the connection is closed: the confirmer stays set
            if self.closing or not self._appends:
                break
            await settled(self._appends[0].future)
            data, failure = self._settled_runs()
        self._confirmer = None

    # --- pubsub -----------------------------------------------------------------------

    async def _command(self, command: Command) -> None:
        negotiated = self.conn.negotiated
        if negotiated is None or not negotiated.has(EXT_PUBSUB):
            raise RemoteProtocolError(
                f"command {command.name!r} needs the 'pubsub' extension, which this "
                "connection did not negotiate",
                code=UNSUPPORTED,
            )
        request = parse_pubsub_command(command)
        try:
            if isinstance(request, Subscribe):
                await self._subscribe(request)
            else:
                self._unsubscribe(request)
        except PolyportError as exc:
            # A well-formed request that failed: report it, keep the connection.
            self._stats.error(exc.code, exc.message)
            await self._send(
                Error.from_code(exc.code, f"{command.name} {request.destination}: {exc.message}")
            )

    async def _subscribe(self, request: Subscribe) -> None:
        flt = request.filter
        filter_text = str(flt) if flt is not None else ""
        for sub in self._subs:
            if sub.destination == request.destination and sub.filter_text == filter_text:
                return  # already subscribed: subscribing again changes nothing
        if len(self._subs) >= MAX_SUBSCRIPTIONS:
            raise Busy(f"a connection may hold at most {MAX_SUBSCRIPTIONS} subscriptions")
        selector = filter_selector(self.context, request.destination.stream, flt)
        handle: Subscription | GroupMember
        if request.destination.kind == QUEUE:
            durable = queue_group_name(self.context, request.destination, flt)
            member = await self.tenant.subscribe(
                CoreSubscribe(selector, END, durable, SUBSCRIPTION_BUFFER), credit=True
            )
            assert isinstance(member, GroupMember)
            window = self.conn.negotiated.ack_window if self.conn.negotiated else None
            member.grant(window or QUEUE_CREDIT_WITHOUT_ACKS)
            handle = member
        else:
            handle = await self.tenant.subscribe(
                CoreSubscribe(selector, END, None, SUBSCRIPTION_BUFFER)
            )
        if self.closing:
            handle.close()
            return
        sub = _Sub(request.destination, filter_text, handle)
        sub.task = self._tasks.spawn(self._pump(sub))
        self._subs.append(sub)

    def _unsubscribe(self, request: Unsubscribe) -> None:
        mine = [s for s in self._subs if s.destination == request.destination]
        if not mine:
            raise NotFound("this connection has no subscription to that destination")
        for sub in mine:
            self._subs.remove(sub)
            # A queue member's unacknowledged events go back to the group.
            sub.close()
        self._inflight = {
            seq: entry for seq, entry in self._inflight.items() if not entry[0].closed
        }

    # --- delivery ---------------------------------------------------------------------

    async def _pump(self, sub: _Sub) -> None:
        destination = str(sub.destination)
        try:
            while not self.closing:
                ev = await sub.handle.next()
                if ev is None:
                    return
                await self._deliver(sub, destination, ev)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the last resort: logged, and the client told
            self._log.exception("micromsg2: delivery to %s failed", self.out.peer)
            await self._fail("internal", f"delivery on {destination} failed")

    async def _deliver(self, sub: _Sub, destination: str, ev: RecordedEvent) -> None:
        payload = event_payload(ev, json_negotiated=self._json)
        properties = event_properties(ev)
        while not self.closing:
            if not self.conn.can_send_message():
                self._window_open.clear()
                await self._window_open.wait()
                continue
            seq = self.conn.next_seq
            try:
                data = self.conn.send(Message(seq, destination, payload, properties))
            except LocalProtocolError as exc:
                # Deliberately caught although it is ours: the window and state
                # were checked just above, so what is left is an event that
                # cannot be framed (e.g. properties over 64 KiB).  Say so and go
                # on with the next, rather than stall the destination.
                self._stats.error(exc.code, exc.message)
                await self._send(
                    Error.from_code(
                        exc.code,
                        f"event {ev.stream}@{ev.version} (position {ev.position}) cannot be "
                        f"delivered on {destination}: {exc.message}",
                    )
                )
                self._settle(sub, ev.position)
                return
            if sub.is_queue and self._acks:
                assert isinstance(sub.handle, GroupMember)
                self._inflight[seq] = (sub.handle, ev.position)
            self._stats.frames_out += 1
            self._last_activity = self._loop.time()
            # No await between encoding and writing: frames hit the socket in
            # sequence order.  The await itself is the backpressure.
            await self.out.send(data)
            if not self._acks:
                self._settle(sub, ev.position)
            return

    def _settle(self, sub: _Sub, position: int) -> None:
        """A queue event is done with (acked, or delivered without acks)."""
        if isinstance(sub.handle, GroupMember) and not sub.handle.closed:
            sub.handle.ack(position)
            sub.handle.grant(1)

    def _on_acked(self, seqs: tuple[int, ...]) -> None:
        for seq in seqs:
            entry = self._inflight.pop(seq, None)
            if entry is not None and not entry[0].closed:
                member, position = entry
                member.ack(position)
                member.grant(1)
        self._window_open.set()

    # --- output and failure -------------------------------------------------------------

    async def _send(self, frame: Frame) -> None:
        if self.out.closed:
            return
        await self.out.send(self._frame_bytes(frame))

    def _frame_bytes(self, frame: Frame) -> bytes:
        """``frame`` encoded, counted and noted as activity."""
        data = self.conn.send(frame)
        self._stats.frames_out += 1
        self._last_activity = self._loop.time()
        return data

    async def _revoked(self, code: str, message: str) -> None:
        await self._fail(code, message)

    async def _fail(self, code: str, message: str) -> None:
        """One ERROR frame, then close."""
        if self.closing:
            return
        self.closing = True
        self._window_open.set()
        self._append_room.set()
        self._stats.error(code, message)
        self._log.info("micromsg2: closing %s: %s: %s", self.out.peer, code, message)
        try:
            data = self.conn.send(Error.from_code(code, message))
        except LocalProtocolError:
            # An ERROR may be sent in every state; failing here is our bug.
            # The connection is closed all the same.
            self._log.exception("micromsg2: cannot send the ERROR frame to %s", self.out.peer)
            data = b""
        if data and not self.out.closed:
            self._stats.frames_out += 1
            await self.out.send(data)
        self.out.close()

    async def _watch_idle(self, limit: float) -> None:
        """Closes a connection that never finishes its handshake, or that has
        been silent both ways for ``limit`` seconds with nothing to wait for.
        (A subscriber legitimately sends nothing, so the transport's own idle
        timeout is off for this protocol.)"""
        while not self.closing:
            now = self._loop.time()
            if self.principal is None:
                remaining = self._started + limit - now
                if remaining <= 0:
                    await self._fail("timeout", f"handshake not completed within {limit:g} seconds")
                    return
            else:
                remaining = self._last_activity + limit - now
                if remaining <= 0:
                    if not self._subs and not self._appends:
                        await self._fail("timeout", f"connection idle for {limit:g} seconds")
                        return
                    remaining = limit
            await asyncio.sleep(remaining)
