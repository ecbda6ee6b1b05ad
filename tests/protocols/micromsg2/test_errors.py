"""MicroMsg2 errors on the shared classes: peer faults and our own bugs stay apart."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from polyport.core.commands import Principal
from polyport.core.errors import Busy
from polyport.protocols import errors as shared
from polyport.protocols.micromsg2 import (
    Ack,
    ClientConnection,
    Command,
    Error,
    Extension,
    ExtensionSpec,
    Handshake,
    LocalProtocolError,
    Message,
    ProtocolError,
    RemoteProtocolError,
    ServerConnection,
    decode_frame,
    encode_ack_payload,
    encode_frame,
    encode_handshake,
)
from polyport.protocols.micromsg2.adapter import MicroMsg2Session
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.micromsg2.limits import Limits
from polyport.protocols.session import ListenerStats, SessionContext

from .._outbound import RecordingOutbound
from ._support import open_pair


def test_micromsg2_errors_build_on_the_shared_classes() -> None:
    assert issubclass(ProtocolError, shared.ProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(RemoteProtocolError, shared.RemoteProtocolError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(LocalProtocolError, shared.LocalProtocolError)
    assert RemoteProtocolError("x", code=shared.UNSUPPORTED).code == "unsupported"


def test_local_error_is_not_a_peer_error() -> None:
    # What lets ``except RemoteProtocolError`` in the adapter, the client and
    # the connection leave our own bugs alone.
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(LocalProtocolError, shared.RemoteProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)


# --- the connection --------------------------------------------------------------------


def test_what_the_peer_sends_wrong_is_remote() -> None:
    server = ServerConnection("srv")
    with pytest.raises(RemoteProtocolError, match="not supported"):
        server.receive_data(encode_handshake(Handshake("old", major=0, minor=9)))
    server, _client = open_pair(optional=["pubsub"])
    with pytest.raises(RemoteProtocolError, match="unknown frame flag bits"):
        server.receive_data(b"\x80")
    with pytest.raises(RemoteProtocolError, match="connection is closed"):
        server.receive_data(b"")


def test_what_this_side_may_not_send_is_local_and_changes_nothing() -> None:
    server = ServerConnection("srv")
    with pytest.raises(LocalProtocolError, match="cannot send a Message frame"):
        server.send(Message(1, "topic/a"))
    with pytest.raises(LocalProtocolError, match="no client hello"):
        server.reply_frame()
    with pytest.raises(LocalProtocolError, match="no server reply"):
        ClientConnection("c").final_frame()

    server, client = open_pair(required=["ack"])
    # The shared checks (numbering, ack window, extension ids) raise
    # RemoteProtocolError on receipt; on send the frame is ours.
    with pytest.raises(LocalProtocolError, match="expected 1"):
        server.send(Message(2, "topic/a"))
    server.send(Message(1, "topic/a"))
    with pytest.raises(LocalProtocolError, match="exceeds the ack window"):
        server.send(Message(2, "topic/a"))
    with pytest.raises(LocalProtocolError, match="matches no MESSAGE in flight"):
        client.send(Ack(1))
    with pytest.raises(LocalProtocolError, match="id 9, but 1 extension"):
        server.send(Extension(9))
    with pytest.raises(LocalProtocolError, match="command name"):
        server.send(Command("bad name"))
    assert server.outbound.outstanding == 1 and server.next_seq == 2

    # The same window check on the receiving side is the peer's fault.
    _server, client = open_pair(required=["ack"])
    client.receive_data(encode_frame(Message(1, "topic/a")))
    with pytest.raises(RemoteProtocolError, match="exceeds the ack window"):
        client.receive_data(encode_frame(Message(2, "topic/a")))


def test_constructor_extension_lists_are_ours() -> None:
    with pytest.raises(LocalProtocolError, match="is not 'key=value'"):
        ClientConnection("c", ["batch-ack:max-count:100"])
    with pytest.raises(LocalProtocolError, match="is not a FIELD"):
        ServerConnection("srv", ["json!"])


def test_encoders_raise_local_decoders_remote() -> None:
    with pytest.raises(LocalProtocolError, match="identity is 256 bytes"):
        encode_handshake(Handshake("x" * 256))
    with pytest.raises(LocalProtocolError, match="is not a FIELD"):
        encode_handshake(Handshake("c", optional=(ExtensionSpec("not a field"),)))
    with pytest.raises(LocalProtocolError, match="does not fit 16 bits"):
        encode_frame(Message(70000, "topic/a"))
    with pytest.raises(LocalProtocolError, match="64-bit long"):
        encode_frame(Message(1, "topic/a", b"", {"n": 1 << 64}))
    with pytest.raises(LocalProtocolError, match="command name"):
        encode_frame(Command("a b"))
    with pytest.raises(LocalProtocolError, match=r"outside 1..65535"):
        encode_ack_payload(0)
    with pytest.raises(RemoteProtocolError, match="command name"):
        decode_frame(b"\x01\x03a b")
    with pytest.raises(RemoteProtocolError, match="unknown frame flag bits"):
        decode_frame(b"\x80")


async def test_client_input_errors_are_local() -> None:
    # No socket is touched: the destination and filter are checked first.
    client = MicroMsg2Client(None, None, ClientConnection("c"))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="destination"):
        await client.subscribe("nowhere")
    with pytest.raises(LocalProtocolError, match="no operator"):
        await client.subscribe("topic/a", "amount")
    with pytest.raises(LocalProtocolError, match="destination"):
        await client.unsubscribe("queue/")


# --- the adapter -----------------------------------------------------------------------


def _session() -> tuple[MicroMsg2Session, RecordingOutbound, ListenerStats]:
    stats = ListenerStats("micromsg2")
    ctx = SessionContext(
        store=None,  # type: ignore[arg-type]  # the handshake's first step needs none
        stats=stats,
        settings={},
        log=logging.getLogger("test.micromsg2"),
    )
    out = RecordingOutbound()
    return MicroMsg2Session(ctx, out, Limits(idle_timeout=None)), out, stats


async def test_adapter_answers_peer_errors_with_an_error_frame() -> None:
    session, out, stats = _session()
    await session.data_received(encode_handshake(Handshake("old", major=0, minor=9)))
    [data] = out.sent
    error, _ = decode_frame(data) or (None, 0)
    assert isinstance(error, Error) and error.code == "unsupported"
    assert out.closed and stats.errors == {"unsupported": 1}
    await session.connection_lost()


async def test_adapter_does_not_swallow_its_own_protocol_bug() -> None:
    session, out, stats = _session()
    # Our reply breaks the protocol (an identity over 255 bytes): the
    # connection refuses to send it, and the adapter must not answer that as
    # if the peer had sent something wrong.
    session.conn.reply_frame = lambda: Handshake("x" * 300)  # type: ignore[method-assign]
    with pytest.raises(LocalProtocolError, match="identity is 300 bytes"):
        await session.data_received(encode_handshake(Handshake("client")))
    # Left to the transport, which logs it and closes: no ERROR frame blaming
    # the peer, nothing counted as a peer error.
    assert out.sent == [] and not out.closed
    assert not stats.errors
    await session.connection_lost()


async def test_adapter_hello_then_error_in_one_write_closes_cleanly() -> None:
    # Fuzz finding: a hello and the peer's ERROR in one write.  The connection
    # object decodes both (it is CLOSED afterwards); the adapter used to take
    # the hello for the final handshake (any handshake outside HELLO_RECEIVED)
    # and tripped an assertion, logged as an internal error.
    session, out, stats = _session()
    await session.data_received(bytes.fromhex("01000002667a0000000b6a736f6e3b7075627375620400"))
    assert out.closed and out.sent == []
    assert session.principal is None and not stats.errors
    await session.connection_lost()


class _SlowUsers:
    async def authenticate(
        self, user: str | None, password: str | None, *, peer: str | None = None
    ) -> Principal:
        return Principal(user, "default", None)


class _SlowStore:
    """Appends wait until ``commit`` is set: the writer is behind."""

    users = _SlowUsers()
    on_login = None  # the gateway's connection-table hook

    def __init__(self) -> None:
        self.commit = asyncio.Event()
        self.appended = 0

    async def append(self, append: Any) -> None:
        await self.commit.wait()
        self.appended += len(append.events)

    def start_append(self, append: Any) -> asyncio.Future[None]:
        return asyncio.ensure_future(self.append(append))


async def _logged_in(
    store: _SlowStore, limits: Limits
) -> tuple[MicroMsg2Session, RecordingOutbound, ClientConnection]:
    """A session over ``store`` whose client has completed the handshake."""
    ctx = SessionContext(
        store=store,  # type: ignore[arg-type]
        stats=ListenerStats("micromsg2"),
        settings={},
        log=logging.getLogger("test.micromsg2"),
    )
    out = RecordingOutbound()
    session = MicroMsg2Session(ctx, out, limits)
    client = ClientConnection("c")
    await session.data_received(client.send(client.hello_frame()))
    client.receive_data(out.sent.pop())
    await session.data_received(client.send(client.final_frame()))
    return session, out, client


async def test_pending_bytes_stop_reading_until_commits_catch_up() -> None:
    # Per connection at most max_pending_bytes of MESSAGE payloads wait for
    # the store: the next data_received does not return (the transport does
    # not read the socket) until earlier appends are done.
    store = _SlowStore()
    session, out, client = await _logged_in(store, Limits(idle_timeout=None,
                                                          max_pending_bytes=100))
    assert session.principal is not None
    # The first run is admitted alone, whatever its size.
    await session.data_received(client.send(Message(1, "topic/a", b"x" * 150)))
    second = asyncio.create_task(
        session.data_received(client.send(Message(2, "topic/a", b"y" * 10)))
    )
    await asyncio.sleep(0.05)
    assert not second.done()
    store.commit.set()
    await asyncio.wait_for(second, 5)
    await asyncio.sleep(0.05)
    assert store.appended == 2 and not out.closed
    await session.connection_lost()


class _BusyOnceStore(_SlowStore):
    """The store's queue refuses the first MESSAGE as busy, once: at once
    (``sync``) or when its commit comes; later tries are taken."""

    def __init__(self, sync: bool) -> None:
        super().__init__()
        self.commit.set()
        self.sync = sync
        self.refused = 0

    def start_append(self, append: Any) -> asyncio.Future[None]:
        if self.refused == 0:
            self.refused += 1
            if self.sync:
                raise Busy("the writer's queue is full")
            refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            refused.set_exception(Busy("the chain's queue is full"))
            return refused
        return super().start_append(append)


@pytest.mark.parametrize("sync", [True, False], ids=["at-once", "at-commit"])
async def test_a_busy_store_is_retried_not_reported(sync: bool) -> None:
    # MicroMsg2 has no per-message refusal: a busy writer is waited out (the
    # retrying task), whether it refused when queued or when committing.
    store = _BusyOnceStore(sync)
    session, out, client = await _logged_in(store, Limits(idle_timeout=None))
    await session.data_received(client.send(Message(1, "topic/a", b"x")))
    for _ in range(100):
        if store.appended:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)
    assert store.refused == 1 and store.appended == 1
    assert not out.closed
    assert not [f for data in out.sent for f in _frames(data) if isinstance(f, Error)]
    await session.connection_lost()


def _frames(data: bytes) -> list[Any]:
    frames = []
    while data:
        decoded = decode_frame(data)
        if decoded is None:
            break
        frame, used = decoded
        frames.append(frame)
        data = data[used:]
    return frames
