"""BSON errors on the shared classes: peer faults and our own bugs stay apart."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from polyport.core.commands import Principal
from polyport.protocols import errors as shared
from polyport.protocols.bson import (
    Connect,
    Emit,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestError,
    Response,
    ServerConnection,
    decode_frame,
    encode_frame,
)
from polyport.protocols.bson.adapter import BsonSession
from polyport.protocols.session import ListenerStats, SessionContext
from tests.protocols._outbound import RecordingOutbound


def test_bson_errors_build_on_the_shared_classes() -> None:
    assert issubclass(ProtocolError, shared.ProtocolError)
    assert issubclass(RemoteProtocolError, shared.RemoteProtocolError)
    assert issubclass(LocalProtocolError, shared.LocalProtocolError)
    assert issubclass(RequestError, RemoteProtocolError)
    assert RequestError("x", code=shared.NOT_FOUND).code == "not_found"


def test_local_error_is_not_a_peer_error() -> None:
    # What lets ``except RemoteProtocolError`` in the adapter, client and
    # connection leave our own bugs alone.
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(LocalProtocolError, shared.RemoteProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)


def test_peer_faults_from_the_connection_are_remote() -> None:
    conn = ServerConnection()
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(encode_frame(Emit("s", "t", {})))
    assert info.value.code == "unauthenticated"
    with pytest.raises(LocalProtocolError) as local:
        ServerConnection().send(Response(ok=True))
    assert not isinstance(local.value, RemoteProtocolError)


# --- the adapter ----------------------------------------------------------------------


class _Users:
    async def authenticate(
        self, user: str | None, password: str | None, *, peer: str | None = None
    ) -> Principal:
        return Principal(user, "default", None)


class _Store:
    users = _Users()
    on_login = None  # the gateway's connection-table hook


def _session() -> tuple[BsonSession, RecordingOutbound, ListenerStats]:
    stats = ListenerStats("bson")
    ctx = SessionContext(
        store=_Store(),  # type: ignore[arg-type]
        stats=stats,
        settings={},
        log=logging.getLogger("test.bson"),
    )
    out = RecordingOutbound()
    return BsonSession(ctx, out), out, stats


async def _fatal_reply(session: BsonSession, out: RecordingOutbound, data: bytes) -> Any:
    """Feed ``data`` to a connected session; the RESPONSE it closes with."""
    await session.data_received(data)
    # The writer task sends the replies in flight, then the fatal RESPONSE.
    for _ in range(50):
        if out.closed:
            break
        await asyncio.sleep(0)
    assert out.closed
    await session.connection_lost()
    return decode_frame(out.sent[-1])


async def test_adapter_answers_peer_errors_with_their_code() -> None:
    session, out, stats = _session()
    await session.data_received(encode_frame(Connect("1.0")))
    reply = await _fatal_reply(session, out, b"\x05\x00\x00\x00\x01")
    assert reply == Response(ok=False, err_code="malformed", err_msg=reply.err_msg)
    assert stats.errors["malformed"] == 1


async def test_adapter_does_not_blame_the_peer_for_its_own_bug(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    session, out, stats = _session()

    async def broken(frame: Any) -> None:
        raise LocalProtocolError("cannot send EMIT: our bug", code=shared.MALFORMED)

    await session.data_received(encode_frame(Connect("1.0")))
    monkeypatch.setattr(session, "_handle", broken)
    with caplog.at_level(logging.ERROR, logger="polyport.bson"):
        reply = await _fatal_reply(session, out, encode_frame(Emit("s", "t", {})))
    # Not the peer-fault path: the code is ``internal``, never the local
    # error's ``malformed``, and it is logged as our error.
    assert reply.err_code == "internal"
    assert "our bug" in reply.err_msg
    assert stats.errors["internal"] == 1 and not stats.errors["malformed"]
    assert any("BSON adapter error" in r.getMessage() for r in caplog.records)
