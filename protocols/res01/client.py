"""A thin asyncio Res01 client: a pyzmq DEALER socket over the sans-IO wire format.

Requests are correlated with their replies by request id (the sans-IO
:class:`~polyport.protocols.res01.connection.ClientConnection` keeps which are
in flight and checks each reply against its request), so many requests may be
outstanding on one client at once (bounded by ``max_in_flight``)::

    client = await Res01Client.connect("tcp://127.0.0.1:5560")
    commit_id = await client.commit("ctx", "orders-1", 1, [new_event("Placed", '{"n": 1}')])
    [sub_id] = await client.subscribe("me", [("ctx", "orders-", datetime(2020, 1, 1))])
    [batch] = await client.fetch([(sub_id, 100)])
    await client.progress([(sub_id, batch.events[-1].timestamp)])
    await client.close()

A server error (ER) raises :class:`Res01ServerError` with the spec's code; a
reply that breaks the protocol raises :class:`RemoteProtocolError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import zmq
import zmq.asyncio

from polyport.protocols.res01.connection import ClientConnection
from polyport.protocols.res01.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from polyport.protocols.res01.frames import (
    PROTOCOL_FRAME,
    AppendCommit,
    CommitResult,
    EventsFetched,
    FetchEntry,
    FetchEvents,
    NewEvent,
    ProgressEntry,
    ProgressSubscriptions,
    RegisterSubscriptions,
    Request,
    Response,
    SetEntry,
    SetSubscription,
    SubscribeResult,
    SubscriptionDefinition,
    SubscriptionProgressed,
    SubscriptionSet,
)
from polyport.protocols.res01.state import replies_due

log = logging.getLogger("polyport.res01.client")


class Res01ServerError(Exception):
    """The server answered ER."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"Res01 error {code}: {message}")
        self.code = code
        self.message = message

    @property
    def error_code(self) -> ErrorCode | None:
        try:
            return ErrorCode(self.code)
        except ValueError:
            return None


def new_event(
    type: str,
    body: str,
    headers: str = "{}",
    *,
    event_id: uuid.UUID | None = None,
    timestamp: datetime | None = None,
) -> NewEvent:
    """An event for :meth:`Res01Client.commit` (fresh id, now, unless given)."""
    return NewEvent(
        event_id=event_id or uuid.uuid4(),
        timestamp=timestamp or datetime.now(UTC),
        type=type,
        headers=headers,
        body=body,
    )


def _endpoint(address: str | tuple[str, int]) -> str:
    if isinstance(address, str):
        return address
    host, port = address
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


@dataclass(frozen=True)
class CurveClientKeys:
    """CURVE for a client socket: the server's public key and this client's
    key pair (Z85 text, as ``polyport keys create`` prints them)."""

    server_public: str
    public: str
    secret: str

    def apply(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public.encode("ascii"))
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret.encode("ascii"))


class Res01Client:
    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        *,
        protocol: str = PROTOCOL_FRAME,
        timeout: float = 30.0,
        max_in_flight: int = 1000,
    ) -> None:
        self._sock = sock
        self.protocol = protocol
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max_in_flight)
        self._ids = itertools.count(1)
        self._conn = ClientConnection()
        self._waiters: dict[bytes, asyncio.Future[list[Response]]] = {}
        self._reader = asyncio.create_task(self._read_loop(), name="res01-client")
        self._closed = False

    @classmethod
    async def connect(
        cls,
        address: str | tuple[str, int],
        *,
        protocol: str = PROTOCOL_FRAME,
        timeout: float = 30.0,
        max_in_flight: int = 1000,
        context: zmq.asyncio.Context | None = None,
        curve: CurveClientKeys | None = None,
        plain_username: str | None = None,
        plain_password: str | None = None,
    ) -> Res01Client:
        """``address``: a ZeroMQ endpoint (``tcp://host:port``) or (host, port).

        ``curve``: speak CURVE to a server with that public key.
        ``plain_username``/``plain_password``: log in with ZeroMQ's PLAIN
        mechanism (the server checks them through ZAP).  A refused login is
        not an error reply: ZeroMQ closes the connection during the handshake
        and requests time out, as with any other ZeroMQ PLAIN server.
        """
        ctx = context or zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(sock)
        if plain_username is not None:
            sock.setsockopt(zmq.PLAIN_USERNAME, plain_username.encode("utf-8"))
            sock.setsockopt(zmq.PLAIN_PASSWORD, (plain_password or "").encode("utf-8"))
        sock.connect(_endpoint(address))
        return cls(sock, protocol=protocol, timeout=timeout, max_in_flight=max_in_flight)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(ConnectionError("Res01 client closed"))
        self._waiters.clear()
        self._sock.close(linger=0)

    async def __aenter__(self) -> Res01Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- requests -----------------------------------------------------------

    def next_request_id(self) -> bytes:
        return str(next(self._ids)).encode("ascii")

    async def request(
        self, request: Request, expected_replies: int | None = None
    ) -> list[Response]:
        """Send one request and wait for all its replies (FE gets one EF per
        entry, none without entries).  ``expected_replies``, if given, must be
        that number.  Raises Res01ServerError on ER, RemoteProtocolError for a
        reply that breaks the protocol, TimeoutError."""
        if self._closed:
            raise ConnectionError("Res01 client closed")
        due = replies_due(request)
        if expected_replies is not None and expected_replies != due:
            raise LocalProtocolError(
                f"{type(request).__name__} gets {due} replies, not {expected_replies}",
                request_id=request.request_id,
            )
        async with self._slots:
            rid = request.request_id
            frames = self._conn.send(request)  # refuses an id already in flight
            if not self._conn.is_pending(rid):  # no reply due
                async with asyncio.timeout(self.timeout):
                    await self._sock.send_multipart(frames)
                return []
            fut: asyncio.Future[list[Response]] = asyncio.get_running_loop().create_future()
            self._waiters[rid] = fut
            try:
                async with asyncio.timeout(self.timeout):
                    await self._sock.send_multipart(frames)
                    return await fut
            finally:
                self._waiters.pop(rid, None)
                # Timed out or cancelled: replies still coming are dropped.
                self._conn.abandon(rid)

    async def commit(
        self,
        context: str,
        stream: str,
        expected_version: int,
        events: Iterable[NewEvent],
    ) -> uuid.UUID:
        """AC; ``expected_version``: -1 any, 1 new stream, n = the first event's version."""
        req = AppendCommit(
            self.next_request_id(), context, stream, expected_version, tuple(events), self.protocol
        )
        [reply] = await self.request(req)
        assert isinstance(reply, CommitResult)
        return reply.commit_id

    async def subscribe(
        self,
        subscriber_id: str,
        subscriptions: Iterable[SubscriptionDefinition | tuple[str, str, datetime]],
    ) -> list[int]:
        """RS: (context, filter, start time) per subscription → their ids."""
        defs = tuple(
            s if isinstance(s, SubscriptionDefinition) else SubscriptionDefinition(*s)
            for s in subscriptions
        )
        req = RegisterSubscriptions(self.next_request_id(), subscriber_id, defs, self.protocol)
        [reply] = await self.request(req)
        assert isinstance(reply, SubscribeResult)
        return list(reply.subscription_ids)

    async def fetch(self, entries: Iterable[FetchEntry | tuple[int, int]]) -> list[EventsFetched]:
        """FE: (subscription id, suggested count) per entry → one EF each."""
        fe = tuple(e if isinstance(e, FetchEntry) else FetchEntry(*e) for e in entries)
        req = FetchEvents(self.next_request_id(), fe, self.protocol)
        replies = await self.request(req, expected_replies=len(fe))
        out = [r for r in replies if isinstance(r, EventsFetched)]
        assert len(out) == len(replies)
        return out

    async def progress(
        self, entries: Iterable[ProgressEntry | tuple[int, datetime]]
    ) -> list[int]:
        """PS: (subscription id, last event time of the fetched batch)."""
        pe = tuple(e if isinstance(e, ProgressEntry) else ProgressEntry(*e) for e in entries)
        req = ProgressSubscriptions(self.next_request_id(), pe, self.protocol)
        [reply] = await self.request(req)
        assert isinstance(reply, SubscriptionProgressed)
        return list(reply.subscription_ids)

    async def set_subscription(
        self, entries: Iterable[SetEntry | tuple[str, str, str, datetime]]
    ) -> list[str]:
        """SS: (subscriber id, context, filter, set to) → "" per success, else a message."""
        se = tuple(e if isinstance(e, SetEntry) else SetEntry(*e) for e in entries)
        req = SetSubscription(self.next_request_id(), se, self.protocol)
        [reply] = await self.request(req)
        assert isinstance(reply, SubscriptionSet)
        return list(reply.results)

    # --- replies ------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            try:
                frames = await self._sock.recv_multipart()
            except zmq.ZMQError as exc:
                if self._sock.closed:
                    return
                log.warning("res01 client: receive failed: %s", exc)
                continue
            try:
                answered = self._conn.receive_message(frames)
            except RemoteProtocolError as exc:
                fut = self._waiters.get(exc.request_id) if exc.request_id is not None else None
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
                else:
                    log.warning("res01 client: unusable reply: %s", exc)
                continue
            if answered is None:
                continue  # more replies due, or a late reply to an abandoned request
            fut = self._waiters.get(answered.request_id)
            if fut is None or fut.done():
                continue
            error = answered.error
            if error is not None:
                fut.set_exception(Res01ServerError(error.code, error.message))
            else:
                fut.set_result(list(answered.replies))
