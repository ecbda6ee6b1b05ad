"""Thin asyncio clients over the segment-wire codec.

- :class:`SegmentWriter`: one TCP connection carrying any number of appenders
  (:class:`SegmentAppender`, one ConnectionId and segment each).  Appends are
  blocks of many events, optionally cut at a fixed block size with partial
  messages, as the spec describes.  Every appender keeps its unacknowledged
  events (:class:`AppendWriter`), so after
  :meth:`SegmentWriter.reconnect` — to the same gateway or another one — it
  resends from the server's ack level and the segment holds each event
  exactly once.
- :class:`SegmentReader`: ReadSegment requests; :meth:`SegmentReader.iterate`
  walks a segment from any offset, reply by reply.

Use separate connections for writing and reading: a writer connection treats
any error reply as fatal (the server closes it), a reader connection matches
each error to the read it answers.

::

    writer = await SegmentWriter.connect("127.0.0.1", 12345)
    orders = await writer.open_segment("shop/orders")
    await orders.append([b"e1", b"e2", b"e3"])
    await orders.flush()          # every event acknowledged (committed)
    ...
    reader = await SegmentReader.connect("127.0.0.1", 12345)
    data = await reader.read_to_tail("shop/orders")
    events = list(iter_events(data))
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from ssl import SSLContext

from polyport.protocols.errors import NOT_FOUND, UNAUTHENTICATED
from polyport.protocols.segment.connection import ClientConnection, ClientInput
from polyport.protocols.segment.errors import RemoteProtocolError
from polyport.protocols.segment.frames import (
    EVENT,
    HEADER_SIZE,
    MAX_WIRE_LENGTH,
    PARTIAL_OVERHEAD,
    AppendSetup,
    AuthFailed,
    BeginAppendBlock,
    DataAppended,
    EndAppendBlock,
    ErrorMessage,
    Event,
    KeepAlive,
    NoSuchSegment,
    PartialKind,
    PartialMessage,
    ReadSegment,
    RequestFrame,
    SegmentRead,
    SetupAppend,
    event_size,
)
from polyport.protocols.segment.wire import encode_event, encode_frame

READ_CHUNK = 64 * 1024
DEFAULT_WINDOW_BYTES = 4 << 20
DEFAULT_RESEND_BLOCK_BYTES = 1 << 20
DEFAULT_TIMEOUT = 30.0

_HEADER = struct.Struct(">iI")

ErrorFrame = NoSuchSegment | AuthFailed | ErrorMessage



# --- append blocks and exactly-once bookkeeping (no I/O) -------------------------
# An ``AppendWriter`` outlives connections: after a reconnect, send its
# ``setup_append()`` on the new ClientConnection, then pass the AppendSetup's
# ack level to ``resume`` and send the frames it returns.


def block_frames(
    connection_id: uuid.UUID,
    connection_offset: int,
    events: Sequence[bytes],
    *,
    boundary: int | None = None,
) -> list[RequestFrame]:
    """The frames of one append block carrying ``events`` from ``connection_offset``.

    Without ``boundary`` every event is a whole EVENT message.  With it, the
    block announces exactly ``boundary`` wire bytes before its EndAppendBlock
    (the original client's fixed-size blocks): every event but the last is
    whole, the last one's EVENT bytes are cut into PartialMessage(Begin)
    before the EndAppendBlock and PartialMessage(End) after it.  A boundary
    that would leave either piece empty, or cut an earlier event, is a
    ValueError.
    """
    total = sum(event_size(data) for data in events)
    begin_offset = connection_offset
    end = EndAppendBlock(
        connection_id=connection_id,
        connection_offset=begin_offset + total,
        block_length=total,
    )
    if boundary is None or boundary == total:
        return [
            BeginAppendBlock(connection_id, begin_offset, total),
            *(Event(data) for data in events),
            end,
        ]
    if not events:
        raise ValueError(f"an empty block cannot reach boundary {boundary}")
    *whole, last = events
    before = sum(event_size(data) for data in whole)
    framed_last = encode_event(Event(last))
    cut = boundary - before - PARTIAL_OVERHEAD
    if not 1 <= cut < len(framed_last):
        low = before + PARTIAL_OVERHEAD + 1
        high = before + PARTIAL_OVERHEAD + len(framed_last) - 1
        raise ValueError(
            f"boundary {boundary} does not cut the last event: use {total} (no cut) or "
            f"{low}..{high}"
        )
    return [
        BeginAppendBlock(connection_id, begin_offset, boundary),
        *(Event(data) for data in whole),
        PartialMessage(PartialKind.BEGIN, framed_last[:cut]),
        end,
        PartialMessage(PartialKind.END, framed_last[cut:]),
    ]


def encode_block(
    connection_id: uuid.UUID,
    connection_offset: int,
    events: Sequence[bytes],
    *,
    boundary: int | None = None,
) -> bytes:
    frames = block_frames(connection_id, connection_offset, events, boundary=boundary)
    return b"".join(encode_frame(frame) for frame in frames)


class AppendWriter:
    """One appender (ConnectionId) to one segment."""

    def __init__(self, connection_id: uuid.UUID, segment: str, *, credentials: str = "") -> None:
        self.connection_id = connection_id
        self.segment = segment
        # "<user>:<password>" sent with every SetupAppend; empty = anonymous.
        self.credentials = credentials
        # Connection offset after every event handed to ``block`` so far.
        self.offset = 0
        self.ack_level = 0
        self._unacked: deque[tuple[int, bytes]] = deque()

    @property
    def unacked(self) -> tuple[tuple[int, bytes], ...]:
        """(start offset, body) of every event written but not acknowledged."""
        return tuple(self._unacked)

    def setup_append(self) -> SetupAppend:
        return SetupAppend(
            connection_id=self.connection_id, segment=self.segment, credentials=self.credentials
        )

    def block(self, events: Sequence[bytes], *, boundary: int | None = None) -> list[RequestFrame]:
        """Frames appending ``events`` after everything written so far."""
        frames = block_frames(self.connection_id, self.offset, events, boundary=boundary)
        for data in events:
            self._unacked.append((self.offset, bytes(data)))
            self.offset += event_size(data)
        return frames

    def acknowledge(self, ack_level: int) -> None:
        """Forget the events stored up to ``ack_level`` (from DataAppended or
        AppendSetup)."""
        while self._unacked:
            start, data = self._unacked[0]
            end = start + event_size(data)
            if end > ack_level:
                if start < ack_level:
                    raise RemoteProtocolError(
                        f"ack level {ack_level} falls inside the event at offsets {start}..{end}",
                        segment=self.segment,
                    )
                break
            self._unacked.popleft()
        self.ack_level = max(self.ack_level, ack_level)

    def resume(self, ack_level: int, *, block_size: int | None = None) -> list[RequestFrame]:
        """After an AppendSetup with ``ack_level``: drop the events it covers
        (end offset <= ack level) and return blocks resending the rest from
        their original offsets, each at most ``block_size`` wire bytes unless
        a single event is larger.  A fresh writer whose ConnectionId already
        has data stored continues after it."""
        self.acknowledge(ack_level)
        first = self._unacked[0][0] if self._unacked else self.offset
        if ack_level < first:
            raise RemoteProtocolError(
                f"ack level {ack_level} is below data already acknowledged up to {first}; "
                "that data can no longer be resent",
                segment=self.segment,
            )
        if not self._unacked:
            self.offset = max(self.offset, ack_level)
            return []
        groups: list[list[bytes]] = [[]]
        size = 0
        for _start, data in self._unacked:
            if groups[-1] and block_size is not None and size + event_size(data) > block_size:
                groups.append([])
                size = 0
            groups[-1].append(data)
            size += event_size(data)
        frames: list[RequestFrame] = []
        offset = self._unacked[0][0]
        for group in groups:
            frames += block_frames(self.connection_id, offset, group)
            offset += sum(event_size(data) for data in group)
        return frames

class SegmentError(Exception):
    """The server answered with an error reply, or the connection failed."""

    def __init__(self, message: str, *, code: str = "internal", segment: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.segment = segment

    @classmethod
    def from_reply(cls, reply: ErrorFrame) -> SegmentError:
        if isinstance(reply, NoSuchSegment):
            return NoSuchSegmentError(reply.message, code=NOT_FOUND, segment=reply.segment)
        if isinstance(reply, AuthFailed):
            return SegmentError(reply.message, code=UNAUTHENTICATED, segment=reply.segment)
        return SegmentError(reply.message, code=reply.code, segment=reply.segment)


class NoSuchSegmentError(SegmentError):
    pass


class ConnectionLost(SegmentError):
    """The connection ended; a writer can :meth:`SegmentWriter.reconnect`."""

    def __init__(self, message: str = "connection lost") -> None:
        super().__init__(message, code="connection_lost")


def iter_events(data: bytes) -> Iterator[bytes]:
    """Event bodies of EVENT-framed segment bytes (starting at an event
    boundary and holding whole events)."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < HEADER_SIZE:
            raise ValueError(f"truncated EVENT header at byte {pos}")
        type_code, length = _HEADER.unpack_from(data, pos)
        if type_code != EVENT:
            raise ValueError(f"type {type_code} at byte {pos} is not an EVENT")
        end = pos + HEADER_SIZE + length
        if end > len(data):
            raise ValueError(f"truncated EVENT body at byte {pos}")
        yield data[pos + HEADER_SIZE : end]
        pos = end


class _Link:
    """One TCP connection: requests go through the client state machine,
    replies are read by a task and handed to ``on_reply``; ``on_close`` gets
    the reason when the connection ends."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_reply: Callable[[_Link, ClientInput], None],
        on_close: Callable[[_Link, SegmentError], None],
        max_message_size: int,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._on_reply = on_reply
        self._on_close = on_close
        self.codec = ClientConnection(max_message_size)
        self.error: SegmentError | None = None
        self._task = asyncio.create_task(self._run(), name="segment-client-reader")

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        on_reply: Callable[[_Link, ClientInput], None],
        on_close: Callable[[_Link, SegmentError], None],
        *,
        max_message_size: int = MAX_WIRE_LENGTH,
        seconds: float = DEFAULT_TIMEOUT,
        ssl: SSLContext | None = None,
    ) -> _Link:
        try:
            async with asyncio.timeout(seconds):
                reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
        except (OSError, TimeoutError) as exc:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}") from exc
        return cls(reader, writer, on_reply, on_close, max_message_size)

    async def _run(self) -> None:
        reason: SegmentError = ConnectionLost("connection closed by the server")
        try:
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    break
                for reply in self.codec.receive_data(data):
                    self._on_reply(self, reply)
        except RemoteProtocolError as exc:
            reason = SegmentError(f"bad reply from the server: {exc.message}", code=exc.code)
        except (ConnectionError, OSError) as exc:
            reason = ConnectionLost(f"connection lost: {exc}")
        except asyncio.CancelledError:
            reason = ConnectionLost("connection closed")
        finally:
            self._fail(reason)
            self._writer.close()

    def _fail(self, reason: SegmentError) -> None:
        if self.error is None:
            self.error = reason
            self._on_close(self, reason)

    async def send(self, frames: Sequence[RequestFrame]) -> None:
        if self.error is not None:
            raise self.error
        await self.write_raw(self.codec.send_all(frames))

    async def write_raw(self, data: bytes) -> None:
        """Bytes as they are, bypassing the state machine (a low-level escape
        hatch: tests use it to cut a block short)."""
        if self.error is not None:
            raise self.error
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._fail(ConnectionLost(f"connection lost: {exc}"))
            raise ConnectionLost(f"connection lost: {exc}") from exc

    def abort(self) -> None:
        """Drop the TCP connection at once, without flushing."""
        self._writer.transport.abort()
        self._task.cancel()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _usable(link: _Link | None) -> _Link:
    """The connection, if there is one and it has not failed."""
    if link is None:
        raise ConnectionLost("not connected")
    if link.error is not None:
        raise link.error
    return link


class _KeepAlives:
    def __init__(self) -> None:
        self.pending: deque[asyncio.Future[bytes]] = deque()

    def answer(self, frame: KeepAlive) -> None:
        while self.pending:
            fut = self.pending.popleft()
            if not fut.done():
                fut.set_result(frame.data)
                return

    def fail(self, error: SegmentError) -> None:
        while self.pending:
            fut = self.pending.popleft()
            if not fut.done():
                fut.set_exception(error)


async def _keep_alive(link: _Link, keep_alives: _KeepAlives, data: bytes, seconds: float) -> bytes:
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    keep_alives.pending.append(fut)
    await link.send([KeepAlive(data)])
    async with asyncio.timeout(seconds):  # cancels fut, as wait_for did
        return await fut


# --- writing ----------------------------------------------------------------------


class SegmentAppender:
    """One ConnectionId appending to one segment; made by
    :meth:`SegmentWriter.open_segment`."""

    def __init__(self, client: SegmentWriter, writer: AppendWriter) -> None:
        self._client = client
        self.writer = writer

    @property
    def segment(self) -> str:
        return self.writer.segment

    @property
    def connection_id(self) -> uuid.UUID:
        return self.writer.connection_id

    @property
    def offset(self) -> int:
        """This appender's connection offset after everything handed to append."""
        return self.writer.offset

    @property
    def ack_level(self) -> int:
        """Offset up to which the server confirmed the events are committed."""
        return self.writer.ack_level

    async def append(self, events: Sequence[bytes], *, boundary: int | None = None) -> int:
        """Send ``events`` as one append block (with ``boundary``, cut so that
        exactly that many wire bytes precede the EndAppendBlock); returns the
        offset after them.  Waits while more than the writer's window is
        unacknowledged.  Does not wait for the commit: see :meth:`flush`."""
        return await self._client._append(self, events, boundary)

    def encode_block(self, events: Sequence[bytes], *, boundary: int | None = None) -> bytes:
        """The wire bytes of the next block, without sending them (for
        :meth:`SegmentWriter.write_raw`, e.g. to test a block cut short).  The
        events count as appended: a reconnect resends them."""
        link = self._client._current()
        return link.codec.send_all(self.writer.block(events, boundary=boundary))

    async def flush(self, seconds: float | None = DEFAULT_TIMEOUT) -> None:
        """Wait (up to ``seconds``) until everything appended so far is
        acknowledged."""
        await self._client._wait_acked(self, self.writer.offset, seconds)


class SegmentWriter:
    """A writer connection; survives reconnects with exactly-once resends."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        resend_block_bytes: int = DEFAULT_RESEND_BLOCK_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        ssl: SSLContext | None = None,
        credentials: str = "",
    ) -> None:
        self.host = host
        self.port = port
        self.ssl = ssl  # TLS context for every (re)connect
        # "<user>:<password>" sent with every SetupAppend; empty = anonymous.
        self.credentials = credentials
        self.window_bytes = window_bytes
        self.resend_block_bytes = resend_block_bytes
        self.timeout = timeout
        self._link: _Link | None = None
        self._appenders: dict[uuid.UUID, SegmentAppender] = {}
        self._setups: dict[uuid.UUID, asyncio.Future[int]] = {}
        self._keep_alives = _KeepAlives()
        # Set on every acknowledgement and failure; waiters re-check.
        self._changed = asyncio.Event()
        # Sends and reconnects must not interleave (a block is many frames).
        self._send_lock = asyncio.Lock()

    @classmethod
    async def connect(
        cls, host: str, port: int, **options: float | int | str | SSLContext | None
    ) -> SegmentWriter:
        client = cls(host, port, **options)  # type: ignore[arg-type]
        await client.reconnect()
        return client

    @property
    def error(self) -> SegmentError | None:
        """Why the current connection failed (None while it works)."""
        return None if self._link is None else self._link.error

    async def open_segment(
        self, segment: str, connection_id: uuid.UUID | None = None
    ) -> SegmentAppender:
        """SetupAppend for a new appender.  With the ConnectionId of earlier
        appends, the appender continues after that ConnectionId's ack level."""
        writer = AppendWriter(
            connection_id or uuid.uuid4(), segment, credentials=self.credentials
        )
        appender = SegmentAppender(self, writer)
        async with self._send_lock:
            await self._setup_and_resume(self._current(), appender)
        self._appenders[writer.connection_id] = appender
        return appender

    async def reconnect(self, host: str | None = None, port: int | None = None) -> None:
        """A new connection (optionally to another address); every appender is
        set up again and resends what the server has not stored."""
        self.host, self.port = host or self.host, port or self.port
        async with self._send_lock:
            if self._link is not None:
                self._link.abort()
            self._link = await _Link.open(
                self.host, self.port, self._on_reply, self._on_close, seconds=self.timeout,
                ssl=self.ssl,
            )
            for appender in list(self._appenders.values()):
                await self._setup_and_resume(self._link, appender)

    async def keep_alive(self, data: bytes = b"") -> bytes:
        return await _keep_alive(self._current(), self._keep_alives, data, self.timeout)

    async def write_raw(self, data: bytes) -> None:
        """Send bytes as they are (low level; see SegmentAppender.encode_block)."""
        async with self._send_lock:
            await self._current().write_raw(data)

    def abort(self) -> None:
        """Drop the connection at once (unacknowledged events stay queued for
        the next :meth:`reconnect`)."""
        if self._link is not None:
            self._link.abort()

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()

    # --- internals ------------------------------------------------------------------

    def _current(self) -> _Link:
        return _usable(self._link)

    async def _setup_and_resume(self, link: _Link, appender: SegmentAppender) -> None:
        writer = appender.writer
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._setups[writer.connection_id] = fut
        try:
            await link.send([writer.setup_append()])
            async with asyncio.timeout(self.timeout):  # cancels fut, as wait_for did
                ack = await fut
        finally:
            self._setups.pop(writer.connection_id, None)
        await link.send(writer.resume(ack, block_size=self.resend_block_bytes))
        self._changed.set()

    async def _append(
        self, appender: SegmentAppender, events: Sequence[bytes], boundary: int | None
    ) -> int:
        writer = appender.writer
        await self._wait_acked(appender, writer.offset - self.window_bytes, self.timeout)
        async with self._send_lock:
            link = self._current()
            frames = writer.block(events, boundary=boundary)
            # From here the events are the writer's: if the send fails they
            # are resent by the next reconnect.
            await link.send(frames)
        return writer.offset

    async def _wait_acked(
        self, appender: SegmentAppender, level: int, seconds: float | None
    ) -> None:
        async def wait() -> None:
            while appender.writer.ack_level < level:
                self._current()  # raises once the connection failed
                self._changed.clear()
                await self._changed.wait()

        async with asyncio.timeout(seconds):
            await wait()

    def _on_reply(self, link: _Link, reply: ClientInput) -> None:
        if link is not self._link:
            return  # a late reply on a connection already replaced
        if isinstance(reply, DataAppended):
            appender = self._appenders.get(reply.connection_id)
            if appender is not None:
                appender.writer.acknowledge(reply.ack_level)
        elif isinstance(reply, AppendSetup):
            fut = self._setups.get(reply.connection_id)
            if fut is not None and not fut.done():
                fut.set_result(reply.ack_level)
        elif isinstance(reply, KeepAlive):
            self._keep_alives.answer(reply)
        elif isinstance(reply, NoSuchSegment | AuthFailed | ErrorMessage):
            # The server closes a writer connection after an error reply.
            link._fail(SegmentError.from_reply(reply))
        self._changed.set()

    def _on_close(self, link: _Link, reason: SegmentError) -> None:
        if link is not self._link:
            return
        for fut in self._setups.values():
            if not fut.done():
                fut.set_exception(reason)
        self._keep_alives.fail(reason)
        self._changed.set()


# --- reading ----------------------------------------------------------------------


class SegmentReader:
    """A reader connection.  Reads may be pipelined: the server answers them
    in order, one SegmentRead (or error reply) each."""

    def __init__(
        self, host: str, port: int, *, timeout: float = DEFAULT_TIMEOUT,
        ssl: SSLContext | None = None, credentials: str = "",
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.ssl = ssl
        # "<user>:<password>" sent with every ReadSegment; empty = anonymous.
        self.credentials = credentials
        self._link: _Link | None = None
        self._pending: deque[asyncio.Future[SegmentRead]] = deque()
        self._keep_alives = _KeepAlives()

    @classmethod
    async def connect(
        cls, host: str, port: int, *, seconds: float = DEFAULT_TIMEOUT,
        ssl: SSLContext | None = None, credentials: str = "",
    ) -> SegmentReader:
        reader = cls(host, port, timeout=seconds, ssl=ssl, credentials=credentials)
        reader._link = await _Link.open(
            host, port, reader._on_reply, reader._on_close, seconds=seconds, ssl=ssl
        )
        return reader

    def _current(self) -> _Link:
        return _usable(self._link)

    async def read(
        self, segment: str, offset: int = 0, suggested_length: int = 1 << 20
    ) -> SegmentRead:
        """One ReadSegment: the server's SegmentRead (at the tail it may wait a
        little for new data first).  Raises NoSuchSegmentError for a segment
        nothing was ever appended to."""
        link = self._current()
        fut: asyncio.Future[SegmentRead] = asyncio.get_running_loop().create_future()
        self._pending.append(fut)
        await link.send([ReadSegment(segment, offset, suggested_length, self.credentials)])
        async with asyncio.timeout(self.timeout):
            return await asyncio.shield(fut)

    async def iterate(
        self,
        segment: str,
        offset: int = 0,
        *,
        suggested_length: int = 1 << 20,
        follow: bool = False,
    ) -> AsyncIterator[SegmentRead]:
        """SegmentRead replies from ``offset`` on, each continuing where the
        previous one ended; stops at the tail unless ``follow``."""
        while True:
            reply = await self.read(segment, offset, suggested_length)
            offset += len(reply.data)
            yield reply
            if reply.at_tail and not follow:
                return

    async def read_to_tail(self, segment: str, offset: int = 0) -> bytes:
        """Every byte of the segment from ``offset`` to its current end."""
        out = bytearray()
        async for reply in self.iterate(segment, offset):
            out += reply.data
        return bytes(out)

    async def keep_alive(self, data: bytes = b"") -> bytes:
        return await _keep_alive(self._current(), self._keep_alives, data, self.timeout)

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()

    def _on_reply(self, _link: _Link, reply: ClientInput) -> None:
        if isinstance(reply, KeepAlive):
            self._keep_alives.answer(reply)
            return
        if not isinstance(reply, SegmentRead | NoSuchSegment | AuthFailed | ErrorMessage):
            return  # a reader connection sets up no appenders
        while self._pending:
            fut = self._pending.popleft()
            if fut.done():
                continue
            if isinstance(reply, SegmentRead):
                fut.set_result(reply)
            else:
                fut.set_exception(SegmentError.from_reply(reply))
            return

    def _on_close(self, _link: _Link, reason: SegmentError) -> None:
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(reason)
        self._keep_alives.fail(reason)
