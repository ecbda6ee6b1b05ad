"""The sans-IO connections: SETUP rules, stream tables, credits, lease,
fragmentation and the spec's "Handling the Unexpected", without sockets."""

from __future__ import annotations

import pytest

from polyport.protocols.budgets import ByteBudget
from polyport.protocols.rsocket import frames as F
from polyport.protocols.rsocket.connection import ClientConnection, ServerConnection, StreamError
from polyport.protocols.rsocket.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.rsocket.frames import (
    Cancel,
    ErrorFrame,
    Keepalive,
    Lease,
    Payload,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    Setup,
)
from polyport.protocols.rsocket.metadata import COMPOSITE
from polyport.protocols.rsocket.state import Phase
from polyport.protocols.rsocket.wire import encode_frame, encode_tcp_frame

SETUP = Setup(500, 30_000, COMPOSITE, "application/json")


def tcp(*frames: F.Frame) -> bytes:
    return b"".join(encode_tcp_frame(f) for f in frames)


def server(**kw: object) -> ServerConnection:
    conn = ServerConnection("tcp", **kw)  # type: ignore[arg-type]
    assert conn.receive_data(tcp(SETUP)) == [SETUP]
    return conn


def test_first_frame_must_be_setup() -> None:
    conn = ServerConnection("tcp")
    with pytest.raises(RemoteProtocolError) as err:
        conn.receive_data(tcp(RequestResponse(1, None, b"x")))
    assert err.value.error_code == F.INVALID_SETUP
    assert conn.closed
    # Only ERROR on stream 0 may follow, and then nothing.
    with pytest.raises(LocalProtocolError):
        conn.send(Payload(1, None, b"x", next=True))
    assert conn.send_error(0, "malformed", "bye", F.INVALID_SETUP)
    assert conn.receive_data(tcp(SETUP)) == []


def test_frames_split_at_every_byte_arrive_whole() -> None:
    conn = ServerConnection("tcp")
    wire = tcp(SETUP, RequestResponse(1, b"m", b"d"), Keepalive(True, 0, b"k"))
    got: list[object] = []
    for i in range(len(wire)):
        got += conn.receive_data(wire[i : i + 1])
    assert got == [SETUP, RequestResponse(1, b"m", b"d"), Keepalive(True, 0, b"k")]


def test_frame_length_checked_before_the_frame_arrives() -> None:
    conn = ServerConnection("tcp", max_frame_size=100)
    with pytest.raises(RemoteProtocolError) as err:
        conn.receive_data((101).to_bytes(3, "big"))
    assert err.value.code == "too_large"


def test_request_response_answered_once_with_complete() -> None:
    conn = server()
    request = RequestResponse(1, None, b"q")
    assert conn.receive_data(tcp(request)) == [request]
    with pytest.raises(LocalProtocolError):
        conn.send(Payload(1, None, b"a", next=True))  # without C
    conn.send_payload(1, b"a", complete=True)
    assert not conn.is_live(1)
    with pytest.raises(LocalProtocolError):
        conn.send_payload(1, b"again", complete=True)


def test_request_n_credits_bound_what_the_server_may_send() -> None:
    conn = server()
    conn.receive_data(tcp(RequestStream(1, 2, None, b"q")))
    conn.send_payload(1, b"1")
    conn.send_payload(1, b"2")
    with pytest.raises(LocalProtocolError):
        conn.send_payload(1, b"3")
    assert conn.credits(1) == 0
    assert conn.receive_data(tcp(RequestN(1, 3))) == [RequestN(1, 3)]
    assert conn.credits(1) == 3
    conn.send_payload(1, b"3")
    conn.send_complete(1)  # COMPLETE uses no credit
    assert not conn.is_live(1)


def test_fragmented_request_is_reassembled_and_counts_once() -> None:
    conn = server()
    parts = [
        RequestStream(1, 4, b"me", b"", follows=True),
        Payload(1, b"ta", b"da", follows=True, next=True),
        RequestN(1, 1),  # credits granted mid-request count once it is whole
        Payload(1, None, b"ta", next=True),
    ]
    assert conn.receive_data(tcp(*parts)) == [RequestStream(1, 4, b"meta", b"data")]
    assert conn.credits(1) == 5


def test_fragmented_answer_uses_one_credit() -> None:
    conn = server(max_fragment=4)
    conn.receive_data(tcp(RequestStream(1, 1, None, b"q")))
    wire = conn.send_payload(1, b"0123456789")
    assert len(wire) == 3 and conn.credits(1) == 0
    client = ClientConnection("tcp", max_fragment=4)
    client.setup(SETUP)
    sid, _ = client.request_stream(None, b"q", 1)
    assert client.receive_data(b"".join(wire)) == [Payload(sid, None, b"0123456789", next=True)]


def test_message_size_limit_rejects_the_stream_not_the_connection() -> None:
    conn = server(max_message_size=4)
    events = conn.receive_data(tcp(
        RequestResponse(1, None, b"abc", follows=True), Payload(1, None, b"de", next=True)))
    assert events == [StreamError(1, "too_large", "request exceeds max_message_size 4")]
    conn.send_error(1, "too_large", "no")
    assert conn.streams == {}


def test_reassembly_budget_is_per_connection() -> None:
    # Each request within max_message_size; all fragmented requests of the
    # connection together within max_reassembly_bytes, else too_large.
    conn = server(max_message_size=4, max_reassembly_bytes=6)
    events = conn.receive_data(tcp(
        RequestResponse(1, None, b"abc", follows=True),
        RequestResponse(3, None, b"def", follows=True),
        RequestResponse(5, None, b"g", follows=True),
    ))
    assert events == [StreamError(
        5, "too_large",
        "fragmented messages on this connection exceed max_reassembly_bytes 6")]
    assert conn.reassembly_bytes == 6
    conn.send_error(5, "too_large", "no")
    assert conn.receive_data(tcp(Payload(1, None, b"h", next=True))) == [
        RequestResponse(1, None, b"abch")]
    assert conn.reassembly_bytes == 3
    # One request alone always fits.
    alone = server(max_message_size=4, max_reassembly_bytes=1)
    assert alone.receive_data(tcp(
        RequestResponse(1, None, b"ab", follows=True), Payload(1, None, b"cd", next=True)
    )) == [RequestResponse(1, None, b"abcd")]


def test_the_unexpected_is_ignored() -> None:
    conn = server()
    conn.receive_data(tcp(RequestStream(1, 1, None, b"q")))
    ignored = tcp(
        RequestResponse(1, None, b"reuse"),  # stream id in use
        Cancel(9),  # unknown stream
        Payload(11, None, b"x", next=True),  # unknown stream
        ErrorFrame(5, F.APPLICATION_ERROR, b""),  # unknown stream
        SETUP,  # a second SETUP
        ErrorFrame(0, F.REJECTED_SETUP, b""),  # SETUP errors from a client
        F.MetadataPush(b"x", 3),  # METADATA_PUSH on a stream
        F.UnknownFrame(0x20, F.FLAG_IGNORE, 0, b"?"),
    )
    assert conn.receive_data(ignored) == []
    assert conn.is_live(1)


def test_even_stream_ids_and_stream_zero_are_connection_errors() -> None:
    with pytest.raises(RemoteProtocolError):
        server().receive_data(tcp(RequestResponse(2, None, b"")))
    with pytest.raises(RemoteProtocolError):
        server().receive_data(tcp(RequestN(0, 1)))


def test_lease_counts_requests_and_expires() -> None:
    now = [100.0]
    conn = ServerConnection("tcp", clock=lambda: now[0])
    conn.receive_data(tcp(Setup(500, 30_000, COMPOSITE, "application/json", lease=True)))
    # Before the LEASE nothing may be requested.
    assert conn.receive_data(tcp(RequestFnf(1, None, b""))) == []
    [rejected] = conn.receive_data(tcp(RequestResponse(3, None, b"")))
    assert isinstance(rejected, StreamError) and rejected.code == "busy"
    conn.send_error(3, rejected.code, rejected.message)
    conn.send(Lease(1000, 2))
    assert len(conn.receive_data(tcp(RequestResponse(5, None, b""), RequestFnf(7, None, b"")))) == 2
    [over] = conn.receive_data(tcp(RequestResponse(9, None, b"")))
    assert isinstance(over, StreamError)
    conn.send(Lease(1000, 5))
    now[0] += 1.5  # past the TTL
    [expired] = conn.receive_data(tcp(RequestResponse(11, None, b"")))
    assert isinstance(expired, StreamError)


def test_resume_is_refused() -> None:
    with pytest.raises(RemoteProtocolError) as err:
        ServerConnection("tcp").receive_data(tcp(F.Resume(b"t", 0, 0)))
    assert err.value.error_code == F.REJECTED_RESUME
    with pytest.raises(RemoteProtocolError) as err:
        ServerConnection("tcp").receive_data(tcp(
            Setup(500, 30_000, COMPOSITE, "application/json", resume_token=b"t")))
    assert err.value.error_code == F.REJECTED_SETUP


def test_client_tables() -> None:
    client = ClientConnection("websocket")
    with pytest.raises(LocalProtocolError):
        client.request_response(None, b"")  # SETUP first
    client.setup(SETUP)
    sid, [_] = client.request_response(None, b"q")
    assert sid == 1 and client.streams[1].phase is Phase.REQUESTED
    # A PAYLOAD without C answering a request-response is taken as complete.
    answer = Payload(1, None, b"a", next=True)
    assert client.receive_data(encode_frame(answer)) == [answer]
    assert not client.is_live(1)
    assert client.request_n(1, 5) == b"" and client.cancel(1) == b""
    sid, _ = client.request_stream(None, b"q", 2)
    assert client.credits(sid) == 2
    client.request_n(sid, 3)
    assert client.credits(sid) == 5
    client.cancel(sid)
    assert client.streams == {}


def test_connections_share_the_gateway_reassembly_budget() -> None:
    # Fragments of every connection draw on one budget with a share per
    # source address: past either, the fragment's stream is rejected (busy:
    # ERROR[REJECTED]) and holds nothing; the rest goes back as messages
    # complete, streams end and connections close.
    budget = ByteBudget(10, per_address=6, what="fragmented requests",
                        setting="reassembly_budget",
                        per_address_setting="reassembly_budget_per_address")
    a1, a2, b = server(), server(), server()
    a1.budget, a2.budget, b.budget = (budget.account("10.0.0.1"), budget.account("10.0.0.1"),
                                      budget.account("10.0.0.2"))
    assert a1.receive_data(tcp(RequestResponse(1, None, b"abcd", follows=True))) == []
    refused = a2.receive_data(tcp(RequestResponse(1, None, b"efg", follows=True)))
    assert refused == [StreamError(
        1, "busy", "fragmented requests from 10.0.0.1 exceed "
        "reassembly_budget_per_address 6; retry later")]
    assert a2.send_error(1, "busy", "no")[3 + 6 : 3 + 10] == F.REJECTED.to_bytes(4, "big")
    assert b.receive_data(tcp(RequestResponse(1, None, b"hijkl", follows=True))) == []
    assert budget.used == 9
    # The whole budget is full before another address's share is.
    assert b.receive_data(tcp(RequestResponse(3, None, b"mn", follows=True)))[0].message == (
        "fragmented requests of all clients exceed reassembly_budget 10; retry later")
    assert budget.used == 9
    # Completion releases (the last fragment is never held).
    assert a1.receive_data(tcp(Payload(1, None, b"z", next=True))) == [
        RequestResponse(1, None, b"abcdz")]
    assert budget.used == 5 and budget.by_address == {"10.0.0.2": 5}
    # So does the stream's end by CANCEL, and a closed connection.
    assert a1.receive_data(tcp(RequestStream(3, 1, None, b"ab", follows=True))) == []
    a1.receive_data(tcp(Cancel(3)))
    assert budget.used == 5
    b.release_budget()
    assert budget.used == 0 and not budget.by_address
    # A connection error gives back what its streams held.
    assert a2.receive_data(tcp(RequestResponse(3, None, b"abc", follows=True))) == []
    assert budget.used == 3
    with pytest.raises(RemoteProtocolError):
        a2.receive_data(b"\x00\x00\x01")
    assert budget.used == 0


def test_a_frame_not_yet_whole_counts_in_the_budget() -> None:
    # A peer can leave a large frame half sent for as long as it likes: its
    # bytes so far are held against the budget too; past it the connection
    # fails busy (ERROR[CONNECTION_ERROR]) and gives everything back.
    budget = ByteBudget(100)
    conn = server()
    conn.budget = budget.account("10.0.0.1")
    wire = tcp(RequestResponse(1, None, b"x" * 150))
    conn.receive_data(wire[:60])
    assert budget.used == 60
    with pytest.raises(RemoteProtocolError) as err:
        conn.receive_data(wire[60:120])
    assert err.value.code == "busy" and err.value.error_code == F.CONNECTION_ERROR
    assert budget.used == 0
    # Whole frames pass through without being held.
    whole = server()
    whole.budget = budget.account("10.0.0.1")
    assert whole.receive_data(wire) == [RequestResponse(1, None, b"x" * 150)]
    assert budget.used == 0
