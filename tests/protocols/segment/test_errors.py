"""Segment-wire errors on the shared classes: peer faults and our own bugs stay apart."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest

from polyport.core.commands import Principal
from polyport.protocols import errors as shared
from polyport.protocols.segment import (
    AppendSetup,
    ClientConnection,
    DataAppended,
    ErrorMessage,
    Event,
    KeepAlive,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    ServerConnection,
    SetupAppend,
    decode_frame,
    encode_frame,
)
from polyport.protocols.segment.adapter import AppenderRegistry, SegmentSession
from polyport.protocols.segment.frames import NoSuchSegment
from polyport.protocols.session import ListenerStats, SessionContext

from .._outbound import RecordingOutbound

CID = uuid.UUID(int=7)


def test_segment_errors_build_on_the_shared_classes() -> None:
    assert issubclass(ProtocolError, shared.ProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(RemoteProtocolError, shared.RemoteProtocolError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(LocalProtocolError, shared.LocalProtocolError)
    # segment keeps its own part: the segment name and the error reply.
    error = RemoteProtocolError("gone", code=shared.NOT_FOUND, segment="ctx/s")
    assert error.reply() == NoSuchSegment(segment="ctx/s", message="gone")


def test_local_error_is_not_a_peer_error() -> None:
    # What lets ``except RemoteProtocolError`` in the adapter, the client and
    # the connections leave our own bugs alone.
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(LocalProtocolError, shared.RemoteProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)


def test_peer_faults_are_remote_and_stay_remote() -> None:
    server = ServerConnection()
    with pytest.raises(RemoteProtocolError, match="only valid inside an append block"):
        server.receive_data(encode_frame(Event(b"x")))
    # Later calls repeat the failure with the same class: still the peer's fault.
    with pytest.raises(RemoteProtocolError, match="connection already failed"):
        server.receive_data(b"")

    client = ClientConnection()
    with pytest.raises(RemoteProtocolError, match="not set up"):
        client.receive_data(encode_frame(DataAppended(CID, 8)))
    with pytest.raises(RemoteProtocolError, match="unknown message type"):
        decode_frame(b"\x00\x00\x00\x63\x00\x00\x00\x00")


def test_what_this_side_may_not_send_is_local() -> None:
    with pytest.raises(LocalProtocolError, match="not set up"):
        ServerConnection().send(DataAppended(CID, 8))
    with pytest.raises(LocalProtocolError, match="a server does not send"):
        ServerConnection().send(SetupAppend(CID, "s"))  # type: ignore[arg-type]
    # The request state machine judges the peer on the server, our own
    # requests on the client.
    client = ClientConnection()
    with pytest.raises(LocalProtocolError, match="only valid inside an append block"):
        client.send(Event(b"x"))
    with pytest.raises(LocalProtocolError, match="connection already failed"):
        client.send(KeepAlive())
    with pytest.raises(LocalProtocolError, match="65535-byte limit"):
        encode_frame(SetupAppend(CID, "s" * 70_000))


# --- the adapter -----------------------------------------------------------------------


class _Users:
    async def authenticate(
        self, user: str | None, password: str | None, *, peer: str | None = None
    ) -> Principal:
        return Principal(user, "default", None)


class _Store:
    users = _Users()
    on_login = None  # the gateway's connection-table hook

    async def producer_ack_level(self, cid: uuid.UUID, context: str, stream: str) -> int:
        return 0


def _session() -> tuple[SegmentSession, RecordingOutbound, ListenerStats]:
    stats = ListenerStats("segment")
    ctx = SessionContext(
        store=_Store(),  # type: ignore[arg-type]
        stats=stats,
        settings={},
        log=logging.getLogger("polyport.segment"),
    )
    out = RecordingOutbound()
    return SegmentSession(ctx, out, AppenderRegistry()), out, stats


async def _closed_with(session: SegmentSession, out: RecordingOutbound) -> Any:
    """The last reply before the session closed the connection."""
    for _ in range(100):
        if out.closed:
            break
        await asyncio.sleep(0)
    assert out.closed
    await session.connection_lost()
    return decode_frame(out.sent[-1])


async def test_adapter_answers_peer_errors_with_their_code() -> None:
    session, out, stats = _session()
    await session.data_received(encode_frame(Event(b"x")))
    reply = await _closed_with(session, out)
    assert isinstance(reply, ErrorMessage) and reply.code == "malformed"
    assert stats.errors == {"malformed": 1}


async def test_adapter_lets_a_local_error_from_the_codec_through() -> None:
    session, out, stats = _session()

    def broken(data: bytes) -> list[Any]:
        raise LocalProtocolError("our bug", code=shared.MALFORMED)

    session.conn.receive_data = broken  # type: ignore[method-assign]
    with pytest.raises(LocalProtocolError, match="our bug"):
        await session.data_received(b"\x00")
    # Left to the transport (which logs it and closes): no error reply that
    # blames the client, nothing counted as its fault.
    await asyncio.sleep(0)
    assert out.sent == [] and not out.closed and not stats.errors
    await session.connection_lost()


async def test_adapter_does_not_blame_the_peer_for_its_own_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session, out, stats = _session()

    async def broken(frame: SetupAppend) -> None:
        raise LocalProtocolError("cannot send AppendSetup: our bug", segment=frame.segment)

    session._setup = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="polyport.segment"):
        await session.data_received(encode_frame(SetupAppend(CID, "default/s")))
        reply = await _closed_with(session, out)
    # Not the peer-fault path: ``internal``, never the local error's
    # ``malformed``, and logged with its traceback as our error.
    assert reply == ErrorMessage("default/s", "internal", "cannot send AppendSetup: our bug")
    assert stats.errors == {"internal": 1}
    assert any(
        r.exc_info and "append on 'default/s' failed" in r.getMessage() for r in caplog.records
    )


async def test_adapter_setup_still_answers() -> None:
    # The happy path of the helpers above, so the failures they show are real.
    session, out, _stats = _session()
    await session.data_received(encode_frame(SetupAppend(CID, "default/s")))
    for _ in range(100):
        if out.sent:
            break
        await asyncio.sleep(0)
    assert decode_frame(out.sent[0]) == AppendSetup("default/s", CID, 0)
    await session.connection_lost()
