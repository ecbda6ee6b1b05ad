"""ReactiveSocket's errors on the shared classes, and who catches which."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from polyport.protocols import errors as shared
from polyport.protocols.reactivesocket import (
    LocalProtocolError,
    PayloadError,
    ProtocolError,
    RemoteProtocolError,
    decode_frame,
)
from polyport.protocols.reactivesocket import payloads as P
from polyport.protocols.reactivesocket.adapter import ReactiveSocketSession
from polyport.protocols.reactivesocket.connection import ServerConnection, StreamError
from polyport.protocols.reactivesocket.frames import ErrorFrame, Setup
from polyport.protocols.reactivesocket.limits import Limits
from polyport.protocols.session import ListenerStats, SessionContext
from tests.protocols._outbound import RecordingOutbound

from .util import SETUP_TCP, h


def test_error_classes_build_on_the_shared_ones() -> None:
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(RemoteProtocolError, shared.RemoteProtocolError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(LocalProtocolError, shared.LocalProtocolError)
    assert not issubclass(LocalProtocolError, shared.RemoteProtocolError)
    assert issubclass(PayloadError, RemoteProtocolError)
    err = RemoteProtocolError("bad", code=shared.TOO_LARGE, stream_id=3, frames=[1])
    assert (err.message, err.code, err.stream_id, err.frames) == ("bad", "too_large", 3, [1])
    assert repr(err) == "RemoteProtocolError('bad', code='too_large')"
    assert LocalProtocolError("ours").code == shared.MALFORMED


def test_peer_faults_are_remote_errors() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(h("01 00 0001 0000000000000000"))  # version 1
    assert info.value.code == shared.UNSUPPORTED
    with pytest.raises(RemoteProtocolError):
        P.decode_request(b"\xc1")  # not MessagePack


def _session(out: RecordingOutbound) -> ReactiveSocketSession:
    # The store is never reached: no request gets past the connection object.
    ctx = SessionContext(
        store=cast(Any, object()),
        stats=ListenerStats("reactivesocket"),
        settings={},
        log=logging.getLogger("test.reactivesocket"),
    )
    return ReactiveSocketSession(ctx, out, "tcp", Limits(idle_timeout=None))


async def test_adapter_answers_a_peer_fault_with_error_on_stream_0() -> None:
    out = RecordingOutbound()
    session = _session(out)
    await session.data_received(SETUP_TCP + h("00000010 01 00 0001 0000000000000000"))
    (wire,) = out.sent
    frame = decode_frame(wire[4:])
    assert isinstance(frame, ErrorFrame) and frame.stream_id == 0
    assert P.decode_error_data(frame.data).code == shared.UNSUPPORTED
    assert out.closed
    await session.connection_lost()


async def test_adapter_peer_error_path_does_not_catch_our_own_bugs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = RecordingOutbound()
    session = _session(out)

    def broken(data: bytes) -> list[object]:
        raise LocalProtocolError("a bug on our side")

    monkeypatch.setattr(session.conn, "receive_data", broken)
    # Not answered as the peer's fault (ERROR on stream 0, close): it surfaces.
    with pytest.raises(LocalProtocolError):
        await session.data_received(SETUP_TCP)
    assert out.sent == [] and not out.closed
    assert session.stats.errors == {}
    await session.connection_lost()


def test_stream_error_and_connection_close_in_one_read_leave_nothing_to_answer() -> None:
    # Fuzz finding: SETUP, a stream fault (a follow fragment without its first)
    # and the peer's ERROR on stream 0, all in one read.  The documented loop
    # answers each StreamError with send_error, which raised
    # LocalProtocolError: by then the connection was closed.  A stream error
    # on a connection that is gone has no one to answer, so it is not reported.
    conn = ServerConnection("tcp")
    events = conn.receive_data(
        h(
            "00000011000000010000000000000000800000001100200011000000000000000180"
            "0000002200000021000000000000000082a4636f6465a178a76d657373616765a100"
        )
    )
    assert conn.closed
    for ev in events:
        if isinstance(ev, StreamError):
            conn.send_error(ev.stream_id, ev.code, ev.message)
    assert [type(ev) for ev in events] == [Setup, ErrorFrame]
