"""Connection-level rules and the per-stream state machines."""

from __future__ import annotations

import pytest

from polyport.protocols.reactivesocket import (
    Cancel,
    ClientConnection,
    ConnectionState,
    ErrorFrame,
    Ext,
    Kind,
    LocalProtocolError,
    Phase,
    RemoteProtocolError,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Response,
    ServerConnection,
    Setup,
    StreamError,
    UnknownFrame,
    encode_frame,
)
from polyport.protocols.reactivesocket import payloads as P
from polyport.protocols.reactivesocket.frames import MAX_I64

from .util import SETUP_TCP, SETUP_WS, deliver, h, open_pair, open_server, tcp

# --- connection level -----------------------------------------------------------------


def fatal(conn: ServerConnection | ClientConnection, data: bytes) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(data)
    assert conn.state is ConnectionState.ERRORED
    return info.value


def test_setup_first_then_requests():
    server = ServerConnection()
    assert server.state is ConnectionState.AWAITING_SETUP
    events = server.receive_data(SETUP_TCP + tcp(RequestResponse(1, b"q")))
    assert events == [Setup(), RequestResponse(1, b"q")]
    assert server.state is ConnectionState.OPEN
    assert server.live_streams() == [1]


@pytest.mark.parametrize(
    "first",
    [RequestResponse(1, b""), RequestN(1, 1), Cancel(1), Response(1), ErrorFrame(1), Ext(0, 5)],
)
def test_first_frame_must_be_setup(first):
    server = ServerConnection(extensions=[5])
    err = fatal(server, tcp(first))
    assert err.code == "malformed"
    assert "first frame must be SETUP" in err.message
    # The adapter answers with ERROR on stream 0, then closes.
    wire = server.send_error(0, err.code, err.message)
    assert wire[4:16] == h("00 00 0021 0000000000000000")
    assert server.state is ConnectionState.CLOSED
    assert server.receive_data(SETUP_TCP) == []
    with pytest.raises(LocalProtocolError):
        server.send_error(0, "internal", "again")


def test_error_on_stream_zero_before_setup_is_fatal():
    assert "not allowed" in fatal(ServerConnection(), tcp(ErrorFrame(0))).message


def test_after_a_fatal_error_only_error_on_stream_zero_may_be_sent():
    server = open_server()
    server.receive_data(tcp(RequestStream(1, 5)))
    fatal(server, h("00000010 01 00 0016 0000000000000001"))
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"x"))
    with pytest.raises(LocalProtocolError):
        server.send_error(1, "internal", "x")
    assert server.receive_data(b"more") == []
    server.send_error(0, "unsupported", "bye")
    assert server.closed


def test_setup_on_another_stream_and_second_setup():
    err = fatal(ServerConnection(), h("00000010 00 00 0001 0000000000000001"))
    assert "stream id 0" in err.message
    server = open_server()
    err = fatal(server, SETUP_TCP)
    assert "SETUP may only be sent once" in err.message


def test_wrong_version_is_fatal():
    err = fatal(open_server(), h("00000010 01 00 0016 0000000000000001"))
    assert err.code == "unsupported"
    err = fatal(ServerConnection(), h("00000010 02 00 0001 0000000000000000"))
    assert err.code == "unsupported"


def test_unknown_type_with_ignore_is_dropped_without_is_fatal():
    server = ServerConnection()
    # Even before SETUP: "ignore frame if not understood".
    assert server.receive_data(tcp(UnknownFrame(0x0030, 0x80, 0, b"x")) + SETUP_TCP) == [Setup()]
    assert server.receive_data(tcp(UnknownFrame(0x0000, 0x80, 1))) == []
    err = fatal(server, tcp(RequestFnf(1, b"a")) + tcp(UnknownFrame(0x0017, 0x00, 1)))
    assert err.code == "unsupported"
    assert "0x0017" in err.message
    # Frames decoded before the fault are kept on the error.
    assert err.frames == [RequestFnf(1, b"a")]


def test_extensions():
    server = ServerConnection(extensions=[7])
    server.receive_data(SETUP_TCP)
    assert server.receive_data(tcp(Ext(0, 7, b"x"))) == [Ext(0, 7, b"x")]
    assert server.receive_data(tcp(Ext(3, 8, b"x", ignore=True))) == []
    err = fatal(server, tcp(Ext(3, 8, b"x")))
    assert err.code == "unsupported"
    assert "0x00000008" in err.message


def test_tcp_length_over_the_limit_fails_before_the_body_arrives():
    server = open_server(max_frame_size=100)
    err = fatal(server, h("00000069"))  # 105 - 4 = 101 > 100
    assert err.code == "too_large"
    server = open_server(max_frame_size=100)
    # 104 - 4 = 100: fine, waits for the body.
    assert server.receive_data(h("00000068 00 00 0012 0000000000000001")) == []
    assert server.receive_data(b"x" * 88) == [RequestFnf(1, b"x" * 88)]


@pytest.mark.parametrize("length_hex", ["80000010", "0000000c", "00000000"])
def test_bad_tcp_length_is_malformed(length_hex):
    assert fatal(open_server(), h(length_hex)).code == "malformed"


def test_websocket_framing():
    server = ServerConnection("websocket", max_frame_size=64)
    assert server.receive_data(SETUP_WS) == [Setup()]
    assert server.receive_data(encode_frame(RequestStream(1, 2, b"ab"))) == [
        RequestStream(1, 2, b"ab")
    ]
    # Each call is one whole message: two frames glued are one bad frame.
    err = fatal(server, encode_frame(Cancel(1)) + encode_frame(Cancel(1)))
    assert "CANCEL frame body must be 0 bytes" in err.message
    server = ServerConnection("websocket", max_frame_size=64)
    assert fatal(server, b"\x00" * 65).code == "too_large"
    assert fatal(ServerConnection("websocket"), b"").code == "malformed"
    # The server's bytes are bare messages.
    server = open_server("websocket")
    server.receive_data(encode_frame(RequestResponse(1)))
    assert server.send(Response(1, b"r", complete=True)) == h("00 70 0020 0000000000000001 72")


@pytest.mark.parametrize(
    "frame", [RequestResponse(0), RequestStream(0, 1), RequestN(0, 1), Cancel(0), RequestFnf(0)]
)
def test_stream_zero_is_reserved(frame):
    err = fatal(open_server(), tcp(frame))
    assert "stream 0" in err.message


def test_client_error_on_stream_zero_closes():
    server = open_server()
    events = server.receive_data(tcp(ErrorFrame(0, b"")) + tcp(RequestFnf(1)))
    assert events == [ErrorFrame(0, b"")]
    assert server.state is ConnectionState.CLOSED


def test_responses_from_the_client_are_ignored():
    server = open_server()
    assert server.receive_data(tcp(Response(1, b"x")) + tcp(ErrorFrame(3, b""))) == []
    assert fatal(server, tcp(Response(0))).code == "malformed"


def test_setup_rejection():
    server = ServerConnection()
    setup = P.encode_setup_data(P.SetupData(user="u", password="wrong"))
    client = ClientConnection()
    events = server.receive_data(client.setup(setup) + client.request_response(b"r")[1][0])
    assert events[0] == Setup(setup)
    wire = server.send_error(0, "unauthenticated", "bad password")
    assert server.state is ConnectionState.CLOSED
    assert client.receive_data(wire) == [
        ErrorFrame(0, P.encode_error_data("unauthenticated", "bad password"))
    ]
    assert client.state is ConnectionState.CLOSED
    assert not client.setup_accepted
    with pytest.raises(LocalProtocolError):
        client.request_response(b"")


def test_server_sends_only_responses_errors_and_ext():
    server = open_server(extensions=[1])
    for frame in (Setup(), RequestResponse(1), RequestN(1, 1), Cancel(1)):
        with pytest.raises(LocalProtocolError):
            server.send(frame)
    assert server.send(Ext(0, 1)) == tcp(Ext(0, 1))


def test_send_over_max_frame_size_asks_for_fragmentation():
    server = open_server(max_frame_size=20)
    server.receive_data(tcp(RequestResponse(1)))
    with pytest.raises(LocalProtocolError) as info:
        server.send(Response(1, b"x" * 9, complete=True))
    assert "fragment" in info.value.message
    assert server.is_live(1)  # nothing changed
    frames = server.send_response(1, b"x" * 9, complete=True, max_fragment=8)
    assert len(frames) == 2


# --- REQUEST_RESPONSE ---------------------------------------------------------------


def test_request_response_answer_is_one_complete():
    server = open_server()
    server.receive_data(tcp(RequestResponse(1, b"q")))
    assert server.streams[1].kind is Kind.REQUEST_RESPONSE
    with pytest.raises(LocalProtocolError) as info:
        server.send(Response(1, b"a"))
    assert "one RESPONSE with C" in info.value.message
    assert server.send(Response(1, b"a", complete=True)) == tcp(Response(1, b"a", complete=True))
    assert not server.is_live(1)
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"a", complete=True))


def test_request_response_error_and_cancel():
    server = open_server()
    server.receive_data(tcp(RequestResponse(1)) + tcp(RequestResponse(3)))
    server.send_error(1, "not_found", "no such stream")
    assert server.live_streams() == [3]
    assert server.receive_data(tcp(Cancel(3))) == [Cancel(3)]
    assert server.live_streams() == []
    # "the response should not be sent"
    with pytest.raises(LocalProtocolError):
        server.send(Response(3, b"", complete=True))
    # REQUEST_N on a request/response means nothing and is dropped.
    server.receive_data(tcp(RequestResponse(5)))
    assert server.receive_data(tcp(RequestN(5, 3))) == []
    assert server.credits(5) == 0


def test_fire_and_forget_is_never_live():
    server = open_server()
    assert server.receive_data(tcp(RequestFnf(1, b"x"))) == [RequestFnf(1, b"x")]
    assert server.streams == {}
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"", complete=True))
    with pytest.raises(LocalProtocolError):
        server.send_error(1, "internal", "x")
    # The same id may carry a new request afterwards.
    assert server.receive_data(tcp(RequestFnf(1, b"y"))) == [RequestFnf(1, b"y")]


# --- REQUEST_STREAM / REQUEST_SUB credits -------------------------------------------------


def test_stream_credits():
    server = open_server()
    server.receive_data(tcp(RequestStream(1, 2, b"q")))
    assert server.credits(1) == 2
    server.send_response(1, b"a")
    server.send(Response(1, b"b"))
    assert server.credits(1) == 0
    with pytest.raises(LocalProtocolError) as info:
        server.send(Response(1, b"c"))
    assert "no credits" in info.value.message
    assert server.receive_data(tcp(RequestN(1, 3))) == [RequestN(1, 3)]
    assert server.credits(1) == 3
    server.send(Response(1, b"c"))
    # A COMPLETE without data uses no credit; with data it is a NEXT too.
    server.send_complete(1)
    assert not server.is_live(1)
    assert server.receive_data(tcp(RequestN(1, 3)) + tcp(Cancel(1))) == []


def test_complete_with_data_needs_a_credit():
    server = open_server()
    server.receive_data(tcp(RequestStream(1, 0)))
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"last", complete=True))
    assert server.is_live(1)
    server.send_complete(1)


def test_initial_zero_waits_for_request_n():
    server = open_server()
    server.receive_data(tcp(RequestSub(1, 0)))
    assert server.is_live(1) and server.credits(1) == 0
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"e"))
    server.receive_data(tcp(RequestN(1, 1)))
    server.send(Response(1, b"e"))


def test_unbounded_credits_saturate():
    server = open_server()
    server.receive_data(tcp(RequestStream(1, MAX_I64)))
    for _ in range(3):
        server.send(Response(1, b"x"))
    assert server.credits(1) == MAX_I64
    server.receive_data(tcp(RequestStream(3, 5)) + tcp(RequestN(3, MAX_I64)))
    assert server.credits(3) == MAX_I64


def test_subscription_never_completes():
    server = open_server()
    server.receive_data(tcp(RequestSub(1, 10)))
    server.send(Response(1, b"e"))
    with pytest.raises(LocalProtocolError) as info:
        server.send_complete(1)
    assert "never completes" in info.value.message
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"e", complete=True))
    assert server.is_live(1)
    assert server.receive_data(tcp(Cancel(1))) == [Cancel(1)]
    assert not server.is_live(1)


def test_subscription_ends_by_error():
    server = open_server()
    server.receive_data(tcp(RequestSub(1, 10)))
    server.send_error(1, "storage_unavailable", "down")
    assert server.live_streams() == []


def test_request_n_and_cancel_on_unknown_streams_are_ignored():
    server = open_server()
    assert server.receive_data(tcp(RequestN(9, 1)) + tcp(Cancel(9)) + tcp(RequestN(9, -4))) == []
    assert server.streams == {}


# --- stream-level faults ---------------------------------------------------------------


def test_reused_live_stream_id_is_a_stream_error():
    server = open_server()
    server.receive_data(tcp(RequestStream(1, 5)))
    events = server.receive_data(tcp(RequestResponse(1, b"again")) + tcp(RequestFnf(3)))
    assert events == [
        StreamError(1, "malformed", "stream id 1 is already in use by a live REQUEST_STREAM"),
        RequestFnf(3),
    ]
    assert server.streams[1].phase is Phase.REJECTED
    assert server.is_live(1)  # the ERROR is still owed
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"x"))
    # Frames for the rejected stream are moot until the ERROR goes out.
    assert server.receive_data(tcp(RequestN(1, 3)) + tcp(Cancel(1))) == []
    server.send_error(1, "malformed", "reused")
    assert server.streams == {}
    # Then the id is free again.
    assert server.receive_data(tcp(RequestResponse(1))) == [RequestResponse(1)]


@pytest.mark.parametrize("n", [0, -1, -(1 << 63)])
def test_non_positive_request_n_is_a_stream_error(n):
    server = open_server()
    server.receive_data(tcp(RequestStream(1, 5)))
    [event] = server.receive_data(tcp(RequestN(1, n)))
    assert isinstance(event, StreamError)
    assert event.stream_id == 1 and "must be positive" in event.message
    assert server.credits(1) == 0
    server.send_error(event.stream_id, event.code, event.message)
    assert server.streams == {}


def test_negative_initial_request_n_is_a_stream_error():
    server = open_server()
    [event] = server.receive_data(tcp(RequestSub(1, -1)))
    assert isinstance(event, StreamError) and event.stream_id == 1
    assert "negative Initial Request N" in event.message
    server.send_error(1, event.code, event.message)


def test_too_many_streams_is_busy():
    server = open_server(max_streams=2)
    events = server.receive_data(
        tcp(RequestSub(1, 1)) + tcp(RequestSub(3, 1)) + tcp(RequestSub(5, 1)) + tcp(RequestFnf(7))
    )
    assert events[:2] == [RequestSub(1, 1), RequestSub(3, 1)]
    assert isinstance(events[2], StreamError) and events[2].code == "busy"
    assert events[3] == RequestFnf(7)  # needs no stream


def test_live_streams_and_snapshots():
    server = open_server()
    server.receive_data(tcp(RequestStream(5, 1)) + tcp(RequestResponse(3)) + tcp(RequestSub(1, 2)))
    assert server.live_streams() == [1, 3, 5]
    info = server.streams[1]
    assert (info.kind, info.phase, info.credits) == (Kind.REQUEST_SUB, Phase.RESPONDING, 2)
    assert server.credits(99) == 0


# --- client ------------------------------------------------------------------------------


def test_client_must_send_setup_first_and_once():
    client = ClientConnection()
    with pytest.raises(LocalProtocolError):
        client.request_response(b"")
    with pytest.raises(LocalProtocolError):
        client.send(Cancel(1))
    assert client.setup() == SETUP_TCP
    with pytest.raises(LocalProtocolError):
        client.setup()


def test_client_receiving_before_setup_is_fatal():
    client = ClientConnection()
    with pytest.raises(RemoteProtocolError):
        client.receive_data(tcp(Response(1)))


def test_client_stream_ids_are_odd_and_fresh():
    client, _ = open_pair()
    assert [client.request_fnf(b"")[0] for _ in range(3)] == [1, 3, 5]
    assert client.next_stream_id() == 7


def test_client_round_trip_and_setup_accepted():
    client, server = open_pair()
    sid, wire = client.request_response(P.encode_request(P.ReadRequest("s")))
    [request] = deliver(server, wire)
    assert isinstance(request, RequestResponse)
    assert P.decode_request(request.data) == P.ReadRequest("s")
    answer = P.encode_read_response(P.ReadResponse(()))
    assert not client.setup_accepted
    [response] = deliver(client, server.send_response(sid, answer, complete=True))
    assert response == Response(sid, answer, complete=True)
    assert client.setup_accepted
    assert client.live_streams() == [] == server.live_streams()


def test_client_credits_and_stream_end():
    client, server = open_pair()
    sid, wire = client.request_stream(b"q", 2)
    deliver(server, wire)
    assert client.credits(sid) == 2
    deliver(client, server.send_response(sid, b"1"))
    assert client.credits(sid) == 1
    deliver(server, [client.request_n(sid, 4)])
    assert client.credits(sid) == 5 == server.credits(sid) + 0
    events = deliver(client, [server.send(Response(sid, b"2")), server.send_complete(sid)])
    assert events == [Response(sid, b"2"), Response(sid, b"", complete=True)]
    assert not client.is_live(sid)
    # Races with completion are harmless on the convenience calls.
    assert client.request_n(sid, 1) == b""
    assert client.cancel(sid) == b""
    with pytest.raises(LocalProtocolError):
        client.send(Cancel(sid))


def test_client_cancel_then_late_responses_are_dropped():
    client, server = open_pair()
    sid, wire = client.request_sub(b"", 10)
    deliver(server, wire)
    late = server.send(Response(sid, b"late"))
    cancel = client.cancel(sid)
    assert cancel == tcp(Cancel(sid))
    assert client.receive_data(late) == []
    assert server.receive_data(cancel) == [Cancel(sid)]


def test_client_error_on_stream_closes_it():
    client, server = open_pair()
    sid, wire = client.request_stream(b"", 1)
    deliver(server, wire)
    [err] = deliver(client, [server.send_error(sid, "forbidden", "no")])
    assert isinstance(err, ErrorFrame)
    assert P.decode_error_data(err.data) == P.ErrorData("forbidden", "no")
    assert not client.is_live(sid)


def test_client_send_checks():
    client, _ = open_pair()
    sid, _ = client.request_stream(b"", 1)
    with pytest.raises(LocalProtocolError):
        client.send(RequestN(sid, 0))
    with pytest.raises(LocalProtocolError):
        client.send(RequestStream(sid, 1))  # live id
    with pytest.raises(LocalProtocolError):
        client.send(RequestStream(99, -1))
    with pytest.raises(LocalProtocolError):
        client.send(ErrorFrame(sid, b""))
    with pytest.raises(LocalProtocolError):
        client.send(Response(sid))
    with pytest.raises(LocalProtocolError):
        client.send(RequestN(77, 1))  # not live
    rr, _ = client.request_response(b"")
    with pytest.raises(LocalProtocolError):
        client.send(RequestN(rr, 1))  # meaningless on a single response


def test_client_ignores_requests_from_the_server():
    client, _ = open_pair()
    assert client.receive_data(tcp(RequestResponse(2)) + tcp(RequestN(1, 1)) + tcp(Cancel(1))) == []
    assert client.setup_accepted  # "... or if it sees a REQUEST type"


def test_client_takes_lenient_forms():
    client, _server = open_pair()
    rr, _wire = client.request_response(b"")
    # A NEXT without C on a request/response is still its one answer.
    assert client.receive_data(tcp(Response(rr, b"a"))) == [Response(rr, b"a")]
    assert not client.is_live(rr)
    # A RESPONSE with neither B nor E from a peer that never fragments is whole.
    sid, _ = client.request_stream(b"", 5)
    events = client.receive_data(tcp(Response(sid, b"n", begin=False, end=False)))
    assert events == [Response(sid, b"n")]
    # A COMPLETE on a subscription ends it.
    sub, _ = client.request_sub(b"", 5)
    assert client.receive_data(tcp(Response(sub, b"", complete=True))) == [
        Response(sub, b"", complete=True)
    ]
    assert not client.is_live(sub)
