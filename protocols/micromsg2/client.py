"""A thin asyncio MicroMsg2 client over the sans-IO codec.

    client = await MicroMsg2Client.connect("127.0.0.1", 7090, optional=["json", "pubsub"])
    await client.subscribe("topic/orders", "amount>N100")
    await client.publish("topic/orders", b'{"id": 1}', {"amount": 250, "type": "OrderPlaced"})
    message = await client.receive()
    await client.ack(message)          # with ack / batch-ack
    await client.close()

``subscribe`` and ``unsubscribe`` get no reply on success; a failure arrives
later as an ERROR frame, which ``receive`` raises as :class:`MicroMsg2Error`
in the order it arrived among the messages.  With an ack extension
``publish`` waits while the window is full and :meth:`flush` waits until the
server has acknowledged (= committed) everything published.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from ssl import SSLContext
from types import TracebackType

from polyport.protocols.micromsg2.connection import ClientConnection
from polyport.protocols.micromsg2.errors import RemoteProtocolError, as_local, error_frame
from polyport.protocols.micromsg2.filters import Filter, parse_filter
from polyport.protocols.micromsg2.frames import (
    AUTH_PASSWORD,
    AUTH_USER,
    EXT_AUTH,
    PROTOCOL_VERSION,
    SEQ_FIRST,
    Ack,
    Error,
    ExtensionSpec,
    Handshake,
    Message,
    PropertyValue,
)
from polyport.protocols.micromsg2.negotiation import Negotiated, as_spec
from polyport.protocols.micromsg2.pubsub import Destination, Subscribe, Unsubscribe, to_command

READ_CHUNK = 64 * 1024


class MicroMsg2Error(Exception):
    """An ERROR frame from the server, or a failure on this side."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.text = message

    @classmethod
    def from_frame(cls, frame: Error) -> MicroMsg2Error:
        return cls(frame.text, frame.code)


class ConnectionClosed(MicroMsg2Error):
    """The connection is gone; ``code``/``text`` repeat the ERROR that ended it, if any."""


_CLOSED = object()


class MicroMsg2Client:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: ClientConnection,
        *,
        queue_size: int = 1000,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._conn = conn
        # Bounded: a consumer that does not read stops the socket reads (TCP
        # backpressure reaches the server).  Holds Message, Error or _CLOSED.
        self._queue: asyncio.Queue[object] = asyncio.Queue(max(1, queue_size))
        self._window = asyncio.Event()
        self._closed = asyncio.Event()
        self.errors: list[Error] = []
        self._fatal: Error | None = None
        self._last_received: int | None = None
        self._read_task: asyncio.Task[None] | None = None

    # --- connecting -------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 7090,
        *,
        identity: str = "polyport-client",
        required: Iterable[str | ExtensionSpec] = (),
        optional: Iterable[str | ExtensionSpec] = (),
        supported: Iterable[str] = (),
        user: str | None = None,
        password: str | None = None,
        version: tuple[int, int] = PROTOCOL_VERSION,
        first_inbound_seq: int = SEQ_FIRST,
        queue_size: int = 1000,
        timeout: float = 10.0,
        ssl: SSLContext | None = None,
    ) -> MicroMsg2Client:
        """Connect and run the three-step handshake.  ``user`` adds a required
        ``x-auth`` extension.  Raises MicroMsg2Error when the server refuses
        (its ERROR frame) or when this side cannot accept the server's reply
        (then this side sends the ERROR, as the spec says).

        ``first_inbound_seq`` must match the server's ``micromsg2_initial_seq``
        (1 outside tests of the sequence wrap)."""
        with as_local:  # the caller's own extension lists
            required_specs = [as_spec(e) for e in required]
        if user is not None:
            props = {AUTH_USER: user}
            if password is not None:
                props[AUTH_PASSWORD] = password
            required_specs = [s for s in required_specs if s.name != EXT_AUTH]
            required_specs.append(ExtensionSpec(EXT_AUTH, props))
        conn = ClientConnection(
            identity,
            required_specs,
            optional,
            supported=supported,
            version=version,
            first_inbound_seq=first_inbound_seq,
        )
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
        client = cls(reader, writer, conn, queue_size=queue_size)
        try:
            async with asyncio.timeout(timeout):
                await client._handshake()
        except BaseException:
            writer.close()
            raise
        client._read_task = asyncio.create_task(client._read_loop())
        return client

    async def _handshake(self) -> None:
        try:
            await self._exchange_handshakes()
        except ConnectionError as exc:
            # A reset (uvloop reports a refused TLS client certificate so)
            # is the same event as an orderly close: one error for callers.
            raise ConnectionClosed(
                f"server closed the connection during the handshake ({exc})") from exc

    async def _exchange_handshakes(self) -> None:
        self._writer.write(self._conn.send(self._conn.hello_frame()))
        await self._writer.drain()
        reply: Handshake | None = None
        while reply is None:
            data = await self._reader.read(READ_CHUNK)
            if not data:
                raise ConnectionClosed("server closed the connection during the handshake")
            try:
                frames = self._conn.receive_data(data)
            except RemoteProtocolError as exc:
                # This side cannot go on (e.g. the server requires an extension
                # we lack): ERROR, then disconnect.
                self._writer.write(self._conn.send(error_frame(exc)))
                await self._writer.drain()
                raise MicroMsg2Error(exc.message, exc.code) from None
            for frame in frames:
                if isinstance(frame, Error):
                    raise MicroMsg2Error.from_frame(frame)
                if isinstance(frame, Handshake):
                    reply = frame
        self._writer.write(self._conn.send(self._conn.final_frame()))
        await self._writer.drain()

    @property
    def negotiated(self) -> Negotiated:
        assert self._conn.negotiated is not None
        return self._conn.negotiated

    @property
    def server_reply(self) -> Handshake | None:
        return self._conn.reply

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # --- sending ----------------------------------------------------------------------

    async def publish(
        self,
        destination: str,
        payload: bytes | str = b"",
        properties: Mapping[str, PropertyValue] | None = None,
    ) -> int:
        """Send one MESSAGE (the server appends it to the destination's stream);
        returns its sequence number.  With an ack extension this waits while
        the window is full."""
        body = payload.encode("utf-8") if isinstance(payload, str) else payload
        while not self._conn.can_send_message():
            self._check_open()
            self._window.clear()
            await self._window.wait()
        self._check_open()
        seq = self._conn.next_seq
        await self._write(self._conn.send(Message(seq, destination, body, properties or {})))
        return seq

    async def flush(self, timeout: float | None = None) -> None:
        """With an ack extension: wait until every published MESSAGE is acked
        (the server acks after the commit).  Without one, only the socket is
        drained."""

        async def settled() -> None:
            while self._conn.outbound.outstanding:
                self._check_open()
                self._window.clear()
                await self._window.wait()
            await self._writer.drain()

        async with asyncio.timeout(timeout):
            await settled()

    async def subscribe(self, destination: str, filter: str | Filter | None = None) -> None:
        with as_local:  # the caller's destination and filter, not the server's
            flt = parse_filter(filter) if isinstance(filter, str) else filter
            request = Subscribe(Destination.parse(destination), flt)
        await self._write(self._conn.send(to_command(request)))

    async def unsubscribe(self, destination: str) -> None:
        with as_local:
            request = Unsubscribe(Destination.parse(destination))
        await self._write(self._conn.send(to_command(request)))

    async def ack(self, message: Message | int | None = None) -> None:
        """Acknowledge every MESSAGE received up to ``message`` (default: the
        last one received)."""
        seq = message.seq if isinstance(message, Message) else message
        if seq is None:
            seq = self._last_received
        if seq is None:
            raise MicroMsg2Error("nothing received to acknowledge")
        await self._write(self._conn.send(Ack(seq)))

    async def send_raw(self, data: bytes) -> None:
        """Bytes straight to the socket, bypassing the codec (for tests of bad input)."""
        await self._write(data)

    async def _write(self, data: bytes) -> None:
        self._check_open()
        self._writer.write(data)
        await self._writer.drain()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise self._closed_error()

    def _closed_error(self) -> ConnectionClosed:
        if self._fatal is not None:
            return ConnectionClosed(self._fatal.text, self._fatal.code)
        return ConnectionClosed("connection closed")

    # --- receiving --------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message:
        """The next MESSAGE.  An ERROR frame from the server is raised as
        MicroMsg2Error where it arrived; after the connection ends (and every
        message before that was received) ConnectionClosed is raised.
        TimeoutError when nothing arrives within ``timeout`` seconds."""
        if self._closed.is_set() and self._queue.empty():
            raise self._closed_error()
        async with asyncio.timeout(timeout):
            item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # for the next caller too
            raise self._closed_error()
        if isinstance(item, Error):
            raise MicroMsg2Error.from_frame(item)
        assert isinstance(item, Message)
        return item

    async def wait_closed(self, timeout: float | None = None) -> None:
        async with asyncio.timeout(timeout):
            await self._closed.wait()

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    data = await self._reader.read(READ_CHUNK)
                except (ConnectionError, OSError):
                    break
                if not data:
                    break
                try:
                    frames = self._conn.receive_data(data)
                except RemoteProtocolError as exc:
                    self._fatal = Error.from_code(exc.code, exc.message)
                    with contextlib.suppress(Exception):
                        self._writer.write(self._conn.send(error_frame(exc)))
                    break
                for frame in frames:
                    if isinstance(frame, Message):
                        self._last_received = frame.seq
                        await self._queue.put(frame)
                    elif isinstance(frame, Ack):
                        self._window.set()
                    elif isinstance(frame, Error):
                        self.errors.append(frame)
                        self._fatal = frame
                        await self._queue.put(frame)
        finally:
            self._closed.set()
            self._window.set()
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(_CLOSED)
            self._writer.close()

    # --- closing ----------------------------------------------------------------------

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        if self._read_task is not None:
            self._read_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._read_task
        self._closed.set()

    async def __aenter__(self) -> MicroMsg2Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
